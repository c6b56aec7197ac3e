"""A lock around any block of code, without a registered job."""

from django_exclusive_jobs import LockHeld, exclusive_lock


def rebuild_search_index() -> bool:
    """Rebuild the index unless another server is already doing it."""
    try:
        with exclusive_lock("rebuild_search_index", ttl="5m") as lock:
            # lock.token grows at every acquisition: pass it to writes that must
            # refuse a holder that was taken over (see "Fencing tokens").
            print(f"rebuilding with fencing token {lock.token}")
            return True
    except LockHeld as held:
        print(f"skipped: held by {held.holder} until {held.expires_at}")
        return False

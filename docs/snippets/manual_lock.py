"""Taking, renewing and checking a lock by hand with try_acquire()."""

from django_exclusive_jobs import LockLost, try_acquire


def import_feed(items: list[str]) -> int | None:
    """Import ``items`` on one server; None when another server holds the lock."""
    lock = try_acquire("import_feed", ttl="2m")
    if lock is None:
        return None  # another server has it: skip quietly
    lock.start_keepalive()  # renew every ttl / 3 while we work
    try:
        imported = 0
        for _item in items:
            imported += 1  # the real work goes here
        # One query: raises LockLost if the lease ran out, or an operator
        # force-released the lock, or another server took it over, while we worked.
        # Do it before anything that must not happen twice, such as committing.
        lock.ensure_held()
        return imported
    except LockLost:
        return None  # another server may be running: do not commit
    finally:
        lock.release()

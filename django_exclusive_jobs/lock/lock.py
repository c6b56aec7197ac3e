"""``Lock``: one acquisition of a named lock, and what its holder can do with it.

A lock is held while its lease is open on the database's clock. Its holder renews the
lease (keep-alive does it every ttl/3), checks it (``ensure_held``), and releases it.
``token`` is the fencing token: it grows by one at every acquisition of the name, so a
guarded write (``... WHERE fence_token <= mine``, storing ``mine``) refuses a holder that
was taken over: a newer holder has written a higher token.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.db import connections

from .. import signals
from ..logs import extra
from ..naming import holder_name
from .errors import JobLockError, LockLost
from .keepalive import KeepAlive
from .retry import run_statement
from .sql import Identity, Statements

logger = logging.getLogger("django_exclusive_jobs")


class _Process:
    """This process: host, pid and a random instance id, renewed in a forked child."""

    def __init__(self) -> None:
        self.refresh()

    def refresh(self) -> None:
        self.host = socket.gethostname()[:255]
        self.pid = os.getpid()
        self.instance = uuid.uuid4().hex

    def holder(self) -> str:
        return holder_name(self.host, self.pid, self.instance)

    def me(self) -> Identity:
        """This process and the calling thread, as a take writes them into the row."""
        return Identity(self.host, self.pid, self.instance, threading.get_native_id())


process = _Process()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=process.refresh)


# Nested acquisitions: the outermost Lock each thread holds, per (alias, name).
_registry = threading.local()


def held_here() -> dict[tuple[str, str], Lock]:
    held: dict[tuple[str, str], Lock] | None = getattr(_registry, "held", None)
    if held is None:
        held = _registry.held = {}
    return held


def forget(lock: Lock) -> None:
    """Drop ``lock`` from this thread's held locks (on release)."""
    held = held_here()
    if held.get((lock.using, lock.name)) is lock:
        del held[(lock.using, lock.name)]


class Lock:
    """One acquisition of a named lock. Made by ``try_acquire``; not shared between threads."""

    def __init__(
        self,
        *,
        name: str,
        using: str,
        ttl: dt.timedelta,
        min_hold: dt.timedelta,
        token: int,
        acquired_at: dt.datetime | None,
        expires_at: dt.datetime | None,
        started: float,
        parent: Lock | None = None,
    ) -> None:
        #: The lock's name (one lock per name and database).
        self.name = name
        #: The database alias the lock row lives on.
        self.using = using
        #: How long each lease lasts; keep-alive renews it every ttl/3.
        self.ttl = ttl
        #: On release the lease stays until ``acquired_at + min_hold``.
        self.min_hold = min_hold
        #: The fencing token: one higher at every acquisition of the name, never reused.
        self.token = token
        #: This holder: ``host:pid:instance`` (the instance id is random per process).
        self.holder = process.holder()
        #: When this acquisition was made, on the database's clock.
        self.acquired_at = acquired_at
        #: When the lease ends unless renewed, on the database's clock.
        self.expires_at = expires_at
        #: Why the lock was lost, once it was found lost.
        self.lost_reason: str | None = None
        self._parent = parent
        self._released = False
        # The lease was written as db_now + ttl with db_now later than `started`, so
        # `started + ttl` on our monotonic clock is never later than the real expiry.
        self._deadline = started + ttl.total_seconds()
        self._mutex = threading.Lock()
        self._keepalive: Any = None
        #: Called with the new :attr:`deadline` after each renewal (from keep-alive's thread).
        self.on_renewed: Callable[[float], None] | None = None

    def __repr__(self) -> str:
        state = "released" if self._released else "lost" if self.lost_reason else "held"
        return f"<Lock {self.name!r} token={self.token} {state}>"

    @property
    def reentrant(self) -> bool:
        """True when this is a nested acquisition inside one this thread already had."""
        return self._parent is not None

    @property
    def held(self) -> bool:
        """Whether this holder may still act, judged without a query.

        False once released or lost, and once the lease may have run out on the
        database's clock (measured from before the acquiring statement was sent).
        """
        if self._released or self.lost_reason is not None:
            return False
        if self._parent is not None:
            return self._parent.held
        return time.monotonic() < self._deadline

    @property
    def lost(self) -> bool:
        """True once the lock was found lost (see ``lost_reason``)."""
        if self._parent is not None:
            return self._parent.lost
        return self.lost_reason is not None

    @property
    def deadline(self) -> float:
        """When the lease may end, on this machine's monotonic clock (never later than the
        real end on the database's clock)."""
        if self._parent is not None:
            return self._parent.deadline
        return self._deadline

    @property
    def seconds_left(self) -> float:
        """Conservative seconds until the lease runs out (0 when not held)."""
        if self._released or self.lost_reason is not None:
            return 0.0
        if self._parent is not None:
            return self._parent.seconds_left
        return max(0.0, self._deadline - time.monotonic())

    def ensure_held(self) -> None:
        """Raise :class:`LockLost` unless the database still shows this lease (one query)."""
        self._raise_unless_active()
        if self._parent is not None:
            return self._parent.ensure_held()
        statements = Statements(connections[self.using])
        if not run_statement(self.using, lambda: statements.check(self.name, self.token)):
            self._lose("the database no longer shows this lease")

    def renew(self) -> None:
        """Extend the lease to database now + ttl, or raise :class:`LockLost`."""
        self._raise_unless_active()
        if self._parent is not None:
            return self._parent.renew()
        started = time.monotonic()
        statements = Statements(connections[self.using])
        ttl = self.ttl.total_seconds()
        expires_at = run_statement(self.using, lambda: statements.renew(self.name, self.token, ttl))
        if expires_at is None:
            self._lose("the lease ran out or the lock was force-released or taken over")
        with self._mutex:
            in_time = self.lost_reason is None
            if in_time:
                self.expires_at = expires_at
                self._deadline = started + ttl
        if in_time and self.on_renewed is not None:
            self.on_renewed(self._deadline)
        if not in_time:
            # The watchdog gave up while this renewal was on its way and the job was told
            # to stop. The lease it extended keeps other servers out until the job has
            # stopped and release() hands it back.
            raise LockLost(self.name, self.token, self.lost_reason or "lost")

    def release(self) -> bool:
        """Give the lock back; keep it closed until ``acquired_at + min_hold``.

        Returns False (and logs) when this holder no longer had the lock; it never frees
        another holder's lock: the token is in the statement's WHERE clause.
        """
        self.stop_keepalive()
        if self._parent is not None:
            was_held = not self._released
            self._released = True
            return was_held
        forget(self)
        if self._released:
            return False
        if self.lost_reason is not None:
            self._release_after_loss()
            return False
        freed, tries = self._release_row()
        if not freed and tries > 1 and self._released_by_us():
            freed = True  # the first try committed before the connection dropped
        if not freed:
            self._mark_lost("the lock was force-released or taken over before release")
            logger.warning(
                "release of %s token=%s found it no longer held",
                self.name,
                self.token,
                extra=extra("lost", lock=self.name, token=self.token),
            )
        self._released = True
        if not freed:
            return False
        logger.debug("released %s token=%s", self.name, self.token)
        return True

    def start_keepalive(self) -> None:
        """Renew every ttl/3 from a background thread until released or lost."""
        if self._parent is not None or self._keepalive is not None:
            return
        self._keepalive = KeepAlive(self)
        self._keepalive.start()

    def stop_keepalive(self) -> None:
        """Stop renewing the lease (release() does this itself)."""
        keepalive, self._keepalive = self._keepalive, None
        if keepalive is not None:
            keepalive.stop()

    # --- used by keep-alive ---------------------------------------------------------

    def _mark_lost(self, reason: str, *, unless_renewed_by: float | None = None) -> bool:
        """Mark the lock lost (once) and send ``lock_lost``; True if this call did it.

        With ``unless_renewed_by``, only if the local deadline is still at or before that
        monotonic time: a renewal that got through in the meantime wins.
        """
        with self._mutex:
            if self._released or self.lost_reason is not None:
                return False
            if unless_renewed_by is not None and self._deadline > unless_renewed_by:
                return False
            self.lost_reason = reason
        logger.warning(
            "lock lost: %s token=%s holder=%s: %s",
            self.name,
            self.token,
            self.holder,
            reason,
            extra=extra("lost", lock=self.name, token=self.token, holder=self.holder),
        )
        signals.lock_lost.send(sender=Lock, lock=self, reason=reason)
        return True

    def _lease_slipped(self) -> bool:
        """True once the conservative local deadline has passed."""
        return time.monotonic() >= self._deadline

    # --- helpers ----------------------------------------------------------------------

    def _raise_unless_active(self) -> None:
        if self._released:
            raise LockLost(self.name, self.token, "released")
        if self.lost_reason is not None:
            raise LockLost(self.name, self.token, self.lost_reason)

    def _lose(self, reason: str) -> None:
        self._mark_lost(reason)
        raise LockLost(self.name, self.token, self.lost_reason or reason)

    def _release_row(self) -> tuple[bool, int]:
        """Run the release statement; (freed, how many tries it took)."""
        statements = Statements(connections[self.using])
        hold = self.min_hold.total_seconds()
        tries = 0

        def release_once() -> bool:
            nonlocal tries
            tries += 1
            return statements.release(self.name, self.token, hold)

        return run_statement(self.using, release_once), tries

    def _release_after_loss(self) -> None:
        """The job has stopped: free our row if a late renewal kept its lease open."""
        self._released = True
        try:
            freed, _ = self._release_row()
        except JobLockError as exc:
            logger.warning(
                "could not free %s token=%s after it was lost: %s",
                self.name,
                self.token,
                exc,
                extra=extra("lost", lock=self.name, token=self.token),
            )
            return
        logger.warning(
            "release of %s token=%s: this holder had already lost it (%s)%s",
            self.name,
            self.token,
            self.lost_reason,
            "; freed its row" if freed else "",
            extra=extra("lost", lock=self.name, token=self.token),
        )

    def _released_by_us(self) -> bool:
        row = run_statement(self.using, lambda: Statements(connections[self.using]).read(self.name))
        return row is not None and row.token == self.token and row.released_at is not None

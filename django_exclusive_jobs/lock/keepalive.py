"""Keep-alive: renew a held lock's lease from a background thread while a job runs."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from typing import Protocol

from django.db import connections

from ..logs import extra
from .errors import LockLost

logger = logging.getLogger("django_exclusive_jobs")


class Leased(Protocol):
    """What the keep-alive needs of a held lock (``lock.Lock`` is one): ``lock.py``
    imports this module, never the other way round."""

    name: str
    using: str
    ttl: dt.timedelta
    token: int

    @property
    def held(self) -> bool: ...

    @property
    def seconds_left(self) -> float: ...

    def renew(self) -> None: ...

    def _mark_lost(self, reason: str, *, unless_renewed_by: float | None = None) -> bool: ...

    def _lease_slipped(self) -> bool: ...


def watchdog_margin(ttl: float) -> float:
    """How long before the local lease deadline an unrenewed lock is given up.

    The job is told to stop (``lock_lost``) that much before the lease can end on the
    database, so it stops before another server can take the lock over.
    """
    return min(1.0, max(0.05, ttl / 20))


class KeepAlive(threading.Thread):
    """Renews ``lock`` every ttl/3 until :meth:`stop`, or until the lock is lost.

    A renewal that fails with a database error is retried (on a fresh connection) until
    the lease would run out; then the lock is marked lost, which sends ``lock_lost``.
    Uses its own database connection, so the job's transactions never hold it up.

    A watchdog thread marks the lock lost shortly before its lease could end even when a
    renewal is stuck waiting on a database that stopped answering (packets dropped,
    connection never closed), where the renewal itself would wait without limit.
    """

    def __init__(self, lock: Leased, *, interval: float | None = None) -> None:
        super().__init__(name=f"exclusive-jobs-keepalive:{lock.name}", daemon=True)
        self.lock = lock
        self.interval = interval if interval is not None else lock.ttl.total_seconds() / 3
        self.margin = watchdog_margin(lock.ttl.total_seconds())
        self._stopping = threading.Event()
        self._watchdog = threading.Thread(
            target=self._watch, name=f"exclusive-jobs-watchdog:{lock.name}", daemon=True
        )
        self.renewals = 0

    def start(self) -> None:
        super().start()
        self._watchdog.start()

    def stop(self, timeout: float | None = None) -> None:
        self._stopping.set()
        if threading.current_thread() is self._watchdog:
            return
        wait = timeout if timeout is not None else max(5.0, self.interval)
        if self._watchdog.is_alive():
            self._watchdog.join(wait)
        if self.is_alive() and threading.current_thread() is not self:
            self.join(wait)

    def _watch(self) -> None:
        """Give the lock up at ``deadline - margin`` unless a renewal moved the deadline."""
        while not self._stopping.is_set():
            left = self.lock.seconds_left  # 0 once released or lost
            if left <= self.margin:
                # Marks it lost only if still held and not renewed meanwhile.
                if self._give_up(time.monotonic()) or not self.lock.held:
                    return
                continue
            self._stopping.wait(left - self.margin)

    def _give_up(self, now: float) -> bool:
        return self.lock._mark_lost(
            "could not renew before the lease ran out: no renewal got through (the "
            "database did not answer, or this process was paused)",
            unless_renewed_by=now + self.margin,
        )

    def run(self) -> None:
        try:
            while not self._stopping.wait(self.interval):
                if not self._renew_until_deadline():
                    return
        finally:
            connections[self.lock.using].close()

    def _renew_until_deadline(self) -> bool:
        """One renewal, retried on errors; False when the lock is gone."""
        retry_delay = min(1.0, max(0.05, self.interval / 5))
        while not self._stopping.is_set():
            try:
                self.lock.renew()
            except LockLost:
                return False
            except Exception as exc:
                connections[self.lock.using].close()
                if self.lock._lease_slipped():
                    self.lock._mark_lost(f"could not renew before the lease ran out: {exc}")
                    return False
                logger.info(
                    "renewal of %s token=%s failed, retrying: %s",
                    self.lock.name,
                    self.lock.token,
                    exc,
                    extra=extra("database", lock=self.lock.name, status="retrying"),
                )
                self._stopping.wait(min(retry_delay, max(0.0, self.lock.seconds_left)))
                continue
            self.renewals += 1
            return True
        return True

"""Keep-alive: renew a held lock's lease from a background thread while a job runs."""

from __future__ import annotations

import datetime as dt
import heapq
import itertools
import logging
import os
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


class KeepAlive:
    """Renews ``lock`` every ttl/3 until :meth:`stop`, or until the lock is lost.

    A renewal that fails with a database error is retried (on a fresh connection) until
    the lease would run out; then the lock is marked lost, which sends ``lock_lost``.
    Uses its own database connection, so the job's transactions never hold it up.

    A watchdog thread marks the lock lost shortly before its lease could end even when a
    renewal is stuck waiting on a database that stopped answering (packets dropped,
    connection never closed), where the renewal itself would wait without limit.

    Both threads start when first needed (the first renewal, or the watchdog's moment if
    that comes first), woken by the process's one :class:`_Waker`: a job that ends sooner
    (most scheduled runs) starts no thread at all.
    """

    def __init__(self, lock: Leased, *, interval: float | None = None) -> None:
        self.lock = lock
        self.interval = interval if interval is not None else lock.ttl.total_seconds() / 3
        self.margin = watchdog_margin(lock.ttl.total_seconds())
        self._stopping = threading.Event()
        self._mutex = threading.Lock()
        self._threads: tuple[threading.Thread, ...] = ()
        self._first_renewal = 0.0
        self.renewals = 0

    def start(self) -> None:
        now = time.monotonic()
        self._first_renewal = now + self.interval
        watch_at = now + max(0.0, self.lock.seconds_left - self.margin)
        _waker.add(min(self._first_renewal, watch_at), self)

    def begin(self) -> None:
        """Start the renewing and watching threads (the waker calls it when due)."""
        with self._mutex:
            if self._stopping.is_set() or self._threads:
                return
            name = self.lock.name
            self._threads = (
                threading.Thread(target=self._watch, name=f"exclusive-jobs-watchdog:{name}"),
                threading.Thread(target=self.run, name=f"exclusive-jobs-keepalive:{name}"),
            )
            for thread in self._threads:
                thread.daemon = True
                thread.start()

    @property
    def stopped(self) -> bool:
        return self._stopping.is_set()

    def is_alive(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    def stop(self, timeout: float | None = None) -> None:
        with self._mutex:
            self._stopping.set()
            threads = self._threads
        here = threading.current_thread()
        if threads and here is threads[0]:  # the watchdog, giving the lock up
            return
        wait = timeout if timeout is not None else max(5.0, self.interval)
        for thread in threads:
            if thread is not here and thread.is_alive():
                thread.join(wait)

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
            wait = max(0.0, self._first_renewal - time.monotonic())
            while not self._stopping.wait(wait):
                if not self._renew_until_deadline():
                    return
                wait = self.interval
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


class Due(Protocol):
    """What the waker begins when due: a keep-alive, or a run's ``warn_after``
    (``run/long_runs.py``). ``begin`` must not block: it starts a thread if it has work."""

    @property
    def stopped(self) -> bool: ...

    def begin(self) -> None: ...


def wake_at(at: float, due: Due) -> None:
    """Call ``due.begin()`` at ``at`` (monotonic) from the process's one waker thread,
    unless ``due`` has stopped by then."""
    _waker.add(at, due)


class _Waker:
    """The one thread of a process that begins each keep-alive when it is due, so that a
    short run costs no thread. It does no I/O: it only starts threads."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, Due]] = []
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._count = itertools.count()
        self._sweep_at = 64  # how many waits make it drop those of stopped keep-alives

    def add(self, at: float, keepalive: Due) -> None:
        with self._changed:
            if len(self._due) >= self._sweep_at:
                # Most locks are released long before their first renewal: without this,
                # a process taking many locks would keep each until its ttl / 3.
                self._due = [due for due in self._due if not due[2].stopped]
                heapq.heapify(self._due)
                self._sweep_at = max(64, 2 * len(self._due))
            heapq.heappush(self._due, (at, next(self._count), keepalive))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="exclusive-jobs-keepalive-waker", daemon=True
                )
                self._thread.start()
            elif self._due[0][2] is keepalive:
                self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._changed.wait(self._due[0][0] - time.monotonic() if self._due else None)
                keepalive = heapq.heappop(self._due)[2]
            keepalive.begin()  # nothing if it was stopped meanwhile


_waker = _Waker()


def _forked() -> None:
    """In a forked child none of the parent's threads runs: a waker of its own."""
    global _waker
    _waker = _Waker()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)

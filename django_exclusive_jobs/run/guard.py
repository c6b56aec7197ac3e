"""A job's guard: what stops a job's process when the job may no longer run.

It lives in the job's own process (one process per run): a thread that takes in the
scheduler's lease renewals and watches the clock, backed by the kernel's interval timer
(``SIGALRM``, whose default action ends the process), which needs neither the thread nor
the GIL. It stops the job's process group:

* the scheduler is gone, even by ``kill -9`` (its end of the report connection closes):
  SIGKILL at once;
* the lease is about to end without a renewal having reached the guard (the scheduler is
  frozen by SIGSTOP, a debugger or a stalled disk, or cannot reach the database): SIGTERM
  a safety margin before the lease's end, SIGKILL half-way through the margin. The
  scheduler forwards each renewal's new deadline (on the monotonic clock, which the
  processes of one machine share). A whole machine that stops (a VM pause) stops the
  guard too: the fencing token is what refuses that job's late writes;
* the job passed its ``timeout``: SIGTERM, SIGKILL :data:`KILL_AFTER` seconds later.

A job that holds the GIL in one long call into C starves the thread, not the timer: its
process ends at the last of its kills all the same (by ``SIGALRM``, which the scheduler
reads as the limit passed). A job must leave ``SIGALRM`` and ``setitimer`` alone.
"""

from __future__ import annotations

import _thread
import os
import select
import signal
import time
from contextlib import suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from .shutdown import KILL_AFTER

GUARD_TICK = 0.2  # seconds: how often a job's guard looks at the clock
STOPS = {signal.SIGTERM, signal.SIGINT}


@dataclass
class Limits:
    """When a job must stop: its lease (``deadline``, renewed by the scheduler, less a
    safety ``margin``) and its timeout (``timeout_at``). Monotonic seconds."""

    deadline: float
    margin: float
    timeout_at: float | None

    def passed(self) -> dict[str, float]:
        """Which limit a job killed at the last of them (by the guard's timer) passed:
        its timeout, if that is behind, else its lease; and when."""
        now = time.monotonic()
        if self.timeout_at is not None and now >= self.timeout_at:
            return {"timed_out": self.timeout_at}
        return {"lease_ended": min(now, self.deadline - self.margin)}


def timeout_at(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


class Guard:
    """The thread of a job's process that stops its process group when the job may no
    longer run, backed by the kernel's timer (``SIGALRM``, whose default is to end the
    process), which needs neither the thread nor the GIL.

    The thread waits for the first of: the job's end (:meth:`end`), the scheduler's end
    (its end of the connection closes: SIGKILL at once), a new lease deadline from the
    scheduler, ``deadline - margin`` (SIGTERM, then SIGKILL at ``deadline - margin / 2``),
    or the timeout (SIGTERM, then SIGKILL after :data:`KILL_AFTER`). The timer is armed
    for the latest SIGKILL and re-armed with each renewal the thread takes in: a job that
    keeps the GIL from the thread (one long call into C) ends at its lease's end all the
    same, and so does a process thawed after it.
    """

    def __init__(self, connection: Connection, limits: Limits) -> None:
        self.connection = connection
        self.limits = limits
        self.sending = _thread.allocate_lock()  # the job's report and the guard's messages
        self._ended, self._ending = os.pipe()
        self._watching = _thread.allocate_lock()  # held while the thread runs

    def start(self) -> None:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        self._arm(self._last_kill(self.limits.deadline))
        # The thread starts with SIGTERM and SIGINT blocked: they are the job's (its main
        # thread's), and held there once it has ended (a signal a thread does not block
        # may be delivered to it).
        # A bare thread (``_thread``): threading's bookkeeping costs a child about 0.6 ms of
        # CPU, in pages copied on write, for nothing a guard needs.
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
        self._watching.acquire()
        try:
            _thread.start_new_thread(self._run, ())
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def send(self, message: dict[str, Any]) -> None:
        with self.sending, suppress(OSError):
            self.connection.send(message)

    def end(self) -> None:
        """The job has ended and reported: the guard stops, and so does the timer."""
        os.close(self._ending)
        self._watching.acquire()  # the thread has returned
        signal.setitimer(signal.ITIMER_REAL, 0)

    def _last_kill(self, deadline: float) -> float:
        ends = self.limits.timeout_at
        lease_kill = deadline - self.limits.margin / 2
        return lease_kill if ends is None else min(lease_kill, ends + KILL_AFTER)

    @staticmethod
    def _arm(kill_at: float) -> None:
        signal.setitimer(signal.ITIMER_REAL, max(0.001, kill_at - time.monotonic()))

    def _run(self) -> None:
        try:
            self._watch()
        finally:
            self._watching.release()

    def _watch(self) -> None:
        deadline, margin, timeout_at = (
            self.limits.deadline,
            self.limits.margin,
            self.limits.timeout_at,
        )
        renewed = True  # renewals count until the lease is given up for lost
        kill_at = float("inf")
        while True:
            now = time.monotonic()
            if renewed and now >= deadline - margin:
                # No renewal reached us in time: the job must be gone before the lease ends.
                renewed = False
                self._stop({"lease_ended": now})
                kill_at = min(kill_at, deadline - margin / 2)
            elif timeout_at is not None and now >= timeout_at:
                timeout_at = None
                self._stop({"timed_out": now})
                kill_at = min(kill_at, now + KILL_AFTER)
            if now >= kill_at:
                os.killpg(os.getpgrp(), signal.SIGKILL)
                return
            # Short waits, each followed by a look at the clock: a wait of the whole time
            # left would not count the time this process spent stopped (a VM paused).
            tick = GUARD_TICK if kill_at == float("inf") else GUARD_TICK / 4
            events = [kill_at, deadline - margin if renewed else kill_at, timeout_at or kill_at]
            waits = [self._ended, self.connection.fileno()] if renewed else [self._ended]
            ready, _, _ = select.select(waits, [], [], max(0.0, min(tick, min(events) - now)))
            if self._ended in ready:
                return
            if self.connection.fileno() in ready:
                try:
                    deadline = max(deadline, self.connection.recv()["lease_until"])
                except (EOFError, OSError):  # the scheduler is gone, the job is not
                    os.killpg(os.getpgrp(), signal.SIGKILL)
                    return
                self._arm(min(kill_at, self._last_kill(deadline)))

    def _stop(self, why: dict[str, float]) -> None:
        """Tell the scheduler why the job is stopped, and send its process group SIGTERM."""
        self.send(why)
        os.killpg(os.getpgrp(), signal.SIGTERM)

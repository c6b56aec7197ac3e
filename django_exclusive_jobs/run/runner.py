"""A run: take a job's lock, run it with keep-alive, say one line per decision.

Used by ``@exclusive_job`` (sync and async), ``manage.py run_exclusive``, ``exclusive_jobs
run`` and the scheduler. The lock engine decides who holds a lock; this module decides
what a run looks like: history, signals, log lines, how it ended, shutdown on
SIGTERM/SIGINT, and exit codes. A :class:`Run` is built in floors, each a module of its
own: ``run_state.py`` (its settings and progress), ``saying.py`` (its lines and signals),
``finishing.py`` (its end), ``starting.py`` (its start), ``executing.py`` (around a job
in this thread); ``ending.py`` decides how it ended, over values.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from ..lock.clock import DatabaseClock
from ..lock.keepalive import watchdog_margin
from ..lock.lock import Lock
from ..lock.retry import run_statement
from ..logs import line
from .child import ChildExit
from .ending import (
    EXIT_DATABASE,
    EXIT_FAILED,
    EXIT_LOST,
    EXIT_OK,
    EXIT_TIMED_OUT,
    EXIT_USAGE,
    LEASE_ENDED,
    RunResult,
    child_end,
    describe_exit,
)
from .ending import stopped_while_running as _stopped_while_running
from .executing import Executing
from .process import JobProcess, Outcome
from .run_info import running
from .shutdown import Cancelled, Interrupted, TimedOut, stop_on_signals
from .status import RunStatus
from .thread import JobThread
from .tracing import trace_context

# What other modules and tests import from here (defined in ending.py).
__all__ = [
    "EXIT_DATABASE",
    "EXIT_FAILED",
    "EXIT_LOST",
    "EXIT_OK",
    "EXIT_TIMED_OUT",
    "EXIT_USAGE",
    "LEASE_ENDED",
    "Run",
    "RunResult",
    "_stopped_while_running",
    "call_each_due",
    "describe_exit",
]


class Run(Executing):
    """One run of a job, from take to finish. One instance per run; not shared between
    threads. What it runs with is fixed when it is built: the job's settings (a
    :class:`Job`, overridden by the command line with :meth:`Job.but`) and why it runs.

    The life of a run, written once: :meth:`start` (take the lock, claim the slot,
    account for missed slots), then the job executes, then :meth:`finish` (release,
    history, signals). How the job executes is the caller's choice of method:
    :meth:`call` (in this thread: a function, a management command or an external
    program), :meth:`acall` (awaited), or :meth:`start_child` and :meth:`end_child` (a
    process of its own, for the scheduler).
    """

    # --- how the job executes -----------------------------------------------------------

    def call(self, target: Callable[[Lock], Any] | None = None) -> RunResult:
        """Start, run ``target(lock)`` in this thread (default: the job's function),
        finish. The job's errors become the result; KeyboardInterrupt and SystemExit are
        raised again once the run is recorded."""
        self.in_process = True
        started = self.start()
        if isinstance(started, RunResult):
            return started
        result = self.begin(started)
        info = self.info(started)
        with self._executing(result), running(info):
            self._may_start(started)
            with self._stoppable(started), self._time_limit():
                target = target or self.target
                if target:
                    result.value = target(started)
                else:
                    result.value = self.job.call(self.job_slot, started.token, info)
                self.returned = True  # a timeout that fires from now on is too late
        result = self.finish(result)
        stopped = (RunStatus.INTERRUPTED, RunStatus.CANCELLED)
        if self.pending_signal is not None and result.status not in stopped:
            # The signal came while the lock was being released: the job had ended, but
            # the process was still asked to stop.
            result.status, result.signum = RunStatus.INTERRUPTED, self.pending_signal
        escaping = result.exception
        if escaping is not None and not isinstance(
            escaping, (Exception, Interrupted, TimedOut, Cancelled)
        ):
            raise escaping
        return result

    async def acall(self, target: Callable[[Lock], Awaitable[Any]]) -> RunResult:
        """:meth:`call` for a coroutine: the lock's statements block, so they run in
        Django's sync thread, while the job is awaited here."""
        from asgiref.sync import sync_to_async

        self.in_process = True
        started = await sync_to_async(self.start, thread_sensitive=True)()
        if isinstance(started, RunResult):
            return started
        result = self.begin(started)
        with self._executing(result), running(self.info(started)):
            self._may_start(started)
            result.value = await target(started)
        await sync_to_async(self.finish, thread_sensitive=True)(result)
        return result

    def start_child(self, lock: Lock, *, grace: float) -> JobProcess | JobThread | RunResult:
        """Start the job in a process of its own (or, ``in_process=True``, a thread of
        this one); the ended result if it could not."""
        result = self.begin(lock)
        with self._executing(result):
            self._may_start(lock)
            if self.job.runs_in_thread:
                return JobThread(
                    self.name,
                    self.job_slot,
                    kwargs=self.job.kwargs,
                    trace=trace_context(lock),
                    token=lock.token,
                    info=self.info(lock),
                )
            margin = watchdog_margin(lock.ttl.total_seconds())
            child = JobProcess(
                self.name,
                self.job_slot,
                grace=grace,
                deadline=self.lease_end(),
                margin=margin,
                timeout=self.job.time_limit,
                kwargs=self.job.kwargs,
                trace=trace_context(lock),
                token=lock.token,
                info=self.info(lock),
            )
            # Each renewal reaches the child's guard, which stops the job by itself when
            # none comes in time: the end of the first of its leases (its groups').
            for each in (lock, *self.group_locks):
                each.on_renewed = lambda _deadline: child.extend(self.lease_end())
            child.extend(self.lease_end())  # a renewal may have come before the lines above
            return child
        return self.finish(result)

    def lease_end(self) -> float:
        """When the first of the run's leases ends (monotonic): its own, its groups'."""
        assert self.lock is not None
        return min(each.deadline for each in (self.lock, *self.group_locks))

    def end_child(self, child: JobProcess | JobThread, outcome: Outcome) -> RunResult:
        """Record and finish the run whose process (or thread) ended with ``outcome``."""
        lock = self.lock
        assert lock is not None
        result = self.begin(lock)
        stopped = _stopped_while_running(child, outcome)
        returncode = outcome.returncode  # a process's (an in-process run has none)
        if returncode is not None and returncode < 0 and child.stopped_by and not stopped:
            # Killed by the scheduler's stop that came after its job had returned (a
            # slow exit): the kill is not the job's; the run is what the job did.
            returncode = None
        if returncode is not None:
            result.value = ChildExit(returncode)
        result.enqueued = outcome.enqueued
        end = child_end(
            outcome,
            stopped=stopped,
            stopped_by=child.stopped_by,
            lost=lock.lost,
            lock=(lock.name, lock.token),
            time_limit=self.job.time_limit,
        )
        if end.error is not None:
            self.record(result, end.error)
        elif end.interrupted:
            result.status, result.signum = RunStatus.INTERRUPTED, end.signum
        # The job's own end, not when the scheduler noticed it (a frozen one notices late).
        return self.finish(result, ended=outcome.ended or outcome.lease_ended)

    def on_signal(self, signum: int) -> None:
        """SIGTERM/SIGINT: stop the job if it is running, else finish the lock work first.

        Raising inside a lock statement could leave the lock held until its lease ends,
        so outside the job body the signal is only remembered.
        """
        if self.in_job and self.on_stop is not None:  # a program: it gets the signal
            self.pending_signal = signum
            self.on_stop(signum)
            return
        if self.in_job:
            self.in_job = False  # a second signal must not cut the release short
            self.pending_signal = signum
            raise Interrupted(signum)
        self.pending_signal = signum


def call_each_due(make_run: Callable[[dt.datetime | None], Run]) -> RunResult:
    """Run the job now in this thread, SIGTERM/SIGINT stopping it; under
    ``catch_up="all"``, then each further missed slot in turn (as the scheduler does),
    and under a buffering ``overlap``, the slots that came during the run; after an
    unsuccessful attempt with retries left (``retries=N``), wait until its ``retry_at``
    on the database's clock and run the slot's next attempt. Each is a run of its own,
    built by ``make_run(not_before)``. The last run's result."""
    current = [make_run(None)]
    received: list[int] = []  # a signal that came between two runs stops the next one
    followed = 0  # runs started because the one before overran (a buffering overlap)

    def on_signal(signum: int) -> None:
        received.append(signum)
        current[0].on_signal(signum)

    with stop_on_signals(on_signal):
        while True:
            run = current[0]
            result = run.call()
            if received or result.status == RunStatus.INTERRUPTED:
                return result
            if result.status != RunStatus.SKIPPED and result.retry_at is not None:
                if not _wait_for_retry(run, result.retry_at, received):
                    # Stopped while waiting: the usual exit code of a signal; the retry is
                    # left to whichever server comes next.
                    return replace(result, status=RunStatus.INTERRUPTED, signum=received[0])
                current[0] = make_run(result.retry_at)  # the same slot, never a later one
            elif run.more_due or (run.overran and followed < run.job.catch_up.limit):
                # A cron line whose every run overruns stops after catch_up_limit of them.
                followed += 0 if run.more_due else 1
                current[0] = make_run(None)
            else:
                return result


RETRY_WAIT_STEP = 0.1  # seconds: how soon a signal ends the wait for a retry


def _wait_for_retry(run: Run, retry_at: dt.datetime, received: list[int]) -> bool:
    """Wait until ``retry_at`` on the database's clock; False if a signal came first."""
    assert run.lock is not None
    clock = DatabaseClock(run.lock.using)
    run_statement(run.lock.using, clock.sync)
    said = f"waiting for the retry of {run.name} at {retry_at.isoformat(timespec='seconds')}"
    run._say(line("waiting", said, job_name=run.name, slot=run.slot, retry_at=retry_at))
    while not received:
        left = clock.seconds_until(retry_at)
        if left <= 0:
            return True
        time.sleep(min(left, RETRY_WAIT_STEP))
    return False

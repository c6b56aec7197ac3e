"""A run: take a job's lock, run it with keep-alive, say one line per decision.

Used by ``@exclusive_job`` (sync and async), ``manage.py run_exclusive``, ``exclusive_jobs
run`` and the scheduler. The lock engine decides who holds a lock; this module decides
what a run looks like: history, signals, log lines, how it ended, shutdown on
SIGTERM/SIGINT, and exit codes.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from django.db import connections

from .. import logs, signals
from ..conf import app_settings
from ..lock.acquire import acquire_or_raise
from ..lock.clock import DatabaseClock, database_now
from ..lock.errors import JobLockError, LockHeld, LockLost
from ..lock.keepalive import watchdog_margin
from ..lock.lock import Lock, process
from ..lock.retry import run_statement
from ..lock.validation import resolve_alias
from ..logs import line
from ..naming import holder_name
from . import history, overrides, pausing, run_requests, slot_locks
from .catchup import Replaced
from .child import ChildExit
from .process import JobFailed, JobProcess, Outcome
from .registry import Job
from .shutdown import Cancelled, Interrupted, TimedOut, stop_on_signals, time_limit
from .start import Start
from .status import RunStatus
from .tasks import Enqueued
from .thread import JobThread
from .tracing import trace_context

if TYPE_CHECKING:
    from ..models import JobState, RunRequest

logger = logging.getLogger("django_exclusive_jobs")

# Exit codes of ``manage.py run_exclusive`` (documented in the README and --help).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_DATABASE = 3
EXIT_LOST = 4
EXIT_TIMED_OUT = 124  # as timeout(1)

EARLY_WAIT_LIMIT = 2.0  # seconds a start that came early waits for its slot
JITTER_TICK = 0.1  # seconds between two looks for a stop while waiting for a slot's start


@dataclass
class RunResult:
    """How one call of a job went: ``status`` is a :class:`RunStatus` value."""

    name: str
    status: RunStatus
    value: Any = None
    exception: BaseException | None = None
    duration: float = 0.0
    token: int | None = None
    holder: str = ""
    held_until: dt.datetime | None = None
    returncode: int | None = None  # a child program's own exit code
    signum: int | None = None
    enqueued: Enqueued | None = None  # the task result, for a django.tasks job
    attempt: int = 1  # of the slot it served (retries=N)
    # Ended: when the slot's next attempt may start (None: this attempt was its last).
    # Skipped: when the slot's pending retry is due, if that is why.
    retry_at: dt.datetime | None = None

    @property
    def final(self) -> bool:
        """No further attempt of its slot will be made: how it ended is the slot's end."""
        return self.retry_at is None

    @property
    def exit_code(self) -> int:
        done = (RunStatus.SUCCEEDED, RunStatus.SKIPPED, RunStatus.ENQUEUED, RunStatus.CANCELLED)
        if self.status in done:
            return EXIT_OK
        if self.status == RunStatus.INTERRUPTED and self.signum:
            return 128 + self.signum
        if self.status == RunStatus.LOST:
            return EXIT_LOST
        if self.status == RunStatus.TIMED_OUT:
            return EXIT_TIMED_OUT
        if self.returncode:
            return self.returncode if self.returncode > 0 else 128 - self.returncode
        return EXIT_FAILED


class Run:
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

    def __init__(
        self,
        job: Job,
        *,
        report: Callable[[str, bool], None] | None = None,
        on_lost: Callable[[Lock], None] | None = None,
        start: Start | None = None,
        supervised: bool = False,
        on_timeout: Callable[[float], None] | None = None,
        grace: float = 10.0,
        cancel_wait: float | None = None,
        target: Callable[[Lock], Any] | None = None,
        on_stop: Callable[[int], None] | None = None,
        context: dict[str, Any] | None = None,
    ) -> None:
        #: The job and its settings; a request's arguments over its declared ones.
        start = Start.call() if start is None else start
        request = start.request
        self.job = job.with_arguments(request.kwargs) if request is not None else job
        self.name = job.name
        # Called with each decision line and whether it is the normal path (True) or not;
        # each line also carries the fields of ``context`` (the scheduler's name).
        self.report = report
        self.context = context or {}
        # Called (from keep-alive's thread) when the lock is found lost mid-run.
        self.on_lost = on_lost
        # Why it runs (see start.py): its schedule's slot (a direct call, by default; a
        # cron line's, which waits for the slot's start, its jitter; the scheduler's due
        # slot, never served before its time on the database's clock), a run asked for
        # now, a backfill of a past slot.
        self.reason = start
        # A command's run (``supervised``; a direct call of the decorated function, in a
        # web request, is not) is stopped by :meth:`call` at the job's timeout, and when a
        # newer slot cancels it (``overlap="cancel_other"``): ``on_timeout(seconds)``
        # stops what it runs (a program), else TimedOut is raised in this thread, and a job
        # that has not returned ``grace`` seconds later ends the process.
        self.supervised = supervised
        self.on_timeout = on_timeout
        self.grace = grace
        # overlap="cancel_other": how long a start whose lock is held by an older slot's
        # run waits for it once asked to stop (None: it never asks; the scheduler: 0, it
        # looks again each second instead).
        self.cancel_wait = cancel_wait
        self.stop_asked = False  # this start asked the holder to stop
        self.cancelled_by = ""  # who asked this run to stop (cancel_other)
        # The job is running (``in_job`` says whether an exception may be raised in it:
        # no longer once a first signal has been), and has returned.
        self.job_running = False
        self.returned = False
        # What :meth:`call` runs (default: the job's function), and how a SIGTERM or
        # SIGINT stops it while it runs (default: Interrupted raised in it; a program is
        # sent the signal instead, see ChildProgram.on_signal).
        self.target = target
        self.on_stop = on_stop
        # The job executes in this thread (call, acall), not in a process of its own
        # (start_child): job_started says so to receivers (a tracer makes its span current).
        self.in_process = False
        # What happened so far.
        self.lock_name = job.name  # under overlap="allow_all", its slot's (see start)
        self.lock_slot: dt.datetime | None = None
        self.lock: Lock | None = None
        self.run_id: int | None = None
        self.slot: dt.datetime | None = None  # the slot it serves (None: a manual run)
        self.more_due = False  # catch_up="all": more missed slots to run after this one
        self.attempt = 1  # of the slot it serves
        self.retry_at: dt.datetime | None = None  # see RunResult.retry_at
        self.early = False  # the lock came far earlier than not_before (see _on_time)
        self.in_job = False
        self.pending_signal: int | None = None
        # Writes this run's end later, when the database could not be reached at its end.
        self.unwritten_end: Callable[[], None] | None = None
        self._started = self._acquired = 0.0
        self._finished: RunResult | None = None
        self._state: JobState | None = None  # what operators decided, read by _in_force
        self._state_read = False
        self._finishing = threading.Lock()

    @property
    def job_slot(self) -> dt.datetime | None:
        """What a job function that takes ``slot`` is given: the slot this run serves; on
        a manual run of a scheduled job, the slot its schedule would serve now."""
        if self.slot is not None or self.job.schedule is None or self.lock is None:
            return self.slot
        acquired = self.lock.acquired_at
        return self.job.schedule.slot_at(acquired) if acquired is not None else None

    @property
    def request(self) -> RunRequest | None:
        """The run-now request (with a slot: a backfill's) a scheduler serves, if any."""
        return self.reason.request

    @property
    def backfilled(self) -> bool:
        """It serves a past slot a backfill asked for, not its schedule's."""
        return self.reason.backfilled

    @property
    def overran(self) -> bool:
        """This run of a job whose ``overlap`` runs a slot that came during a run
        (``"buffer_one"``, ``"buffer_all"``, ``"cancel_other"``) ended after its
        schedule's next slot: that slot is to run now, after it."""
        job, lock, result = self.job, self.lock, self._finished
        if not job.buffers or job.schedule is None or self.slot is None:
            return False
        if self.backfilled:
            return False
        if lock is None or lock.acquired_at is None or result is None:
            return False
        ended = lock.acquired_at + dt.timedelta(seconds=result.duration)
        return job.schedule.next_after(self.slot) <= ended

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
        with self._executing(result):
            self._may_start(started)
            with self._stoppable(started), self._time_limit():
                target = target or self.target
                if target:
                    result.value = target(started)
                else:
                    result.value = self.job.call(self.job_slot, started.token)
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
        with self._executing(result):
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
                )
            margin = watchdog_margin(lock.ttl.total_seconds())
            child = JobProcess(
                self.name,
                self.job_slot,
                grace=grace,
                deadline=lock.deadline,
                margin=margin,
                timeout=self.job.time_limit,
                kwargs=self.job.kwargs,
                trace=trace_context(lock),
                token=lock.token,
            )
            # Each renewal reaches the child's guard, which stops the job by itself when
            # none comes in time.
            lock.on_renewed = child.extend
            child.extend(lock.deadline)  # a renewal may have come before the line above
            return child
        return self.finish(result)

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
        returned_in_time = outcome.finished and (outcome.ended or 0) < (outcome.lease_ended or 0)
        if outcome.lease_ended is not None and not returned_in_time:
            self.record(result, LockLost(lock.name, lock.token, LEASE_ENDED))
        elif outcome.timed_out is not None and not outcome.finished:
            self.record(result, TimedOut(self.job.time_limit or 0.0))
        elif outcome.error is not None:
            self.record(result, outcome.error)
        elif not lock.lost and (outcome.interrupted_by or stopped):
            result.status = RunStatus.INTERRUPTED
            result.signum = outcome.interrupted_by or child.stopped_by
        elif not outcome.finished and not lock.lost and outcome.returncode is not None:
            self.record(result, JobFailed("ProcessDied", describe_exit(outcome.returncode)))
        # The job's own end, not when the scheduler noticed it (a frozen one notices late).
        return self.finish(result, ended=outcome.ended or outcome.lease_ended)

    @contextmanager
    def _executing(self, result: RunResult) -> Iterator[None]:
        """Around the job's execution: whatever it raises is recorded in ``result``
        (never raised from here)."""
        self.in_job = self.job_running = True
        try:
            yield
        except BaseException as exc:
            self.record(result, exc)
        finally:
            self.in_job = self.job_running = False

    @contextmanager
    def _time_limit(self) -> Iterator[None]:
        """Around the job's execution in :meth:`call`: stop it at its timeout."""
        limit = self.job.time_limit if self.supervised else None
        main = threading.current_thread() is threading.main_thread()
        if limit is None or not main:  # only the main thread can be interrupted
            yield
            return
        last_resort = None
        if self.job.is_async:
            # The coroutine runs in another thread that nothing can interrupt: at the
            # timeout, the run is recorded and the process ended at once.
            last_resort = threading.Timer(limit, self._abandon, (limit,))
        elif self.on_timeout is None:  # in this thread: a job that ignores TimedOut
            last_resort = threading.Timer(limit + self.grace, self._abandon, (limit,))
        try:
            if last_resort is not None:
                last_resort.daemon = True
                last_resort.start()
            if self.job.is_async:
                yield
            else:
                with time_limit(limit, lambda: self._timed_out(limit)):
                    yield
        finally:
            if last_resort is not None:
                last_resort.cancel()

    @contextmanager
    def _stoppable(self, lock: Lock) -> Iterator[None]:
        """Around a command's job of ``overlap="cancel_other"``: look every few seconds
        for a stop asked by a newer slot's start (elsewhere: a scheduler's poll does)."""
        if not self.supervised or not self.job.overlap.stops_older_run:
            yield
            return
        done = threading.Event()
        watcher = threading.Thread(
            target=self._watch_for_stop, args=(lock, done), name=f"exclusive-jobs-stop:{self.name}"
        )
        watcher.daemon = True
        watcher.start()
        try:
            yield
        finally:
            done.set()
            watcher.join()

    def _watch_for_stop(self, lock: Lock, done: threading.Event) -> None:
        try:
            while not done.wait(run_requests.STOP_POLL):
                with suppress(JobLockError):
                    asked = run_requests.find_stop(self.name, token=lock.token, using=lock.using)
                    if asked and run_requests.take(asked, by=lock.holder, using=lock.using):
                        self.cancelled_by = asked.requested_by
                        by = asked.requested_by
                        said = f"stopping {self.name}: {by} runs a newer slot"
                        self._say(line("stopping", said, job_name=self.name, token=lock.token))
                        os.kill(os.getpid(), signal.SIGTERM)  # stops it as a SIGTERM does
                        return
        finally:
            connections.close_all()  # this thread's own

    def _timed_out(self, limit: float) -> None:
        """The run passed its timeout (SIGALRM, in the main thread): stop the job."""
        if not self.job_running or self.returned:
            return
        if self.on_timeout is not None:
            self.on_timeout(limit)
        else:
            raise TimedOut(limit)

    def _abandon(self, limit: float) -> None:
        """The job did not return within the grace after TimedOut (it caught it, or is
        stuck in C code): record the run timed out, release the lock, end the process, as
        SIGKILL ends a job's process elsewhere. Runs in a timer thread. (An async job,
        which runs in a thread of its own, comes here at the timeout itself.)"""
        if not self.job_running or self.returned or self.lock is None:
            return
        try:
            if self.job.is_async:
                text = f"{self.name} passed its timeout: ending the process"
            else:
                text = f"{self.name} did not stop within {self.grace:g}s of its timeout"
                text += ": ending the process"
            self._say(
                logs.line("stopping", text, job_name=self.name, status="timed_out"), normal=False
            )
            result = self.begin(self.lock)
            self.record(result, TimedOut(limit))
            self.finish(result)
        finally:
            logging.shutdown()
            os._exit(EXIT_TIMED_OUT)

    def _may_start(self, lock: Lock) -> None:
        """Raise if the job must not start: a stop asked for while the lock was being
        taken, or a lease that ran out while the run was set up (writing the run row
        waited on a slow database): another server may hold the lock by now."""
        if self.pending_signal is not None:
            raise Interrupted(self.pending_signal)
        if not lock.held:
            raise LockLost(lock.name, lock.token, "the lease ran out before the job started")

    # --- the life of a run --------------------------------------------------------------

    def start(self) -> Lock | RunResult:
        """Take the lock and claim the run; a SKIPPED result if another has either.

        Never re-entrant: a second run of the job in this thread (a job calling itself,
        or another async call sharing Django's sync thread) skips like any other server.
        """
        if self.reason.waits_for_jitter:
            stopped = self._jitter()
            if stopped is not None:
                return stopped
        self.lock_slot = self._slot_of_lock()
        if self.lock_slot is not None:
            using = resolve_alias(self.job.using)
            self.lock_name = slot_locks.prepare(self.name, self.lock_slot, using=using)
        try:
            lock = self._take(self.job.wait)
        except LockHeld as held:
            if self.pending_signal is not None:
                return RunResult(self.name, RunStatus.INTERRUPTED, signum=self.pending_signal)
            taken = self._cancel_other(held)
            if taken is None:
                until = held.expires_at.isoformat(timespec="seconds") if held.expires_at else "?"
                return self._skipped(
                    f"held by {held.holder or '?'} until {until}", held.holder, held.expires_at
                )
            lock = taken
        acquired = time.monotonic()  # just after acquired_at on the database's clock
        keepalive = app_settings.KEEPALIVE if self.job.keepalive is None else self.job.keepalive
        if keepalive:  # from now: writing history may be slow (busy retries)
            lock.start_keepalive()
        try:
            skipped = self._claim(lock)
        except BaseException:
            lock.release()  # never leave the lock held because history failed
            raise
        if skipped is not None:
            lock.release()
            return skipped
        self.lock = lock
        self._started = time.monotonic()
        self._acquired = acquired
        try:
            slot = f" slot={self.slot.isoformat()}" if self.slot else ""
            own = f" lock={lock.name}" if lock.name != self.name else ""  # allow_all's
            said = f"acquired {self.name} token={lock.token} holder={lock.holder}{slot}{own}"
            self._say(
                line(
                    "acquired",
                    said,
                    job_name=self.name,
                    token=lock.token,
                    holder=lock.holder,
                    slot=self.slot,
                    attempt=self.attempt,
                    lock=lock.name if own else None,
                )
            )
            signals.lock_lost.connect(self._lost_receiver, sender=Lock)
            signals.job_started.send(
                sender=self.name,
                name=self.name,
                lock=lock,
                slot=self.slot,
                attempt=self.attempt,
                backfill=self.backfilled,
                in_process=self.in_process,
            )
        except BaseException as exc:
            # A failing job_started receiver (or a log handler): the run ends here,
            # recorded and released, never left 'running' under a renewed lease.
            result = self.begin(lock)
            self.record(result, exc)
            self.finish(result)
            raise
        return lock

    def _slot_of_lock(self) -> dt.datetime | None:
        """``overlap="allow_all"``: the slot whose own lock this run takes (see
        ``slot_locks.py``); None: the job's lock (every other policy, a run with no slot)."""
        if not self.job.overlap.lock_per_slot or self.job.schedule is None:
            return None
        if self.reason.asked:  # a backfill's slot; None: run now
            return self.reason.slot_asked
        return self._due_slot()

    def _due_slot(self) -> dt.datetime:
        """The slot this start is for, before its lock is taken: the scheduler's due
        slot (``not_before``), else the slot of the database's time, as the claim finds
        it (one read of the clock)."""
        self._in_force()  # the slot is the schedule's in force
        schedule = self.job.schedule
        assert schedule is not None
        if self.reason.not_before is not None:
            return schedule.latest_at_or_before(self.reason.not_before)[0]
        using = resolve_alias(self.job.using)
        return schedule.slot_at(run_statement(using, lambda: database_now(using)))

    def _take(self, wait: Any) -> Lock:
        return acquire_or_raise(
            self.lock_name,
            ttl=self.job.ttl,
            min_hold=self.job.min_hold,
            wait=wait,
            using=self.job.using,
            reentrant=False,
            stop_waiting=lambda: self.pending_signal is not None,
        )

    def _cancel_other(self, held: LockHeld) -> Lock | None:
        """``overlap="cancel_other"``: if the holder runs an older slot than this start's
        (one look at its run, by its token), ask it to stop and take the lock once it has,
        within ``cancel_wait``. None: a skip as any other (the holder serves this slot or
        a newer one, is a manual run, has not claimed its slot yet, or did not stop in
        time)."""
        schedule = self.job.schedule
        if not self.job.overlap.stops_older_run or self.cancel_wait is None or schedule is None:
            return None
        if held.token is None:
            return None
        from ..models import JobRun  # models: not before apps are ready

        using = resolve_alias(self.job.using)
        slot = self._due_slot()
        runs, token = JobRun.objects.using(using), held.token
        older = run_statement(using, lambda: runs.slot_running_under(self.name, token))
        if older is None or older >= slot:
            return None
        me = holder_name(process.host, process.pid, process.instance)
        if run_requests.ask_to_stop(self.name, token=held.token, by=me, using=using):
            said = (
                f"cancelling {self.name}: asked its run token={held.token} by {held.holder} to "
                f"stop, for slot {slot.isoformat()} (overlap=cancel_other)"
            )
            fields = {"token": held.token, "holder": held.holder, "slot": slot}
            self._say(line("cancelling", said, job_name=self.name, **fields), normal=False)
        self.stop_asked = True
        if self.cancel_wait <= 0:
            return None
        try:
            return self._take(self.cancel_wait)
        except LockHeld:
            return None

    def begin(self, lock: Lock) -> RunResult:
        """The result the job's run fills in."""
        return RunResult(self.name, RunStatus.SUCCEEDED, token=lock.token)

    def record(self, result: RunResult, exc: BaseException) -> None:
        """Set the status a job's exception means."""
        if isinstance(exc, Interrupted):
            result.status, result.signum = RunStatus.INTERRUPTED, exc.signum
        elif isinstance(exc, TimedOut):
            result.status = RunStatus.TIMED_OUT
        elif isinstance(exc, LockLost):
            result.status = RunStatus.LOST
        elif isinstance(exc, Exception):
            result.status = RunStatus.FAILED
            logger.error(
                "job %s failed",
                self.name,
                exc_info=exc,
                extra=logs.extra("finished", job_name=self.name, status="failed"),
            )
        else:  # KeyboardInterrupt, CancelledError, SystemExit
            result.status = RunStatus.INTERRUPTED
        result.exception = exc

    def finish(self, result: RunResult, *, ended: float | None = None) -> RunResult:
        """Stop keep-alive, release (min_hold honoured), record, say and signal the end.

        ``ended``: when the job ended (monotonic), if known better than "now". Once per
        run: a second call (a job that returned while its timeout ended the process)
        returns the first result.
        """
        with self._finishing:
            if self._finished is None:
                self._finished = self._finish(result, ended)
            return self._finished

    def _finish(self, result: RunResult, ended: float | None) -> RunResult:
        lock = self.lock
        assert lock is not None
        result.duration = (ended or time.monotonic()) - self._started
        lock.stop_keepalive()
        signals.lock_lost.disconnect(self._lost_receiver, sender=Lock)
        try:
            lock.release()
        except JobLockError as exc:
            logger.error(
                "could not release %s token=%s (its lease ends by itself within %s): %s",
                self.name,
                lock.token,
                lock.ttl,
                exc,
                extra=logs.extra("unrecorded", job_name=self.name, token=lock.token),
            )
        # Checked after release(): that is where a lock force-released mid-run is found.
        if lock.lost and result.status != RunStatus.INTERRUPTED:
            result.status = RunStatus.LOST
        if isinstance(result.value, ChildExit):
            result.returncode = result.value.returncode
            if result.returncode != 0 and result.status == RunStatus.SUCCEEDED:
                result.status = RunStatus.FAILED
        if isinstance(result.value, Enqueued):
            result.enqueued = result.value
        if result.enqueued is not None and result.status == RunStatus.SUCCEEDED:
            result.status = RunStatus.ENQUEUED
        if self.cancelled_by and result.status == RunStatus.INTERRUPTED:
            result.status, result.signum = RunStatus.CANCELLED, None
            result.exception = Cancelled(self.cancelled_by)
        result.attempt = self.attempt
        if self.run_id is not None and result.status in RunStatus.unsuccessful():
            result.retry_at = self.retry_at = self._retry_at(lock, ended)
        if self.run_id is not None:
            self.unwritten_end = history.record_end(
                lock,
                self.run_id,
                status=result.status,
                duration=result.duration,
                exception=result.exception,
                returncode=result.returncode,
                enqueued=result.enqueued,
                retry_at=result.retry_at,
            )
        self._say_finished(lock, result)
        self._pause_if_failing(lock, result)
        return result

    def _pause_if_failing(self, lock: Lock, result: RunResult) -> None:
        """``pause_after=N``: a slot's last attempt failed; pause the job if the N runs
        before it did too. A failure to look is one line: the run's end stands."""
        failures = self.job.pause_after
        if not failures or result.status not in RunStatus.failures() or result.retry_at:
            return
        try:
            if pausing.pause_after_failures(self.name, failures, using=lock.using):
                said = f"paused {self.name}: its last {failures} runs failed (pause_after)"
                self._say(line("paused", said, job_name=self.name), normal=False)
        except JobLockError as exc:
            logger.warning("%s: could not judge pause_after: %s", self.name, exc)

    def _retry_at(self, lock: Lock, ended: float | None) -> dt.datetime | None:
        """When this unsuccessful attempt's slot may be tried again (None: no more).

        Its end on the database's clock, followed from the acquisition on this machine's
        monotonic clock as the scheduler follows it: no query on the way out."""
        if lock.acquired_at is None:
            return None
        elapsed = (ended or time.monotonic()) - self._acquired
        end = lock.acquired_at + dt.timedelta(seconds=max(0.0, elapsed))
        return self.job.retry.retry_at(self.slot, self.attempt, end)

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

    def _claim(self, lock: Lock) -> RunResult | None:
        """Write this run's history row; a SKIPPED result if its slot already has a run.

        A stop asked for while the lock was being taken ends here, before the slot is
        used up: the result is INTERRUPTED and nothing is written.
        """
        if self.pending_signal is not None:
            return RunResult(self.name, RunStatus.INTERRUPTED, signum=self.pending_signal)
        if not lock.held:  # taking it took longer than its lease: claim nothing
            return self._skipped("the lease ran out while the lock was being taken", "", None)
        not_before = self._on_time(lock)
        looked = None
        declared = self.job
        its_slot = self.reason.serves_its_slot(declared.schedule, declared.overlap)
        if its_slot and not self._state_read:  # the operator row, read with the look
            assert declared.schedule is not None
            looked = history.look(lock, self.name, declared.schedule, not_before)
        state = self._in_force(looked)
        if self.job.overlap.stops_older_run:  # stops asked of runs before ours are moot
            run_requests.close_stops(self.name, below=lock.token, using=lock.using)
        # The start as served now: a due slot the database's clock was far from is the
        # slot of its time (see _on_time).
        start = self.reason.waited(not_before)
        claim = history.claim(
            lock, self.job, start, slot=self.lock_slot, state=state, looked=looked
        )
        self.slot, self.more_due = claim.slot, claim.more
        self.retry_at = claim.retry_at
        self._say_missed(lock, claim.missed, claim.replaced)
        self._say_skipped(claim.skipped)
        if claim.run is None:
            return self._skipped(claim.why, lock.holder, None)
        if history.is_ours(claim.run, lock):
            self.run_id, self.attempt = claim.run.pk, claim.run.attempt
            return None
        slot = self.slot.isoformat() if self.slot else "?"
        run = claim.run
        return self._skipped(
            f"slot {slot} already run by {run.holder} ({run.status})", run.holder, None
        )

    def _in_force(self, looked: history.Look | None = None) -> JobState | None:
        """Read what operators decided about the job (once per run: a pause, an
        override), unless it was read with the look at the history (``looked``), and
        run the job as they override it (see ``overrides.py``)."""
        if not self._state_read:
            if looked is not None:
                self._state = looked.state
            else:
                self._state = history.job_state(self.name, using=resolve_alias(self.job.using))
            self.job = overrides.in_force(self.job, self._state)
            self._state_read = True
        return self._state

    def _jitter(self) -> RunResult | None:
        """A cron line fires at the slot; the slot starts later by its jitter: wait for
        that on the database's clock, then serve the slot as the scheduler does (from
        ``not_before``). A line that fires after the start goes at once. A stop while
        waiting ends the run before anything is taken: an INTERRUPTED result."""
        if self.job.schedule is None or not self.job.jitter:
            return None
        self._in_force()  # the slot to wait for is the schedule's in force
        schedule = self.job.schedule
        assert schedule is not None
        clock = DatabaseClock(resolve_alias(self.job.using))
        run_statement(clock.using, clock.sync)
        slot = schedule.slot_at(clock.now())
        start = self.job.start_of(slot)
        if clock.seconds_until(start) <= 0:
            return None
        said = (
            f"waiting for {self.name}: slot={slot.isoformat()} starts at "
            f"{start.isoformat(timespec='milliseconds')} (jitter)"
        )
        self._say(line("waiting", said, job_name=self.name, slot=slot, until=start))
        while self.pending_signal is None and (left := clock.seconds_until(start)) > 0:
            time.sleep(min(left, JITTER_TICK))
        if self.pending_signal is not None:
            return RunResult(self.name, RunStatus.INTERRUPTED, signum=self.pending_signal)
        self.reason = self.reason.waited(start)
        return None

    def _on_time(self, lock: Lock) -> dt.datetime | None:
        """The scheduler's due slot (``not_before``), once the database's clock has
        reached it: a lock taken a little early waits the difference. Taken far earlier
        (the scheduler's estimate of the clock is off, or the job's database has a clock
        of its own): None, and the run serves the slot of the database's time, as a cron
        line would (``early`` tells the scheduler to read the clock again)."""
        not_before = self.reason.not_before
        if not_before is None or lock.acquired_at is None:
            return not_before
        early = (not_before - lock.acquired_at).total_seconds()
        if early > EARLY_WAIT_LIMIT:
            self.early = True
            return None
        if early > 0:
            time.sleep(early)
        return not_before

    def _say_missed(
        self, lock: Lock, missed: list[dt.datetime], replaced: Replaced | None = None
    ) -> None:
        """One line for the slots this start found missed (one more for those of a
        schedule an operator replaced), and a signal for each slot recorded on its own
        (not for those of a missed-range record)."""
        old = replaced.slots if replaced is not None else []
        new = missed[len(old) :]
        if replaced is not None and replaced.total:
            oldest = replaced.first or old[0]
            first, last = oldest.isoformat(), old[-1].isoformat()
            span = first if replaced.total == 1 else f"{first} .. {last}"
            changed = replaced.changed.isoformat(timespec="seconds")
            said = (
                f"missed {self.name}: {replaced.how_many()} slot(s) of its replaced schedule "
                f"({replaced.schedule}) no server ran, {span}, before its schedule changed at "
                f"{changed}; recorded"
            )
            if replaced.earlier:
                said += f" (the newest {len(old)} one by one, the others as one range)"
            self._say(line("missed", said, job_name=self.name, slots=old), normal=False)
        if new:
            first, last = new[0].isoformat(), new[-1].isoformat()
            span = first if len(new) == 1 else f"{first} .. {last}"
            said = f"missed {self.name}: {len(new)} slot(s) no server ran, {span}; recorded"
            self._say(line("missed", said, job_name=self.name, slots=new), normal=False)
        for slot in missed:
            # Robust: the rows are written; a receiver that raises must not undo the run.
            answers = signals.slot_missed.send_robust(
                sender=self.name, name=self.name, slot=slot, noticed_by=lock.holder
            )
            for receiver, answer in answers:
                if isinstance(answer, Exception):
                    logger.error(
                        "slot_missed receiver %r raised",
                        receiver,
                        exc_info=answer,
                        extra=logs.extra("missed", job_name=self.name, slot=slot),
                    )

    def _say_skipped(self, skipped: list[dt.datetime]) -> None:
        """One line for the slots that came during the previous run and were skipped."""
        if skipped:
            first, last = skipped[0].isoformat(), skipped[-1].isoformat()
            span = first if len(skipped) == 1 else f"{first} .. {last}"
            said = (
                f"skipped {self.name}: {len(skipped)} slot(s) came while its previous run "
                f"still ran (overlap={self.job.overlap}), {span}; recorded"
            )
            self._say(line("overlapped", said, job_name=self.name, slots=skipped))

    def _skipped(self, why: str, holder: str, until: dt.datetime | None) -> RunResult:
        fields = {"holder": holder or None, "until": until, "slot": self.slot}
        said = f"skipped {self.name}: {logs.given(why)}"  # a pause's reason is in ``why``
        self._say(line("skipped", said, job_name=self.name, **fields))
        extra = {"slot": self.slot} if self.slot is not None else {}
        signals.job_skipped.send(
            sender=self.name, name=self.name, holder=holder, expires_at=until, **extra
        )
        return RunResult(
            self.name, RunStatus.SKIPPED, holder=holder, held_until=until, retry_at=self.retry_at
        )

    def _say(self, said: logs.Line, *, normal: bool = True) -> None:
        """One line per decision: to the log, and to ``report`` (the command's output)."""
        for key, value in self.context.items():
            said.fields.setdefault(key, value)
        logs.say(self.report, said, normal=normal)

    def _say_finished(self, lock: Lock, result: RunResult) -> None:
        detail = ""
        if result.returncode not in (None, 0):
            detail = f" exit={result.returncode}"
        if result.enqueued is not None:
            detail += f" task={result.enqueued.result_id} backend={result.enqueued.backend}"
        if result.exception is not None:
            exc = result.exception
            message = getattr(exc, "message", None) or exc
            detail += f" error={history.error_type(exc)}: {logs.given(message)}"
        if self.slot is not None and self.job.retries and not self.backfilled:
            # "attempt 1 of 3 failed; retry at T" (a backfill's attempts are not counted)
            ended = self.job.retry.describe(result.attempt, result.status.value, result.retry_at)
            detail += f" ({ended})"
        said = (
            f"finished {self.name} status={result.status.value} "
            f"duration={result.duration:.3f}s token={lock.token}{detail}"
        )
        fields = {
            "status": result.status.value,
            "duration": result.duration,
            "token": lock.token,
            "slot": self.slot,
            "attempt": result.attempt,
            "retry_at": result.retry_at,
            "error": history.error_type(result.exception) if result.exception else None,
        }
        self._say(
            line("finished", said, job_name=self.name, **fields),
            normal=result.status in (RunStatus.SUCCEEDED, RunStatus.ENQUEUED),
        )
        signals.job_finished.send(
            sender=self.name,
            name=self.name,
            lock=lock,
            status=result.status.value,
            duration=result.duration,
            exception=result.exception,
            attempt=result.attempt,
            final=result.final,
            slot=self.slot,
            backfill=self.backfilled,
        )

    def _lost_receiver(self, sender: Any, lock: Lock, reason: str, **kwargs: Any) -> None:
        if lock is self.lock and self.on_lost is not None:
            self.on_lost(lock)


LEASE_ENDED = (
    "no renewal reached the job's process before its lease could end (the scheduler was "
    "frozen or could not reach the database): the job was stopped before the lease's end"
)


def _stopped_while_running(child: JobProcess | JobThread, outcome: Outcome) -> bool:
    """The scheduler stopped the run before its job ended (a stop that comes after the
    job returned, a shutdown racing its end, interrupted nothing)."""
    stopped_at = getattr(child, "stopped_at", None)
    if child.stopped_by is None or stopped_at is None:
        return False
    return not outcome.finished or outcome.ended is None or outcome.ended > stopped_at


def describe_exit(returncode: int) -> str:
    """Why a job's process ended before its function returned."""
    if returncode < 0:
        with suppress(ValueError):
            return f"The job's process was killed by {signal.Signals(-returncode).name}."
        return f"The job's process was killed by signal {-returncode}."
    return f"The job's process exited with code {returncode} before the job returned."


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

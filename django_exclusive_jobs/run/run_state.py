"""What a run runs with, and what has happened to it so far.

The first floor of :class:`~.runner.Run`: the job and the settings it was built with,
and the facts its start, its job and its end fill in (each method of the floors above
reads and writes these). Nothing here does anything.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..lock.lock import Lock
from .ending import RunResult
from .long_runs import LongRunWatch
from .registry import Job
from .run_info import RunInfo
from .start import Start

if TYPE_CHECKING:
    from ..models import JobState, RunRequest


class RunState:
    """One run's settings (fixed when it is built) and its progress (see :class:`Run`)."""

    # What happened so far: each starts so, and is set once the run gets there.
    stop_asked = False  # this start asked the holder to stop (cancel_other)
    cancelled_by = ""  # who asked this run to stop (cancel_other)
    # The job is running (``in_job`` says whether an exception may be raised in it: no
    # longer once a first signal has been), and has returned.
    job_running = False
    returned = False
    in_job = False
    # The job executes in this thread (call, acall), not in a process of its own
    # (start_child): job_started says so to receivers (a tracer makes its span current).
    in_process = False
    lock_slot: dt.datetime | None = None  # under overlap="allow_all", its slot's lock's
    lock: Lock | None = None
    run_id: int | None = None
    slot: dt.datetime | None = None  # the slot it serves (None: a manual run)
    more_due = False  # catch_up="all": more missed slots to run after this one
    attempt = 1  # of the slot it serves
    retry_at: dt.datetime | None = None  # see RunResult.retry_at
    early = False  # the lock came far earlier than not_before (see _on_time)
    pending_signal: int | None = None
    # Writes this run's end later, when the database could not be reached at its end.
    unwritten_end: Callable[[], None] | None = None
    _started = _acquired = 0.0
    _finished: RunResult | None = None
    _state: JobState | None = None  # what operators decided, read by _in_force
    _state_read = False
    _long: LongRunWatch | None = None  # its warn_after's watch, while it runs

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
        # What :meth:`call` runs (default: the job's function), and how a SIGTERM or
        # SIGINT stops it while it runs (default: Interrupted raised in it; a program is
        # sent the signal instead, see ChildProgram.on_signal).
        self.target = target
        self.on_stop = on_stop
        self.lock_name = job.name  # under overlap="allow_all", its slot's (see start)
        self.group_locks: list[Lock] = []  # its concurrency groups', held with its own
        self._finishing = threading.Lock()

    @property
    def job_slot(self) -> dt.datetime | None:
        """What a job function that takes ``slot`` is given: the slot this run serves; on
        a manual run of a scheduled job, the slot its schedule would serve now."""
        if self.slot is not None or self.job.schedule is None or self.lock is None:
            return self.slot
        acquired = self.lock.acquired_at
        return self.job.schedule.slot_at(acquired) if acquired is not None else None

    def info(self, lock: Lock) -> RunInfo:
        """What its job is told of this run (``run=``, the environment of a program): a
        value, fixed once the run holds its lock and its slot."""
        slot, acquired = self.job_slot, lock.acquired_at
        limit = self.job.time_limit if self.supervised or not self.in_process else None
        return RunInfo(
            name=self.name,
            slot=slot,
            attempt=self.attempt,
            token=lock.token,
            why=self._why(acquired),
            requested_by=self.reason.by or None,
            lease_until=lock.expires_at,
            deadline=None
            if limit is None or acquired is None
            else acquired + dt.timedelta(seconds=limit),
        )

    def _why(self, acquired: dt.datetime | None) -> str:
        """Why it runs, in the job's words (``RunInfo.why``)."""
        if self.backfilled:
            return "backfill"
        if self.reason.asked:
            return "run_now"
        if self.attempt > 1:
            return "retry"
        if self.reason.reason == "call":
            return "call"
        schedule, slot = self.job.schedule, self.slot
        if schedule and slot and acquired and schedule.next_after(slot) <= acquired:
            return "catch_up"  # a later slot had begun when it started
        return "scheduled"  # its slot, or a cron line of a job without a schedule

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

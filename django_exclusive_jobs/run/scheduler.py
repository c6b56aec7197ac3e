"""The scheduler: ``manage.py exclusive_scheduler`` on every server, each slot run once.

Every server runs the same scheduler. For each job with a schedule it sleeps until the
job's next slot on the database's clock, then starts the job as a cron line would (a
:class:`Run`: take the lock, claim the slot, record the run). One server wins the
slot and the others skip it. The winner runs the job in a child process
(:class:`JobProcess`), or for ``in_process=True`` in a thread (:class:`JobThread`), and
keeps the lease alive until it ends.

One thread decides and writes the history, on one connection; it waits on the next
slot, the children and the signals at once, so an idle scheduler sends nothing but its
heartbeat and a clock check.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import time
from collections.abc import Callable
from contextlib import suppress
from multiprocessing.connection import wait
from typing import Any, TypeVar

from .. import logs
from ..lock.acquire import prepare_locks
from ..lock.clock import DatabaseClock
from ..lock.errors import JobLockError, LockDatabaseError
from ..lock.lock import process
from ..lock.retry import run_statement
from ..logs import Line, line
from ..models import JobRun, RunRequest
from ..models import Scheduler as SchedulerRow
from . import control, overrides, spread, when
from .catchup import CANCEL_WAIT
from .heartbeat import Heartbeat
from .outage import Outage
from .process import Outcome, shut_down, warm_up
from .registry import Job
from .runner import Run, RunResult
from .running import Active, Running
from .serving import ServedJobs
from .shutdown import stop_on_signals
from .start import Start

logger = logging.getLogger("django_exclusive_jobs")
_T = TypeVar("_T")

CLOCK_CHECK = 60.0  # seconds between two reads of the database's clock
REQUEST_POLL = 5.0  # seconds between two looks for runs asked for now (one query)
CANCEL_LOOK = 1.0  # seconds between two looks for a lock whose run was asked to stop


class Scheduler:
    """Runs ``jobs`` at each of their slots, in cooperation with every other scheduler.

    :meth:`run` returns when :meth:`stop` is called (SIGTERM, SIGINT) and the running
    jobs have ended, or ``grace`` seconds later, after stopping them.
    """

    def __init__(
        self,
        jobs: list[Job],
        *,
        using: str,
        on_request: list[Job] | None = None,
        max_concurrent: int = 10,
        grace: float = 20.0,
        report: Callable[[str, bool], None] | None = None,
        max_runs: int | None = None,
        run_for: float | None = None,
    ) -> None:
        # Each job as declared, and as it runs (with its operators' override), or
        # misconfigured; and the jobs whose "run now" requests it serves (serving.py).
        self.served = ServedJobs(jobs, on_request, self.say)
        # Switches that let a test (or a one-off) drive it to completion: stop once
        # ``max_runs`` runs started here have ended, or after ``run_for`` seconds.
        self.max_runs = max_runs
        self.run_for = run_for
        self.ended_runs = 0
        self.deadline = float("inf")  # monotonic
        self.next_poll = 0.0  # monotonic
        self.using = using
        self.max_concurrent = max_concurrent
        self.grace = grace
        self.report = report
        self.clock = DatabaseClock(using)
        # Every job it serves, with a schedule or only on request ("run now").
        self.heartbeat = Heartbeat(using, self.served.names)
        self.name = f"{process.host}:{process.pid}"  # as its heartbeat row names it
        self.outage = Outage(self.say)
        self.due: dict[str, dt.datetime] = {}  # each job's next start, database time
        # Work spread: the slots this one is not the first choice for (spread.py).
        self.handoffs = spread.Handoffs()
        self.running = Running()  # the runs started here (running.py)
        self.stopping = False
        self.began = False  # reached the database once: its heartbeat row exists
        self.stop_signal: int | None = None
        self.next_beat = 0.0  # monotonic
        self.clock_doubtful = False  # a start found the database's clock behind our estimate
        self.unwritten: list[Callable[[], None]] = []  # run ends to write once it answers
        self.started_runs = 0
        self.stops = 0  # SIGTERM/SIGINT received
        self.starting: Run | None = None  # a start under way
        # In-process runs still going when it stopped: their threads end with the
        # process, which the command ends at once (see exclusive_scheduler).
        self.left_running: list[str] = []
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)

    # --- the loop -----------------------------------------------------------------------

    def run(self) -> int:
        """Serve the jobs until stopped; 0 after a clean stop."""
        # SIGTERM and SIGINT only call stop(): nothing is raised inside a statement.
        try:
            with stop_on_signals(self.stop):
                self._begin()
                if self.run_for is not None:
                    self.deadline = time.monotonic() + self.run_for
                while not self.stopping:
                    self._reap()
                    if self._done():
                        self.stop()
                        break
                    self._keep_time()
                    self._start_requested()
                    self._start_due()
                    self._sleep()
                self._shut_down()
        finally:
            os.close(self._wake_read)
            os.close(self._wake_write)
        return 0

    def _done(self) -> bool:
        enough = self.max_runs is not None and self.ended_runs >= self.max_runs
        return enough or time.monotonic() >= self.deadline

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Take no new slot; let running jobs end within the grace (a second stop: now).

        Called from a signal handler: it only sets flags and wakes the loop, which does
        the stopping (nothing here may take a lock the interrupted code holds).
        """
        self.stops += 1
        self.stopping, self.stop_signal = True, signum
        if self.starting is not None:  # a start under way claims nothing more
            self.starting.pending_signal = signum
        with suppress(OSError):
            os.write(self._wake_write, b"x")

    def _begin(self) -> None:
        """Read the clock and each job's first due slot, waiting out a database outage."""
        while not self.stopping:
            try:
                run_statement(self.using, self.clock.sync)
                self._read_overrides()
                run_statement(self.using, self._first_due)
                prepare_locks(self.served.jobs, using=self.using)  # the first take logs no error
                self.heartbeat.beat(self.free)
                self.handoffs.peers = spread.peers(self.using)
            except LockDatabaseError as exc:
                self._pause(self.outage.failed(exc))
                continue
            self.outage.ended()
            self.began = True
            self.next_beat = time.monotonic() + _beat_seconds()
            served = [*self.served.jobs.values(), *self.served.on_request.values()]
            if not all(job.runs_in_thread for job in served):
                warm_up()  # else started on first use (an override's timeout, say)
            said = (
                f"scheduler started: {len(self.served.jobs)} job(s), max {self.max_concurrent} at "
                f"once; the database's clock is {self.clock.offset:+.3f}s from this server's"
            )
            self.say(line("scheduler", said, status="started"))
            return

    def _first_due(self, names: list[str] | None = None) -> None:
        """Each job's first due time (``when.first_due``), from its newest run: one
        query. ``names``: only these (their schedule was overridden), else every job."""
        chosen = list(self.served.jobs) if names is None else names
        names = [name for name in chosen if name not in self.served.misconfigured]
        for name in names:
            self.handoffs.handed.pop(name, None)
        latest = {run.name: run for run in JobRun.objects.using(self.using).newest_attempts(names)}
        now = self.clock.now()
        for name in names:
            job = self.served.jobs[name]
            assert job.schedule is not None
            due = self._computed(job, when.first_due, job, now, latest.get(name))
            if due is not None:
                self.due[name] = due

    def _keep_time(self) -> None:
        """The heartbeat, and a fresh read of the database's clock now and then (during
        an outage: both, every second, until the database answers)."""
        if time.monotonic() < self.next_beat:
            return
        try:
            stale = time.monotonic() - self.clock.synced_at > CLOCK_CHECK
            if stale or self.outage.ongoing or self.clock_doubtful:
                run_statement(self.using, self.clock.sync)
                self.clock_doubtful = False
            self.heartbeat.beat(self.free)
            self.handoffs.peers = spread.peers(self.using)
            self._write_unwritten_ends()
        except LockDatabaseError as exc:
            self._database_down(exc)
            return
        self.outage.ended()
        self.next_beat = time.monotonic() + _beat_seconds()

    def _database_down(self, exc: BaseException) -> None:
        """Start nothing until a probe (``_keep_time``) gets through."""
        self.next_beat = time.monotonic() + self.outage.failed(exc)

    def _write_unwritten_ends(self) -> None:
        """Runs whose end could not be written (the database was down): written now, so
        no later holder takes them for runs whose server crashed."""
        while self.unwritten:
            self.unwritten[0]()  # raises LockDatabaseError while still down
            self.unwritten.pop(0)

    def _start_due(self) -> None:
        """Start the jobs due now, in this scheduler's own order; a slot this one is not
        the first choice for waits its handoff first (spread.py)."""
        if self.outage.ongoing:
            return
        now = self.clock.now()
        me = process.instance
        looks = self._handoffs(now)
        waited: dict[str, dt.datetime] = {}  # handed-off jobs whose wait is over
        # Only those due by now are put in order (a hash each): the loop comes back here
        # after every run that ends, and most of a scheduler's jobs wait for later.
        ready = [(name, due) for name, due in self.due.items() if due <= now]
        for name, due in sorted(ready, key=lambda i: (i[1], spread.turn(me, *i))):
            if self.stopping:
                break
            if name in self.running:
                self._supersede(self.running[name], due)
                continue  # it starts again once its run ends
            if len(self.running) >= self.max_concurrent:
                break  # stays due: started when a run ends, unless another server has it
            if name in self.handoffs.handed:
                waited[name] = self.handoffs.handed.pop(name)
                continue
            job = self.served.jobs[name]
            if name in looks:
                look = looks[name]
                if look is None:  # not among its slot's first three choices
                    self._next(job, None, self._following(job, due))
                else:
                    self.handoffs.handed[name], self.due[name] = due, look
                continue
            self._start(job, due)
            now = self.clock.now()
        if waited:
            self._take_over(waited)

    def _handoffs(self, now: dt.datetime) -> dict[str, dt.datetime | None]:
        """When to look again at each slot due by ``now`` that this scheduler is not the
        first choice for (spread.py; None: never, it is not among the first three), and,
        in ``self.handoffs.heads``, the slot whose run shows that its first choice is at
        work. A start that is not a slot's (a catch-up, a retry, a recheck) is not
        handed off."""
        if not self.handoffs.shared:
            return {}
        bursts: dict[dt.datetime, dict[str, dt.datetime]] = {}
        running: dict[dt.datetime, dict[str, dt.datetime]] = {}  # due here, running here
        for name, due in list(self.due.items()):
            job = self.served.jobs[name]
            if due > now or name in self.handoffs.handed or job.schedule is None:
                continue
            if self.handoffs.first_for.get(name) == due:  # placed already (it waits for room)
                continue
            found = self._computed(job, when.slot_and_start, job, due)
            if found is None:
                continue
            slot, start = found
            if start == due:
                (running if name in self.running else bursts).setdefault(due, {})[name] = slot
        return self.handoffs.later(process.instance, self.served.jobs, bursts, running)

    def _take_over(self, waited: dict[str, dt.datetime]) -> None:
        """One query for the slots this scheduler waited for and the heads of their first
        choices' shares; then each slot's verdict (``Handoffs.verdict``): start it, look
        again later, or leave it to the scheduler at work."""
        slots = {}
        for name, due in list(waited.items()):
            job = self.served.jobs[name]
            found = self._computed(job, when.slot_and_start, job, due)
            if found is None:
                del waited[name]
                continue
            slots[name] = found[0]
        heads = self.handoffs.take_heads(slots)
        looked = {head: slot for head, slot, _ in heads.values()}
        try:
            claimed = spread.claimed({**looked, **slots}, using=self.using)
        except LockDatabaseError as exc:
            self.handoffs.put_back(waited, heads)  # looked at again once it answers
            self._database_down(exc)
            return
        for name, due in waited.items():
            job = self.served.jobs[name]
            full = self.stopping or len(self.running) >= self.max_concurrent
            verdict, at = self.handoffs.verdict(
                name, due, heads[name], slots[name], claimed, rechecks=job.rechecks, full=full
            )
            if verdict == spread.START:
                self._start(job, due)
            elif verdict == spread.LEAVE:
                self._next(job, None, self._following(job, due))
            elif at is not None:
                self.due[name] = at

    def _sleep(self) -> None:
        """Wait for the next due slot, a child's end or report, a signal, or a beat."""
        if self.stopping:
            return
        waiting = [due for name, due in self.due.items() if self._waits_for(name, due)]
        full = len(self.running) >= self.max_concurrent
        next_poll = self.next_poll if self._polls_requests else float("inf")
        timeout = min(self.next_beat, next_poll, self.deadline) - time.monotonic()
        if waiting and not full and not self.outage.ongoing:
            timeout = min(timeout, self.clock.seconds_until(min(waiting)) + 0.001)
        self._wait(max(0.0, timeout))

    def _waits_for(self, name: str, due: dt.datetime) -> bool:
        """Whether the loop wakes at ``name``'s due time: it is not running here, or it
        is and that coming time may stop its run (cancel_other)."""
        active = self.running.get(name)
        if active is None:
            return True
        cancels = active.job.overlap.stops_older_run and not active.run.cancelled_by
        return cancels and due > self.clock.now()

    def _wait(self, timeout: float) -> None:
        if self._wake_read in wait([self._wake_read, *self.running.waitables()], timeout):
            with suppress(BlockingIOError, OSError):
                os.read(self._wake_read, 64)

    def _pause(self, seconds: float) -> None:
        """Sleep ``seconds`` unless stopped first."""
        self._wait(seconds)

    @property
    def free(self) -> int:
        """How many more runs it could start now (``--max-concurrent`` less its running)."""
        return max(0, self.max_concurrent - len(self.running))

    @property
    def _polls_requests(self) -> bool:
        """Whether it looks for runs asked for now: it serves some, and the database is
        not down (then only the outage's probe runs)."""
        return bool(self.served.on_request) and not self.outage.ongoing

    def _start_requested(self) -> None:
        """Every few seconds, one query for runs asked for now and backfilled slots
        (``control.pending``: a job's slots oldest first); start those it can, one per
        job at a time. A request with a slot runs as a backfill of that slot, or is used
        up without a run if the slot has succeeded meanwhile (``history.claim``)."""
        if self.stopping or not self._polls_requests or time.monotonic() < self.next_poll:
            return
        self.next_poll = time.monotonic() + REQUEST_POLL
        try:
            self._read_overrides()
            requests = control.pending(sorted(self.served.on_request), using=self.using)
        except LockDatabaseError as exc:
            self._database_down(exc)
            return
        for request in requests:  # stops first: a full scheduler still honours them
            if request.stop_token is not None:
                self._stop_asked(request)
        for request in requests:
            if request.stop_token is not None:
                continue
            if len(self.running) >= self.max_concurrent:
                return
            if request.name in self.served.misconfigured:
                continue  # waits until its row is put right
            if request.name not in self.running:
                self._start(self.served.on_request[request.name], self.clock.now(), request=request)

    def _read_overrides(self) -> None:
        """Follow each job's operators' override (one query, at each poll); a job whose
        schedule changed, or that was put right, is due again from its schedule."""
        states = overrides.read(self.served.names, using=self.using)
        moved = self.served.follow(states, self.clock.now(), self._misconfigure)
        if moved and self.began:
            self._first_due(moved)

    def _misconfigure(self, name: str, reason: str) -> None:
        """``name``'s row cannot be used (or its schedule computed): its problem only.
        It is not due until its row changes (:meth:`_read_overrides`)."""
        self.due.pop(name, None)
        self.handoffs.forget(name)
        self.served.misconfigure(name, reason)

    def _computed(self, job: Job, compute: Callable[..., _T], *args: Any) -> _T | None:
        """``compute(*args)``, a computation of ``job``'s schedule; None if it fails (any
        exception: a row that an older version wrote may hold what no check foresaw),
        which makes the job misconfigured. Only such computations go through here, not
        the scheduler's own work: a bug of the scheduler still shows."""
        try:
            return compute(*args)
        except Exception as exc:
            self._misconfigure(job.name, overrides.uncomputable(job.name, exc).reason)
            return None

    def _supersede(self, active: Active, due: dt.datetime) -> None:
        """``overlap="cancel_other"``: a newer slot of a job running here is due: its
        run is stopped (``Running.supersede``)."""
        job, schedule = active.job, active.job.schedule
        if not job.overlap.stops_older_run or schedule is None or active.run.cancelled_by:
            return
        slot = self._computed(job, lambda: schedule.latest_at_or_before(due)[0])
        if slot is not None:
            self.running.supersede(active, slot, self.say)

    def _stop_asked(self, request: RunRequest) -> None:
        """A newer slot's start asks a run to stop (``Running.stop_asked``)."""
        try:
            self.running.stop_asked(request, self.using, self.say)
        except LockDatabaseError as exc:
            self._database_down(exc)

    # --- one start ----------------------------------------------------------------------

    def _start(self, job: Job, due: dt.datetime, request: RunRequest | None = None) -> None:
        """Start ``job`` as a cron line would at ``due``: win the slot, or skip it.

        With ``request``: the run asked for now, outside the schedule (due unchanged).
        Whatever goes wrong (a signal receiver that raises, say) stays with this start.
        """
        try:
            self._start_one(job, due, request)
        except overrides.Misconfigured as exc:  # its row changed since the poll: its own
            self._misconfigure(job.name, exc.reason)
        except Exception as exc:
            said = f"{job.name} not started: {type(exc).__name__}: {exc}"
            self.say(line("not_started", said, job_name=job.name, error=type(exc).__name__), False)
            self._next(job, request, self._following(job, max(self.clock.now(), due)))
        finally:
            self.starting = None

    def _start_one(self, job: Job, due: dt.datetime, request: RunRequest | None) -> None:
        run = Run(
            # Never wait for a held lock: the loop must keep every other job's slots. The
            # next try is the next slot (or the lease's end, with retries). As declared:
            # the run applies the override in force when it claims its slot.
            self.served.declared.get(job.name, job).but(wait=0),
            report=self.report,
            on_lost=self.running.lost,
            # Never serve a slot before its time on the database's clock (ours is an
            # estimate); a request (run now, a backfill's slot) is served at once.
            start=Start.slot(due) if request is None else Start.run_now(request=request),
            # cancel_other: ask an older slot's run to stop, but wait for it here.
            cancel_wait=0.0 if request is None else None,
            context={"scheduler": self.name},
        )
        self.starting = run
        try:
            started = run.start()
        except LockDatabaseError as exc:
            self._database_down(exc)  # still due: started once the database answers
            return
        except overrides.Misconfigured:
            raise  # see _start
        except JobLockError as exc:
            said = f"{job.name} not started: {exc}"
            self.say(line("not_started", said, job_name=job.name, error=type(exc).__name__), False)
            self._next(job, request, self._following(job, due))
            return
        self.outage.ended()
        now = self.clock.now()
        if run.early:  # our estimate of the database's clock was off: read it again
            self.clock_doubtful, self.next_beat = True, 0.0
        if isinstance(started, RunResult):  # skipped, or stopped before the claim
            again = self._after_skip(job, started, max(now, due)) if request is None else None
            if again is not None:
                self.due[job.name] = again
            if run.stop_asked and job.schedule is not None:
                # cancel_other: the older run was asked to stop; look again in a moment.
                slot = job.schedule.latest_at_or_before(due)[0]
                if (now - job.start_of(slot)).total_seconds() < CANCEL_WAIT:
                    self.due[job.name] = now + dt.timedelta(seconds=CANCEL_LOOK)
            return
        child = run.start_child(started, grace=self.grace)
        if isinstance(child, RunResult):  # the lease ran out, or no process could start
            self._keep_unwritten(run)
            self._next(job, request, self._following(job, max(now, due)))
            return
        self.running[started.name] = Active(job, run, child)  # allow_all: a slot's lock
        if started.lost:  # lost before it was registered: _lost found nothing to stop
            self.running.lost(started)
        self.started_runs += 1
        slot = run.slot or due
        # catch_up="all" with more missed slots: the next one as soon as this one ends.
        self._next(job, request, slot if run.more_due else self._following(job, slot))

    def _next(self, job: Job, request: RunRequest | None, when: dt.datetime | None) -> None:
        """Set when ``job`` is due next (a run asked for now leaves it as it was)."""
        if request is None and when is not None and job.name in self.due:
            self.due[job.name] = when

    def _following(self, job: Job, moment: dt.datetime) -> dt.datetime | None:
        """When the next slot after ``moment`` starts (``when.following``); None without
        a schedule, or if it cannot be computed (the job is then misconfigured)."""
        return self._computed(job, when.following, job, moment)

    def _after_skip(self, job: Job, result: RunResult, now: dt.datetime) -> dt.datetime | None:
        """When to try again after a skip (``when.after_skip``); None if ``job``'s
        schedule cannot be computed (it is then misconfigured: not due)."""
        return self._computed(job, when.after_skip, job, result.retry_at, result.held_until, now)

    def _reap(self) -> None:
        """Finish the runs whose child has exited."""
        for name, active, outcome in self.running.ended():
            self.ended_runs += 1
            try:
                self._finish(active, outcome)
            except Exception as exc:  # a job_finished receiver that raises, say
                said = f"{name}: finishing its run failed: {exc}"
                fields = {"job_name": active.job.name, "error": type(exc).__name__}
                self.say(line("unrecorded", said, **fields), False)

    def _finish(self, active: Active, outcome: Outcome) -> None:
        """Release, record and report a run whose child exited, as run_exclusive would."""
        try:
            active.run.end_child(active.process, outcome)
        finally:  # even if a job_finished receiver raised
            self._keep_unwritten(active.run)
            if active.run.request is not None:
                # The job's next waiting request (a backfill's next slot) starts at once,
                # not at the next poll.
                self.next_poll = 0.0
            if active.run.retry_at is not None:
                # The slot's next attempt: here too, whichever server comes first.
                self._next(active.job, active.run.request, active.run.retry_at)

    def _keep_unwritten(self, run: Run) -> None:
        """A run whose end could not be written: write it once the database answers."""
        if run.unwritten_end is not None:
            self.unwritten.append(run.unwritten_end)
            self.next_beat = 0.0  # try at once; an outage makes it a probe each second

    def _shut_down(self) -> None:
        """Let running jobs end within the grace, then stop them; mark this scheduler gone."""
        if self.running:
            said = (
                f"stopping: waiting up to {self.grace:g}s for {len(self.running)} running "
                f"job(s): {', '.join(sorted(self.running))}"
            )
            self.say(line("scheduler", said, status="stopping"), False)
        deadline = time.monotonic() + self.grace
        while self.running and time.monotonic() < deadline and self.stops < 2:
            self._wait(min(1.0, deadline - time.monotonic()))
            self._reap()
            self._keep_time()  # still alive while its jobs end
        self.running.stop_all()
        while self.running.stoppable:
            self._wait(0.2)
            self._reap()
        try:
            self._write_unwritten_ends()
        except LockDatabaseError as exc:
            said = f"could not record the end of {len(self.unwritten)} run(s): {exc}"
            self.say(line("unrecorded", said, error=type(exc).__name__), False)
        try:
            if self.began:  # a scheduler that never reached the database has no row
                self.heartbeat.stopped()
        except LockDatabaseError as exc:
            said = f"could not mark this scheduler stopped: {exc}"
            self.say(line("scheduler", said, status="stopped", error=type(exc).__name__), False)
        shut_down()
        self._reap()  # an in-process run that has just ended is recorded, not left
        if self.running:  # in-process runs: nothing can stop them (see thread.py)
            self.left_running = sorted(self.running)
            said = (
                f"leaving {len(self.running)} in-process run(s) to their lease: "
                f"{', '.join(self.left_running)} (not released; the server that takes "
                "the lock over records the run)"
            )
            self.say(line("scheduler", said, status="stopping"), False)
        self.say(line("scheduler", "scheduler stopped", status="stopped"))

    def say(self, said: Line, normal: bool = True) -> None:
        """One line: to the log, and to ``report`` (the command's output), naming this
        scheduler."""
        said.fields.setdefault("scheduler", self.name)
        logs.say(self.report, said, normal=normal)


def _beat_seconds() -> float:
    return SchedulerRow.BEAT.total_seconds()

"""The scheduler's state and upkeep: what it serves and runs, when each job is due, its
heartbeat and clock, the database's outages, and the wait between two turns of its loop.
``starts.py`` starts the jobs on it, and ``scheduler.py`` is the loop."""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from collections.abc import Callable
from contextlib import suppress
from multiprocessing.connection import wait
from typing import Any, TypeVar

from .. import logs
from ..lock.clock import DatabaseClock
from ..lock.errors import LockDatabaseError
from ..lock.lock import process
from ..lock.retry import run_statement
from ..logs import Line
from ..models import RunRequest
from ..models import Scheduler as SchedulerRow
from . import overrides, spread, when
from .heartbeat import Heartbeat, Pulse
from .listening import Listener
from .outage import Outage
from .registry import Job
from .runner import Run, RunResult
from .running import Running
from .serving import ServedJobs

logger = logging.getLogger("django_exclusive_jobs")
_T = TypeVar("_T")

CLOCK_CHECK = 60.0  # seconds between two reads of the database's clock


class Upkeep:
    """A scheduler's state, and what keeps it: the floor :class:`Scheduler` stands on."""

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
        skip_schedules: bool = False,
    ) -> None:
        # Each job as declared, and as it runs (with its operators' override), or
        # misconfigured; and the jobs whose "run now" requests it serves (serving.py).
        self.skip_schedules = skip_schedules
        self.served = self._served(jobs, on_request)
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
        listed = [] if skip_schedules else self.served.names
        self.heartbeat = Heartbeat(using, listed, skips_schedules=skip_schedules)
        self.listener = Listener(using)
        # Where it polls: the overrides' text its last look read, and a beat's look not
        # yet used for the requests (scheduler.py).
        self.overrides_seen: str | None = None
        self.fresh_look: Pulse | None = None
        self.name = f"{process.host}:{process.pid}"  # as its heartbeat row names it
        self.outage = Outage(self.say)
        self.due: dict[str, dt.datetime] = {}  # each job's next start, database time
        # Work spread: the slots this one is not the first choice for (spread.py).
        self.handoffs = spread.Handoffs()
        # Jobs waiting their turn in a concurrency group: what was said, by name.
        self.waiting: dict[str, str] = {}
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

    def _served(self, jobs: list[Job], on_request: list[Job] | None) -> ServedJobs:
        """What it serves. With ``skip_schedules`` (SKIP_SCHEDULES, --skip-schedules) no
        slot of any job, only what is asked for now: its row says so and lists no job, so
        no other scheduler hands it a slot (spread.py)."""
        if self.skip_schedules:
            on_request = jobs if on_request is None else on_request
            return ServedJobs([], on_request, self.say, schedules=False)
        return ServedJobs(jobs, on_request, self.say)

    def say(self, said: Line, normal: bool = True) -> None:
        """One line: to the log, and to ``report`` (the command's output), naming this
        scheduler."""
        said.fields.setdefault("scheduler", self.name)
        logs.say(self.report, said, normal=normal)

    @property
    def free(self) -> int:
        """How many more runs it could start now (``--max-concurrent`` less its running)."""
        return max(0, self.max_concurrent - len(self.running))

    @property
    def _polls_requests(self) -> bool:
        """Whether it looks for runs asked for now: it serves some, and the database is
        not down (then only the outage's probe runs)."""
        return bool(self.served.on_request) and not self.outage.ongoing

    def _keep_time(self) -> None:
        """The heartbeat, and a fresh read of the database's clock now and then (during
        an outage: both, every second, until the database answers)."""
        if time.monotonic() < self.next_beat:
            return
        try:
            stale = time.monotonic() - self.clock.synced_at > CLOCK_CHECK
            self._beat(sync=stale or self.outage.ongoing or self.clock_doubtful)
            self.clock_doubtful = False
            self._write_unwritten_ends()
            self._listen()
        except LockDatabaseError as exc:
            self._database_down(exc)
            return
        self.outage.ended()
        self.next_beat = time.monotonic() + beat_seconds()

    @property
    def _looks(self) -> bool:
        """Whether it looks for requests and changes (polls), rather than listening."""
        return self._polls_requests and not self.listener.wanted

    def _beat(self, sync: bool) -> None:
        """The heartbeat; ``sync``: the database's clock too. It carries a look where
        the database can (heartbeat.py; on PostgreSQL the live list and the clock too):
        listening, the look is its safety net (:meth:`_noticed`); polling, it is that
        turn's look for requests. Else the beat alone, and the rest read apart."""
        looks = self.listener.wanted or (self._looks and self.began)
        names = self.served.names if looks else None
        pulse = self.heartbeat.beat(self.free, names)
        self._looked(pulse, sync)
        if self.listener.wanted:
            self._noticed(pulse)
        elif pulse.waiting is not None:
            self.fresh_look = pulse  # this turn's look for requests (scheduler.py)
        if sync and pulse.clock is None:
            run_statement(self.using, self.clock.sync)
        if names is None:  # no look reads the live list for it
            self.handoffs.peers = spread.peers(self.using, pulse.alive)

    def _looked(self, pulse: Pulse, sync: bool) -> None:
        """Take in what a look read: the clock (``sync``), the live schedulers (if read).
        The requests and the overrides' text are the scheduler's (scheduler.py)."""
        if sync and pulse.clock is not None:
            self.clock.observe(*pulse.clock)
        if pulse.alive is not None:
            self.handoffs.peers = spread.peers(self.using, pulse.alive)

    def _noticed(self, pulse: Pulse) -> None:
        """Listening: what the beat's look found that no NOTIFY told of (a row written
        by hand, say): an override's text that changed since the last beat, a request
        waiting while it waits for a NOTIFY. Read at once, then."""
        if self.overrides_seen is not None and pulse.overrides != self.overrides_seen:
            self.next_poll = 0.0
        if pulse.waiting and self.next_poll == float("inf"):
            self.next_poll = 0.0
        self.overrides_seen = pulse.overrides

    def _look(self) -> Pulse:
        """Where it polls: one look (heartbeat.py), the clock read with it when due."""
        pulse = self.heartbeat.look(self.served.names)
        self._looked(pulse, sync=time.monotonic() - self.clock.synced_at > CLOCK_CHECK)
        return pulse

    def _listen(self) -> None:
        """Listen (again, on a reopened connection), then read once what it may have
        missed before: the next poll comes at once."""
        if self.listener.moved():
            run_statement(self.using, self.listener.listen)
            self.next_poll = 0.0

    def _serving(self) -> None:
        """The jobs it serves changed (run-time schedules): its row says so."""
        if not self.skip_schedules:
            self.heartbeat.serve(self.served.names, written=self.began)

    def _database_down(self, exc: BaseException) -> None:
        """Start nothing until a probe (``_keep_time``) gets through."""
        self.next_beat = time.monotonic() + self.outage.failed(exc)

    def _write_unwritten_ends(self) -> None:
        """Runs whose end could not be written (the database was down): written now, so
        no later holder takes them for runs whose server crashed."""
        while self.unwritten:
            self.unwritten[0]()  # raises LockDatabaseError while still down
            self.unwritten.pop(0)

    def _keep_unwritten(self, run: Run) -> None:
        """A run whose end could not be written: write it once the database answers."""
        if run.unwritten_end is not None:
            self.unwritten.append(run.unwritten_end)
            self.next_beat = 0.0  # try at once; an outage makes it a probe each second

    def _sleep(self) -> None:
        """Wait for the next due slot, a child's end or report, a signal, or a beat."""
        if self.stopping:
            return
        if self.listener.heard():  # during the statements since the last wait
            self.next_poll = 0.0
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
        listening = self.listener.fileno()
        heard = [] if listening is None else [listening]
        ready = wait([self._wake_read, *heard, *self.running.waitables()], timeout)
        if self._wake_read in ready:
            with suppress(BlockingIOError, OSError):
                os.read(self._wake_read, 64)
        if listening in ready and self.listener.heard():
            self.next_poll = 0.0

    def _pause(self, seconds: float) -> None:
        """Sleep ``seconds`` unless stopped first."""
        self._wait(seconds)

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

    def _misconfigure(self, name: str, reason: str) -> None:
        """``name``'s row cannot be used (or its schedule computed): its problem only.
        It is not due until its row changes (:meth:`_read_overrides`)."""
        self.due.pop(name, None)
        self.handoffs.forget(name)
        self.served.misconfigure(name, reason)
        # A start may have read a row it has not followed yet (written without a
        # NOTIFY, between two looks): follow it now, so that the row that puts it right
        # is seen as a change.
        self.next_poll, self.overrides_seen = 0.0, None

    def _next(self, job: Job, request: RunRequest | None, at: dt.datetime | None) -> None:
        """Set when ``job`` is due next (a run asked for now leaves it as it was)."""
        if request is None and at is not None and job.name in self.due:
            self.due[job.name] = at

    def _following(self, job: Job, moment: dt.datetime) -> dt.datetime | None:
        """When the next slot after ``moment`` starts (``when.following``); None without
        a schedule, or if it cannot be computed (the job is then misconfigured)."""
        return self._computed(job, when.following, job, moment)

    def _after_skip(self, job: Job, result: RunResult, now: dt.datetime) -> dt.datetime | None:
        """When to try again after a skip (``when.after_skip``); None if ``job``'s
        schedule cannot be computed (it is then misconfigured: not due)."""
        return self._computed(job, when.after_skip, job, result.retry_at, result.held_until, now)


def beat_seconds() -> float:
    return SchedulerRow.BEAT.total_seconds()

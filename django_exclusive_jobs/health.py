"""Every job at a glance, and what is wrong with it: for the admin's jobs page,
``manage.py exclusive_jobs`` (and its ``--check``) and the optional health view.

:func:`overview` reads everything in a fixed number of queries, whatever the number of
jobs and runs, on the database's clock. The states it reads (a lock's, a run's, a
scheduler's, a run request's) are the querysets' of ``models.py``; what it adds is the
one judgement of a job's health (:class:`Health`, :func:`_judge`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from django.db import models

from .conf import app_settings
from .lock.acquire import prepare_locks
from .lock.clock import database_now
from .models import (
    JobLock,
    JobRun,
    JobState,
    LockState,
    RunRequest,
    Scheduler,
    SchedulerState,
    running_long,
)
from .run import overrides, slot_locks
from .run.arguments import describe as describe_arguments
from .run.control import AUTO_PAUSER
from .run.preview import Upcoming, upcoming
from .run.registry import Job, all_jobs
from .run.schedules import Cron, Every, Schedule
from .run.status import RunStatus
from .run.tasks import result_status


class Health(models.TextChoices):
    """A job's health. A job shows the first of its problems (worst first, in this
    order), else ``paused``, ``interrupted``, ``never ran`` or ``ok``."""

    PAUSED = "paused"
    MISCONFIGURED = "misconfigured"
    PAUSED_AFTER_FAILURES = "paused after failures"
    STALE_LOCK = "stale lock"
    RUNNING_LONG = "running long"
    UNSERVED = "unserved"
    MISSED = "missed"
    NEVER_RAN = "never ran"
    FAILING = "failing"
    INTERRUPTED = "interrupted"
    OK = "ok"


# The grace: a slot with no run this long after it (at most half the interval) is unrun.
LATE_AFTER = dt.timedelta(minutes=5)
# Interrupted runs in a row that make a problem (one is a deploy's graceful stop).
INTERRUPTED_IN_A_ROW = 2


@dataclass
class JobHealth:
    """One job as the jobs page, the CLI and the health view show it."""

    name: str
    declared: bool
    schedule: str = ""
    timezone: str = ""
    arguments: str = ""  # the keyword arguments its runs pass, as one line of JSON
    next_slot: dt.datetime | None = None
    upcoming: list[Upcoming] = field(default_factory=list)  # next_slot and those after it
    first_seen: dt.datetime | None = None  # when its lock row was made on this database
    last_run: JobRun | None = None
    previous_status: str = ""  # the status of the run before the last
    last_slot: dt.datetime | None = None
    last_slot_status: str = ""
    failures_24h: int = 0
    missed_24h: int = 0
    median: float | None = None
    lock_state: str = ""
    lock_id: int | None = None
    holder: str = ""
    running_for: float | None = None
    # Spans whose slots are not unrun: its last pause, before its schedule was in force.
    quiet: list[tuple[dt.datetime, dt.datetime]] = field(default_factory=list)
    task_status: str = ""  # a django.tasks job: what its backend says of the last enqueue
    paused: bool = False
    paused_by: str = ""
    paused_at: dt.datetime | None = None
    pause_reason: str = ""
    paused_until: dt.datetime | None = None
    # What operators override of its declaration (see overrides.drift), by whom and why.
    overrides: list[dict[str, str]] = field(default_factory=list)
    overridden_by: str = ""
    overridden_at: dt.datetime | None = None
    override_reason: str = ""
    schedulers: int | None = None  # alive schedulers serving it; None: no known one does
    requests: list[RunRequest] = field(default_factory=list)  # run now / backfill, waiting
    recent: list[JobRun] = field(default_factory=list)  # its last runs, newest first
    # Why its operator row cannot be used (overrides.Misconfigured): its runs are not
    # started until it is put right; "" when it can.
    misconfigured: str = ""
    badge: str = Health.OK
    problems: list[str] = field(default_factory=list)
    kinds: list[Health] = field(default_factory=list)  # each problem's kind, in order

    @property
    def served(self) -> bool:
        """A live scheduler serves it (its slots and its run-now requests)."""
        return bool(self.schedulers)

    def as_dict(self) -> dict[str, Any]:
        last = self.last_run
        return {
            "name": self.name,
            "declared": self.declared,
            "schedule": self.schedule,
            "timezone": self.timezone,
            "arguments": self.arguments or None,
            "next_slot": _iso(self.next_slot),
            "first_seen": _iso(self.first_seen),
            "last_run": None
            if last is None
            else {
                "status": last.status,
                "slot": _iso(last.slot),
                "started_at": _iso(last.started_at),
                "finished_at": _iso(last.finished_at),
                "duration": last.duration,
                "requested_by": last.requested_by or None,
                "task_result_id": last.task_result_id or None,
                "task_status": self.task_status or None,
            },
            "failures_24h": self.failures_24h,
            "missed_24h": self.missed_24h,
            "median_duration": self.median,
            "lock": self.lock_state,
            "holder": self.holder,
            "running_for": self.running_for,
            "paused": self.paused,
            "paused_by": self.paused_by,
            "pause_reason": self.pause_reason or None,
            "paused_until": _iso(self.paused_until),
            "overrides": [
                {"setting": o["setting"], "value": o["value"], "code": o["code"]}
                for o in self.overrides
            ],
            "overridden_by": self.overridden_by or None,
            "override_reason": self.override_reason or None,
            "requests": [
                {
                    "id": r.pk,
                    "requested_by": r.requested_by,
                    "requested_at": _iso(r.requested_at),
                    "slot": _iso(r.slot),
                    "kwargs": r.kwargs,
                }
                for r in self.requests
            ],
            "schedulers_alive": self.schedulers,
            "health": self.badge,
            "problems": self.problems,
        }


@dataclass
class Overview:
    """Every declared job, the jobs only the history knows, and the schedulers."""

    now: dt.datetime
    jobs: list[JobHealth]
    undeclared: list[JobHealth]
    schedulers: list[Scheduler]  # known rows, newest beat first, read ``with_state()``

    @property
    def schedulers_alive(self) -> int:
        return sum(row.state == SchedulerState.ALIVE for row in self.schedulers)  # type: ignore[attr-defined]

    @property
    def last_beat(self) -> dt.datetime | None:
        """The newest heartbeat of any known scheduler."""
        return max((row.last_beat_at for row in self.schedulers), default=None)

    @property
    def scheduler_problems(self) -> list[str]:
        """One line per scheduler gone without a clean stop and not acknowledged."""
        return [
            f"scheduler {row}: gone: no beat since {_when(row.last_beat_at)} and no clean "
            f"stop; acknowledge it, or start a scheduler on {row.host} again"
            for row in self.schedulers
            if row.unacknowledged  # type: ignore[attr-defined]
        ]

    @property
    def problems(self) -> list[str]:
        """One line per problem, for ``--check`` and the health view."""
        jobs = [f"{job.name}: {problem}" for job in self.jobs for problem in job.problems]
        return jobs + self.scheduler_problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": not self.problems,
            "now": _iso(self.now),
            "problems": self.problems,
            "schedulers_alive": self.schedulers_alive,
            "last_scheduler_beat": _iso(self.last_beat),
            "schedulers": [_scheduler_dict(row) for row in self.schedulers],
            "jobs": [job.as_dict() for job in self.jobs],
            "undeclared": [job.as_dict() for job in self.undeclared],
        }


def overview(using: str, *, slots: int = 1, recent: int = 0) -> Overview:
    """Read every job's state: eight queries, however many jobs and runs there are (nine
    with ``recent``).

    ``slots``: how many of each scheduled job's next slots to compute (on the database's
    clock read here, without a query more; the jobs page shows 5).
    ``recent``: how many of each job's last runs to read, missed and skipped slots
    included (one query for all jobs; the jobs page's strips show 50).

    A declared job with no lock row yet gets one now (one more query, once): the row's
    creation is when this database first saw the job, which "never ran" counts from.
    """
    now = database_now(using)
    declared = {job.name: job for job in all_jobs()}
    rows = JobLock.objects.using(using).with_state().with_runs()
    locks = {lock.name: lock for lock in rows}
    if set(declared) - set(locks):
        prepare_locks(sorted(set(declared) - set(locks)), using=using)
        locks = {lock.name: lock for lock in rows.all()}
    slots_held = _fold_slot_locks(locks, declared)
    wanted = {
        getattr(lock, key) for lock in locks.values() for key in ("last_run_id", "last_slot_id")
    }
    runs = JobRun.objects.using(using)
    found = {run.pk: run for run in runs.rows(wanted - {None})}
    counts = runs.counts_since(now - dt.timedelta(hours=24))
    medians = runs.medians()
    schedulers = list(Scheduler.objects.using(using).known().with_state())
    states = {state.name: state for state in JobState.objects.using(using)}
    last_runs: dict[str, list[JobRun]] = {}
    # Only what a strip shows: no error texts, fifty times a thousand jobs.
    shown = ("name", "status", "slot", "started_at", "duration")
    for run in runs.last_runs(recent).only(*shown) if recent else ():
        last_runs.setdefault(run.name, []).append(run)
    requests: dict[str, list[RunRequest]] = {}
    for request in RunRequest.objects.using(using).runs_waiting():
        requests.setdefault(request.name, []).append(request)

    alive = [row for row in schedulers if row.state == SchedulerState.ALIVE]  # type: ignore[attr-defined]
    result: list[JobHealth] = []
    undeclared: list[JobHealth] = []
    for name in sorted(set(declared) | set(locks)):
        job = declared.get(name)
        health = JobHealth(name, declared=job is not None, requests=requests.get(name, []))
        health.recent = last_runs.get(name, [])
        lock = locks.get(name)
        if lock is not None:
            _read_lock(health, lock, found)
        if name in slots_held and health.lock_state != LockState.HELD:
            held = slots_held[name]  # allow_all: the newest slot running
            health.lock_state, health.holder = LockState.HELD, held.holder
        health.failures_24h = counts[name].get(RunStatus.FAILED, 0)
        health.missed_24h = counts[name].get(RunStatus.MISSED, 0)
        health.median = medians.get(name)
        state = states.get(name)
        if state is not None:
            _read_state(health, job, state, now)
            job = _in_force(health, job, state, now) if job is not None else None
        if any(row.serves(name) for row in schedulers):
            health.schedulers = sum(row.serves(name) for row in alive)
        if job is not None:
            _describe(health, job, now, slots)
        _judge(health, job, now, uses_schedulers=bool(schedulers))
        (result if job is not None else undeclared).append(health)
    return Overview(now, result, undeclared, schedulers)


def _fold_slot_locks(locks: dict[str, JobLock], declared: dict[str, Job]) -> dict[str, JobLock]:
    """Take the locks of the slots of ``overlap="allow_all"`` jobs out of ``locks`` (they
    are no jobs of their own); the newest held one of each job, by job. A stale one is
    no problem of the job: the run it left is marked lost by the job's next slot."""
    side_by_side = {name for name, job in declared.items() if job.overlap.lock_per_slot}
    held: dict[str, JobLock] = {}
    for lock_name in sorted(locks):
        name, separator, _ = lock_name.rpartition(slot_locks.SEPARATOR)
        if separator and name in side_by_side:
            lock = locks.pop(lock_name)
            if lock.state == LockState.HELD:  # type: ignore[attr-defined]
                held[name] = lock
    return held


def _read_lock(health: JobHealth, lock: JobLock, runs: dict[int, JobRun]) -> None:
    """What the lock row (read ``with_state().with_runs()``) says of the job."""
    health.first_seen = lock.created_at
    health.last_run = runs.get(lock.last_run_id)  # type: ignore[attr-defined]
    health.previous_status = lock.previous_status or ""  # type: ignore[attr-defined]
    slot_run = runs.get(lock.last_slot_id)  # type: ignore[attr-defined]
    if slot_run is not None:
        health.last_slot, health.last_slot_status = slot_run.slot, slot_run.status
    health.lock_state, health.lock_id = lock.state, lock.pk  # type: ignore[attr-defined]
    if health.lock_state == LockState.HELD:
        health.holder = lock.holder
        health.running_for = lock.running_for


def schedule_in_words(schedule: Schedule) -> tuple[str, str]:
    """The schedule as a sentence, and its time zone ("" for every=)."""
    if isinstance(schedule, Cron):
        from cron_descriptor import Options, get_description  # type: ignore[import-untyped]

        options = Options()
        options.use_24hour_time_format = True
        return get_description(schedule.expression, options), schedule.timezone
    if isinstance(schedule, Every):
        return _every_in_words(schedule.period), ""
    return schedule.describe(), ""


def _every_in_words(period: dt.timedelta) -> str:
    seconds = int(period.total_seconds())
    for size, unit in ((86400, "day"), (3600, "hour"), (60, "minute"), (1, "second")):
        if seconds % size == 0:
            count = seconds // size
            return f"Every {unit}" if count == 1 else f"Every {count} {unit}s"
    return f"Every {period.total_seconds():g} seconds"


def _read_state(health: JobHealth, job: Job | None, state: JobState, now: dt.datetime) -> None:
    """What operators decided: its pause (a pause past its end is over), its override."""
    health.quiet = state.quiet(now)
    if state.paused_now(now):
        health.paused, health.paused_by = True, state.paused_by
        health.paused_at, health.paused_until = state.paused_at, state.paused_until
        health.pause_reason = state.pause_reason
    if state.override:
        health.overrides = overrides.drift(job, state)
        health.overridden_by, health.overridden_at = state.overridden_by, state.overridden_at
        health.override_reason = state.override_reason


def _in_force(health: JobHealth, job: Job, state: JobState, now: dt.datetime) -> Job:
    """The job as its override has it run, if the override can be used and its schedule
    computed; else the job as declared, and ``health.misconfigured`` says why."""
    if not state.override:
        return job
    try:
        return overrides.tried(overrides.in_force(job, state), now)
    except overrides.Misconfigured as exc:
        health.misconfigured = exc.reason
        return job


def _describe(health: JobHealth, job: Job, now: dt.datetime, slots: int) -> None:
    health.arguments = describe_arguments(job.kwargs)
    if job.schedule is None:
        health.schedule = "no schedule"
        return
    try:
        health.schedule, health.timezone = schedule_in_words(job.schedule)
        if health.misconfigured:
            return  # no slot of its is started: none is shown coming
        health.upcoming = upcoming(job, now, slots)
    except Exception as exc:  # a slot out of range, a few slots on: still the job's problem
        failed = overrides.uncomputable(job.name, exc)
        health.misconfigured = health.misconfigured or failed.reason
        health.upcoming = []
        return
    health.next_slot = health.upcoming[0].slot
    last = health.last_run
    if job.task is not None and last is not None and last.task_result_id:
        health.task_status = result_status(job.task, last.task_result_id, last.task_backend)


def _judge(health: JobHealth, job: Job | None, now: dt.datetime, *, uses_schedulers: bool) -> None:
    """Set the badge and one line per problem: the one definition of a job's health."""
    found: list[tuple[Health, str]] = []
    if health.misconfigured:
        said = f"{health.misconfigured}; its runs are not started until it is fixed"
        found.append((Health.MISCONFIGURED, said))
    if health.paused and health.paused_by == AUTO_PAUSER:
        found.append((Health.PAUSED_AFTER_FAILURES, health.pause_reason))
    if health.lock_state == LockState.STALE:
        found.append((Health.STALE_LOCK, "its holder's lease ran out and it was never released"))
    if running_long(health.running_for, health.median):
        found.append(
            (
                Health.RUNNING_LONG,
                f"running for {health.running_for:.0f}s, "
                f"{float(app_settings.RUNNING_LONG_FACTOR):g}x its median of {health.median:.1f}s",
            )
        )
    unrun = None
    if job is not None and not health.paused and not health.misconfigured:
        unrun = _unrun_slot(health, job, now)
    if unrun is not None and uses_schedulers and not health.served:
        found.append(
            (
                Health.UNSERVED,
                f"no live scheduler serves it, and no run for the slot of {_when(unrun)}",
            )
        )
    elif unrun is not None and health.last_slot is None:
        seen = _when(health.first_seen)
        found.append(
            (Health.NEVER_RAN, f"first seen {seen}, no run for the slot of {_when(unrun)}")
        )
    elif unrun is not None:
        found.append((Health.MISSED, f"no run for the slot of {_when(unrun)}"))
    elif health.last_slot_status == RunStatus.MISSED and job is not None and not health.paused:
        found.append((Health.MISSED, f"the slot of {_when(health.last_slot)} was not run"))
    if health.requests and job is not None and not health.served:
        first = health.requests[0]
        what = "run now" if first.slot is None else f"backfill of slot {_when(first.slot)}"
        found.append(
            (
                Health.UNSERVED,
                f"{what} asked by {first.requested_by} at {_when(first.requested_at)} waits, "
                "and no live scheduler serves it",
            )
        )
    last = health.last_run
    # An attempt that will be retried is not the slot's end: failing only after the last.
    if last is not None and last.status in RunStatus.failures() and last.retry_at is None:
        found.append(
            (
                Health.FAILING,
                f"its last run {RunStatus(last.status).label} at {_when(last.finished_at)}",
            )
        )
    interrupted = last is not None and last.status == RunStatus.INTERRUPTED
    if interrupted and health.previous_status == RunStatus.INTERRUPTED:
        assert last is not None
        found.append(
            (
                Health.INTERRUPTED,
                f"its last {INTERRUPTED_IN_A_ROW} runs were interrupted, the last at "
                f"{_when(last.finished_at)}",
            )
        )
    health.problems = [f"{kind}: {text}" for kind, text in found]
    health.kinds = [kind for kind, _ in found]
    if health.paused:
        health.badge = Health.PAUSED
    elif found:
        health.badge = found[0][0]
    elif interrupted:
        health.badge = Health.INTERRUPTED
    elif job is not None and job.schedule is not None and health.last_slot is None:
        health.badge = Health.NEVER_RAN
    else:
        health.badge = Health.OK


def _unrun_slot(health: JobHealth, job: Job, now: dt.datetime) -> dt.datetime | None:
    """The newest slot past its grace with no run, after the job's latest slotted run
    (or, for one that never ran, after this database first saw it), outside its last
    pause; None if there is none."""
    if job.schedule is None:
        return None
    _, interval = job.schedule.latest_at_or_before(now)
    # Its grace counts from the slot's start: up to its jitter after the slot.
    grace = min(LATE_AFTER, interval / 2) + job.jitter
    slot, _ = job.schedule.latest_at_or_before(now - grace)
    since = health.last_slot if health.last_slot is not None else health.first_seen
    if since is None or slot <= since:
        return None
    if any(begin <= slot <= end for begin, end in health.quiet):
        return None  # in the job's last pause, or before its schedule: not run, on purpose
    return slot


def _scheduler_dict(row: Scheduler) -> dict[str, Any]:
    return {
        "host": row.host,
        "pid": row.pid,
        "instance": row.instance,
        "state": row.state,  # type: ignore[attr-defined]
        "jobs": row.jobs,
        "started_at": _iso(row.started_at),
        "last_beat_at": _iso(row.last_beat_at),
        "stopped_at": _iso(row.stopped_at),
        "acknowledged_by": row.acknowledged_by or None,
        "problem": bool(row.unacknowledged),  # type: ignore[attr-defined]
    }


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _when(value: dt.datetime | None) -> str | None:
    """A time in a problem's line: to the second."""
    return value.isoformat(timespec="seconds") if value is not None else None

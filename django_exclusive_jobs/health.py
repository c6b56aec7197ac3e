"""Every job at a glance, and what is wrong with it: for the admin's jobs page,
``manage.py exclusive_jobs`` (and its ``--check``) and the optional health view.

:func:`overview` reads everything in a fixed number of queries, whatever the number of
jobs and runs, all judged on the database's clock.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, F, OuterRef, Q, Subquery, Window
from django.db.models.functions import RowNumber

from .conf import app_settings
from .lock.clock import database_now
from .models import JobLock, JobRun, JobState, LockState, Scheduler
from .run.registry import Job, all_jobs
from .run.schedules import Cron, Every, Schedule
from .run.status import RunStatus
from .run.tasks import result_status

# Badges, worst first: a job shows the first that applies.
PAUSED = "paused"
STALE_LOCK = "stale lock"
RUNNING_LONG = "running long"
NO_SCHEDULER = "no scheduler alive"
MISSED = "missed"
FAILING = "failing"
NEVER_RAN = "never ran"
OK = "ok"

MEDIAN_SAMPLE = 20  # successful runs the median duration is taken over
MEDIAN_DAYS = 7  # ... among those of the last week
LATE_AFTER = dt.timedelta(minutes=5)  # a slot without a run this long after it is missed


@dataclass
class JobHealth:
    """One job as the jobs page, the CLI and the health view show it."""

    name: str
    declared: bool
    schedule: str = ""
    timezone: str = ""
    next_slot: dt.datetime | None = None
    last_run: JobRun | None = None
    last_slot: dt.datetime | None = None
    last_slot_status: str = ""
    failures_24h: int = 0
    missed_24h: int = 0
    median: float | None = None
    lock_state: str = ""
    lock_id: int | None = None
    holder: str = ""
    running_for: float | None = None
    last_pause: tuple[dt.datetime, dt.datetime] | None = None  # its slots are not missed
    task_status: str = ""  # a django.tasks job: what its backend says of the last enqueue
    paused: bool = False
    paused_by: str = ""
    paused_at: dt.datetime | None = None
    schedulers: int | None = None  # alive schedulers serving it; None: not served by one
    badge: str = OK
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        last = self.last_run
        return {
            "name": self.name,
            "declared": self.declared,
            "schedule": self.schedule,
            "timezone": self.timezone,
            "next_slot": _iso(self.next_slot),
            "last_run": None
            if last is None
            else {
                "status": last.status,
                "slot": _iso(last.slot),
                "started_at": _iso(last.started_at),
                "finished_at": _iso(last.finished_at),
                "duration": last.duration,
                "task_result_id": last.task_result_id or None,
                "task_status": self.task_status or None,
            },
            "failures_24h": self.failures_24h,
            "missed_24h": self.missed_24h,
            "median_duration": self.median,
            "lock": self.lock_state,
            "holder": self.holder,
            "paused": self.paused,
            "paused_by": self.paused_by,
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
    schedulers_alive: int
    schedulers_known: int
    last_beat: dt.datetime | None = None  # the newest heartbeat of any known scheduler

    @property
    def problems(self) -> list[str]:
        """One line per problem, for ``--check`` and the health view."""
        return [f"{job.name}: {problem}" for job in self.jobs for problem in job.problems]

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": not self.problems,
            "now": _iso(self.now),
            "problems": self.problems,
            "schedulers_alive": self.schedulers_alive,
            "last_scheduler_beat": _iso(self.last_beat),
            "jobs": [job.as_dict() for job in self.jobs],
            "undeclared": [job.as_dict() for job in self.undeclared],
        }


def overview(using: str) -> Overview:
    """Read every job's state: seven queries, however many jobs and runs there are."""
    now = database_now(using)
    states = {state.name: state for state in JobState.objects.using(using)}
    latest_run = JobRun.objects.filter(name=OuterRef("name")).order_by("-started_at", "-id")
    latest_slot = JobRun.objects.filter(name=OuterRef("name"), slot__isnull=False)
    current_run = JobRun.objects.filter(
        name=OuterRef("name"), token=OuterRef("token"), status=RunStatus.RUNNING
    )
    annotated = (
        JobLock.objects.using(using)
        .with_state()
        .annotate(
            last_run_id=Subquery(latest_run.values("id")[:1]),
            last_slot_id=Subquery(latest_slot.order_by("-slot").values("id")[:1]),
            run_started_at=Subquery(current_run.values("started_at")[:1]),
        )
    )
    locks = {lock.name: lock for lock in annotated}
    # Each job's last run and last slotted run, looked up by the database (no id list).
    last = Q(id__in=annotated.values("last_run_id")) | Q(id__in=annotated.values("last_slot_id"))
    runs = {run.id: run for run in JobRun.objects.using(using).filter(last)}
    counts = _counts_24h(using, now)
    medians = _medians(using, now)
    served, alive, alive_count, known, last_beat = _schedulers(using, now)

    declared = {job.name: job for job in all_jobs()}
    result: list[JobHealth] = []
    undeclared: list[JobHealth] = []
    for name in sorted(set(declared) | set(locks)):
        job = declared.get(name)
        lock = locks.get(name)
        health = JobHealth(name, declared=job is not None)
        if lock is not None:
            health.last_run = runs.get(lock.last_run_id)  # type: ignore[attr-defined]
            slot_run = runs.get(lock.last_slot_id)  # type: ignore[attr-defined]
            if slot_run is not None:
                health.last_slot, health.last_slot_status = slot_run.slot, slot_run.status
            health.lock_state = getattr(lock, "state", "")
            health.lock_id = lock.pk
            if health.lock_state == LockState.HELD:
                health.holder = lock.holder
                started = getattr(lock, "run_started_at", None)
                if started is not None:
                    health.running_for = (now - started).total_seconds()
        health.failures_24h = counts[name].get("failed", 0)
        health.missed_24h = counts[name].get("missed", 0)
        health.median = medians.get(name)
        state = states.get(name)
        if state is not None and state.paused_at and state.resumed_at:
            health.last_pause = (state.paused_at, state.resumed_at)
        if state is not None and state.paused:
            health.paused, health.paused_by, health.paused_at = (
                True,
                state.paused_by,
                state.paused_at,
            )
        if name in served:
            health.schedulers = alive.get(name, 0)
        if job is not None:
            _describe(health, job, now)
        _judge(health, job, now)
        (result if job is not None else undeclared).append(health)
    return Overview(now, result, undeclared, alive_count, known, last_beat)


def _counts_24h(using: str, now: dt.datetime) -> dict[str, dict[str, int]]:
    """Failed and missed runs per job over the last 24 hours (one grouped query)."""
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    rows = (
        JobRun.objects.using(using)
        .filter(started_at__gte=now - dt.timedelta(hours=24))
        .filter(status__in=[RunStatus.FAILED, RunStatus.MISSED])
        .values_list("name", "status")
        .annotate(n=Count("id"))
        .order_by()
    )
    for name, status, number in rows:
        counts[name][status] = number
    return counts


def _medians(using: str, now: dt.datetime) -> dict[str, float]:
    """Median duration of each job's last successful runs of the past week (one query)."""
    recent = (
        JobRun.objects.using(using)
        .filter(
            status=RunStatus.SUCCEEDED,
            duration__isnull=False,
            started_at__gte=now - dt.timedelta(days=MEDIAN_DAYS),
        )
        .annotate(
            rank=Window(RowNumber(), partition_by=[F("name")], order_by=F("started_at").desc())
        )
        .filter(rank__lte=MEDIAN_SAMPLE)
        .values_list("name", "duration")
    )
    durations: dict[str, list[float]] = defaultdict(list)
    for name, duration in recent:
        if duration is not None:
            durations[name].append(duration)
    return {name: statistics.median(values) for name, values in durations.items()}


def _schedulers(
    using: str, now: dt.datetime
) -> tuple[set[str], dict[str, int], int, int, dt.datetime | None]:
    """Jobs any known scheduler serves; per job, how many alive ones serve it; how many
    schedulers are alive, and known (rows not yet forgotten); the newest heartbeat."""
    served: set[str] = set()
    alive: dict[str, int] = defaultdict(int)
    alive_count = known = 0
    last_beat: dt.datetime | None = None
    for row in Scheduler.objects.using(using).exclude(
        last_beat_at__lte=now - Scheduler.FORGET_AFTER
    ):
        known += 1
        last_beat = max(last_beat or row.last_beat_at, row.last_beat_at)
        jobs = set(row.jobs or [])
        served |= jobs
        if row.stopped_at is None and now - row.last_beat_at < Scheduler.ALIVE_FOR:
            alive_count += 1
            for name in jobs:
                alive[name] += 1
    return served, alive, alive_count, known, last_beat


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


def _describe(health: JobHealth, job: Job, now: dt.datetime) -> None:
    if job.schedule is None:
        health.schedule = "no schedule"
        return
    health.schedule, health.timezone = schedule_in_words(job.schedule)
    health.next_slot = job.schedule.next_after(now)
    last = health.last_run
    if job.task is not None and last is not None and last.task_result_id:
        health.task_status = result_status(job.task, last.task_result_id, last.task_backend)


def _judge(health: JobHealth, job: Job | None, now: dt.datetime) -> None:
    """Set the badge and one line per problem."""
    problems = health.problems
    if health.lock_state == LockState.STALE:
        problems.append(f"{STALE_LOCK}: its holder's lease ran out and it was never released")
    if health.running_for is not None and health.median:
        factor = float(app_settings.SUSPECT_FACTOR)
        if health.running_for > factor * health.median:
            problems.append(
                f"{RUNNING_LONG}: running for {health.running_for:.0f}s, "
                f"{factor:g}x its median of {health.median:.1f}s"
            )
    if health.schedulers == 0 and job is not None and not health.paused:
        problems.append(f"{NO_SCHEDULER}: the schedulers that served it have all stopped")
    overdue = _overdue_slot(health, job, now)
    if overdue is not None and not health.paused:
        problems.append(f"{MISSED}: no run for the slot of {overdue.isoformat()}")
    elif health.last_slot_status == RunStatus.MISSED and not health.paused:
        problems.append(f"{MISSED}: the slot of {_iso(health.last_slot)} was not run")
    last = health.last_run
    if last is not None and last.status in RunStatus.unsuccessful():
        problems.append(f"{FAILING}: its last run {last.status} at {_iso(last.finished_at)}")
    if health.paused:
        health.badge = PAUSED
    elif problems:
        health.badge = problems[0].split(":", 1)[0]
    elif job is not None and job.schedule is not None and health.last_slot is None:
        health.badge = NEVER_RAN
    else:
        health.badge = OK


def _overdue_slot(health: JobHealth, job: Job | None, now: dt.datetime) -> dt.datetime | None:
    """The newest slot that should have a run by now but has none (scheduled jobs that
    ran before; a job that never ran is not judged)."""
    if job is None or job.schedule is None or health.last_slot is None:
        return None
    _, interval = job.schedule.latest_at_or_before(now)
    slot, _ = job.schedule.latest_at_or_before(now - min(LATE_AFTER, interval / 2))
    slot = slot.astimezone(dt.UTC)
    pause = health.last_pause
    if pause is not None and pause[0] <= slot <= pause[1]:
        return None  # it fell in the job's last pause: not run, on purpose
    return slot if slot > health.last_slot else None


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None

"""Every job at a glance, and what is wrong with it: for the admin's jobs page,
``manage.py exclusive_jobs`` (and its ``--check``) and the optional health view.

:func:`overview` reads everything in a fixed number of queries, whatever the number of
jobs and runs, on the database's clock. The states it reads (a lock's, a run's, a
scheduler's, a run request's) are the querysets' of ``models.py``; what it adds is the
one judgement of a job's health (:class:`Health`, :func:`~.job_health.judge`, in
``job_health.py`` with :class:`JobHealth`, each job as it is shown).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from .conf import app_settings
from .job_health import Health, JobHealth, iso, judge, when
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
)
from .run import overrides, runtime_schedules, slot_locks
from .run.arguments import describe as describe_arguments
from .run.preview import upcoming
from .run.registry import Job, all_jobs
from .run.schedules import Cron, Every, Schedule
from .run.status import RunStatus
from .run.tasks import result_status
from .values import GROUP_PREFIX

# Health and JobHealth are shown and judged in job_health.py; this module is their door.
__all__ = ["Health", "JobHealth", "Overview", "overview", "schedule_in_words"]


# SKIP_SCHEDULES in this process's settings, as --check, the health view and every page say it.
SKIPPED_HERE = (
    "schedules skipped here: SKIP_SCHEDULES is on, no slot starts on this server "
    "(runs asked for now do)"
)


@dataclass
class Overview:
    """Every declared job, the jobs only the history knows, and the schedulers."""

    now: dt.datetime
    jobs: list[JobHealth]
    undeclared: list[JobHealth]
    schedulers: list[Scheduler]  # known rows, newest beat first, read ``with_state()``
    skipped_here: bool = False  # SKIP_SCHEDULES in this process's settings

    @property
    def skipping(self) -> list[Scheduler]:
        """The live schedulers that start no slot (SKIP_SCHEDULES, --skip-schedules)."""
        return [
            row
            for row in self.schedulers
            if row.state == SchedulerState.ALIVE and row.skips_schedules  # type: ignore[attr-defined]
        ]

    @property
    def switch_problems(self) -> list[str]:
        """Schedules skipped here, or by a live scheduler: a line each (production with
        the switch set by mistake is seen at once)."""
        found = [SKIPPED_HERE] if self.skipped_here else []
        found += [
            f"scheduler {row}: skips schedules: it starts no slot, only runs asked for now "
            "(SKIP_SCHEDULES or --skip-schedules)"
            for row in self.skipping
        ]
        return found

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
            f"scheduler {row}: gone: no beat since {when(row.last_beat_at)} and no clean "
            f"stop; acknowledge it, or start a scheduler on {row.host} again"
            for row in self.schedulers
            if row.unacknowledged  # type: ignore[attr-defined]
        ]

    @property
    def problems(self) -> list[str]:
        """One line per problem, for ``--check`` and the health view."""
        jobs = [f"{job.name}: {problem}" for job in self.jobs for problem in job.problems]
        return self.switch_problems + jobs + self.scheduler_problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": not self.problems,
            "now": iso(self.now),
            "problems": self.problems,
            "schedules_skipped_here": self.skipped_here,
            "schedulers_alive": self.schedulers_alive,
            "last_scheduler_beat": iso(self.last_beat),
            "schedulers": [_scheduler_dict(row) for row in self.schedulers],
            "jobs": [job.as_dict() for job in self.jobs],
            "undeclared": [job.as_dict() for job in self.undeclared],
        }


def overview(using: str, *, slots: int = 1, recent: int = 0) -> Overview:
    """Read every job's state: nine queries, however many jobs and runs there are (ten
    with ``recent``).

    ``slots``: how many of each scheduled job's next slots to compute (on the database's
    clock read here, without a query more; the jobs page shows 5).
    ``recent``: how many of each job's last runs to read, missed and skipped slots
    included (one query for all jobs; the jobs page's strips show 50).

    A declared job with no lock row yet gets one now (one more query, once): the row's
    creation is when this database first saw the job, which "never ran" counts from.
    """
    read = _Read.of(using, recent)
    result: list[JobHealth] = []
    undeclared: list[JobHealth] = []
    for name in sorted(set(read.declared) | set(read.locks)):
        health = _job_health(read, name, slots)
        (result if health.declared else undeclared).append(health)
    return Overview(read.now, result, undeclared, read.schedulers, skipped_here=read.skipped)


@dataclass
class _Read:
    """What :func:`overview` reads of every job, in its fixed number of queries."""

    now: dt.datetime
    declared: dict[str, Job]
    locks: dict[str, JobLock]
    slots_held: dict[str, JobLock]  # allow_all: each job's newest slot running
    runs: dict[int, JobRun]  # each lock's last run and last slot's run, by id
    counts: dict[str, dict[str, int]]  # runs by status in the last 24 hours (a defaultdict)
    medians: dict[str, float]
    schedulers: list[Scheduler]
    alive: list[Scheduler]
    states: dict[str, JobState]
    last_runs: dict[str, list[JobRun]]
    requests: dict[str, list[RunRequest]]
    skipped: bool  # SKIP_SCHEDULES in this process's settings, read once
    # The run-time schedules (in ``declared``), with why none of their slots starts.
    added: dict[str, str]

    @classmethod
    def of(cls, using: str, recent: int) -> _Read:
        now = database_now(using)
        declared = {job.name: job for job in all_jobs()}
        added = runtime_schedules.jobs_of(
            runtime_schedules.list_schedules(using=using), declared, now
        )
        declared.update({name: job for name, (job, _) in added.items()})
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
        return cls(
            now,
            declared,
            locks,
            slots_held,
            found,
            counts,
            medians,
            schedulers,
            alive,
            states,
            last_runs,
            requests,
            bool(app_settings.SKIP_SCHEDULES),
            {name: why for name, (_, why) in added.items()},
        )


def _job_health(read: _Read, name: str, slots: int) -> JobHealth:
    """Job ``name`` as it is shown (its ``slots`` next slots), judged."""
    job = read.declared.get(name)
    health = JobHealth(name, declared=job is not None, requests=read.requests.get(name, []))
    health.recent = read.last_runs.get(name, [])
    lock = read.locks.get(name)
    if lock is not None:
        _read_lock(health, lock, read.runs)
    if name in read.slots_held and health.lock_state != LockState.HELD:
        held = read.slots_held[name]  # allow_all: the newest slot running
        health.lock_state, health.holder = LockState.HELD, held.holder
    health.failures_24h = read.counts[name].get(RunStatus.FAILED, 0)
    health.missed_24h = read.counts[name].get(RunStatus.MISSED, 0)
    health.median = read.medians.get(name)
    state = read.states.get(name)
    if state is not None:
        _read_state(health, job, state, read.now)
        job = _in_force(health, job, state, read.now) if job is not None else None
    if any(row.serves(name) for row in read.schedulers):
        health.schedulers = sum(row.serves(name) for row in read.alive)
    if name in read.added:
        _added(health, job, read.added[name])
    if job is not None:
        _describe(health, job, read.now, slots)
    judge(health, job, read.now, uses_schedulers=bool(read.schedulers), skipped=read.skipped)
    return health


def _fold_slot_locks(locks: dict[str, JobLock], declared: dict[str, Job]) -> dict[str, JobLock]:
    """Take the locks of the slots of ``overlap="allow_all"`` jobs, and the concurrency
    groups' locks, out of ``locks`` (they are no jobs of their own); the newest held
    slot lock of each job, by job. A stale one is no problem of the job: the run it left
    is marked lost by the job's next slot."""
    side_by_side = {name for name, job in declared.items() if job.overlap.lock_per_slot}
    held: dict[str, JobLock] = {}
    for lock_name in [name for name in locks if name.startswith(GROUP_PREFIX)]:
        del locks[lock_name]  # a concurrency group's (its members' runs tell)
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


def _added(health: JobHealth, job: Job | None, why: str) -> None:
    """A run-time schedule: switched off or ended, it shows as paused (nothing of it is
    due); one the scheduler cannot use, as misconfigured."""
    health.added = True
    if why in ("switched off", "ended"):
        health.paused, health.pause_reason = True, why
    elif why:
        health.misconfigured = why


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
    health.arguments, health.groups = describe_arguments(job.kwargs), job.groups
    if job.schedule is None:
        health.schedule = "no schedule"
        return
    try:
        health.schedule, health.timezone = schedule_in_words(job.schedule)
        if health.misconfigured:
            return  # no slot of its is started: none is shown coming
        coming = upcoming(job, max(now, job.starts_at or now), slots)
        health.upcoming = [each for each in coming if not job.ends_at or each.slot < job.ends_at]
    except Exception as exc:  # a slot out of range, a few slots on: still the job's problem
        failed = overrides.uncomputable(job.name, exc)
        health.misconfigured = health.misconfigured or failed.reason
        health.upcoming = []
        return
    health.next_slot = health.upcoming[0].slot if health.upcoming else None
    last = health.last_run
    if job.task is not None and last is not None and last.task_result_id:
        health.task_status = result_status(job.task, last.task_result_id, last.task_backend)


def _scheduler_dict(row: Scheduler) -> dict[str, Any]:
    return {
        "host": row.host,
        "pid": row.pid,
        "instance": row.instance,
        "state": row.state,  # type: ignore[attr-defined]
        "jobs": row.jobs,
        "skips_schedules": row.skips_schedules,
        "started_at": iso(row.started_at),
        "last_beat_at": iso(row.last_beat_at),
        "stopped_at": iso(row.stopped_at),
        "acknowledged_by": row.acknowledged_by or None,
        "problem": bool(row.unacknowledged),  # type: ignore[attr-defined]
    }

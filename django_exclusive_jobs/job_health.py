"""One job's health: what the jobs page, ``manage.py exclusive_jobs`` and the health
view show of it (:class:`JobHealth`), and the one judgement of what is wrong with it
(:func:`judge`): its badge and one line per problem.

What it is judged on is read by :func:`~django_exclusive_jobs.health.overview`; nothing
here sends a query.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from django.db import models

from .conf import app_settings
from .models import JobRun, LockState, RunRequest, running_long
from .run.control import AUTO_PAUSER
from .run.preview import Upcoming
from .run.registry import Job
from .run.status import RunStatus


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
    added: bool = False  # a schedule added at run time (runtime_schedules.py)
    schedule: str = ""
    timezone: str = ""
    arguments: str = ""  # the keyword arguments its runs pass, as one line of JSON
    groups: tuple[str, ...] = ()  # its concurrency groups (group=)
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
            "run_time": self.added,
            "schedule": self.schedule,
            "timezone": self.timezone,
            "arguments": self.arguments or None,
            "groups": list(self.groups),
            "next_slot": iso(self.next_slot),
            "first_seen": iso(self.first_seen),
            "last_run": None
            if last is None
            else {
                "status": last.status,
                "slot": iso(last.slot),
                "started_at": iso(last.started_at),
                "finished_at": iso(last.finished_at),
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
            "paused_until": iso(self.paused_until),
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
                    "requested_at": iso(r.requested_at),
                    "slot": iso(r.slot),
                    "kwargs": r.kwargs,
                }
                for r in self.requests
            ],
            "schedulers_alive": self.schedulers,
            "health": self.badge,
            "problems": self.problems,
        }


# A problem found: its kind, and the line that says it.
Problem = tuple[Health, str]


def judge(
    health: JobHealth,
    job: Job | None,
    now: dt.datetime,
    *,
    uses_schedulers: bool,
    skipped: bool = False,
) -> None:
    """Set the badge and one line per problem: the one definition of a job's health.
    ``skipped``: schedules are skipped here (SKIP_SCHEDULES): its slots are not run on
    purpose, and the one line that says so is the overview's."""
    found = [
        *_state_problems(health, job),
        *([] if skipped else _slot_problems(health, job, now, uses_schedulers=uses_schedulers)),
        *_request_problems(health, job),
        *_run_problems(health),
    ]
    health.problems = [f"{kind}: {text}" for kind, text in found]
    health.kinds = [kind for kind, _ in found]
    health.badge = _badge(health, job, found)


def _state_problems(health: JobHealth, job: Job | None) -> list[Problem]:
    """What its operator row, its pause and its lock say is wrong."""
    found: list[Problem] = []
    if health.misconfigured:
        said = f"{health.misconfigured}; its runs are not started until it is fixed"
        found.append((Health.MISCONFIGURED, said))
    if health.paused and health.paused_by == AUTO_PAUSER:
        found.append((Health.PAUSED_AFTER_FAILURES, health.pause_reason))
    if health.lock_state == LockState.STALE:
        found.append((Health.STALE_LOCK, "its holder's lease ran out and it was never released"))
    limit = job.warn_seconds if job is not None else None
    if running_long(health.running_for, health.median, warn_after=limit):
        if limit is not None:
            past = f"past its warn_after of {limit:g}s"
        else:
            factor = float(app_settings.RUNNING_LONG_FACTOR)
            past = f"{factor:g}x its median of {health.median:.1f}s"
        found.append((Health.RUNNING_LONG, f"running for {health.running_for:.0f}s, {past}"))
    return found


def _slot_problems(
    health: JobHealth, job: Job | None, now: dt.datetime, *, uses_schedulers: bool
) -> list[Problem]:
    """A slot that was not run: no scheduler serves it, it never ran, or it missed one."""
    unrun = None
    if job is not None and not health.paused and not health.misconfigured:
        unrun = unrun_slot(health, job, now)
    if unrun is not None and uses_schedulers and not health.served:
        return [
            (
                Health.UNSERVED,
                f"no live scheduler serves it, and no run for the slot of {when(unrun)}",
            )
        ]
    if unrun is not None and health.last_slot is None:
        seen = when(health.first_seen)
        return [(Health.NEVER_RAN, f"first seen {seen}, no run for the slot of {when(unrun)}")]
    if unrun is not None:
        return [(Health.MISSED, f"no run for the slot of {when(unrun)}")]
    if health.last_slot_status == RunStatus.MISSED and job is not None and not health.paused:
        return [(Health.MISSED, f"the slot of {when(health.last_slot)} was not run")]
    return []


def _request_problems(health: JobHealth, job: Job | None) -> list[Problem]:
    """A run now or backfill that waits, and no live scheduler serves the job."""
    if not (health.requests and job is not None and not health.served):
        return []
    first = health.requests[0]
    what = "run now" if first.slot is None else f"backfill of slot {when(first.slot)}"
    return [
        (
            Health.UNSERVED,
            f"{what} asked by {first.requested_by} at {when(first.requested_at)} waits, "
            "and no live scheduler serves it",
        )
    ]


def _run_problems(health: JobHealth) -> list[Problem]:
    """Its last run failed, or its last runs were interrupted."""
    found: list[Problem] = []
    last = health.last_run
    # An attempt that will be retried is not the slot's end: failing only after the last.
    if last is not None and last.status in RunStatus.failures() and last.retry_at is None:
        found.append(
            (
                Health.FAILING,
                f"its last run {RunStatus(last.status).label} at {when(last.finished_at)}",
            )
        )
    if _interrupted(health) and health.previous_status == RunStatus.INTERRUPTED:
        assert last is not None
        found.append(
            (
                Health.INTERRUPTED,
                f"its last {INTERRUPTED_IN_A_ROW} runs were interrupted, the last at "
                f"{when(last.finished_at)}",
            )
        )
    return found


def _interrupted(health: JobHealth) -> bool:
    """Its last run was interrupted."""
    last = health.last_run
    return last is not None and last.status == RunStatus.INTERRUPTED


def _badge(health: JobHealth, job: Job | None, found: list[Problem]) -> Health:
    """The badge: paused, else its first problem, else interrupted, never ran or ok."""
    if health.paused:
        return Health.PAUSED
    if found:
        return found[0][0]
    if _interrupted(health):
        return Health.INTERRUPTED
    if job is not None and job.schedule is not None and health.last_slot is None:
        return Health.NEVER_RAN
    return Health.OK


def unrun_slot(health: JobHealth, job: Job, now: dt.datetime) -> dt.datetime | None:
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


def iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def when(value: dt.datetime | None) -> str | None:
    """A time in a problem's line: to the second."""
    return value.isoformat(timespec="seconds") if value is not None else None

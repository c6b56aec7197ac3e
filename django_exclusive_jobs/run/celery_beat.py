"""Moving from django-celery-beat: its periodic tasks become run-time schedules.

``celery_beat_job()`` (in an app's ``jobs`` module) declares one job, ``celery_beat``,
that sends the Celery task its run's arguments name (``task``, ``args``, ``kwargs``,
``queue``), as ``schedule_celery_task`` does: once per slot, from the server that wins
it, with the slot in the headers. ``manage.py exclusive_jobs import-celery-beat``
reads django-celery-beat's ``PeriodicTask`` rows and adds one run-time schedule of that
job per task (``celery_beat:TASK NAME``), through the one door
(``runtime_schedules.add_schedule``), so staff keep editing them in the admin.

What is carried: crontab schedules (their time zone too), interval schedules (a second
or more), clocked ones (a minute's time: one slot), the arguments and queue, enabled,
the start time, and one-off (only the first slot from the start, then it ends). What
is not, and said so: solar schedules, expiry, exchange, routing key, priority and
headers. A task whose schedule already exists is left as it is (an import can be run
again). :func:`plan` decides, over rows read, without writing: ``--dry-run`` prints it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any

from .. import values
from ..lock.errors import LockConfigurationError
from . import runtime_schedules
from .celery_tasks import sender
from .decorator import exclusive_job
from .registry import Job, get_job
from .run_info import RunInfo
from .schedules import SCHEDULE_SEPARATOR
from .tasks import Enqueued

JOB = "celery_beat"
SECONDS = {"days": 86400, "hours": 3600, "minutes": 60, "seconds": 1, "microseconds": 1e-6}
# What a periodic task may say that a run-time schedule cannot carry, with its default.
NOT_CARRIED = {
    "expires": None, "expire_seconds": None, "exchange": None, "routing_key": None,
    "priority": None, "headers": "{}",
}  # fmt: skip


def celery_beat_job(name: str = JOB, *, app: Any = None, **options: Any) -> Job:
    """Declare the job whose run-time schedules each send a Celery task by name: their
    arguments say which (``task``), with what (``args``, ``kwargs``) and where
    (``queue``). ``app`` and every other argument as ``schedule_celery_task``'s, but
    no schedule (each run-time schedule has its own)."""

    def send_named(
        run: RunInfo,
        task: str,
        args: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        queue: str | None = None,
    ) -> Enqueued:
        return sender(task, app, list(args or []), queue)(run, **(kwargs or {}))

    send_named.__qualname__ = send_named.__name__ = "send_celery_task"
    exclusive_job(name, **options)(send_named)
    job = get_job(name)
    assert job is not None
    return job


@dataclass(frozen=True)
class Carried:
    """One periodic task as a run-time schedule: its key, settings, and what was left."""

    task: str  # the periodic task's name
    key: str
    settings: dict[str, Any]
    reason: str
    left_out: tuple[str, ...] = ()


@dataclass(frozen=True)
class NotCarried:
    task: str
    why: str


@dataclass
class Plan:
    carried: list[Carried] = field(default_factory=list)
    not_carried: list[NotCarried] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)  # already imported: left as is


def plan(
    tasks: list[Any], job: Job, now: dt.datetime, existing: set[str], first_slot: Callable[..., Any]
) -> Plan:
    """What an import does with ``tasks`` (``PeriodicTask`` rows, their schedules read
    with them), for ``job``, at ``now`` (the database's), given the names of the
    schedules ``existing``: each carried (checked by the door), not carried (why), or
    there already. ``first_slot(settings, from)``: the first slot of a schedule from then
    (for a one-off's end). No I/O."""
    decided = Plan()
    for task in tasks:
        try:
            carried = _carried(task, job, now, first_slot)
        except LockConfigurationError as exc:
            decided.not_carried.append(NotCarried(task.name, str(exc)))
            continue
        if f"{job.name}{SCHEDULE_SEPARATOR}{carried.key}" in existing:
            decided.existing.append(task.name)
        else:
            decided.carried.append(carried)
    return decided


def _carried(task: Any, job: Job, now: dt.datetime, first_slot: Callable[..., Any]) -> Carried:
    """``task`` as a run-time schedule of ``job`` (LockConfigurationError: why not)."""
    settings = {**_schedule(task), "kwargs": _arguments(task), "enabled": bool(task.enabled)}
    if task.start_time is not None:
        settings["starts_at"] = task.start_time
    if task.one_off or task.clocked_id is not None:
        starts = max(now, task.start_time or now)
        if task.clocked_id is not None:
            starts = max(starts, task.clocked.clocked_time)
        slot = first_slot(runtime_schedules.check(job, settings), starts)
        settings["starts_at"], settings["ends_at"] = starts, slot + dt.timedelta(seconds=1)
    runtime_schedules.check(job, settings)  # the one door, as add_schedule will
    key = runtime_schedules.name_of(job.name, task.name.replace(SCHEDULE_SEPARATOR, "-"))
    left = tuple(
        f"{key_name}={getattr(task, key_name)!r}"
        for key_name, default in NOT_CARRIED.items()
        if getattr(task, key_name, default) not in (default, None, "", "{}")
    )
    said = values.reason(f"imported from django-celery-beat: {task.description or task.name}")
    return Carried(task.name, key.partition(SCHEDULE_SEPARATOR)[2], settings, said, left)


def _schedule(task: Any) -> dict[str, Any]:
    """The run-time schedule's cron (and zone) or interval, from the task's schedule."""
    if task.crontab_id is not None:
        crontab = task.crontab
        fields = (crontab.minute, crontab.hour, crontab.day_of_month, crontab.month_of_year,
                  crontab.day_of_week)  # fmt: skip
        return {"cron": " ".join(str(part) for part in fields), "timezone": str(crontab.timezone)}
    if task.interval_id is not None:
        interval = task.interval
        return {"every": interval.every * SECONDS[interval.period]}
    if task.clocked_id is not None:
        moment = task.clocked.clocked_time.astimezone(dt.UTC)
        if moment.second or moment.microsecond:
            raise LockConfigurationError(
                f"clocked at {moment.isoformat()}: a run-time schedule's slots fall on a minute"
            )
        return {"cron": f"{moment.minute} {moment.hour} {moment.day} {moment.month} *",
                "timezone": "UTC"}  # fmt: skip
    if task.solar_id is not None:
        raise LockConfigurationError(
            f"a solar schedule ({task.solar}) is not carried: give it a cron in the admin"
        )
    raise LockConfigurationError("it has no schedule")


def spec_of(settings: dict[str, Any]) -> dict[str, Any]:
    """A run-time schedule's settings as a schedule's JSON (``overrides.describe``)."""
    if settings.get("cron"):
        return {"cron": settings["cron"], "timezone": settings.get("timezone") or "UTC"}
    return {"every": settings["every"]}


def _arguments(task: Any) -> dict[str, Any]:
    """What ``celery_beat``'s runs send: the task's name, arguments and queue."""
    try:
        args, kwargs = json.loads(task.args or "[]"), json.loads(task.kwargs or "{}")
    except ValueError as exc:
        raise LockConfigurationError(f"its arguments are not JSON: {exc}") from None
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise LockConfigurationError("its args are not a JSON list or its kwargs not an object")
    given: dict[str, Any] = {"task": task.task, "args": args, "kwargs": kwargs}
    if task.queue:
        given["queue"] = task.queue
    return given


def import_tasks(
    job_name: str, *, using: str, by: str, dry_run: bool = False, source: str | None = None
) -> Plan:
    """Read django-celery-beat's periodic tasks (from the database ``source``, default
    where Django's routers read them) and add each one it can carry as a run-time
    schedule of the declared ``job_name`` (none with ``dry_run``): the plan.
    LockConfigurationError if django-celery-beat is not installed or the job not
    declared."""
    from django.apps import apps  # django-celery-beat's models: only when importing
    from django.db import router

    from ..lock.clock import database_now
    from ..lock.retry import run_statement

    if not apps.is_installed("django_celery_beat"):
        raise LockConfigurationError(
            "django-celery-beat is not installed: add django_celery_beat to INSTALLED_APPS "
            "to read its periodic tasks."
        )
    job = runtime_schedules.declared(job_name)
    model = import_module("django_celery_beat.models").PeriodicTask
    rows = model.objects.using(source or router.db_for_read(model))
    rows = rows.select_related("crontab", "interval", "solar", "clocked").order_by("name")
    tasks = list(rows)
    existing = {row.name for row in runtime_schedules.list_schedules(job_name, using=using)}
    now = run_statement(using, lambda: database_now(using))
    decided = plan(tasks, job, now, existing, _first_slot)
    if not dry_run:
        for carried in decided.carried:
            runtime_schedules.add_schedule(
                job_name, carried.key, reason=carried.reason, by=by, using=using,
                **carried.settings,
            )  # fmt: skip
    return decided


def _first_slot(settings: dict[str, Any], moment: dt.datetime) -> dt.datetime:
    """The first slot of the schedule ``settings`` say at or after ``moment``."""
    from .schedules import make_schedule

    schedule = make_schedule(
        every=settings["every"], cron=settings["cron"] or None,
        timezone=settings["timezone"] or None,
    )  # fmt: skip
    assert schedule is not None
    return schedule.next_after(moment - dt.timedelta(microseconds=1))

"""Schedules added at run time: staff give a declared job more schedules, from the admin
or from Python, without a deploy: "this report, for this customer, every Monday at 8".

Each is a ``RunTimeSchedule`` row and runs as a job of its own, named ``JOB:KEY``: the
declared job's function and settings (its lease, timeout, overlap, catch-up, retries,
groups), with the row's schedule (``cron`` in its ``timezone``, or ``every``), its
arguments over the declared ones, and its window (``starts_at``, ``ends_at``). It has
its own lock, its own slots (each run once across servers, as a declared job's) and its
own history. Every value passes its one check (:func:`check`, the same doors as the
decorator's); each change is audited under the schedule's name, and wakes the
schedulers, which follow the rows at their next poll (or at once, listening).

Its slots count from when it was added, changed or switched back on (``starts_at``
if later): the job's ``JobState.schedule_since``, as for an override, so slots before
then are neither run nor missed. One that ends (``ends_at``) is no longer started; one
switched off (``enabled``) is not either. A row the scheduler cannot use (a function
whose parameters changed under its arguments, a row written by SQL) makes that
schedule misconfigured, never its scheduler.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction

from .. import values
from ..lock.acquire import prepare_locks
from ..lock.clock import DatabaseNow, database_now
from ..lock.errors import LockConfigurationError
from ..lock.retry import run_statement
from ..lock.validation import resolve_alias
from . import audit, overrides
from .arguments import check_kwargs
from .registry import Job, get_job
from .schedules import SCHEDULE_SEPARATOR, Schedule, make_schedule

if TYPE_CHECKING:
    from ..models import RunTimeSchedule, RunTimeScheduleQuerySet

# What a run-time schedule says; everything else is its declared job's.
SETTINGS = ("cron", "every", "timezone", "kwargs", "starts_at", "ends_at", "enabled")
# Those whose change starts its slots anew (its schedule comes in force then).
RESTARTS = ("cron", "every", "timezone", "starts_at", "enabled")


def check(job: Job, given: dict[str, Any]) -> dict[str, Any]:
    """``given`` (a run-time schedule of ``job``'s settings) checked, normalized as
    stored; LockConfigurationError, one line. ``cron=`` or ``every=`` (not both), the
    time zone a cron's, arguments that fit the function over the declared ones."""
    return _checked(job, given)[0]


def _checked(job: Job, given: dict[str, Any]) -> tuple[dict[str, Any], Schedule]:
    """:func:`check`'s settings, and the schedule it built from them (with the job's
    slot tolerance)."""
    unknown = sorted(set(given) - set(SETTINGS))
    if unknown:
        raise LockConfigurationError(f"A run-time schedule has no {', '.join(unknown)}.")
    cron, every = given.get("cron") or None, given.get("every")
    every = None if every in ("", None) else every
    if cron is None and every is None:
        raise LockConfigurationError("A run-time schedule needs cron= or every=.")
    tolerance = job.schedule.tolerance if job.schedule is not None else None
    zone = given.get("timezone") or None
    schedule = make_schedule(every=every, cron=cron, timezone=zone, tolerance=tolerance)
    spec = overrides.schedule_spec(schedule)
    assert spec is not None
    kwargs = given.get("kwargs") or {}
    if not isinstance(kwargs, dict):
        check_kwargs(job.func, kwargs, what="The arguments")  # says it is not a dict
    what = "The schedule's arguments (the declared kwargs updated by these)"
    check_kwargs(job.func, {**job.kwargs, **kwargs}, what=what)
    # A time without a zone is on the schedule's clock (its cron's zone, else the job's).
    clock = zoneinfo.ZoneInfo(spec["timezone"]) if "timezone" in spec else job.zone
    starts, ends = (_moment(given.get(key), key, clock) for key in ("starts_at", "ends_at"))
    if starts is not None and ends is not None and ends <= starts:
        raise LockConfigurationError("ends_at must be after starts_at.")
    enabled = given.get("enabled", True)
    if not isinstance(enabled, bool):
        raise LockConfigurationError(f"enabled must be True or False, not {enabled!r}.")
    checked = {
        "cron": spec.get("cron", ""),
        "timezone": spec.get("timezone") or "",
        "every": spec.get("every"),
        "kwargs": values.json_arguments(kwargs, what="The arguments"),
        "starts_at": starts,
        "ends_at": ends,
        "enabled": enabled,
    }
    assert schedule is not None
    return checked, schedule


def _moment(value: Any, what: str, zone: dt.tzinfo) -> dt.datetime | None:
    if value in (None, ""):
        return None
    return values.moment(value, what=what, zone=zone)


def declared(job: str) -> Job:
    """The declared job a schedule is added to (LockConfigurationError if none)."""
    found = get_job(job) if isinstance(job, str) else None
    if found is None:
        raise LockConfigurationError(
            f"No job named {values.printable(repr(job), limit=80)} is declared."
        )
    return found


def name_of(job: str, key: str) -> str:
    """The name the schedule ``key`` of ``job`` runs as: ``JOB:KEY`` (checked)."""
    key = values.name(key, what="Schedule key")
    if SCHEDULE_SEPARATOR in key:
        raise LockConfigurationError(f"Schedule key {key!r} must not contain ':'.")
    name = values.name(f"{job}{SCHEDULE_SEPARATOR}{key}", what="Schedule name")
    if get_job(name) is not None:
        raise LockConfigurationError(f"{name} is declared in the code: choose another key.")
    return name


def _who(by: str, reason: str) -> tuple[str, str]:
    return values.reason(by, what="by", required=True, limit=255), values.reason(reason)


def _rows(using: str) -> RunTimeScheduleQuerySet:
    from ..models import RunTimeSchedule  # models: not before apps are ready

    return RunTimeSchedule.objects.using(using)


def add_schedule(
    job: str,
    key: str,
    *,
    reason: str = "",
    by: str = "python",
    using: str | None = None,
    **settings: Any,
) -> RunTimeSchedule:
    """Add a schedule to the declared ``job``, running as ``JOB:KEY``: ``cron=`` (and
    ``timezone=``) or ``every=``, ``kwargs=`` over the declared ones, ``starts_at=``,
    ``ends_at=``, ``enabled=``. Checked first (LockConfigurationError: nothing written);
    audited; every running scheduler takes it at its next poll."""
    base = declared(job)
    name = name_of(job, key)
    checked = check(base, settings)
    by, reason = _who(by, reason)
    alias = resolve_alias(using if using is not None else base.using)
    stamp = {"changed_at": DatabaseNow(), "changed_by": by}

    def write() -> None:
        with transaction.atomic(using=alias):
            _rows(alias).create(
                name=name, job=job, key=key, reason=reason, created_at=DatabaseNow(),
                created_by=by, **stamp, **checked,
            )  # fmt: skip
            _restart(name, checked["starts_at"], alias)
            after = _said(checked)
            audit.record(name, _action("ADD"), by=by, reason=reason, after=after, using=alias)

    try:
        run_statement(alias, write)
    except IntegrityError:
        raise LockConfigurationError(f"A schedule named {name} exists already.") from None
    # Its lock row now, so that the first schedulers to take it never race to insert it
    # (which PostgreSQL would log as an error).
    prepare_locks([name], using=alias)
    return _found(name, alias)


def change_schedule(
    name: str, *, reason: str = "", by: str = "python", using: str | None = None, **changes: Any
) -> RunTimeSchedule:
    """Change the run-time schedule ``name``'s settings (those given; checked as when it
    was added); audited with before and after."""
    alias = resolve_alias(using)
    row = _found(name, alias)
    base = declared(row.job)
    before = settings_of(row)
    checked = check(base, {**before, **_other_kind(changes)})
    by, reason = _who(by, reason)
    changed = {key: value for key, value in checked.items() if value != before[key]}
    if not changed:
        return row

    def write() -> None:
        with transaction.atomic(using=alias):
            _rows(alias).filter(pk=row.pk).update(
                **changed, reason=reason or row.reason, changed_at=DatabaseNow(), changed_by=by
            )
            if set(changed) & set(RESTARTS):
                _restart(name, checked["starts_at"], alias)
            said = {key: before[key] for key in changed}
            audit.record(
                name, _action("CHANGE"), by=by, reason=reason, before=_said(said),
                after=_said(changed), using=alias,
            )  # fmt: skip

    run_statement(alias, write)
    return _found(name, alias)


def _other_kind(changes: dict[str, Any]) -> dict[str, Any]:
    """``changes``, where a cron replaces an interval and an interval a cron."""
    if changes.get("cron") and "every" not in changes:
        return {"every": None, **changes}
    if changes.get("every") not in (None, "") and "cron" not in changes:
        return {"cron": "", "timezone": "", **changes}
    return changes


def pause_schedule(name: str, **options: Any) -> RunTimeSchedule:
    """Switch the run-time schedule ``name`` off (``enabled=False``) until resumed."""
    return change_schedule(name, enabled=False, **options)


def resume_schedule(name: str, **options: Any) -> RunTimeSchedule:
    """Switch it on again: its slots count from now (those while off are not missed)."""
    return change_schedule(name, enabled=True, **options)


def delete_schedule(
    name: str, *, reason: str = "", by: str = "python", using: str | None = None
) -> bool:
    """Delete the run-time schedule ``name`` (False if there is none). Its history and
    lock rows stay; a run under way ends as it would."""
    alias = resolve_alias(using)
    by, reason = _who(by, reason)
    row = run_statement(alias, lambda: _rows(alias).named(name))
    if row is None:
        return False

    def write() -> None:
        with transaction.atomic(using=alias):
            if _rows(alias).filter(pk=row.pk).delete()[0]:
                before = _said(settings_of(row))
                audit.record(
                    name, _action("DELETE"), by=by, reason=reason, before=before, using=alias
                )

    run_statement(alias, write)
    return True


def list_schedules(job: str | None = None, *, using: str | None = None) -> list[RunTimeSchedule]:
    """The run-time schedules (of ``job``), by name (one query)."""
    alias = resolve_alias(using)
    rows = _rows(alias).all() if job is None else _rows(alias).of_jobs([job])
    return run_statement(alias, lambda: list(rows))


def _found(name: str, using: str) -> RunTimeSchedule:
    row = run_statement(using, lambda: _rows(using).named(name))
    if row is None:
        raise LockConfigurationError(f"No run-time schedule is named {values.printable(name)}.")
    return row


def _action(what: str) -> str:
    from ..models import JobChange  # models: not before apps are ready

    return str(getattr(JobChange.Action, f"{what}_SCHEDULE"))


def _restart(name: str, starts_at: dt.datetime | None, using: str) -> None:
    """In the write's transaction: the schedule's slots count from now, or from
    ``starts_at`` if later (``JobState.schedule_since``: earlier ones are quiet)."""
    from ..models import JobState  # models: not before apps are ready

    now = database_now(using)
    since = max(now, starts_at) if starts_at is not None else now
    JobState.objects.using(using).save_for(name, {"schedule_since": since, "schedule_before": {}})


def settings_of(row: RunTimeSchedule) -> dict[str, Any]:
    """A row's settings, as :func:`check` takes and returns them."""
    return {key: getattr(row, key) for key in SETTINGS}


def _said(settings: dict[str, Any]) -> dict[str, Any]:
    """Settings as the audit keeps them (JSON)."""
    return {
        key: value.isoformat() if isinstance(value, dt.datetime) else value
        for key, value in settings.items()
    }


def describe(row: RunTimeSchedule) -> str:
    """Its schedule in words: ``cron 0 8 * * 1 (Europe/Paris)``, ``every 2h``."""
    return overrides.describe("schedule", row.spec)


def job_of(row: RunTimeSchedule, base: Job) -> Job:
    """The job the row runs as; :class:`overrides.Misconfigured` if the row cannot be
    used (its values out of the door's bounds, arguments its function no longer takes)."""
    try:
        checked, schedule = _checked(base, settings_of(row))
    except (LockConfigurationError, TypeError, ValueError, ArithmeticError) as exc:
        raise overrides.Misconfigured(row.name, f"its run-time schedule: {exc}") from None
    return replace(
        base,
        name=row.name,
        schedule=schedule,
        kwargs={**base.kwargs, **checked["kwargs"]},
        starts_at=checked["starts_at"],
        ends_at=checked["ends_at"],
        added=True,
    )


def read(jobs: list[str], *, using: str) -> list[RunTimeSchedule]:
    """The schedules added to these jobs (one query): for a scheduler's poll."""
    rows = _rows(using).of_jobs(jobs)
    return run_statement(using, lambda: list(rows))


def in_force(rows: list[RunTimeSchedule], now: dt.datetime) -> list[RunTimeSchedule]:
    """The rows a scheduler serves at ``now``: switched on, not ended."""
    return [row for row in rows if row.enabled and (row.ends_at is None or row.ends_at > now)]


def jobs_of(
    rows: list[RunTimeSchedule], code: dict[str, Job], now: dt.datetime
) -> dict[str, tuple[Job, str]]:
    """Each row of a job in ``code`` as the job it runs as, with why none of its slots
    starts now ("" if they do): switched off, ended, or misconfigured (then the job is
    its declared job's, renamed, without a schedule). For the pages and the health view."""
    found = {}
    for row in rows:
        base = code.get(row.job)
        if base is None or row.name in code:
            continue
        try:
            job = overrides.tried(job_of(row, base), now)
        except overrides.Misconfigured as exc:
            found[row.name] = (replace(base, name=row.name, schedule=None, added=True), exc.reason)
            continue
        why = "" if in_force([row], now) else "ended" if row.enabled else "switched off"
        found[row.name] = (job, why)
    return found


def find_job(name: str, *, using: str) -> Job | None:
    """The job ``name`` runs as: declared, or a run-time schedule (one query)."""
    job = get_job(name)
    if job is not None:
        return job
    row = run_statement(using, lambda: _rows(using).named(name))
    base = get_job(row.job) if row is not None else None
    if row is None or base is None:
        return None
    return job_of(row, base)

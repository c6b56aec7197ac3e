"""Overrides: an operator changes a declared job's schedule, arguments, timeout or
overlap policy at run time, without a deploy, with a reason; and goes back to the code.

The code stays the source of truth. An override is a row (``JobState.override``) that
every start reads with the pause it already reads (``history.claim``: no extra
statement), and that a scheduler reads at its poll for requests (within
``REQUEST_POLL`` seconds). Beside it, ``JobState.code`` keeps what the declaration said
of each overridden setting at the time, so the jobs page shows the override as drift
from the code, and a later change of the code as well.

Missed-slot accounting follows the schedule in force at each slot: the first start
after a change records missed the slots of the schedule it replaced
(``JobState.schedule_before``) that no server ran before the change
(``JobState.schedule_since``), and the new schedule's slots count from the change on.
Slots already run are not run again: a slot is one row, whatever the schedule that made it.
``overlap="allow_all"`` takes a lock per slot: a job is not moved to or from it here
(that changes which locks its starts take; change it in the code).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from django.db import transaction

from ..lock.clock import DatabaseNow
from ..lock.errors import LockConfigurationError
from ..lock.retry import run_statement
from ..lock.validation import validate_timeout
from ..values import printable
from . import audit
from .catchup import OVERLAPS
from .policies import find_overlap
from .registry import Job
from .schedules import Cron, Every, Schedule, make_schedule

if TYPE_CHECKING:
    from ..models import JobState

SETTINGS = ("schedule", "kwargs", "timeout", "overlap")


def code_of(job: Job) -> dict[str, Any]:
    """What the code declares of each setting an operator may override, as JSON."""
    timeout = validate_timeout(job.timeout)
    return {
        "schedule": schedule_spec(job.schedule),
        "kwargs": job.kwargs,
        "timeout": timeout.total_seconds() if timeout is not None else None,
        "overlap": job.overlap.name,
    }


def schedule_spec(schedule: Schedule | None) -> dict[str, Any] | None:
    """A schedule as JSON: ``{"cron": ..., "timezone": ...}`` or ``{"every": seconds}``."""
    if isinstance(schedule, Cron):
        return {"cron": schedule.expression, "timezone": schedule.timezone}
    if isinstance(schedule, Every):
        return {"every": schedule.period.total_seconds()}
    return None


def make(spec: Any, tolerance: dt.timedelta | None) -> Schedule:
    """The schedule ``spec`` says (typed, or read from a row), with the job's slot
    tolerance; each value through its one check (``make_schedule``: values.duration,
    values.cron, values.zone), else LockConfigurationError."""
    keys = {"cron", "every", "timezone"}
    if not isinstance(spec, dict) or not spec.keys() <= keys or not spec.keys() - {"timezone"}:
        raise LockConfigurationError("A schedule is a cron expression or an interval.")
    built = make_schedule(
        every=spec.get("every"),  # seconds, as stored
        cron=spec.get("cron"),
        timezone=spec.get("timezone"),
        tolerance=tolerance,
    )
    assert built is not None
    return built


def describe(setting: str, value: Any) -> str:
    """One setting's value in words: ``cron 0 */2 * * * (Europe/Paris)``, ``every 2h``."""
    if setting == "schedule":
        if not value:
            return "no schedule"
        if "cron" in value:
            return f"cron {value['cron']} ({value['timezone']})"
        return f"every {_seconds(value['every'])}"
    if setting == "kwargs":
        return json.dumps(value, sort_keys=True, ensure_ascii=False) if value else "{}"
    if setting == "timeout":
        if value is not None:
            return _seconds(value)
        from ..conf import app_settings

        default = app_settings.TIMEOUT
        return "none" if default is None else f"the TIMEOUT setting's ({default})"
    return str(value)


def describe_all(override: dict[str, Any]) -> str:
    """Every overridden setting in words, in the order of :data:`SETTINGS`."""
    said = [_described(key, override[key]) for key in SETTINGS if key in override]
    return ", ".join(said)


def _seconds(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size:g}{unit}"
    return f"{seconds:g}s"


def check(job: Job, changes: dict[str, Any]) -> dict[str, Any]:
    """``changes`` (setting: value as JSON) checked against ``job`` as the decorator
    checks its arguments; the values normalized. LockConfigurationError, one line."""
    unknown = sorted(set(changes) - set(SETTINGS))
    if unknown:
        said = f"Only {', '.join(SETTINGS)} can be overridden, not {', '.join(unknown)}."
        raise LockConfigurationError(said)
    checked: dict[str, Any] = {}
    if "schedule" in changes:
        if job.schedule is None:
            raise LockConfigurationError(f"{job.name} has no schedule to override.")
        schedule = make(changes["schedule"], job.schedule.tolerance)
        checked["schedule"] = schedule_spec(schedule)
    if "kwargs" in changes:
        from .arguments import check_kwargs

        checked["kwargs"] = check_kwargs(job.func, changes["kwargs"], what="The arguments")
    if "timeout" in changes:
        limit = validate_timeout(changes["timeout"])
        checked["timeout"] = limit.total_seconds() if limit is not None else None
    if "overlap" in changes:
        overlap = changes["overlap"]
        if job.schedule is None:
            raise LockConfigurationError(f"{job.name} has no schedule: overlap does not apply.")
        policy = find_overlap(overlap)
        if policy is None:
            raise LockConfigurationError(f"overlap must be one of {', '.join(OVERLAPS)}.")
        if policy != job.overlap and not (
            policy.may_be_overridden and job.overlap.may_be_overridden
        ):
            raise LockConfigurationError(
                "overlap='allow_all' takes a lock per slot: move a job to or from it in the "
                "code, not here."
            )
        checked["overlap"] = overlap
    return checked


def apply(job: Job, override: dict[str, Any]) -> Job:
    """``job`` as ``override`` changes it (already checked by :func:`check`)."""
    if not override:
        return job
    changes: dict[str, Any] = {}
    if override.get("schedule") and job.schedule is not None:
        changes["schedule"] = make(override["schedule"], job.schedule.tolerance)
    if "kwargs" in override:  # a run's own arguments (run now) still win
        changes["kwargs"] = {**override["kwargs"], **job.given}
    if "timeout" in override:
        timeout = override["timeout"]
        changes["timeout"] = dt.timedelta(seconds=timeout) if timeout is not None else None
    overlap = find_overlap(override.get("overlap"))
    if overlap is not None and overlap.may_be_overridden and job.overlap.may_be_overridden:
        changes["overlap"] = overlap
    return replace(job, **changes)


class Misconfigured(LockConfigurationError):
    """A job's operator row cannot be used: its override holds a value out of range
    (written before the door checked it, by an older version or by SQL), or a schedule
    that cannot be computed. The job's problem, never its scheduler's: its runs are not
    started until the row is put right (Back to the code)."""

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, printable(reason, limit=300)
        super().__init__(f"{name} is misconfigured: {self.reason}")


def in_force(job: Job, state: JobState | None) -> Job:
    """``job`` as it runs now: its declaration, and over it the operators' override.
    :class:`Misconfigured` if the override cannot be used (see :func:`usable`)."""
    if state is None or not state.override:
        return job
    try:
        return apply(job, usable(job, state.override))
    except Misconfigured:
        raise
    except Exception as exc:  # any value the checks above missed: still the job's problem
        raise Misconfigured(job.name, f"its override cannot be applied ({_why(exc)})") from None


def usable(job: Job, override: Any) -> dict[str, Any]:
    """``override`` (a row's, read from the database) if every value in it is one the
    door lets in today (``values.py``: the same bounds), else :class:`Misconfigured`
    naming the first that is not. The schedule is built (:func:`make`: its values and
    its cron's fields), not walked: it is tried where it is computed (the scheduler, the
    pages), as that costs a walk of the cron expression."""
    from .. import values

    def bad(what: str, exc: Exception) -> Misconfigured:
        return Misconfigured(job.name, f"its override's {what}: {_why(exc)}")

    if not isinstance(override, dict):
        raise Misconfigured(job.name, "its override is not a JSON object")
    if override.get("schedule"):
        try:
            make(override["schedule"], None)
        except (LockConfigurationError, TypeError, ValueError) as exc:
            raise bad("schedule", exc) from None
    if override.get("timeout") is not None:
        try:
            values.duration(override["timeout"], what="timeout", positive=True)
        except (LockConfigurationError, TypeError, ValueError) as exc:
            raise bad("timeout", exc) from None
    if "kwargs" in override and not isinstance(override["kwargs"], dict):
        raise Misconfigured(job.name, "its override's arguments are not a JSON object")
    return override


def tried(job: Job, now: dt.datetime) -> Job:
    """``job`` (in force) if its schedule can be computed around ``now``: its slot, the
    next one, their starts. :class:`Misconfigured` otherwise (a cron expression with no
    slot, a date out of range)."""
    schedule = job.schedule
    if schedule is None:
        return job
    try:
        slot, _ = schedule.latest_at_or_before(now)
        job.start_of(slot)
        job.start_of(schedule.next_after(now))
        schedule.early_allowance(now)
    except Exception as exc:
        raise uncomputable(job.name, exc) from None
    return job


def uncomputable(name: str, exc: BaseException) -> Misconfigured:
    """``name`` is misconfigured: computing its schedule raised ``exc``."""
    return Misconfigured(name, f"its schedule cannot be computed ({_why(exc)})")


def _why(exc: BaseException) -> str:
    said = str(exc).rstrip(".")
    return said if isinstance(exc, LockConfigurationError) else f"{type(exc).__name__}: {said}"


def drift(job: Job | None, state: JobState) -> list[dict[str, str]]:
    """Each overridden setting: what is in force, what the code said when it was
    overridden, and what it says now (``changed``: the code moved since)."""
    now = code_of(job) if job is not None else {}
    override = state.override if isinstance(state.override, dict) else {}
    said = state.code if isinstance(state.code, dict) else {}
    found = []
    for setting in SETTINGS:
        if setting not in override:
            continue
        then = said.get(setting)
        found.append(
            {
                "setting": setting,
                "value": _described(setting, override[setting]),
                "code": _described(setting, now.get(setting, then)),
                "changed": "yes" if job is not None and now.get(setting) != then else "",
            }
        )
    return found


def _described(setting: str, value: Any) -> str:
    """:func:`describe`, or the value as JSON if it is none that describe knows (a row
    an older version or SQL wrote)."""
    try:
        return describe(setting, value)
    except Exception:
        return printable(json.dumps(value, sort_keys=True, default=str), limit=200)


def override(
    job: Job,
    changes: dict[str, Any],
    *,
    reason: str,
    by: str,
    using: str,
    expected: str | None = None,
) -> dict[str, Any]:
    """Override ``changes`` of ``job`` (checked first: LockConfigurationError) over what
    is overridden already; a setting given its code's value is no longer overridden.
    Recorded in the audit with before and after. Returns the override now in force.
    With ``expected`` (the :func:`version` a form was opened on), only over that state:
    else :class:`Stale`, and nothing is written."""
    from ..models import JobChange, JobState

    checked = check(job, changes)
    if expected is not None:
        _row(job.name, using)
    code = code_of(job)
    state = _state(job.name, using)
    before = dict(state.override) if state is not None else {}
    after = {**before, **checked}
    after = {key: value for key, value in after.items() if value != code[key]}
    said = {key: code[key] for key in after}
    values: dict[str, Any] = {
        "override": after,
        "code": said,
        "overridden_at": DatabaseNow(),
        "overridden_by": by[:255],
        "override_reason": reason,
    }
    if after.get("schedule") != before.get("schedule"):
        values["schedule_since"] = DatabaseNow()
        values["schedule_before"] = before.get("schedule") or code["schedule"]

    def write() -> None:
        with transaction.atomic(using=using):
            if expected is not None:
                _still(job.name, expected, using)
            JobState.objects.using(using).save_for(job.name, values)
            audit.record(
                job.name, JobChange.Action.OVERRIDE, by=by, reason=reason,
                before=before, after=after, using=using,
            )  # fmt: skip

    run_statement(using, write)
    return after


def back_to_code(
    job: Job, *, reason: str, by: str, using: str, expected: str | None = None
) -> bool:
    """Drop every override of ``job``: its code is in force again. False if none was.
    With ``expected``, only over the state a form was opened on (as :func:`override`)."""
    from ..models import JobChange, JobState

    state = _state(job.name, using)
    if state is None or not state.override:
        return False
    before = dict(state.override)
    values: dict[str, Any] = {
        "override": {},
        "code": {},
        "overridden_at": DatabaseNow(),
        "overridden_by": by[:255],
        "override_reason": reason,
    }
    if "schedule" in before:
        values["schedule_since"] = DatabaseNow()
        values["schedule_before"] = before["schedule"]

    def write() -> None:
        with transaction.atomic(using=using):
            if expected is not None:
                _still(job.name, expected, using)
            JobState.objects.using(using).change(state.pk, **values)
            audit.record(
                job.name, JobChange.Action.BACK_TO_CODE, by=by, reason=reason,
                before=before, after={}, using=using,
            )  # fmt: skip

    run_statement(using, write)
    return True


Stale = audit.Stale


def version(state: JobState | None) -> str:
    """What a form opened on ``state`` saves over: a digest of its override (what, when,
    who, why). Any change of the override since, or back to the code, changes it."""
    if state is None or (state.overridden_at is None and not state.override):
        return "none"  # never overridden: no row, or a row of a pause only
    when = state.overridden_at.isoformat() if state.overridden_at else None
    said = [state.override, when, state.overridden_by, state.override_reason]
    text = json.dumps(said, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def version_of(name: str, *, using: str) -> str:
    """:func:`version` of ``name``'s row now (one query)."""
    return version(_state(name, using))


def _row(name: str, using: str) -> None:
    """Make sure ``name`` has a row (an empty one changes nothing), so that a save can
    lock it: two first overrides at once then wait for each other."""
    from ..models import JobState

    run_statement(using, lambda: JobState.objects.using(using).ensure(name))


def _still(name: str, expected: str, using: str) -> None:
    """In the write's transaction: refuse (:class:`Stale`, nothing written) if ``name``'s
    override changed since ``expected`` (``audit.refuse_if_changed``)."""
    from ..models import JobChange

    def did(change: JobChange) -> str:
        if change.action == JobChange.Action.BACK_TO_CODE:
            return "put it back to the code"
        return f"overrode it ({describe_all(change.after)})"

    actions = [JobChange.Action.OVERRIDE, JobChange.Action.BACK_TO_CODE]
    audit.refuse_if_changed(name, expected, version=version, actions=actions, did=did, using=using)


def _state(name: str, using: str) -> JobState | None:
    from ..models import JobState

    return run_statement(using, lambda: JobState.objects.using(using).of(name))


def read(names: list[str], *, using: str) -> dict[str, JobState]:
    """The operators' rows of these jobs (one query): for a scheduler's poll."""
    from ..models import JobState

    rows = JobState.objects.using(using).of_jobs(names)
    return {row.name: row for row in run_statement(using, lambda: list(rows))}


def job_in_force(name: str, *, using: str, strict: bool = False) -> Job:
    """The declared job ``name`` as it runs now (one query). If its override cannot be
    used (:class:`Misconfigured`): the job as its code declares it, so that the forms
    that put it right (pause, override) start from there; ``strict``: Misconfigured
    (``exclusive_jobs next`` shows no slot that would not run)."""
    from .registry import get_job

    job = get_job(name)
    assert job is not None
    try:
        return in_force(job, _state(name, using))
    except Misconfigured:
        if strict:
            raise
        return job

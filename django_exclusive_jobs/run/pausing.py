"""Pausing a job, and resuming it: a ``JobState`` row every server honours.

Done by operators (``control.py``, whose ``pause`` and ``resume`` these are) and by a run
itself after its job's last failures (``pause_after=``, :func:`pause_after_failures`):
below the run, so the runner asks it without importing the operators' module.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import TYPE_CHECKING

from django.db import transaction

from ..lock.clock import DatabaseNow, database_now
from ..lock.errors import LockConfigurationError
from ..lock.retry import run_statement
from ..signals import job_paused
from . import audit
from .status import RunStatus

if TYPE_CHECKING:
    from ..models import JobChange, JobState


AUTO_PAUSER = "(exclusive_jobs)"  # who pauses a job after its failures (pause_after=)


def pause(
    name: str,
    *,
    by: str,
    using: str,
    reason: str = "",
    until: dt.datetime | None = None,
    expected: str | None = None,
) -> None:
    """Pause ``name`` on every server until :func:`resume`, or until ``until`` (database
    time: the pause then ends by itself, see ``models.pause_in_force``; one already past
    is refused), saying why. With ``expected`` (the :func:`pause_version` a form was
    opened on), only over that state: else ``overrides.Stale``, nothing written."""
    from ..models import JobChange, JobState  # models: not before apps are ready

    if until is not None:
        _not_past(until, using)
    if expected is not None:  # a row to lock (an empty one changes nothing)
        run_statement(using, lambda: JobState.objects.using(using).ensure(name))
    values = {
        "paused": True,
        "paused_at": DatabaseNow(),
        "paused_by": by[:255],
        "pause_reason": reason,
        "paused_until": until,
    }
    after = {"reason": reason, "until": until.isoformat() if until else None}

    def write() -> None:
        with transaction.atomic(using=using):
            if expected is not None:
                _pause_still(name, expected, using)
            JobState.objects.using(using).save_for(name, values)
            action = JobChange.Action.PAUSE
            audit.record(name, action, by=by, reason=reason, after=after, using=using)

    run_statement(using, write)


def pause_version(state: JobState | None) -> str:
    """What a pause form opened on ``state`` saves over: a digest of its pause and
    resume (what, when, who, why). Any pause or resume since changes it."""
    if state is None or (state.paused_at is None and state.resumed_at is None):
        return "none"
    said = [
        state.paused,
        *(moment and moment.isoformat() for moment in (state.paused_at, state.paused_until)),
        state.paused_by,
        state.pause_reason,
        state.resumed_at and state.resumed_at.isoformat(),
        state.resumed_by,
    ]
    text = json.dumps(said, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def pause_version_of(name: str, *, using: str) -> str:
    """:func:`pause_version` of ``name``'s row now (one query)."""
    from ..models import JobState  # models: not before apps are ready

    rows = JobState.objects.using(using)
    return pause_version(run_statement(using, lambda: rows.of(name)))


def _pause_still(name: str, expected: str, using: str) -> None:
    """In the write's transaction: refuse (``Stale``, nothing written) if ``name``'s pause
    changed since ``expected`` (``audit.refuse_if_changed``)."""
    from ..models import JobChange  # models: not before apps are ready

    def did(change: JobChange) -> str:
        return "paused it" if change.action == JobChange.Action.PAUSE else "resumed it"

    actions = [JobChange.Action.PAUSE, JobChange.Action.RESUME]
    audit.refuse_if_changed(
        name, expected, version=pause_version, actions=actions, did=did, using=using
    )


def _not_past(until: dt.datetime, using: str) -> None:
    """A pause's end must be to come (database time): one already past pauses nothing."""
    now = run_statement(using, lambda: database_now(using))
    if until <= now:
        raise LockConfigurationError(
            f"The pause's end {until.isoformat(timespec='seconds')} is past (database time "
            f"{now.isoformat(timespec='seconds')}): give a later one, or none to pause until "
            "resumed."
        )


def resume(name: str, *, by: str, using: str, reason: str = "") -> bool:
    """Let ``name`` run again from its next slot; the slots of the pause are not missed.
    False if it was not paused (a pause past its end is over already: nothing written)."""
    from ..models import JobChange, JobState  # models: not before apps are ready

    values = {"paused": False, "resumed_at": DatabaseNow(), "resumed_by": by[:255]}

    def write() -> bool:
        with transaction.atomic(using=using):
            done = JobState.objects.using(using).resume(name, **values)
            if done:
                audit.record(name, JobChange.Action.RESUME, by=by, reason=reason, using=using)
            return bool(done)

    return run_statement(using, write)


def pause_after_failures(name: str, failures: int, *, using: str) -> bool:
    """``pause_after=N``: pause ``name`` if its last ``failures`` runs failed (a slot's
    last attempt each). True if it paused it now: a health problem until resumed."""
    from ..models import JobRun, JobState  # models: not before apps are ready

    runs = JobRun.objects.using(using)
    last = run_statement(using, lambda: list(runs.last_slot_ends(name, failures)))
    failed = [run for run in last if run.status in RunStatus.failures()]
    if len(failed) < failures:
        return False
    if run_statement(using, JobState.objects.using(using).paused(name).exists):
        return False
    reason = f"its last {failures} runs failed (pause_after={failures})"
    pause(name, by=AUTO_PAUSER, using=using, reason=reason)
    job_paused.send(sender=name, name=name, reason=reason, by=AUTO_PAUSER)
    return True

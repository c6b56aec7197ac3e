"""What operators do: pause a job, resume it, ask for a run now or cancel that request,
and acknowledge a scheduler that is gone.

Pausing is a row in the database (``JobState``), so every server honours it: a start
of a paused job takes the lock, sees the pause, and skips (exit 0). Slots that pass
while a job is paused are neither run nor counted as missed.

A run asked for now is a ``RunRequest`` row; so is each slot of a backfill asked for in
the admin (its ``slot`` set). The command runs it at once, here; one
asked for in the admin is run by the next scheduler that polls (within seconds). The
run takes the job's lock like any other and marks the request taken in the same
decision, so two clicks give two runs and two schedulers never run one request twice.
A manual run is recorded with who asked and its arguments: those given with it update
the job's declared ``kwargs``, the given ones winning. A paused job still runs it. A
request no run has taken yet may be cancelled; the row keeps who cancelled it and when.

A stop is a ``RunRequest`` too (``stop_token``): the start of a newer slot of a job with
``overlap="cancel_other"`` asks the run holding that token to stop. Whatever runs it
takes the request and stops it: a scheduler at its next poll for requests (the same
query), a ``run_exclusive`` every :data:`STOP_POLL` seconds.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import transaction

from ..lock.clock import DatabaseNow, database_now
from ..lock.errors import LockConfigurationError
from ..lock.retry import run_statement
from . import audit
from .registry import get_job
from .runner import Run, RunResult
from .start import Start
from .status import RunStatus

if TYPE_CHECKING:
    from ..models import JobState, RunRequest, SchedulerQuerySet


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
    from ..models import JobChange, JobState

    if until is not None:
        _not_past(until, using)
    if expected is not None:  # a row to lock (an empty one changes nothing)
        run_statement(using, lambda: JobState.objects.using(using).get_or_create(name=name))
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
            JobState.objects.using(using).update_or_create(name=name, defaults=values)
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
    from ..models import JobState

    rows = JobState.objects.using(using).filter(name=name)
    return pause_version(run_statement(using, rows.first))


def _pause_still(name: str, expected: str, using: str) -> None:
    """In the write's transaction: refuse (``Stale``, nothing written) if ``name``'s pause
    changed since ``expected`` (``audit.refuse_if_changed``)."""
    from ..models import JobChange

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
    from ..models import JobChange

    values = {"paused": False, "resumed_at": DatabaseNow(), "resumed_by": by[:255]}

    def write() -> bool:
        with transaction.atomic(using=using):
            done = _paused(name, using).update(**values)
            if done:
                audit.record(name, JobChange.Action.RESUME, by=by, reason=reason, using=using)
            return bool(done)

    return run_statement(using, write)


def _paused(name: str, using: str) -> Any:
    """``name``'s row while paused now: a pause past its end is over (database time)."""
    from ..models import JobState, pause_in_force

    return JobState.objects.using(using).filter(pause_in_force(DatabaseNow()), name=name)


def pause_after_failures(name: str, failures: int, *, using: str) -> bool:
    """``pause_after=N``: pause ``name`` if its last ``failures`` runs failed (a slot's
    last attempt each). True if it paused it now: a health problem until resumed."""
    from ..models import JobRun
    from ..signals import job_paused

    runs = JobRun.objects.using(using).filter(name=name, retry_at__isnull=True)
    runs = runs.exclude(status__in=[RunStatus.RUNNING, *RunStatus.not_runs()])
    last = run_statement(using, lambda: list(runs.order_by("-started_at", "-id")[:failures]))
    failed = [run for run in last if run.status in RunStatus.failures()]
    if len(failed) < failures:
        return False
    if run_statement(using, _paused(name, using).exists):
        return False
    reason = f"its last {failures} runs failed (pause_after={failures})"
    pause(name, by=AUTO_PAUSER, using=using, reason=reason)
    job_paused.send(sender=name, name=name, reason=reason, by=AUTO_PAUSER)
    return True


def request_run(
    name: str,
    *,
    by: str,
    using: str,
    slot: dt.datetime | None = None,
    kwargs: dict[str, Any] | None = None,
) -> RunRequest:
    """Ask for one run of ``name`` outside its schedule (a scheduler will run it); with
    ``slot``, a backfill of that past slot (see ``run/backfill.py``); with ``kwargs``,
    run with them over the job's declared ones (checked here: LockConfigurationError)."""
    from ..models import JobChange, RunRequest

    given = _checked(name, kwargs)

    def write() -> RunRequest:
        with transaction.atomic(using=using):
            made = RunRequest.objects.using(using).create(
                name=name, requested_by=by[:255], requested_at=DatabaseNow(), slot=slot,
                kwargs=given,
            )  # fmt: skip
            if slot is None:  # a backfill records its range once (run/backfill.py)
                after = {"request": made.pk, "kwargs": given}
                audit.record(name, JobChange.Action.RUN_NOW, by=by, after=after, using=using)
            return made

    return run_statement(using, write)


def _checked(name: str, kwargs: object) -> dict[str, Any]:
    """The arguments a run of ``name`` is asked for with, checked before anything is
    written or locked (None: the declared ones; ``[]`` is refused, not taken for none)."""
    if kwargs is None:
        return {}
    job = get_job(name)
    assert job is not None
    return job.check_arguments(kwargs)


STOP_POLL = 2.0  # seconds between two looks for a stop, by a cancel_other run_exclusive


def ask_to_stop(name: str, *, token: int, by: str, using: str) -> bool:
    """Ask the run of ``name`` holding ``token`` to stop (once: False if it was asked)."""
    from ..models import RunRequest

    requests = RunRequest.objects.using(using)
    if run_statement(using, requests.filter(name=name, stop_token=token).exists):
        return False
    run_statement(
        using,
        lambda: requests.create(
            name=name, stop_token=token, requested_by=by[:255], requested_at=DatabaseNow()
        ),
    )
    return True


def find_stop(name: str, *, token: int, using: str) -> RunRequest | None:
    """The waiting stop asked of the run of ``name`` holding ``token``, if any."""
    from ..models import RunRequest

    waiting = RunRequest.objects.using(using).pending().filter(name=name, stop_token=token)
    return run_statement(using, waiting.first)


def take(request: RunRequest, *, by: str, using: str) -> bool:
    """Mark ``request`` taken by ``by``; False if another took (or cancelled) it first."""
    from ..models import RunRequest

    waiting = RunRequest.objects.using(using).pending().filter(pk=request.pk)
    values = {"taken_at": DatabaseNow(), "taken_by": by[:255]}
    return bool(run_statement(using, lambda: waiting.update(**values)))


def close_stops(name: str, *, below: int, using: str) -> None:
    """Stops asked of runs of ``name`` older than token ``below`` are moot: those runs
    have ended (the lock has a newer holder)."""
    from ..models import RunRequest

    moot = RunRequest.objects.using(using).pending().filter(name=name, stop_token__lt=below)
    values = {"taken_at": DatabaseNow(), "taken_by": "(the run had ended)"}
    run_statement(using, lambda: moot.update(**values))


def pending(names: list[str], *, using: str) -> list[RunRequest]:
    """Requests for these jobs that wait, runs and stops, in the order they are served
    (one query): as asked, but a job's backfill requests oldest slot first, wherever they
    stand (a backfill asked for later may reach further back)."""
    from ..models import RunRequest

    waiting = RunRequest.objects.using(using).pending().filter(name__in=names).order_by("id")
    requests = run_statement(using, lambda: list(waiting))
    backfills: dict[str, list[RunRequest]] = {}
    for request in requests:
        if request.slot is not None:
            backfills.setdefault(request.name, []).append(request)
    turns = {name: iter(sorted(slots, key=_slot)) for name, slots in backfills.items()}
    return [next(turns[r.name]) if r.slot is not None else r for r in requests]


def _slot(request: RunRequest) -> dt.datetime:
    assert request.slot is not None
    return request.slot


def cancel(request_id: int, *, by: str, using: str) -> bool:
    """Cancel a run request no run has taken yet; False if it was taken (or cancelled)
    first. A run that takes a request marks it taken in one conditional UPDATE, so a
    request is either run once or cancelled, never both."""
    from ..models import JobChange, RunRequest

    waiting = RunRequest.objects.using(using).pending().filter(pk=request_id)
    now = DatabaseNow()  # taken_at too: no run may take it from now on
    values = {"taken_at": now, "cancelled_at": now, "cancelled_by": by[:255]}

    def write() -> bool:
        with transaction.atomic(using=using):
            request = waiting.first()
            if request is None or not waiting.update(**values):
                return False
            before = {"request": request.pk, "slot": request.slot and request.slot.isoformat()}
            audit.record(request.name, JobChange.Action.CANCEL, by=by, before=before, using=using)
            return True

    return run_statement(using, write)


def acknowledge(schedulers: SchedulerQuerySet, *, by: str, using: str) -> int:
    """Acknowledge the gone ones among ``schedulers``: they are no problem from now on.
    Return how many."""
    from ..models import Scheduler

    # Ids first: MySQL refuses an UPDATE whose subquery reads the table it updates.
    gone = schedulers.using(using).unacknowledged().values_list("pk", flat=True)
    ids = run_statement(using, lambda: list(gone))
    rows = Scheduler.objects.using(using).filter(pk__in=ids, acknowledged_at__isnull=True)
    values = {"acknowledged_at": DatabaseNow(), "acknowledged_by": by[:255]}
    return run_statement(using, lambda: rows.update(**values))


def run_now(
    name: str,
    *,
    by: str,
    using: str,
    report: Callable[[str, bool], None] | None = None,
    kwargs: dict[str, Any] | None = None,
) -> RunResult:
    """Run ``name`` once now in this process, as a manual run asked for by ``by``; with
    ``kwargs``, over the job's declared ones (checked first: LockConfigurationError, and
    no lock is taken).

    No request row: nothing a scheduler could take first. If the lock is held, nothing
    runs (the result is SKIPPED). The job's timeout stops it, as under ``run_exclusive``.
    """
    given = _checked(name, kwargs)
    job = get_job(name)
    assert job is not None
    from .shutdown import stop_on_signals

    job = job.but(using=using).with_arguments(given)
    from ..models import JobChange

    audit.recorded(name, JobChange.Action.RUN_NOW, by=by, after={"kwargs": given}, using=using)
    run = Run(job, start=Start.run_now(by), report=report, supervised=True)
    with stop_on_signals(run.on_signal):
        return run.call()

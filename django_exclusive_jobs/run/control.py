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
from collections.abc import Callable
from typing import Any

from django.db import transaction

from ..lock.clock import DatabaseNow
from ..lock.retry import run_statement
from ..models import JobChange, RunRequest, Scheduler, SchedulerQuerySet
from . import audit
from .pausing import AUTO_PAUSER as AUTO_PAUSER
from .pausing import pause as pause
from .pausing import pause_after_failures as pause_after_failures
from .pausing import pause_version as pause_version
from .pausing import pause_version_of as pause_version_of
from .pausing import resume as resume
from .run_requests import STOP_POLL as STOP_POLL
from .run_requests import ask_to_stop as ask_to_stop
from .run_requests import close_stops as close_stops
from .run_requests import find_stop as find_stop
from .run_requests import take as take
from .runner import Run, RunResult
from .runtime_schedules import find_job
from .shutdown import stop_on_signals
from .start import Start


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
    given = _checked(name, kwargs, using)

    def write() -> RunRequest:
        with transaction.atomic(using=using):
            made = RunRequest.objects.using(using).ask(
                name=name, requested_by=by[:255], requested_at=DatabaseNow(), slot=slot,
                kwargs=given,
            )  # fmt: skip
            if slot is None:  # a backfill records its range once (run/backfill.py)
                after = {"request": made.pk, "kwargs": given}
                audit.record(name, JobChange.Action.RUN_NOW, by=by, after=after, using=using)
            return made

    return run_statement(using, write)


def _checked(name: str, kwargs: object, using: str) -> dict[str, Any]:
    """The arguments a run of ``name`` is asked for with, checked before anything is
    written or locked (None: the declared ones; ``[]`` is refused, not taken for none)."""
    if kwargs is None:
        return {}
    job = find_job(name, using=using)
    assert job is not None
    return job.check_arguments(kwargs)


def pending(names: list[str], *, using: str) -> list[RunRequest]:
    """Requests for these jobs that wait, runs and stops, in the order they are served
    (one query): as asked, but a job's backfill requests oldest slot first, wherever they
    stand (a backfill asked for later may reach further back)."""
    waiting = RunRequest.objects.using(using).waiting_for(names)
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
    requests = RunRequest.objects.using(using)
    now = DatabaseNow()  # taken_at too: no run may take it from now on
    values = {"taken_at": now, "cancelled_at": now, "cancelled_by": by[:255]}

    def write() -> bool:
        with transaction.atomic(using=using):
            request = requests.waiting(request_id).first()
            if request is None or not requests.take(request_id, **values):
                return False
            before = {"request": request.pk, "slot": request.slot and request.slot.isoformat()}
            audit.record(request.name, JobChange.Action.CANCEL, by=by, before=before, using=using)
            return True

    return run_statement(using, write)


def acknowledge(schedulers: SchedulerQuerySet, *, by: str, using: str) -> int:
    """Acknowledge the gone ones among ``schedulers``: they are no problem from now on.
    Return how many."""
    # Ids first: MySQL refuses an UPDATE whose subquery reads the table it updates.
    gone = schedulers.using(using).unacknowledged().values_list("pk", flat=True)
    ids = run_statement(using, lambda: list(gone))
    rows = Scheduler.objects.using(using)
    values = {"acknowledged_at": DatabaseNow(), "acknowledged_by": by[:255]}
    return run_statement(using, lambda: rows.acknowledge(ids, **values))


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
    given = _checked(name, kwargs, using)
    job = find_job(name, using=using)
    assert job is not None
    job = job.but(using=using).with_arguments(given)
    audit.recorded(name, JobChange.Action.RUN_NOW, by=by, after={"kwargs": given}, using=using)
    run = Run(job, start=Start.run_now(by), report=report, supervised=True)
    with stop_on_signals(run.on_signal):
        return run.call()

"""Run history: the ``JobRun`` row each run writes, and pruning old ones.

The unique (name, slot) row is what makes a scheduled slot run once: a server whose cron
fired late takes the free lock, finds the slot's row, and skips. It looks before it
writes, so the normal path never makes the database report a unique violation.
"""

from __future__ import annotations

import datetime as dt
import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, InterfaceError, OperationalError
from django.db.models import F

from ..lock.clock import DatabaseNow
from ..lock.errors import JobLockError, LockDatabaseError, LockLost
from ..lock.lock import Lock, process
from ..lock.retry import run_statement
from ..lock.validation import check_outside_transaction
from . import catchup
from .catchup import CatchUp
from .schedules import Schedule
from .status import RunStatus
from .tasks import Enqueued

if TYPE_CHECKING:
    from ..models import JobRun, JobRunQuerySet, RunRequest

logger = logging.getLogger("django_exclusive_jobs")

TRACEBACK_LIMIT = 16_000
PRUNE_BATCH = 1000


def _runs(alias: str) -> JobRunQuerySet:
    from ..models import JobRun  # on first use: a jobs module may be imported before models

    return JobRun.objects.using(alias)


@dataclass
class Claim:
    """What :func:`claim` found: a run row (ours or another's), its slot, missed slots."""

    run: JobRun | None  # None: nothing runs now; ``why`` says why
    slot: dt.datetime | None = None
    missed: list[dt.datetime] = field(default_factory=list)
    more: bool = False  # more missed slots to run after this one (catch_up="all")
    why: str = ""


def claim(
    lock: Lock,
    name: str,
    *,
    schedule: Schedule | None = None,
    catch_up: CatchUp | None = None,
    retry_failed: bool = False,
    request: RunRequest | None = None,
    requested_by: str = "",
    not_before: dt.datetime | None = None,
    kwargs: dict[str, Any] | None = None,
    start_of: Callable[[dt.datetime], dt.datetime] | None = None,
) -> Claim:
    """This run's row, or the run that already has its slot (:func:`is_ours` tells).

    First closes the job's runs abandoned by earlier holders (:func:`close_abandoned`).
    With a schedule, the slot comes from the lock's acquisition time on database time
    (or ``not_before``, the scheduler's due slot, when the lock came a little before it),
    and slots nobody ran since the job's latest recorded slot are recorded ``missed``.
    ``kwargs``: the arguments the run calls the job with, recorded on its row;
    ``start_of``: when each slot starts (its jitter), from which lateness is counted.
    """
    arguments = kwargs or {}
    close_abandoned(lock, name)
    if request is not None:  # run now: paused or not, outside the schedule
        return _take_request(lock, name, request, arguments)
    if requested_by:  # run now, here: paused or not, outside the schedule
        return Claim(_insert(lock, name, None, arguments, requested_by=requested_by))
    state = run_statement(lock.using, lambda: _states(lock.using).filter(name=name).first())
    if state is not None and state.paused:
        when = state.paused_at.isoformat(timespec="seconds") if state.paused_at else "?"
        return Claim(None, why=f"paused by {state.paused_by or '?'} since {when}")
    if schedule is None:
        return Claim(_insert(lock, name, None, arguments))
    if lock.acquired_at is None:
        raise LockLost(lock.name, lock.token, "the acquisition time is unknown")
    if not_before is None:
        now, current = lock.acquired_at, schedule.slot_at(lock.acquired_at)
    else:  # the scheduler's start: its due slot, never a coming one
        now = max(lock.acquired_at, not_before)
        current = schedule.latest_at_or_before(now)[0]
    runs = _runs(lock.using)
    # One indexed look-up: the current slot's row if any, else the newest before it.
    latest = run_statement(
        lock.using,
        lambda: runs.filter(name=name, slot__lte=current).order_by("-slot").first(),
    )
    if latest is not None and latest.slot == current:
        if retry_failed and latest.status in RunStatus.unsuccessful():
            return Claim(_retry(lock, latest), current)
        return Claim(latest, current)
    quiet = None
    if state is not None and state.paused_at and state.resumed_at:
        quiet = (state.paused_at, state.resumed_at)  # the last pause: not missed
    plan = catchup.plan(
        schedule,
        catch_up or CatchUp(),
        now,
        latest.slot if latest else None,
        paused=quiet,
        current=current,
        start_of=start_of,
    )
    record_missed(lock, name, plan.missed, arguments)
    if plan.run is None:
        late = plan.missed[-1].isoformat() if plan.missed else "?"
        policy = (catch_up or CatchUp()).policy
        why = f"slot {late} started too late (catch_up={policy}): recorded missed"
        if not plan.missed:
            why = "its slot fell in its last pause"
        return Claim(None, None, plan.missed, why=why)
    return Claim(_insert(lock, name, plan.run, arguments), plan.run, plan.missed, plan.more)


def _ours(lock: Lock) -> dict[str, Any]:
    return {
        "status": RunStatus.RUNNING,
        "host": process.host,
        "pid": process.pid,
        "instance": process.instance,
        "token": lock.token,
        "started_at": DatabaseNow(),
    }


def _states(alias: str) -> Any:
    from ..models import JobState

    return JobState.objects.using(alias)


def _take_request(lock: Lock, name: str, request: RunRequest, kwargs: dict[str, Any]) -> Claim:
    """Mark ``request`` taken by this run, unless another run took it first."""
    from ..models import RunRequest

    requests = RunRequest.objects.using(lock.using).filter(pk=request.pk)
    taken = run_statement(
        lock.using,
        lambda: requests.pending().update(taken_at=DatabaseNow(), taken_by=lock.holder),
    )
    if not taken:
        return Claim(None, why=f"run request {request.pk} was taken by another run")
    run = _insert(lock, name, None, kwargs, requested_by=request.requested_by)
    run_statement(lock.using, lambda: requests.update(run=run))
    return Claim(run)


def _insert(
    lock: Lock,
    name: str,
    slot: dt.datetime | None,
    kwargs: dict[str, Any],
    *,
    requested_by: str = "",
) -> JobRun:
    runs = _runs(lock.using)
    try:
        return run_statement(
            lock.using,
            lambda: runs.create(
                name=name, slot=slot, requested_by=requested_by, kwargs=kwargs, **_ours(lock)
            ),
        )
    except IntegrityError:
        # A retried insert whose first try committed, or a holder that lost its lease.
        found: JobRun = run_statement(lock.using, lambda: runs.get(name=name, slot=slot))
        return found


def record_missed(
    lock: Lock, name: str, slots: list[dt.datetime], kwargs: dict[str, Any] | None = None
) -> None:
    """One ``missed`` row per slot, written by the start that noticed them.

    Only the lock's holder writes them, so no other start records the same slots; a
    conflict (a run with another schedule) is ignored, never raised.
    """
    if not slots:
        return
    from ..models import JobRun

    noticed = lock.acquired_at  # database time
    assert noticed is not None
    why = (
        f"No server ran this slot before {lock.holder} started the job at "
        f"{noticed.isoformat(timespec='seconds')}."
    )
    rows = [
        JobRun(
            name=name,
            slot=slot,
            status=RunStatus.MISSED,
            host=process.host,
            pid=process.pid,
            instance=process.instance,
            token=lock.token,
            started_at=noticed,
            finished_at=noticed,
            error=why,
            kwargs=kwargs or {},
        )
        for slot in slots
    ]
    run_statement(lock.using, lambda: _runs(lock.using).bulk_create(rows, ignore_conflicts=True))


def is_ours(run: JobRun, lock: Lock) -> bool:
    """A running row with our token: only our own run can have it."""
    return bool(
        run.token == lock.token
        and run.instance == process.instance
        and run.status == RunStatus.RUNNING
    )


def _retry(lock: Lock, existing: JobRun) -> JobRun:
    """Take over a failed slot's row for this run (``retry_failed``)."""
    retryable = RunStatus.unsuccessful()
    run_statement(
        lock.using,
        lambda: (
            _runs(lock.using)
            .filter(pk=existing.pk, status__in=retryable)
            .update(
                attempt=F("attempt") + 1,
                finished_at=None,
                duration=None,
                error_type="",
                error="",
                returncode=None,
                **_ours(lock),
            )
        ),
    )
    run_statement(lock.using, existing.refresh_from_db)
    return existing


def close_abandoned(lock: Lock, name: str) -> None:
    """Mark this job's runs still 'running' under an older token as lost.

    Holding token N means every holder before it lost the lock: its server crashed, or
    it was paused or cut off and will find out itself. Without this a crashed run would
    stay 'running' for ever, and its slot could never be retried.
    """
    reason = (
        f"The lock was taken over by token {lock.token} after this run's lease ran "
        "out or it was force-released: its server crashed, or lost the lock."
    )
    closed = run_statement(
        lock.using,
        lambda: (
            _runs(lock.using)
            .filter(name=name, status=RunStatus.RUNNING, token__lt=lock.token)
            .update(
                status=RunStatus.LOST,
                finished_at=DatabaseNow(),
                error_type="LockLost",
                error=reason,
            )
        ),
    )
    if closed:
        logger.warning(
            "%s: %s earlier run(s) still marked running lost the lock; marked lost", name, closed
        )


def record_end(
    lock: Lock,
    run_id: int,
    *,
    status: str,
    duration: float,
    exception: BaseException | None,
    returncode: int | None,
    enqueued: Enqueued | None = None,
) -> Callable[[], None] | None:
    """Write how the run ended. When the database cannot be reached, log it and return
    what writes it later (with the end it had: ``started_at + duration``); else None.

    A run marked ``lost`` by a later holder meanwhile (which took it for a crash) gets
    its real end.
    """
    values: dict[str, Any] = {
        "status": status,
        "finished_at": DatabaseNow(),
        "duration": duration,
        "error_type": error_type(exception)[:255] if exception is not None else "",
        "error": bounded_traceback(exception) if exception is not None else "",
        "returncode": returncode,
        "task_result_id": enqueued.result_id if enqueued else "",
        "task_backend": enqueued.backend if enqueued else "",
    }
    runs = _runs(lock.using).filter(pk=run_id, token=lock.token)

    def write(values: dict[str, Any]) -> None:
        if not run_statement(lock.using, lambda: runs.running().update(**values)):
            # Marked lost by a later holder meanwhile: our end, keeping its reason unless
            # we have an error of our own.
            kept = {key: value for key, value in values.items() if value != ""}
            run_statement(lock.using, lambda: runs.filter(status=RunStatus.LOST).update(**kept))

    try:
        write(values)
    except LockDatabaseError as exc:
        if not _unreachable(exc):  # refused for good (bad data, say): retrying cannot help
            logger.error("could not record the end of run %s of %s: %s", run_id, lock.name, exc)
            return None
        logger.warning(
            "could not record the end of run %s of %s (written when the database answers "
            "again): %s",
            run_id,
            lock.name,
            exc,
        )
        later = {**values, "finished_at": F("started_at") + dt.timedelta(seconds=duration)}

        def write_later() -> None:
            try:
                write(later)
            except LockDatabaseError as again:
                if _unreachable(again):
                    raise  # still down: tried again at the next probe
                logger.error(
                    "could not record the end of run %s of %s: %s", run_id, lock.name, again
                )

        return write_later
    except JobLockError:
        logger.exception("could not record the end of run %s of %s", run_id, lock.name)
    return None


def _unreachable(exc: BaseException) -> bool:
    """The database did not answer (as opposed to refusing the statement)."""
    return isinstance(exc.__cause__, (OperationalError, InterfaceError))


def error_type(exc: BaseException) -> str:
    """The exception's class name (for a job run in a child process: the child's)."""
    return getattr(exc, "error_type", None) or type(exc).__qualname__


def bounded_traceback(exc: BaseException) -> str:
    """The exception and its traceback, cut in the middle if longer than the limit."""
    text = getattr(exc, "traceback_text", None) or "".join(
        traceback.format_exception(type(exc), exc, exc.__traceback__)
    )
    if len(text) <= TRACEBACK_LIMIT:
        return text
    head = TRACEBACK_LIMIT // 4
    cut = len(text) - TRACEBACK_LIMIT
    return f"{text[:head]}\n[... {cut} characters cut ...]\n{text[cut + head :]}"


def prune_runs(older_than: dt.timedelta, *, using: str, dry_run: bool = False) -> int:
    """Delete prunable runs (see ``JobRunQuerySet.prunable``); return how many."""
    check_outside_transaction(using)
    runs = _runs(using)
    if dry_run:
        return run_statement(using, lambda: runs.prunable(older_than).count())
    ids = run_statement(using, lambda: list(runs.prunable(older_than).values_list("id", flat=True)))
    deleted = 0
    for start in range(0, len(ids), PRUNE_BATCH):
        batch = ids[start : start + PRUNE_BATCH]
        deleted += run_statement(using, lambda: runs.filter(id__in=batch).delete()[0])  # noqa: B023
    return deleted

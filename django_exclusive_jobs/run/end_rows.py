"""How a run's end is written: its own end (:func:`record_end`, kept for later while the
database is down), and the ends of runs whose holder lost the lock (:func:`close_abandoned`),
with their retry when attempts are left."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import InterfaceError, OperationalError, connections

from ..lock.clock import DatabaseNow, plus_seconds_sql
from ..lock.errors import JobLockError, LockDatabaseError
from ..lock.lock import Lock, process
from ..lock.retry import run_statement
from ..logs import extra
from ..values import storable
from .retries import Retries
from .slot_locks import lock_name
from .status import RunStatus
from .tasks import Enqueued
from .tracebacks import bounded_traceback, error_type

if TYPE_CHECKING:
    from ..models import JobRun, JobRunQuerySet
    from ..models.statements import Where

logger = logging.getLogger("django_exclusive_jobs")


def runs_on(alias: str) -> JobRunQuerySet:
    """The run history on ``alias``."""
    from ..models import JobRun  # on first use: a jobs module may be imported before models

    return JobRun.objects.using(alias)


def is_ours(run: JobRun, lock: Lock) -> bool:
    """A running row with our token: only our own run can have it."""
    return bool(
        run.token == lock.token
        and run.instance == process.instance
        and run.status == RunStatus.RUNNING
    )


def abandoned_by_its_holder(run: JobRun, lock: Lock) -> bool:
    """Whether ``run``, as read, is one that :func:`close_abandoned` closes."""
    return run.status == RunStatus.RUNNING and (run.token or 0) < (lock.token or 0)


def abandoned_runs(name: str, lock: Lock) -> Where:
    """The job's runs still 'running' under a token older than ``lock``'s."""
    return [("name", "=", name), ("status", "=", RunStatus.RUNNING), ("token", "<", lock.token)]


def close_abandoned(
    lock: Lock,
    name: str,
    retry: Retries | None = None,
    *,
    slot: dt.datetime | None = None,
    side_by_side: bool = False,
) -> None:
    """Mark this job's runs still 'running' under an older token as lost.

    Holding token N means every holder before it lost the lock: its server crashed, or
    it was paused or cut off and will find out itself. Without this a crashed run would
    stay 'running' for ever, and its slot could never be retried. With attempts left
    (``retry``), a lost run gets its ``retry_at``, counted from now, so that whichever
    server comes first after it runs the slot again.

    ``side_by_side`` (``overlap="allow_all"``): ``lock`` is the lock of ``slot`` alone
    (None: the job's own, for runs with no slot), so only its runs are judged by token;
    the runs of other slots whose lock was left stale are closed too (lost, not retried:
    this newer start has begun).
    """
    reason = (
        f"The lock was taken over by token {lock.token} after this run's lease ran "
        "out or it was force-released: its server crashed, or lost the lock."
    )
    from ..models import JobRun, statements  # models: not before apps are ready

    where = list(abandoned_runs(name, lock))
    if side_by_side:
        where.append(("slot", "IS NULL", None) if slot is None else ("slot", "=", slot))
        _close_stale_slots(lock, name, slot)
    values = {
        "status": RunStatus.LOST,
        "finished_at": DatabaseNow(),
        "error_type": "LockLost",
        "error": reason,
    }
    closed = run_statement(lock.using, lambda: statements.update(JobRun, lock.using, values, where))
    if closed:
        logger.warning(
            "%s: %s earlier run(s) still marked running lost the lock; marked lost",
            name,
            closed,
            extra=extra("lost", job_name=name, token=lock.token),
        )
    if closed and retry is not None and retry.count and lock.acquired_at is not None:
        _retry_lost(lock, name, retry, lock.acquired_at, reason)


def _close_stale_slots(lock: Lock, name: str, current: dt.datetime | None) -> None:
    """``overlap="allow_all"``: runs of other slots of ``name`` whose slot lock is stale
    (its lease ran out under the run's own token, never released: its server died) are
    marked lost. One query, two more only when another slot is running."""
    from ..models import JobLock  # models: not before apps are ready

    running = run_statement(
        lock.using, lambda: runs_on(lock.using).other_slots_running(name, current)
    )
    if not running:
        return
    names = {lock_name(name, slot): (pk, token) for pk, slot, token in running if slot}
    locks = JobLock.objects.using(lock.using)
    found = run_statement(lock.using, lambda: locks.stale_tokens(names))
    lost = [names[held][0] for held, token in found if names[held][1] == token]
    if not lost:
        return
    reason = "Its slot's lock lease ran out while it ran: its server crashed, or lost the lock."
    run_statement(
        lock.using,
        lambda: runs_on(lock.using).mark_lost(lost, error=reason),
    )
    logger.warning(
        "%s: %s run(s) of other slots lost their slot's lock: marked lost",
        name,
        len(lost),
        extra=extra("lost", job_name=name),
    )


def _retry_lost(lock: Lock, name: str, retry: Retries, noticed: dt.datetime, reason: str) -> None:
    """Give the runs just marked lost their ``retry_at`` (rare: a crash was noticed)."""
    runs = runs_on(lock.using).lost_by(name, lock.token, reason)
    lost = run_statement(lock.using, runs.slots_attempts)
    for pk, slot, attempt in lost:
        retry_at = retry.retry_at(slot, attempt, noticed)
        if retry_at is not None:
            run_statement(
                lock.using,
                lambda: runs.set_retry(pk, retry_at),  # noqa: B023
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
    retry_at: dt.datetime | None = None,
) -> Callable[[], None] | None:
    """Write how the run ended (``retry_at``: when its slot's next attempt may start).
    When the database cannot be reached, log it and return what writes it later (with
    the end it had: ``started_at + duration``); else None.

    A run marked ``lost`` by a later holder meanwhile (which took it for a crash) gets
    its real end.
    """
    values: dict[str, Any] = {
        "status": status,
        "finished_at": DatabaseNow(),
        "duration": duration,
        # As the database takes them: a NUL or a lone surrogate must not leave the run's
        # end unwritten (the row would stay running, then be called lost).
        "error_type": storable(error_type(exception)[:255]) if exception is not None else "",
        "error": storable(bounded_traceback(exception)) if exception is not None else "",
        "returncode": returncode,
        "task_result_id": storable(enqueued.result_id) if enqueued else "",
        "task_backend": storable(enqueued.backend) if enqueued else "",
        "retry_at": retry_at,
    }
    try:
        _write_end(lock, run_id, values)
    except LockDatabaseError as exc:
        if not _unreachable(exc):  # refused for good (bad data, say): retrying cannot help
            _refused(lock, run_id, exc)
            return None
        logger.warning(
            "could not record the end of run %s of %s (written when the database answers "
            "again): %s",
            run_id,
            lock.name,
            exc,
            extra=extra("unrecorded", lock=lock.name, token=lock.token, status="later"),
        )
        return _write_later(lock, run_id, values, duration)
    except JobLockError:
        logger.exception(
            "could not record the end of run %s of %s",
            run_id,
            lock.name,
            extra=extra("unrecorded", lock=lock.name, token=lock.token, status="refused"),
        )
    return None


def _write_end(lock: Lock, run_id: int, values: dict[str, Any]) -> None:
    """Our running row gets ``values``; a row marked lost by a later holder meanwhile
    gets our end too, keeping its reason unless we have an error of our own."""
    from ..models import JobRun, statements  # models: not before apps are ready

    ours = [("pk", "=", run_id), ("token", "=", lock.token)]

    def update(values: dict[str, Any], status: str) -> int:
        where = [*ours, ("status", "=", status)]
        return statements.update(JobRun, lock.using, values, where)

    if not run_statement(lock.using, lambda: update(values, RunStatus.RUNNING)):
        kept = {key: value for key, value in values.items() if value != ""}
        run_statement(lock.using, lambda: update(kept, RunStatus.LOST))


def _write_later(
    lock: Lock, run_id: int, values: dict[str, Any], duration: float
) -> Callable[[], None]:
    """What writes the end once the database answers again, with the end the run had
    (``started_at + duration``), not the time it is written."""
    from ..models import JobRun, statements  # models: not before apps are ready

    connection = connections[lock.using]
    started_at = connection.ops.quote_name(str(JobRun._meta.get_field("started_at").column))
    ended = statements.Sql(plus_seconds_sql(connection.vendor, started_at), (duration,))
    later = {**values, "finished_at": ended}

    def write_later() -> None:
        try:
            _write_end(lock, run_id, later)
        except LockDatabaseError as again:
            if _unreachable(again):
                raise  # still down: tried again at the next probe
            _refused(lock, run_id, again)

    return write_later


def _refused(lock: Lock, run_id: int, exc: BaseException) -> None:
    logger.error(
        "could not record the end of run %s of %s: %s",
        run_id,
        lock.name,
        exc,
        extra=extra("unrecorded", lock=lock.name, token=lock.token, status="refused"),
    )


def _unreachable(exc: BaseException) -> bool:
    """The database did not answer (as opposed to refusing the statement)."""
    return isinstance(exc.__cause__, (OperationalError, InterfaceError))

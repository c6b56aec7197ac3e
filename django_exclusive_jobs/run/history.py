"""Run history: the ``JobRun`` row each run writes, and pruning old ones.

The unique (name, slot) row is what makes a scheduled slot run once: a server whose cron
fired late takes the free lock, finds the slot's row, and skips. It looks before it
writes, so the normal path never makes the database report a unique violation.
"""

from __future__ import annotations

import datetime as dt
import logging
import traceback
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError
from django.db.models import F

from ..lock.clock import DatabaseNow
from ..lock.errors import JobLockError
from ..lock.lock import Lock, process
from ..lock.retry import run_statement
from ..lock.validation import check_outside_transaction
from .status import RunStatus

if TYPE_CHECKING:
    from ..models import JobRun, JobRunQuerySet

logger = logging.getLogger("django_exclusive_jobs")

TRACEBACK_LIMIT = 16_000
PRUNE_BATCH = 1000


def _runs(alias: str) -> JobRunQuerySet:
    from ..models import JobRun  # on first use: a jobs module may be imported before models

    return JobRun.objects.using(alias)


def claim(lock: Lock, name: str, slot: dt.datetime | None, *, retry_failed: bool) -> JobRun:
    """This run's row, or another run that already has ``slot`` (:func:`is_ours` tells).

    First closes the job's runs abandoned by earlier holders (:func:`close_abandoned`).
    """
    runs = _runs(lock.using)
    close_abandoned(lock, name)
    ours: dict[str, Any] = {
        "status": RunStatus.RUNNING,
        "host": process.host,
        "pid": process.pid,
        "instance": process.instance,
        "token": lock.token,
        "started_at": DatabaseNow(),
    }
    if slot is not None:
        existing = run_statement(lock.using, lambda: runs.filter(name=name, slot=slot).first())
        if existing is not None:
            if retry_failed and existing.status in RunStatus.unsuccessful():
                return _retry(lock, existing, ours)
            return existing
    try:
        return run_statement(lock.using, lambda: runs.create(name=name, slot=slot, **ours))
    except IntegrityError:
        # A retried insert whose first try committed, or a holder that lost its lease.
        found: JobRun = runs.get(name=name, slot=slot)
        return found


def is_ours(run: JobRun, lock: Lock) -> bool:
    """A running row with our token: only our own run can have it."""
    return bool(
        run.token == lock.token
        and run.instance == process.instance
        and run.status == RunStatus.RUNNING
    )


def _retry(lock: Lock, existing: JobRun, ours: dict[str, Any]) -> JobRun:
    """Take over a failed slot's row for this run (``retry_failed``)."""
    retryable = RunStatus.unsuccessful()
    run_statement(
        lock.using,
        lambda: (
            _runs(lock.using)
            .filter(pk=existing.pk, status__in=retryable)
            .update(
                attempts=F("attempts") + 1,
                finished_at=None,
                duration=None,
                error_type="",
                error="",
                returncode=None,
                **ours,
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
) -> None:
    """Write how the run ended; an error is logged, never raised (the lock is released)."""
    values = {
        "status": status,
        "finished_at": DatabaseNow(),
        "duration": duration,
        "error_type": type(exception).__qualname__[:255] if exception is not None else "",
        "error": bounded_traceback(exception) if exception is not None else "",
        "returncode": returncode,
    }
    rows = _runs(lock.using).filter(pk=run_id, token=lock.token)
    try:
        run_statement(lock.using, lambda: rows.update(**values))
    except JobLockError:
        logger.exception("could not record the end of run %s of %s", run_id, lock.name)


def bounded_traceback(exc: BaseException) -> str:
    """The exception and its traceback, cut in the middle if longer than the limit."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
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

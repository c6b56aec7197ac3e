"""Pruning old runs: deleted in batches, each added to the run totals (``RunTotal``)
first, so that the metrics' counters never go down when history is pruned."""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING, Any

from django.db import transaction

from ..lock.clock import database_now
from ..lock.retry import run_statement
from ..lock.validation import check_outside_transaction
from .end_rows import runs_on
from .registry import all_jobs
from .slot_locks import prune

if TYPE_CHECKING:
    pass

logger = logging.getLogger("django_exclusive_jobs")

PRUNE_BATCH = 1000


def prune_runs(older_than: dt.timedelta, *, using: str, dry_run: bool = False) -> int:
    """Delete prunable runs (see ``JobRunQuerySet.prunable``); return how many. The free
    locks of slots taken before then (``overlap="allow_all"``) go too."""
    check_outside_transaction(using)
    runs = runs_on(using)
    if dry_run:
        return run_statement(using, lambda: runs.prunable(older_than).count())
    ids = run_statement(using, lambda: list(runs.prunable(older_than).values_list("id", flat=True)))
    deleted = 0
    for start in range(0, len(ids), PRUNE_BATCH):
        deleted += delete_runs(ids[start : start + PRUNE_BATCH], using=using)
    side_by_side = [job.name for job in all_jobs() if job.overlap.lock_per_slot]
    if side_by_side:
        before = run_statement(using, lambda: database_now(using)) - older_than
        locks = prune(side_by_side, before, using=using)
        logger.info("deleted %s free slot lock(s) taken before %s", locks, before.isoformat())
    return deleted


def delete_runs(ids: list[int], *, using: str) -> int:
    """Delete these runs, adding them to the run totals first (``RunTotal``), in one
    transaction; return how many were deleted. The metrics' counters count the totals
    and the rows kept, so they never go down when history is pruned."""
    from ..models import RunTotal  # models: not before apps are ready

    runs = runs_on(using)

    def delete() -> int:
        with transaction.atomic(using=using):
            # Lock the rows first: a second prune running at once waits, then finds them
            # gone, so no run is added to the totals twice.
            found = runs.lock_rows(ids)
            if not found:
                return 0
            gone = runs.rows(found)
            tallies = list(gone.tallies())
            add_to_totals(RunTotal.objects.using(using), tallies)
            return int(gone.delete()[0])

    return run_statement(using, delete)


def add_to_totals(totals: Any, tallies: list[dict[str, Any]]) -> None:
    """Add rows of ``JobRunQuerySet.tallies()`` to ``RunTotal`` (inside a transaction)."""
    from ..models import RunTotal  # models: not before apps are ready

    def key(t: dict[str, Any]) -> tuple[str, str, str, str]:
        return (t["job"], t["state"], t["duration_le"], t["lateness_le"])

    keys = sorted({key(t) for t in tallies})
    # Make the missing rows without an error (ON CONFLICT DO NOTHING), always in one order.
    new = [RunTotal(name=n, status=s, duration_bucket=d, lateness_bucket=b) for n, s, d, b in keys]
    totals.bulk_create(new, ignore_conflicts=True)
    found = totals.lock_rows(sorted({k[0] for k in keys}))
    rows = {(r.name, r.status, r.duration_bucket, r.lateness_bucket): r for r in found}
    touched = []
    for tally in tallies:
        row = rows[key(tally)]
        touched.append(row)
        row.count += tally["n"]
        row.duration_seconds += float(tally["duration_sum"] or 0)
        row.lateness_seconds += float(tally["lateness_sum"] or 0)
        last = tally["last"]
        if last is not None and (row.last_finished_at is None or last > row.last_finished_at):
            row.last_finished_at = last
    fields = ["count", "duration_seconds", "lateness_seconds", "last_finished_at"]
    totals.bulk_update(touched, fields)

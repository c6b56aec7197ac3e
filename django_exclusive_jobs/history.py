"""Run history upkeep: pruning old ``JobRun`` rows in batches."""

from __future__ import annotations

import datetime as dt

from .locks import check_outside_transaction, run_statement

BATCH = 1000


def prune_runs(older_than: dt.timedelta, *, using: str, dry_run: bool = False) -> int:
    """Delete prunable runs (see ``JobRunQuerySet.prunable``); return how many."""
    from .models import JobRun

    check_outside_transaction(using)
    runs = JobRun.objects.using(using)
    if dry_run:
        return run_statement(using, lambda: runs.prunable(older_than).count())
    ids = run_statement(using, lambda: list(runs.prunable(older_than).values_list("id", flat=True)))

    def delete(batch: list[int]) -> int:
        return run_statement(using, lambda: runs.filter(id__in=batch).delete()[0])

    return sum(delete(ids[start : start + BATCH]) for start in range(0, len(ids), BATCH))

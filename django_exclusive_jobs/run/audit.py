"""The audit: what operators did to each job, who, when, why, before and after.

Every override, back to the code, pause, resume, run now, backfill, cancelled request
and lock released by force writes one ``JobChange`` row, whichever way it was done (the
admin, ``manage.py exclusive_jobs``, ``exclusive_locks``). The admin also writes Django's
own admin log for what is done there. The job's page shows its changes, newest first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..lock.clock import DatabaseNow
from ..lock.retry import run_statement

if TYPE_CHECKING:
    from ..models import JobChange

SHOWN = 20  # the changes a job's page shows


def record(
    name: str,
    action: str,
    *,
    by: str,
    using: str,
    reason: str = "",
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> None:
    """One change (in the caller's transaction, if any: the caller retries)."""
    from ..models import JobChange

    JobChange.objects.using(using).create(
        name=name,
        at=DatabaseNow(),
        by=by[:255],
        action=action,
        reason=reason,
        before=before or {},
        after=after or {},
    )


def recorded(name: str, action: str, *, by: str, using: str, **fields: Any) -> None:
    """:func:`record`, retried as any other statement (on its own)."""
    run_statement(using, lambda: record(name, action, by=by, using=using, **fields))


def changes(name: str, *, using: str, limit: int = SHOWN) -> list[JobChange]:
    """The job's newest changes, newest first (one query)."""
    from ..models import JobChange

    rows = JobChange.objects.using(using).filter(name=name).order_by("-at", "-id")[:limit]
    return run_statement(using, lambda: list(rows))

"""The audit: what operators did to each job, who, when, why, before and after.

Every override, back to the code, pause, resume, run now, backfill, cancelled request
and lock released by force writes one ``JobChange`` row, whichever way it was done (the
admin, ``manage.py exclusive_jobs``, ``exclusive_locks``). The admin also writes Django's
own admin log for what is done there. The job's page shows its changes, newest first.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .. import values
from ..lock.errors import LockConfigurationError
from ..lock.retry import run_statement

if TYPE_CHECKING:
    from ..models import JobChange, JobState

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
    """One change (in the caller's transaction, if any: the caller retries): written by
    ``models.record_change``, which ``force_release`` on the tables' floor uses too."""
    from ..models import record_change  # models: not before the app registry is ready

    record_change(name, action, by=by, using=using, reason=reason, before=before, after=after)


def recorded(name: str, action: str, *, by: str, using: str, **fields: Any) -> None:
    """:func:`record`, retried as any other statement (on its own)."""
    run_statement(using, lambda: record(name, action, by=by, using=using, **fields))


def changes(name: str, *, using: str, limit: int = SHOWN) -> list[JobChange]:
    """The job's newest changes, newest first (one query)."""
    from ..models import JobChange  # models: not before apps are ready

    rows = JobChange.objects.using(using).newest_of(name, limit)
    return run_statement(using, lambda: list(rows))


class Stale(LockConfigurationError):
    """A form's save over a state that has changed since it was opened."""


def refuse_if_changed(
    name: str,
    expected: str,
    *,
    version: Callable[[JobState | None], str],
    actions: Sequence[str],
    did: Callable[[JobChange], str],
    using: str,
) -> None:
    """In the write's transaction: lock ``name``'s row (a write: SQLite too), then refuse
    (:class:`Stale`, nothing written) if its ``version`` is no longer ``expected``,
    saying who last did one of ``actions`` (``did``: what, in words), when and why."""
    from ..models import JobChange, JobState  # models: not before apps are ready

    rows = JobState.objects.using(using)
    rows.lock_row(name)  # the row's lock, until the transaction ends
    if version(rows.of(name)) == expected:
        return
    change = JobChange.objects.using(using).last_of(name, actions)
    said = "it changed"
    if change is not None:
        why = f": {change.reason}" if change.reason else ""
        at = change.at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        said = f"{change.by} {did(change)} at {at} UTC{why}"
    raise Stale(
        values.printable(
            f"Not saved: since this form was opened, {said}. Open it again to see what is "
            "in force now, then save your change over it.",
            limit=values.SHOWN_LENGTH,
        )
    )

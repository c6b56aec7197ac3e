"""Concurrency groups: ``group="db-maintenance"`` (or several names), and no two jobs of
a group run at the same time anywhere.

Each group is a lock of its own, ``group:NAME``, in the same table as the jobs' locks. A
member's run takes its groups' locks after its own lock, once its claim has decided
that it runs (a start that runs nothing never holds them: it cannot keep another member
out), all or none, and holds them with its own until it ends: renewed with it, released
with it, and ended by their lease when its server dies (kill -9), as its own lock is.

A start that finds a group held by another member's run does what its ``overlap`` says:
``"skip"`` records its slot skipped, naming that run; the others wait their turn (a cron
line here, looking again every :data:`LOOK` seconds; a scheduler by looking again then,
serving its other jobs meanwhile) and run after it. A look is one read of the groups'
locks; only when they are free does it start again (take its lock, claim its slot).
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from ..lock.acquire import acquire_or_raise
from ..lock.errors import JobLockError, LockHeld
from ..lock.lock import Lock
from ..lock.retry import run_statement
from ..lock.validation import resolve_alias
from ..logs import extra
from ..values import GROUP_PREFIX
from .registry import Job, all_jobs

logger = logging.getLogger("django_exclusive_jobs")
LOOK = 1.0  # seconds between two looks at a group another member's run holds


def lock_of(group: str) -> str:
    """The lock of ``group``."""
    return f"{GROUP_PREFIX}{group}"


@dataclass(frozen=True)
class Busy:
    """A group another member's run holds: which, and who runs in it (as far as the
    look found: the holder may not have written its run's row yet)."""

    group: str
    holder: str  # host:pid:instance
    member: str = ""  # the member whose run holds it
    slot: dt.datetime | None = None  # that run's slot
    until: dt.datetime | None = None  # the group's lease ends then unless renewed

    def _run(self) -> str:
        if not self.member:
            return f"a run by {self.holder or '?'}"
        slot = f" (slot {self.slot.isoformat()})" if self.slot else ""
        return f"the run of {self.member}{slot} by {self.holder or '?'}"

    @property
    def text(self) -> str:
        """What the row of a slot skipped for it says."""
        return f"Group {self.group}: {self._run()} was running."

    @property
    def why(self) -> str:
        """Why nothing runs now, in one line."""
        return f"group {self.group} is held: {self._run()} is running"


def take(job: Job) -> list[Lock] | Busy:
    """The locks of ``job``'s groups, all taken (in order of name, so that two members
    never each hold one the other needs); else none, and the first group held."""
    taken: list[Lock] = []
    for group in job.groups:
        try:
            lock = acquire_or_raise(
                lock_of(group), ttl=job.ttl, min_hold=0, wait=0, using=job.using, reentrant=False
            )
        except LockHeld as held:
            release(taken)
            return _busy(job, group, held)
        except BaseException:  # the database, a stop: none left held
            release(taken)
            raise
        taken.append(lock)
    return taken


def free(job: Job) -> bool:
    """Whether none of ``job``'s groups is held now: the one statement a start that
    waits its turn sends at each look, before it takes anything."""
    from ..models import JobLock  # models: not before apps are ready

    using = resolve_alias(job.using)
    held = JobLock.objects.using(using).named([lock_of(group) for group in job.groups]).held()
    return not run_statement(using, held.exists)


def release(locks: list[Lock]) -> None:
    """Free the groups' locks (their keep-alive stopped first). One that cannot be freed
    (the database does not answer) is said, and ends with its lease: the run's own
    lock is released all the same."""
    for lock in reversed(locks):
        lock.stop_keepalive()
        try:
            lock.release()
        except JobLockError as exc:
            logger.error(
                "could not release %s token=%s (its lease ends by itself within %s): %s",
                lock.name,
                lock.token,
                lock.ttl,
                exc,
                extra=extra("unrecorded", token=lock.token),
            )


def members(group: str) -> list[str]:
    """The declared jobs in ``group``."""
    return [job.name for job in all_jobs() if group in job.groups]


def _busy(job: Job, group: str, held: LockHeld) -> Busy:
    """``group`` as ``held`` found it, with the member whose run holds it: the running
    run of a member made by the group's holder (one look)."""
    from ..models import JobRun  # models: not before apps are ready

    using = resolve_alias(job.using)
    names = [name for name in members(group) if name != job.name]
    runs = JobRun.objects.using(using).running().filter(name__in=names)
    found = run_statement(using, lambda: list(runs.order_by("-started_at")))
    run = next((run for run in found if run.holder == held.holder), None)
    if run is None:
        return Busy(group, held.holder, until=held.expires_at)
    return Busy(group, held.holder, run.name, run.slot, held.expires_at)

"""The lock table: ``JobLock``, the one definition of each lock state (:class:`LockState`,
:func:`lock_states`, judged on the database's clock) and of "running long"."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import ClassVar

from django.db import models, transaction
from django.db.models import Case, OuterRef, Q, Subquery, Value, When
from django.utils.translation import gettext_lazy as _

from ..conf import app_settings
from ..lock.clock import DatabaseNow
from ..naming import SEPARATOR, holder_name, job_of
from ..run.status import RunStatus
from .fields import JobNameField
from .jobs import JobChange, record_change
from .runs import JobRun


class LockState(models.TextChoices):
    """A lock's state on the database's clock: ``held``, ``cooldown`` (released, kept
    closed for ``min_hold``), ``stale`` (lease ran out, never released) or ``free``."""

    HELD = "held", _("held")
    COOLDOWN = "cooldown", _("cooldown")
    STALE = "stale", _("stale")
    FREE = "free", _("free")


def lock_states() -> dict[LockState, Q]:
    """The one definition of each lock state, as a filter on database time."""
    now = DatabaseNow()
    return {
        LockState.HELD: Q(released_at__isnull=True, expires_at__gt=now),
        LockState.COOLDOWN: Q(released_at__isnull=False, expires_at__gt=now),
        LockState.STALE: Q(released_at__isnull=True, expires_at__lte=now),
        LockState.FREE: Q(expires_at__isnull=True)
        | Q(released_at__isnull=False, expires_at__lte=now),
    }


def running_long(
    running_for: float | None,
    median: float | None,
    factor: float | None = None,
    warn_after: float | None = None,
) -> bool:
    """The one rule for "running long": a run has lasted its job's ``warn_after``
    (seconds) if it has one, else over ``factor`` (the setting ``RUNNING_LONG_FACTOR``)
    times its job's median duration (:meth:`JobRunQuerySet.medians`). Shown to people,
    never acted on."""
    if running_for is None:
        return False
    if warn_after is not None:
        return running_for >= warn_after
    factor = float(app_settings.RUNNING_LONG_FACTOR if factor is None else factor)
    return bool(median) and running_for > factor * (median or 0)


class JobLockQuerySet(models.QuerySet["JobLock"]):
    """Locks by state, each computed on the database's clock (:func:`lock_states`)."""

    def held(self) -> JobLockQuerySet:
        """Locks a running holder has and whose lease has not run out."""
        return self.filter(lock_states()[LockState.HELD])

    def stale(self) -> JobLockQuerySet:
        """Locks whose holder never released them and whose lease has run out."""
        return self.filter(lock_states()[LockState.STALE])

    def cooldown(self) -> JobLockQuerySet:
        """Locks released by their holder but kept closed until ``min_hold`` ends."""
        return self.filter(lock_states()[LockState.COOLDOWN])

    def free(self) -> JobLockQuerySet:
        """Locks anyone may take now: released and past ``min_hold``, or never held."""
        return self.filter(lock_states()[LockState.FREE])

    def not_held(self) -> JobLockQuerySet:
        """Every lock but the held ones (what an operator may free without --live)."""
        return self.exclude(lock_states()[LockState.HELD])

    def closed(self) -> JobLockQuerySet:
        """Locks nobody else may take now (held or in cooldown)."""
        states = lock_states()
        return self.filter(states[LockState.HELD] | states[LockState.COOLDOWN])

    def named(self, names: list[str]) -> JobLockQuerySet:
        """The locks of these names."""
        return self.filter(name__in=names)

    def rows(self, pks: list[int]) -> JobLockQuerySet:
        """The locks whose ids are ``pks``."""
        return self.filter(pk__in=pks)

    def row(self, pk: int) -> JobLockQuerySet:
        """The lock whose id is ``pk``."""
        return self.filter(pk=pk)

    def state_of(self, name: str) -> JobLock | None:
        """The lock ``name`` with its state (:meth:`with_state`), or None (one query)."""
        return self.with_state().filter(name=name).first()

    def listed(self, *, stale: bool) -> JobLockQuerySet:
        """Every lock (or only the stale ones) with its state, by name: the list."""
        return (self.stale() if stale else self.all()).with_state().order_by("name")

    def stale_tokens(self, names: Iterable[str]) -> list[tuple[str, int]]:
        """(name, token) of the stale locks among these names (one query)."""
        stale = self.filter(lock_states()[LockState.STALE])
        return list(stale.filter(name__in=names).values_list("name", "token"))

    def lock_row(self, name: str) -> None:
        """Lock the row of the lock ``name`` until the transaction ends (a locking read)."""
        list(self.select_for_update().filter(name=name).values("pk"))

    def old_slot_locks(self, names: list[str], before: dt.datetime) -> JobLockQuerySet:
        """The slot locks (``NAME@SLOT``) of the jobs ``names`` that were taken before
        ``before`` and are released or past their lease: what pruning deletes."""
        ours = Q()
        for name in names:
            ours |= Q(name__startswith=f"{name}{SEPARATOR}")
        free = Q(released_at__isnull=False) | Q(expires_at__lt=DatabaseNow())
        return self.filter(ours, free, acquired_at__lt=before)

    def with_state(self) -> JobLockQuerySet:
        """Annotate ``state`` (a :class:`LockState` value) and ``db_now``."""
        whens = [When(q, then=Value(state)) for state, q in lock_states().items()]
        return self.annotate(
            state=Case(*whens, default=Value(LockState.FREE), output_field=models.CharField()),
            db_now=DatabaseNow(),
        )

    def with_runs(self) -> JobLockQuerySet:
        """Annotate, from run history: ``run_started_at`` (the start of the run the lock's
        current token belongs to, while it is ``running``), ``last_run_id`` (the job's
        latest run: a ``missed``, ``skipped`` or ``paused`` slot is no run),
        ``previous_status`` (the status of the run before it) and
        ``last_slot_id`` (the newest attempt of its latest slot: a backfill's, say)."""
        runs = JobRun.objects.filter(name=OuterRef("name"))
        latest = runs.exclude(status__in=RunStatus.not_runs())
        latest = latest.order_by("-started_at", "-id")
        current = runs.running().filter(token=OuterRef("token"))
        return self.annotate(
            run_started_at=Subquery(current.values("started_at")[:1]),
            last_run_id=Subquery(latest.values("id")[:1]),
            previous_status=Subquery(latest.values("status")[1:2]),
            last_slot_id=Subquery(
                runs.filter(slot__isnull=False).order_by("-slot", "-attempt").values("id")[:1]
            ),
        )

    def running_long(
        self, factor: float | None = None, warn_after: Mapping[str, float] | None = None
    ) -> JobLockQuerySet:
        """Held locks whose current run is running long (:func:`running_long`);
        ``warn_after``: each job's that has one, in seconds, by name."""
        medians = JobRun.objects.using(self.db).medians()
        held = self.held().with_state().with_runs()
        limits = warn_after or {}
        names = [
            lock.name
            for lock in held
            if running_long(lock.running_for, medians.get(lock.name), factor, limits.get(lock.name))
        ]
        return self.filter(name__in=names)

    def force_release(self, by: str = "") -> int:
        """Free these locks now, whoever holds them; return how many changed. With ``by``
        (an operator), each lock freed is recorded in the audit under its job's name.

        The row keeps its token but is marked released, so the old holder's next renew
        or ``ensure_held()`` raises ``LockLost`` and the next acquisition takes a
        higher token.
        """
        now = DatabaseNow()
        freed = self.exclude(lock_states()[LockState.FREE])
        if not by:
            return freed.update(released_at=now, expires_at=now)
        count = 0
        for pk, name, token, host, pid in list(
            freed.values_list("pk", "name", "token", "host", "pid")
        ):
            # One lock at a time, each released and recorded together: exactly the locks
            # this call freed (one taken meanwhile is left to the caller's filter).
            with transaction.atomic(using=self.db):
                if freed.filter(pk=pk).update(released_at=now, expires_at=now):
                    count += 1
                    before = {"token": token, "holder": f"{host}:{pid}" if host else ""}
                    record_change(
                        job_of(name), JobChange.Action.FORCE_RELEASE, by=by, before=before,
                        after={"lock": name}, using=self.db,
                    )  # fmt: skip
        return count


class JobLock(models.Model):
    """The lock for one job name.

    The row is kept when the lock is released (``released_at`` set) so that the fencing
    ``token`` keeps growing across releases, takeovers and manual clears.
    """

    name = JobNameField(_("name"), max_length=255, unique=True)
    token = models.BigIntegerField(
        _("token"),
        default=0,
        help_text=_("Grows by one at every acquisition; never reused."),
    )
    host = models.CharField(_("host"), max_length=255, blank=True)
    pid = models.IntegerField(_("process id"), null=True, blank=True)
    instance = models.CharField(
        _("instance"),
        max_length=32,
        blank=True,
        help_text=_("Random id of the holding process; tells apart processes with one pid."),
    )
    thread = models.BigIntegerField(_("thread id"), null=True, blank=True)
    acquired_at = models.DateTimeField(_("acquired at"), null=True, blank=True)
    expires_at = models.DateTimeField(_("lease expires at"), null=True, blank=True)
    released_at = models.DateTimeField(_("released at"), null=True, blank=True)
    created_at = models.DateTimeField(
        _("first seen"),
        db_default=DatabaseNow(),
        help_text=_(
            "When this database first saw the job: migrate, a scheduler's start, its first "
            "run or the first look of the health overview made this row."
        ),
    )

    objects: ClassVar[JobLockQuerySet] = JobLockQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        verbose_name = _("job lock")
        verbose_name_plural = _("job locks")
        ordering = ["name"]

    def __str__(self) -> str:
        return str(self.name)

    @property
    def holder(self) -> str:
        """Who holds (or last held) the lock: ``host:pid:instance``."""
        return holder_name(self.host, self.pid, self.instance)

    @property
    def running_for(self) -> float | None:
        """Seconds its current run has lasted, on database time (a lock read with
        ``with_state().with_runs()`` that is held; else None)."""
        started = getattr(self, "run_started_at", None)
        if started is None or getattr(self, "state", None) != LockState.HELD:
            return None
        return float((self.db_now - started).total_seconds())  # type: ignore[attr-defined]

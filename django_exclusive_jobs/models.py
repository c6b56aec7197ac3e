"""The lock table. One row per job name; the unique name is what servers race for."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import models
from django.db.models import Case, Q, Value, When
from django.utils.translation import gettext_lazy as _

from .dbtime import DatabaseNow


class JobNameField(models.CharField):  # type: ignore[type-arg]
    """A job name: case-sensitive and byte-exact on every backend.

    MySQL/MariaDB compare strings case-insensitively by default, so ``Report`` and
    ``report`` would fight over one row there but not on PostgreSQL or SQLite.
    """

    def db_type(self, connection: Any) -> str | None:
        if connection.vendor == "mysql":
            return f"varchar({self.max_length}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
        return super().db_type(connection)


class LockState(models.TextChoices):
    HELD = "held", _("held")
    COOLDOWN = "cooldown", _("released, kept for min_hold")
    STALE = "stale", _("expired, not released")
    FREE = "free", _("free")


class JobLockQuerySet(models.QuerySet["JobLock"]):
    """Filters whose meaning is computed on the database's clock."""

    def held(self) -> JobLockQuerySet:
        """Locks a running holder has and whose lease has not run out."""
        return self.filter(released_at__isnull=True, expires_at__gt=DatabaseNow())

    def stale(self) -> JobLockQuerySet:
        """Locks whose holder never released them and whose lease has run out."""
        return self.filter(released_at__isnull=True, expires_at__lte=DatabaseNow())

    def cooldown(self) -> JobLockQuerySet:
        """Locks released by their holder but kept closed until ``min_hold`` ends."""
        return self.filter(released_at__isnull=False, expires_at__gt=DatabaseNow())

    def free(self) -> JobLockQuerySet:
        """Locks anyone may take now: released and past ``min_hold``, or never held."""
        return self.filter(
            Q(expires_at__isnull=True) | Q(released_at__isnull=False, expires_at__lte=DatabaseNow())
        )

    def closed(self) -> JobLockQuerySet:
        """Locks nobody else may take now (held or in cooldown)."""
        return self.filter(expires_at__gt=DatabaseNow())

    def with_state(self) -> JobLockQuerySet:
        """Annotate ``state`` (a :class:`LockState` value) computed on database time."""
        now = DatabaseNow()
        return self.annotate(
            state=Case(
                When(released_at__isnull=True, expires_at__gt=now, then=Value(LockState.HELD)),
                When(released_at__isnull=False, expires_at__gt=now, then=Value(LockState.COOLDOWN)),
                When(
                    released_at__isnull=True, expires_at__isnull=False, then=Value(LockState.STALE)
                ),
                default=Value(LockState.FREE),
                output_field=models.CharField(),
            )
        )

    def force_release(self) -> int:
        """Free these locks now, whoever holds them; return how many changed.

        The row keeps its token but is marked released, so the old holder's next renew
        or ``ensure_held()`` raises ``LockLost`` and the next acquisition takes a
        higher token.
        """
        now = DatabaseNow()
        not_free = Q(released_at__isnull=True, expires_at__isnull=False) | Q(expires_at__gt=now)
        return self.filter(not_free).update(released_at=now, expires_at=now)


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

    objects: ClassVar[JobLockQuerySet] = JobLockQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        verbose_name = _("job lock")
        verbose_name_plural = _("job locks")
        ordering = ["name"]

    def __str__(self) -> str:
        return str(self.name)

    @property
    def owner(self) -> str:
        """Who holds (or last held) the lock: ``host:pid:instance``."""
        if not self.instance:
            return ""
        return f"{self.host}:{self.pid}:{self.instance[:8]}"

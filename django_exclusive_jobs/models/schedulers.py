"""The schedulers' heartbeats: ``Scheduler``, and the one definition of each scheduler
state (:class:`SchedulerState`, :func:`scheduler_states`) on the database's clock."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from django.db import models
from django.db.models import Case, Exists, OuterRef, Q, Value, When
from django.utils.translation import gettext_lazy as _

from ..lock.clock import now_plus


class SchedulerState(models.TextChoices):
    """A scheduler's state on the database's clock: ``alive`` (a beat in the last
    ``Scheduler.ALIVE_FOR``), ``stopped`` (it said so on a clean exit) or ``gone`` (no
    beat for ``ALIVE_FOR`` and no clean stop: killed, crashed or cut off)."""

    ALIVE = "alive", _("alive")
    STOPPED = "stopped", _("stopped")
    GONE = "gone", _("gone")


def scheduler_states() -> dict[SchedulerState, Q]:
    """The one definition of each scheduler state, as a filter on database time."""
    beat_lately = Q(last_beat_at__gt=now_plus(-Scheduler.ALIVE_FOR))
    return {
        SchedulerState.ALIVE: Q(stopped_at__isnull=True) & beat_lately,
        SchedulerState.STOPPED: Q(stopped_at__isnull=False),
        SchedulerState.GONE: Q(stopped_at__isnull=True) & ~beat_lately,
    }


def unacknowledged() -> Q:
    """A gone scheduler is a problem until someone acknowledges it, or a scheduler starts
    again on its host after its last beat (it came back)."""
    came_back = Exists(
        Scheduler.objects.filter(host=OuterRef("host"), started_at__gt=OuterRef("last_beat_at"))
    )
    return scheduler_states()[SchedulerState.GONE] & Q(acknowledged_at__isnull=True) & ~Q(came_back)


def _remembered() -> Q:
    return Q(last_beat_at__gt=now_plus(-Scheduler.FORGET_AFTER)) | unacknowledged()


class SchedulerQuerySet(models.QuerySet["Scheduler"]):
    """``exclusive_scheduler`` processes by state, judged on the database's clock."""

    def alive(self) -> SchedulerQuerySet:
        """Schedulers that beat in the last ``Scheduler.ALIVE_FOR`` and did not stop."""
        return self.filter(scheduler_states()[SchedulerState.ALIVE])

    def stopped(self) -> SchedulerQuerySet:
        """Schedulers that stopped cleanly (``SIGTERM``, ``SIGINT``)."""
        return self.filter(scheduler_states()[SchedulerState.STOPPED])

    def gone(self) -> SchedulerQuerySet:
        """Schedulers that stopped beating without a clean stop: killed, crashed, cut off."""
        return self.filter(scheduler_states()[SchedulerState.GONE])

    def unacknowledged(self) -> SchedulerQuerySet:
        """Gone schedulers that are a problem: nobody acknowledged them, and no scheduler
        has started on their host since their last beat."""
        return self.filter(unacknowledged())

    def known(self) -> SchedulerQuerySet:
        """The rows the jobs page and the health check judge: a beat in the last
        ``Scheduler.FORGET_AFTER``, or gone and unacknowledged however long ago."""
        return self.filter(_remembered())

    def forgotten(self) -> SchedulerQuerySet:
        """The others, which the heartbeats delete (read first: MySQL refuses a DELETE
        whose subquery reads the table it deletes from)."""
        return self.filter(pk__in=list(self.exclude(_remembered()).values_list("pk", flat=True)))

    def record_beat(self, instance: str, **values: Any) -> int:
        """Write the beat (``values``: ``last_beat_at``, ``free``) on the row of the
        scheduler ``instance``; how many rows it changed (0: it has no row yet)."""
        return self.filter(instance=instance).update(**values)

    def record_stop(self, instance: str, **values: Any) -> int:
        """Write the clean stop (``values``: ``last_beat_at``, ``stopped_at``) on the row
        of the scheduler ``instance``."""
        return self.filter(instance=instance).update(**values)

    def acknowledge(self, ids: list[int], **values: Any) -> int:
        """Write the acknowledgement (``values``) on the rows ``ids`` not yet
        acknowledged; how many it changed."""
        return self.filter(pk__in=ids, acknowledged_at__isnull=True).update(**values)

    def with_state(self) -> SchedulerQuerySet:
        """Annotate ``state`` (a :class:`SchedulerState` value) and ``unacknowledged``."""
        whens = [When(q, then=Value(state)) for state, q in scheduler_states().items()]
        problem = When(unacknowledged(), then=Value(True))
        return self.annotate(
            state=Case(*whens, default=Value(SchedulerState.GONE), output_field=models.CharField()),
            unacknowledged=Case(problem, default=Value(False), output_field=models.BooleanField()),
        )


class Scheduler(models.Model):
    """One running ``manage.py exclusive_scheduler``: its heartbeat row.

    Written every ``BEAT`` on database time. A row whose last beat is older than
    ``ALIVE_FOR`` without a clean stop is a scheduler that is gone: a problem until it is
    acknowledged or a scheduler starts on its host again. Rows older than
    ``FORGET_AFTER`` that are no problem are deleted, so "no scheduler since 02:14" can
    be told for a day.
    """

    BEAT = dt.timedelta(seconds=10)
    ALIVE_FOR = dt.timedelta(seconds=45)
    FORGET_AFTER = dt.timedelta(days=1)

    instance = models.CharField(_("instance"), max_length=32, unique=True)
    host = models.CharField(_("host"), max_length=255)
    pid = models.IntegerField(_("process id"))
    version = models.CharField(_("version"), max_length=64, blank=True)
    jobs = models.JSONField(_("jobs"), default=list, help_text=_("The jobs it serves."))
    skips_schedules = models.BooleanField(
        _("skips schedules"),
        default=False,
        db_default=False,
        help_text=_(
            "Started with --skip-schedules or SKIP_SCHEDULES: it starts no scheduled slot, "
            "only runs asked for now and backfills."
        ),
    )
    free = models.PositiveIntegerField(
        _("free capacity"),
        null=True,
        blank=True,
        help_text=_("How many more runs it could start at its last beat (--max-concurrent)."),
    )
    started_at = models.DateTimeField(_("started at"))
    last_beat_at = models.DateTimeField(_("last heartbeat"))
    stopped_at = models.DateTimeField(_("stopped at"), null=True, blank=True)
    acknowledged_at = models.DateTimeField(_("acknowledged at"), null=True, blank=True)
    acknowledged_by = models.CharField(
        _("acknowledged by"),
        max_length=255,
        blank=True,
        help_text=_("Who acknowledged that it is gone (then it is no longer a problem)."),
    )

    objects: ClassVar[SchedulerQuerySet] = SchedulerQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        verbose_name = _("scheduler")
        verbose_name_plural = _("schedulers")
        ordering = ["-last_beat_at"]
        indexes = [models.Index(fields=["last_beat_at"], name="exclusive_jobs_beat")]

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}"

    def serves(self, name: str) -> bool:
        """Whether it runs the job ``name``: its slots and its run-now requests."""
        return name in (self.jobs or [])

"""What operators decided about a job (``JobState``: a pause, overrides; the one rule
for "paused", :func:`pause_in_force`) and what they did (``JobChange``, the audit)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any, ClassVar

from django.db import models
from django.db.models import F, Q
from django.utils.translation import gettext_lazy as _

from ..lock.clock import DatabaseNow
from ..values import EARLIEST
from .fields import JobNameField, PauseEndField
from .requests import wake_schedulers


def pause_in_force(now: dt.datetime | DatabaseNow) -> Q:
    """The one rule for "paused" at ``now`` (database time: a value, or ``DatabaseNow()``
    in a query), as a filter on JobState: a pause with an end is over from then.
    :meth:`JobState.paused_now` applies it to a row already read. An end out of range
    (:class:`PauseEndField`) is read as none: paused until resumed, here too."""
    ends = Q(paused_until__isnull=True) | Q(paused_until__gt=now)
    return Q(paused=True) & (ends | Q(paused_until__lt=EARLIEST))


class JobStateQuerySet(models.QuerySet["JobState"]):
    """The operators' rows, by job."""

    def of(self, name: str) -> JobState | None:
        """``name``'s row, or None (one query)."""
        return self.filter(name=name).first()

    def of_jobs(self, names: list[str]) -> JobStateQuerySet:
        """The rows of these jobs."""
        return self.filter(name__in=names)

    def ensure(self, name: str) -> JobState:
        """``name``'s row, made (empty: it changes nothing) if missing, so that a write
        can lock it."""
        state, _made = self.get_or_create(name=name)
        return state

    def save_for(self, name: str, values: dict[str, Any]) -> None:
        """Write ``values`` on ``name``'s row, made if missing."""
        self.update_or_create(name=name, defaults=values)

    def change(self, pk: int, **values: Any) -> int:
        """Write ``values`` on the row ``pk``."""
        return self.filter(pk=pk).update(**values)

    def lock_row(self, name: str) -> int:
        """Lock ``name``'s row until the transaction ends (a write that changes nothing:
        SQLite too)."""
        return self.filter(name=name).update(name=F("name"))

    def paused(self, name: str) -> JobStateQuerySet:
        """``name``'s row while paused now (:func:`pause_in_force`, database time)."""
        return self.filter(pause_in_force(DatabaseNow()), name=name)

    def resume(self, name: str, **values: Any) -> int:
        """Write the resume (``values``) on ``name``'s row if it is paused now; how many
        rows it changed (0: not paused)."""
        return self.paused(name).update(**values)


class JobState(models.Model):
    """What operators decided about a job: paused or not, and what of its declaration
    they override (see ``run/overrides.py``), when, by whom and why.

    No row means never paused, nothing overridden. The last pause's start and end are
    kept: the slots between them are not counted as missed. The code stays the source of
    truth: ``code`` keeps what the declaration said of each overridden setting when it
    was overridden, so a later change of the code shows as drift too.
    """

    name = JobNameField(_("name"), max_length=255, unique=True)
    paused = models.BooleanField(_("paused"), default=False)
    paused_at = models.DateTimeField(_("paused at"), null=True, blank=True)
    paused_by = models.CharField(_("paused by"), max_length=255, blank=True)
    pause_reason = models.TextField(_("why it is paused"), blank=True)
    paused_until = PauseEndField(
        _("paused until"),
        null=True,
        blank=True,
        help_text=_("The pause ends by itself then (database time); empty: until resumed."),
    )
    resumed_at = models.DateTimeField(_("resumed at"), null=True, blank=True)
    resumed_by = models.CharField(_("resumed by"), max_length=255, blank=True)
    override = models.JSONField(
        _("override"),
        default=dict,
        blank=True,
        help_text=_(
            "The settings an operator overrides, over the code's: schedule, kwargs, "
            "timeout, overlap."
        ),
    )
    code = models.JSONField(
        _("the code said"),
        default=dict,
        blank=True,
        help_text=_("What the code declared of each overridden setting when it was overridden."),
    )
    overridden_at = models.DateTimeField(_("overridden at"), null=True, blank=True)
    overridden_by = models.CharField(_("overridden by"), max_length=255, blank=True)
    override_reason = models.TextField(_("why it is overridden"), blank=True)
    schedule_since = models.DateTimeField(
        _("schedule in force since"),
        null=True,
        blank=True,
        help_text=_(
            "When the schedule in force began (an override of it, or back to the code): "
            "its slots before then are not counted as missed."
        ),
    )
    schedule_before = models.JSONField(
        _("schedule before"),
        default=dict,
        blank=True,
        help_text=_(
            "The schedule in force until then: its slots that no server ran are counted "
            "as missed by the first start after the change."
        ),
    )

    objects: ClassVar[JobStateQuerySet] = JobStateQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        verbose_name = _("job")
        # "All jobs" sorts first among the app's models on the admin's index.
        verbose_name_plural = _("all jobs")
        ordering = ["name"]

    def __str__(self) -> str:
        return str(self.name)

    def paused_now(self, now: dt.datetime) -> bool:
        """Paused at ``now`` (database time): :func:`pause_in_force`, on this row."""
        return self.paused and (self.paused_until is None or now < self.paused_until)

    def why_paused(self) -> str:
        """The pause in words: who, since when, until when, why."""
        since = self.paused_at.isoformat(timespec="seconds") if self.paused_at else "?"
        said = f"paused by {self.paused_by or '?'} since {since}"
        if self.paused_until is not None:
            said += f" until {self.paused_until.isoformat(timespec='seconds')}"
        return said + (f": {self.pause_reason}" if self.pause_reason else "")

    def last_pause(self, now: dt.datetime) -> tuple[dt.datetime, dt.datetime] | None:
        """The last pause's start and end, once over (resumed, or past its end)."""
        if self.paused and self.paused_at and self.paused_until and now >= self.paused_until:
            return (self.paused_at, self.paused_until)
        if not self.paused and self.paused_at and self.resumed_at:
            return (self.paused_at, self.resumed_at)
        return None

    def quiet(self, now: dt.datetime) -> list[tuple[dt.datetime, dt.datetime]]:
        """The spans whose slots are not missed: the last pause, once over, and the time
        before the schedule in force came in force."""
        pause = self.last_pause(now)
        spans = [pause] if pause is not None else []
        if self.schedule_since is not None:
            spans.append((dt.datetime.min.replace(tzinfo=dt.UTC), self.schedule_since))
        return spans


class JobChangeQuerySet(models.QuerySet["JobChange"]):
    """The audit, read by job."""

    def newest_of(self, name: str, limit: int) -> JobChangeQuerySet:
        """The job's newest ``limit`` changes, newest first."""
        return self.filter(name=name).order_by("-at", "-id")[:limit]

    def last_of(self, name: str, actions: Sequence[str]) -> JobChange | None:
        """The job's newest change among ``actions``, or None."""
        return self.filter(name=name, action__in=actions).order_by("-at", "-id").first()


class JobChange(models.Model):
    """One thing an operator did to a job: an override, a pause, a resume, a run now, a
    backfill, a cancelled request, a lock released by force, a run-time schedule added,
    changed or deleted (see ``run/audit.py``). Never
    changed or deleted by the app."""

    class Action(models.TextChoices):
        OVERRIDE = "override", _("override")
        BACK_TO_CODE = "back_to_code", _("back to the code")
        PAUSE = "pause", _("pause")
        RESUME = "resume", _("resume")
        RUN_NOW = "run_now", _("run now")
        BACKFILL = "backfill", _("backfill")
        CANCEL = "cancel", _("cancel a waiting run")
        FORCE_RELEASE = "force_release", _("force-release the lock")
        ADD_SCHEDULE = "schedule_added", _("add a run-time schedule")
        CHANGE_SCHEDULE = "schedule_edited", _("change a run-time schedule")
        DELETE_SCHEDULE = "schedule_gone", _("delete a run-time schedule")

    name = JobNameField(_("job"), max_length=255)
    at = models.DateTimeField(_("at"))
    by = models.CharField(_("by"), max_length=255)
    action = models.CharField(_("action"), max_length=16, choices=Action.choices)
    reason = models.TextField(_("reason"), blank=True)
    before = models.JSONField(_("before"), default=dict, blank=True)
    after = models.JSONField(_("after"), default=dict, blank=True)

    objects: ClassVar[JobChangeQuerySet] = JobChangeQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        verbose_name = _("job change")
        verbose_name_plural = _("job changes")
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["name", "-at"], name="exclusive_jobs_change_name")]

    def __str__(self) -> str:
        return f"{self.name} {self.action} by {self.by}"

    @property
    def before_text(self) -> str:
        """What it was before, as one line of JSON ("" for nothing)."""
        return json.dumps(self.before, sort_keys=True, ensure_ascii=False) if self.before else ""

    @property
    def after_text(self) -> str:
        """What it is after, as one line of JSON ("" for nothing)."""
        return json.dumps(self.after, sort_keys=True, ensure_ascii=False) if self.after else ""


def record_change(
    name: str,
    action: str,
    *,
    by: str,
    using: str,
    reason: str = "",
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> None:
    """One ``JobChange`` (in the caller's transaction, if any: the caller retries); the
    audit's ``record`` (``run/audit.py``) is this. Every operator's change is audited, so
    the listening schedulers are woken here to read it (``wake_schedulers``)."""
    JobChange.objects.using(using).create(
        name=name,
        at=DatabaseNow(),
        by=by[:255],
        action=action,
        reason=reason,
        before=before or {},
        after=after or {},
    )
    wake_schedulers(using)

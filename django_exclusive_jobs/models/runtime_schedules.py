"""Schedules added at run time: more schedules of a declared job, each a row that staff
add, change, pause and delete from the admin or from Python (``run/runtime_schedules.py``
checks each value at its one door and audits the change). A schedule runs as a job of
its own, named ``JOB:KEY``: its own lock, its own slots, its own history."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import models
from django.utils.translation import gettext_lazy as _

from .fields import JobNameField, PauseEndField


class RunTimeScheduleQuerySet(models.QuerySet["RunTimeSchedule"]):
    def of_jobs(self, jobs: list[str]) -> RunTimeScheduleQuerySet:
        """The schedules added to these declared jobs, by name."""
        return self.filter(job__in=jobs).order_by("name")

    def named(self, name: str) -> RunTimeSchedule | None:
        """The schedule ``name`` (``JOB:KEY``), or None (one query)."""
        return self.filter(name=name).first()


class RunTimeSchedule(models.Model):
    """A schedule added at run time to the declared job ``job``: when its slots come
    (``cron`` in ``timezone``, or ``every`` seconds), the arguments its runs take over
    the declared ones, from when to when, and whether it is on."""

    name = JobNameField(_("name"), max_length=255, unique=True, editable=False)
    job = JobNameField(_("job"), max_length=255, help_text=_("The declared job it runs."))
    key = models.CharField(
        _("key"), max_length=100, help_text=_("Its name among the job's schedules: JOB:KEY.")
    )
    cron = models.CharField(_("cron"), max_length=1000, blank=True)
    every = models.FloatField(_("every (seconds)"), null=True, blank=True)
    timezone = models.CharField(_("time zone"), max_length=64, blank=True)
    kwargs = models.JSONField(
        _("arguments"), default=dict, blank=True,
        help_text=_("Keyword arguments over the declared ones, as JSON."),
    )  # fmt: skip
    starts_at = PauseEndField(_("starts at"), null=True, blank=True)
    ends_at = PauseEndField(_("ends at"), null=True, blank=True)
    enabled = models.BooleanField(_("enabled"), default=True)
    reason = models.TextField(_("reason"), blank=True)
    created_at = models.DateTimeField(_("added at"))
    created_by = models.CharField(_("added by"), max_length=255)
    changed_at = models.DateTimeField(_("changed at"))
    changed_by = models.CharField(_("changed by"), max_length=255)

    objects: ClassVar[RunTimeScheduleQuerySet] = RunTimeScheduleQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        verbose_name = _("run-time schedule")
        verbose_name_plural = _("run-time schedules")
        ordering = ["name"]
        indexes = [models.Index(fields=["job"], name="exclusive_jobs_added_job")]

    def __str__(self) -> str:
        return str(self.name)

    @property
    def spec(self) -> dict[str, Any]:
        """Its schedule as the overrides store one: ``{"cron", "timezone"}`` or
        ``{"every": seconds}``."""
        if self.cron:
            return {"cron": self.cron, "timezone": self.timezone or None}
        return {"every": self.every}

"""Run requests: a run now, a backfill's slot, or a stop asked of a running run; taken
by exactly one scheduler or cancelled."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import connections, models
from django.utils.translation import gettext_lazy as _

from ..naming import describe_arguments
from .fields import JobNameField
from .runs import JobRun


class RunRequestQuerySet(models.QuerySet["RunRequest"]):
    def pending(self) -> RunRequestQuerySet:
        """Requests that wait: neither taken nor cancelled."""
        return self.filter(taken_at__isnull=True)

    def runs(self) -> RunRequestQuerySet:
        """Requests for a run (run now, a backfill), not stops."""
        return self.filter(stop_token__isnull=True)

    def stops(self) -> RunRequestQuerySet:
        """Requests to stop a running run (``overlap="cancel_other"``)."""
        return self.filter(stop_token__isnull=False)

    def stop_asked(self, name: str, token: int) -> RunRequestQuerySet:
        """The stop asked of the run of ``name`` holding ``token``, taken or not."""
        return self.filter(name=name, stop_token=token)

    def waiting_stop(self, name: str, token: int) -> RunRequestQuerySet:
        """The stop asked of the run of ``name`` holding ``token``, while it waits."""
        return self.pending().filter(name=name, stop_token=token)

    def waiting(self, pk: int) -> RunRequestQuerySet:
        """The request ``pk``, while it waits (neither taken nor cancelled)."""
        return self.pending().filter(pk=pk)

    def take(self, pk: int, **values: Any) -> int:
        """Mark the request ``pk`` taken (``values``: ``taken_at``, ``taken_by``, and
        ``cancelled_*`` for a cancel) if it still waits: one conditional UPDATE, so a
        request is taken once. How many rows it changed (0 or 1)."""
        return self.waiting(pk).update(**values)

    def close_stops_below(self, name: str, below: int, **values: Any) -> int:
        """Mark taken (``values``) the waiting stops asked of runs of ``name`` older than
        token ``below``."""
        return self.pending().filter(name=name, stop_token__lt=below).update(**values)

    def waiting_for(self, names: list[str]) -> RunRequestQuerySet:
        """The requests of these jobs that wait, runs and stops, in the order asked."""
        return self.pending().filter(name__in=names).order_by("id")

    def runs_waiting(self) -> RunRequestQuerySet:
        """Every job's waiting requests for a run, in the order asked (the jobs page)."""
        return self.pending().runs().order_by("id")

    def run_waiting(self, name: str, pk: int) -> RunRequestQuerySet:
        """The request ``pk`` for a run of ``name``, while it waits (the admin's cancel)."""
        return self.pending().runs().filter(name=name).filter(pk=pk)

    def ask(self, **values: Any) -> RunRequest:
        """Write a request (``values``) and wake the schedulers to it (PostgreSQL: they
        listen, and read it at once; elsewhere they find it at their next poll)."""
        made = self.create(**values)
        wake_schedulers(self.db)
        return made

    def record_run(self, pk: int, run: Any) -> int:
        """Note on the request ``pk`` the run that took it."""
        return self.filter(pk=pk).update(run=run)


class RunRequest(models.Model):
    """A run asked for outside the schedule ("run now", or a past ``slot``: a backfill),
    or a stop asked of a running run (``stop_token``: ``overlap="cancel_other"``): taken
    by exactly one scheduler, or cancelled by an operator before any took it."""

    name = JobNameField(_("job"), max_length=255)
    requested_at = models.DateTimeField(_("asked at"))
    requested_by = models.CharField(_("asked for by"), max_length=255)
    taken_at = models.DateTimeField(
        _("taken at"),
        null=True,
        blank=True,
        help_text=_("When a run took it, or it was cancelled: no run takes it after that."),
    )
    taken_by = models.CharField(_("taken by"), max_length=255, blank=True)
    cancelled_at = models.DateTimeField(_("cancelled at"), null=True, blank=True)
    cancelled_by = models.CharField(_("cancelled by"), max_length=255, blank=True)
    slot = models.DateTimeField(
        _("slot"), null=True, blank=True, help_text=_("A backfill: the past slot to run.")
    )
    stop_token = models.BigIntegerField(
        _("stop token"),
        null=True,
        blank=True,
        help_text=_(
            "A stop: the token of the run to stop, so that a newer slot can run "
            '(overlap="cancel_other").'
        ),
    )
    kwargs = models.JSONField(
        _("arguments"),
        default=dict,
        blank=True,
        help_text=_(
            "A run now asked for with arguments: they update the job's declared kwargs "
            "for this run (the given ones win)."
        ),
    )
    # No constraint: pruning old runs must stay one DELETE, and may leave this dangling.
    run = models.ForeignKey(
        JobRun,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="+",
    )

    objects: ClassVar[RunRequestQuerySet] = RunRequestQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        verbose_name = _("run request")
        verbose_name_plural = _("run requests")
        ordering = ["id"]
        indexes = [models.Index(fields=["taken_at"], name="exclusive_jobs_request_taken")]

    def __str__(self) -> str:
        return f"{self.name} asked by {self.requested_by}"

    @property
    def arguments(self) -> str:
        """The arguments it was asked for with, as one line of JSON ("" for none)."""
        return describe_arguments(self.kwargs)


WAKE_CHANNEL = "django_exclusive_jobs"  # PostgreSQL's NOTIFY channel (run/listening.py)


def wake_schedulers(using: str) -> None:
    """Tell the listening schedulers (PostgreSQL) that a request or an operator's change
    was written: one ``pg_notify`` in the caller's transaction, delivered at its commit
    (and not at all if it rolls back). Elsewhere nothing: the schedulers poll there."""
    connection = connections[using]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [WAKE_CHANNEL])

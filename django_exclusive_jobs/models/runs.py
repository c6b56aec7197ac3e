"""Run history: ``JobRun`` (one row per run or slot) and ``RunTotal`` (what pruning
deleted, summed), with the queries over them the pages and metrics ask by name."""

from __future__ import annotations

import datetime as dt
import statistics
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, ClassVar

from django.db import models
from django.db.models import Case, Count, F, Max, Q, Sum, Value, When, Window
from django.db.models.functions import RowNumber
from django.db.models.lookups import LessThanOrEqual
from django.utils.translation import gettext_lazy as _

from ..lock.clock import DatabaseNow, SecondsBetween, now_plus
from ..naming import holder_name
from ..run.status import RunStatus
from .fields import JobNameField

MEDIAN_SAMPLE = 20  # successful runs a job's median duration is taken over
MEDIAN_DAYS = dt.timedelta(days=7)  # ... among those of the last week

# The histograms' upper bounds, in seconds (the metrics): a run's duration, and how long
# after its slot a scheduled slot's first attempt started (jitter included).
DURATION_BUCKETS = (0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0)
LATENESS_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
INF = "+Inf"


def bucket_key(bound: float) -> str:
    """A bucket's upper bound as stored and exposed (as prometheus-client writes it):
    ``0.5``, ``60.0``."""
    return repr(float(bound))


class JobRunQuerySet(models.QuerySet["JobRun"]):
    """Queries over run history, named by intent."""

    def running(self) -> JobRunQuerySet:
        """Runs not yet ended (or whose server died before the next holder noticed)."""
        return self.filter(status=RunStatus.RUNNING)

    def with_status(self, status: str) -> JobRunQuerySet:
        """Runs that ended so (or are running): the admin's filter by status."""
        return self.filter(status=status)

    def finished(self) -> JobRunQuerySet:
        """Runs that ended, however they ended."""
        return self.exclude(status=RunStatus.RUNNING)

    def succeeded(self) -> JobRunQuerySet:
        """Runs whose job returned (or whose child program exited 0)."""
        return self.filter(status=RunStatus.SUCCEEDED)

    def last_slot_ends(self, name: str, count: int) -> JobRunQuerySet:
        """The job's last ``count`` runs that ended, each a slot's last attempt (no retry
        pending; no missed, skipped or paused slot), newest first: ``pause_after``."""
        runs = self.filter(name=name, retry_at__isnull=True)
        runs = runs.exclude(status__in=[RunStatus.RUNNING, *RunStatus.not_runs()])
        return runs.order_by("-started_at", "-id")[:count]

    def done_in(self, name: str, start: dt.datetime, end: dt.datetime) -> models.QuerySet[Any]:
        """(slot, status) of the job's slots from ``start`` to ``end`` that are done
        (:meth:`RunStatus.done`): what a backfill leaves alone."""
        rows = self.filter(name=name, slot__gte=start, slot__lte=end, status__in=RunStatus.done())
        return rows.values_list("slot", "status")

    def claimed(self, slots: dict[str, dt.datetime]) -> models.QuerySet[Any]:
        """The names of the jobs among ``slots`` (name: slot) whose slot has a row."""
        wanted = Q()
        for name, slot in slots.items():
            wanted |= Q(name=name, slot=slot)
        return self.filter(wanted).values_list("name", flat=True)

    def rows(self, pks: Iterable[Any]) -> JobRunQuerySet:
        """The runs whose ids are ``pks``."""
        return self.filter(pk__in=pks)

    def lock_newest_attempt(self, name: str) -> JobRun | None:
        """The job's newest attempt of its newest slot, read with a lock on the job's
        slotted rows until the transaction ends (a claim's second look), or None."""
        slotted = self.filter(name=name, slot__isnull=False).select_for_update()
        return slotted.order_by("-slot", "-attempt").first()

    def attempts_of(self, name: str, slot: dt.datetime) -> JobRunQuerySet:
        """The job's attempts of ``slot``, newest first."""
        return self.filter(name=name, slot=slot).order_by("-attempt")

    def slot_running_under(self, name: str, token: int) -> dt.datetime | None:
        """The slot of the job's run still running under the lock's ``token`` (None: no
        such run, or a manual run): what ``overlap="cancel_other"`` compares its own with."""
        running = self.running().filter(name=name, token=token)
        slot: dt.datetime | None = running.values_list("slot", flat=True).first()
        return slot

    def give_up_retry(self, pk: int) -> int:
        """Clear the pending retry of the run ``pk`` (it becomes its slot's last attempt);
        how many rows changed (0: no retry was pending)."""
        return self.filter(pk=pk, retry_at__isnull=False).update(retry_at=None)

    def other_slots_running(
        self, name: str, current: dt.datetime | None
    ) -> list[tuple[int, dt.datetime | None, int | None]]:
        """(id, slot, token) of the job's runs still running for another slot than
        ``current`` (``overlap="allow_all"``)."""
        others = self.filter(name=name, status=RunStatus.RUNNING, slot__isnull=False)
        return list(others.exclude(slot=current).values_list("pk", "slot", "token"))

    def mark_lost(self, pks: list[int], error: str) -> int:
        """Mark lost, ended now (database time), these runs still running; ``error``:
        why. How many rows changed."""
        return self.filter(pk__in=pks, status=RunStatus.RUNNING).update(
            status=RunStatus.LOST,
            finished_at=DatabaseNow(),
            error_type="LockLost",
            error=error,
        )

    def lost_by(self, name: str, below: int, error: str) -> JobRunQuerySet:
        """The job's runs marked lost, under a token below ``below``, for ``error``."""
        return self.filter(name=name, status=RunStatus.LOST, token__lt=below, error=error)

    def slots_attempts(self) -> list[tuple[int, dt.datetime | None, int]]:
        """(id, slot, attempt) of these runs."""
        return list(self.values_list("pk", "slot", "attempt"))

    def set_retry(self, pk: int, retry_at: dt.datetime) -> int:
        """Give the run ``pk`` among these its ``retry_at``."""
        return self.filter(pk=pk).update(retry_at=retry_at)

    def lock_rows(self, ids: list[int]) -> list[int]:
        """Lock these runs until the transaction ends; the ids of those still there."""
        return list(self.filter(id__in=ids).select_for_update().values_list("id", flat=True))

    def medians(self) -> dict[str, float]:
        """Each job's median duration in seconds: the one definition, over its last
        ``MEDIAN_SAMPLE`` successful runs of the past ``MEDIAN_DAYS`` (one query)."""
        recent = (
            self.succeeded()
            .filter(duration__isnull=False, started_at__gte=now_plus(-MEDIAN_DAYS))
            .annotate(
                rank=Window(RowNumber(), partition_by=[F("name")], order_by=F("started_at").desc())
            )
            .filter(rank__lte=MEDIAN_SAMPLE)
            .values_list("name", "duration")
        )
        durations: dict[str, list[float]] = defaultdict(list)
        for name, duration in recent:
            durations[name].append(float(duration or 0))
        return {name: statistics.median(values) for name, values in durations.items()}

    def last_runs(self, per_job: int) -> JobRunQuerySet:
        """Each job's newest ``per_job`` rows, missed and skipped slots included, newest
        first within a job (one query, whatever the number of jobs): the jobs page's strip
        of runs."""
        return (
            self.annotate(
                rank=Window(
                    RowNumber(),
                    partition_by=[F("name")],
                    order_by=[F("started_at").desc(), F("id").desc()],
                )
            )
            .filter(rank__lte=per_job)
            .order_by("name", "-started_at", "-id")
        )

    def durations_since(self, name: str, since: dt.datetime, limit: int) -> list[JobRun]:
        """The job's runs that started since ``since`` and have a duration, at most the
        newest ``limit``, oldest first (one query): the job's page's chart of durations."""
        newest = self.filter(name=name, started_at__gte=since, duration__isnull=False)
        return list(reversed(newest.order_by("-started_at", "-id")[:limit]))

    def counts_since(self, since: dt.datetime) -> dict[str, dict[str, int]]:
        """Runs started since ``since``, per job and status (one grouped query)."""
        counts: dict[str, dict[str, int]] = defaultdict(dict)
        rows = (
            self.filter(started_at__gte=since)
            .values_list("name", "status")
            .annotate(n=Count("id"))
            .order_by()
        )
        for name, status, number in rows:
            counts[name][status] = number
        return counts

    def tallies(self, *more: models.QuerySet[Any]) -> models.QuerySet[Any]:
        """The one definition of what the metrics count: one pass over the rows, grouped
        by ``job``, ``state`` (a status), ``duration_le`` and ``lateness_le`` (the
        histogram bucket the run's duration, and its start's lateness, fall in: an upper
        bound, ``+Inf``, or "" when not measured), with ``n`` (how many runs),
        ``duration_sum``, ``lateness_sum`` (seconds) and ``last`` (the newest
        ``finished_at``). Lateness is measured on the first attempt of a scheduled slot
        that ran (no retry, backfill, missed or skipped slot). ``more``: querysets of the
        same columns, read in the same statement (:meth:`RunTotalQuerySet.tallies`)."""
        first_attempt = Q(slot__isnull=False, attempt=1, backfill=False) & ~Q(
            status__in=RunStatus.not_runs()
        )
        late = SecondsBetween("slot", "started_at")
        measured = When(first_attempt, then=_bucket(late, LATENESS_BUCKETS))
        tallies = (
            self.order_by()
            .values(
                job=F("name"),
                state=F("status"),
                duration_le=Case(
                    When(duration__isnull=True, then=Value("")),
                    default=_bucket(F("duration"), DURATION_BUCKETS),
                ),
                lateness_le=Case(measured, default=Value(""), output_field=models.CharField()),
            )
            .annotate(
                n=Count("id"),
                duration_sum=Sum("duration"),
                lateness_sum=Sum(late, filter=first_attempt),
                last=Max("finished_at"),
            )
        )
        # No ordering on the whole either: Django 6.1 would order a union by the model's
        # default ordering, whose columns it does not select.
        return tallies.union(*more, all=True).order_by() if more else tallies

    def newest_attempts(self, names: list[str]) -> list[JobRun]:
        """Each job's newest attempt of its newest slot (one query): what a scheduler
        starting up needs to know, a missed slot or a retry it may be due for."""
        return list(
            self.filter(name__in=names, slot__isnull=False)
            .annotate(
                rank=Window(
                    RowNumber(),
                    partition_by=[F("name")],
                    order_by=[F("slot").desc(), F("attempt").desc()],
                )
            )
            .filter(rank=1)
        )

    def kept_ids(self) -> set[int]:
        """Runs pruning must keep: each job's last run and its latest slotted run."""
        keep: set[int] = set()
        for name in self.values_list("name", flat=True).distinct().order_by():
            of_job = self.filter(name=name)
            latest = of_job.order_by("-started_at", "-id").values_list("id", flat=True).first()
            slotted = (
                of_job.filter(slot__isnull=False)
                .order_by("-slot", "-id")
                .values_list("id", flat=True)
                .first()
            )
            keep.update(i for i in (latest, slotted) if i is not None)
        return keep

    def prunable(self, older_than: dt.timedelta) -> JobRunQuerySet:
        """Finished runs that ended more than ``older_than`` ago and need not be kept."""
        cutoff = now_plus(-older_than)
        return (
            self.finished().filter(finished_at__lt=cutoff).exclude(id__in=sorted(self.kept_ids()))
        )


def _bucket(seconds: Any, bounds: tuple[float, ...]) -> Case:
    """The (non-cumulative) bucket ``seconds`` falls in: the first bound it does not
    exceed, else ``+Inf``."""
    whens = [When(LessThanOrEqual(seconds, Value(b)), then=Value(bucket_key(b))) for b in bounds]
    return Case(*whens, default=Value(INF), output_field=models.CharField())


class JobRun(models.Model):
    """One run of a job: who ran it, for which slot, how it ended."""

    name = JobNameField(_("job"), max_length=255)
    slot = models.DateTimeField(
        _("slot"),
        null=True,
        blank=True,
        help_text=_("The scheduled instant this run serves; one run per job and slot."),
    )
    status = models.CharField(
        _("status"), max_length=16, choices=RunStatus.stored(), default=RunStatus.RUNNING
    )
    host = models.CharField(_("host"), max_length=255, blank=True)
    pid = models.IntegerField(_("process id"), null=True, blank=True)
    instance = models.CharField(_("instance"), max_length=32, blank=True)
    token = models.BigIntegerField(_("token"), null=True, blank=True)
    attempt = models.PositiveIntegerField(
        _("attempt"),
        default=1,
        help_text=_("1 for a slot's first run; each retry of a failed slot is a run of its own."),
    )
    retry_at = models.DateTimeField(
        _("retry at"),
        null=True,
        blank=True,
        help_text=_(
            "Set on a failed attempt that will be retried: the earliest time (database "
            "time) the next attempt may start. Empty on a slot's last attempt."
        ),
    )
    backfill = models.BooleanField(
        _("backfilled"),
        default=False,
        help_text=_("Run by a backfill of past slots; requested_by says who asked."),
    )
    kwargs = models.JSONField(
        _("arguments"),
        default=dict,
        blank=True,
        help_text=_("The keyword arguments the job's function was called with."),
    )
    started_at = models.DateTimeField(_("started at"))
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    duration = models.FloatField(_("duration (s)"), null=True, blank=True)
    error_type = models.CharField(_("error type"), max_length=255, blank=True)
    error = models.TextField(_("error"), blank=True)
    returncode = models.IntegerField(_("exit code"), null=True, blank=True)
    requested_by = models.CharField(
        _("asked for by"),
        max_length=255,
        blank=True,
        help_text=_("Set on a manual run (run now): who asked for it."),
    )
    task_result_id = models.CharField(
        _("task result id"),
        max_length=255,
        blank=True,
        help_text=_("Set when the run enqueued a django.tasks Task: its result's id."),
    )
    task_backend = models.CharField(_("task backend"), max_length=255, blank=True)

    objects: ClassVar[JobRunQuerySet] = JobRunQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        verbose_name = _("job run")
        verbose_name_plural = _("job runs")
        ordering = ["-started_at", "-id"]
        constraints = [
            # One run per job, slot and attempt. NULL slots (unscheduled runs) never
            # collide: NULLs are distinct in unique indexes on PostgreSQL, MySQL/MariaDB
            # and SQLite alike.
            models.UniqueConstraint(
                fields=["name", "slot", "attempt"], name="exclusive_jobs_one_run_per_attempt"
            )
        ]
        indexes = [
            models.Index(fields=["name", "-started_at"], name="exclusive_jobs_run_name"),
            models.Index(fields=["status", "-started_at"], name="exclusive_jobs_run_status"),
            models.Index(fields=["finished_at"], name="exclusive_jobs_run_finished"),
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.started_at:%Y-%m-%d %H:%M:%S} {self.status}"

    @property
    def holder(self) -> str:
        """The lock holder that made the run: ``host:pid:instance``."""
        return holder_name(self.host, self.pid, self.instance)


class RunTotalQuerySet(models.QuerySet["RunTotal"]):
    def lock_rows(self, names: list[str]) -> RunTotalQuerySet:
        """The totals of these jobs, locked until the transaction ends, always in one
        order (two prunes at once wait for each other, never deadlock)."""
        return (
            self.select_for_update()
            .filter(name__in=names)
            .order_by("name", "status", "duration_bucket", "lateness_bucket")
        )

    def tallies(self) -> models.QuerySet[Any]:
        """These totals in the columns of :meth:`JobRunQuerySet.tallies`."""
        return self.order_by().values(
            job=F("name"),
            state=F("status"),
            duration_le=F("duration_bucket"),
            lateness_le=F("lateness_bucket"),
            n=F("count"),
            duration_sum=F("duration_seconds"),
            lateness_sum=F("lateness_seconds"),
            last=F("last_finished_at"),
        )


class RunTotal(models.Model):
    """What pruning deleted, summed: runs that are gone still count in the metrics, whose
    counters and histograms are these totals plus the rows still kept (so they never go
    down). One row per row of :meth:`JobRunQuerySet.tallies` (job, status and buckets);
    written only when runs are deleted (``prune_job_runs``, the admin), never by a run."""

    name = JobNameField(_("job"), max_length=255)
    status = models.CharField(_("status"), max_length=16)
    duration_bucket = models.CharField(
        _("duration bucket"),
        max_length=16,
        blank=True,
        help_text=_("The upper bound of the runs' duration; empty: not measured."),
    )
    lateness_bucket = models.CharField(
        _("lateness bucket"),
        max_length=16,
        blank=True,
        help_text=_("The upper bound of how late they started; empty: not measured."),
    )
    count = models.BigIntegerField(_("runs"), default=0)
    duration_seconds = models.FloatField(_("duration (s)"), default=0.0)
    lateness_seconds = models.FloatField(_("lateness (s)"), default=0.0)
    last_finished_at = models.DateTimeField(_("last finished at"), null=True, blank=True)

    objects: ClassVar[RunTotalQuerySet] = RunTotalQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        verbose_name = _("run total")
        verbose_name_plural = _("run totals")
        constraints = [
            models.UniqueConstraint(
                fields=["name", "status", "duration_bucket", "lateness_bucket"],
                name="exclusive_jobs_one_total",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.status}"

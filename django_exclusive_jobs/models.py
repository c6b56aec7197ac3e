"""The app's tables, and the one definition of every state.

A lock held / cooldown / stale / free, a run running long, a job's median duration, a
scheduler alive / stopped / gone, a run request pending: each is defined once here, as a
QuerySet method (or the ``Q`` it filters on), judged on the database's clock. The admin,
``health.py`` (the jobs page, ``exclusive_jobs``, the health view) and the commands ask
these; none rebuilds the filters.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
from collections import defaultdict
from typing import Any, ClassVar

from django.db import models, transaction
from django.db.models import (
    Case,
    Count,
    Exists,
    F,
    Max,
    OuterRef,
    Q,
    Subquery,
    Sum,
    Value,
    When,
    Window,
)
from django.db.models.functions import RowNumber
from django.db.models.lookups import LessThanOrEqual
from django.utils.translation import gettext_lazy as _

from .conf import app_settings
from .lock.clock import DatabaseNow, SecondsBetween, now_plus
from .naming import describe_arguments, holder_name, job_of
from .run.status import RunStatus
from .values import EARLIEST, LATEST

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
    running_for: float | None, median: float | None, factor: float | None = None
) -> bool:
    """The one rule for "running long": a run has lasted over ``factor`` (the setting
    ``RUNNING_LONG_FACTOR``) times its job's median duration (:meth:`JobRunQuerySet.medians`).
    Shown to people, never acted on."""
    factor = float(app_settings.RUNNING_LONG_FACTOR if factor is None else factor)
    return running_for is not None and bool(median) and running_for > factor * (median or 0)


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

    def running_long(self, factor: float | None = None) -> JobLockQuerySet:
        """Held locks whose current run is running long (:func:`running_long`)."""
        medians = JobRun.objects.using(self.db).medians()
        held = self.held().with_state().with_runs()
        names = [
            lock.name
            for lock in held
            if running_long(lock.running_for, medians.get(lock.name), factor)
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


class JobRunQuerySet(models.QuerySet["JobRun"]):
    """Queries over run history, named by intent."""

    def running(self) -> JobRunQuerySet:
        """Runs not yet ended (or whose server died before the next holder noticed)."""
        return self.filter(status=RunStatus.RUNNING)

    def finished(self) -> JobRunQuerySet:
        """Runs that ended, however they ended."""
        return self.exclude(status=RunStatus.RUNNING)

    def succeeded(self) -> JobRunQuerySet:
        """Runs whose job returned (or whose child program exited 0)."""
        return self.filter(status=RunStatus.SUCCEEDED)

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


def pause_in_force(now: dt.datetime | DatabaseNow) -> Q:
    """The one rule for "paused" at ``now`` (database time: a value, or ``DatabaseNow()``
    in a query), as a filter on JobState: a pause with an end is over from then.
    :meth:`JobState.paused_now` applies it to a row already read. An end out of range
    (:class:`PauseEndField`) is read as none: paused until resumed, here too."""
    ends = Q(paused_until__isnull=True) | Q(paused_until__gt=now)
    return Q(paused=True) & (ends | Q(paused_until__lt=EARLIEST))


class PauseEndField(models.DateTimeField):  # type: ignore[type-arg]
    """A pause's end, read through SQL that gives NULL for an end outside
    [``values.EARLIEST``, ``values.LATEST``]: the door (``values.moment``) lets in
    nothing else, but a row written by an older version or by SQL may hold one (on
    PostgreSQL a BC or year-10000 timestamp, which the driver cannot even read; on
    SQLite any text). Such an end reads as none: paused until resumed (the pause is kept,
    which is safer than ending it). Compared in SQL, so no statement is added and the
    driver never sees the value; migration 0012 clears those already there."""

    def select_format(self, compiler: Any, sql: str, params: Any) -> tuple[str, Any]:
        sql, params = super().select_format(compiler, sql, params)
        return in_range_sql(compiler.connection.vendor, sql), params


def in_range_sql(vendor: str, column: str) -> str:
    """``column`` (a pause's end) as SQL that is NULL when the end is out of range."""
    earliest = EARLIEST.strftime("%Y-%m-%d %H:%M:%S")
    latest = LATEST.strftime("%Y-%m-%d %H:%M:%S")
    if vendor == "sqlite":  # text: datetime() is NULL for text that is no time
        checked = f"datetime({column})"
    elif vendor == "postgresql":
        checked, earliest, latest = column, f"{earliest}+00", f"{latest}+00"
    else:
        checked = column
    return f"CASE WHEN {checked} BETWEEN '{earliest}' AND '{latest}' THEN {column} END"


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


class JobChange(models.Model):
    """One thing an operator did to a job: an override, a pause, a resume, a run now, a
    backfill, a cancelled request, a lock released by force (see ``run/audit.py``). Never
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

    name = JobNameField(_("job"), max_length=255)
    at = models.DateTimeField(_("at"))
    by = models.CharField(_("by"), max_length=255)
    action = models.CharField(_("action"), max_length=16, choices=Action.choices)
    reason = models.TextField(_("reason"), blank=True)
    before = models.JSONField(_("before"), default=dict, blank=True)
    after = models.JSONField(_("after"), default=dict, blank=True)

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
    audit's ``record`` (``run/audit.py``) is this."""
    JobChange.objects.using(using).create(
        name=name,
        at=DatabaseNow(),
        by=by[:255],
        action=action,
        reason=reason,
        before=before or {},
        after=after or {},
    )


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

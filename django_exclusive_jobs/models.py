"""The lock table. One row per job name; the unique name is what servers race for."""

from __future__ import annotations

import datetime as dt
import statistics
from typing import Any, ClassVar

from django.db import models
from django.db.models import Case, Q, Value, When
from django.utils.translation import gettext_lazy as _

from .lock.clock import DatabaseNow, now_plus
from .lock.sql import holder_name
from .run.status import RunStatus


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
    """A lock's state on the database's clock, as ``JobLockQuerySet.with_state()`` computes it."""

    HELD = "held", _("held")
    COOLDOWN = "cooldown", _("released, kept for min_hold")
    STALE = "stale", _("stale: lease ran out, never released")
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

    def not_held(self) -> JobLockQuerySet:
        """Every lock but the held ones (what an operator may free without --live)."""
        return self.exclude(released_at__isnull=True, expires_at__gt=DatabaseNow())

    def closed(self) -> JobLockQuerySet:
        """Locks nobody else may take now (held or in cooldown)."""
        return self.filter(expires_at__gt=DatabaseNow())

    def suspect(self, factor: float | None = None) -> JobLockQuerySet:
        """Held locks whose current run has lasted over ``factor`` x the job's median.

        Never acted on automatically: a suspect lock is only shown to people.
        """
        from .conf import app_settings

        factor = float(app_settings.SUSPECT_FACTOR if factor is None else factor)
        runs = JobRun.objects.using(self.db)
        names = []
        for name, token in self.held().values_list("name", "token"):
            median = runs.median_duration(name)
            if median is None:
                continue
            overdue = now_plus(-dt.timedelta(seconds=factor * median))
            if runs.running().filter(name=name, token=token, started_at__lt=overdue).exists():
                names.append(name)
        return self.filter(name__in=names)

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
    def holder(self) -> str:
        """Who holds (or last held) the lock: ``host:pid:instance``."""
        return holder_name(self.host, self.pid, self.instance)


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

    def failed(self) -> JobRunQuerySet:
        """Runs whose job raised (or whose child program exited non-zero)."""
        return self.filter(status=RunStatus.FAILED)

    def median_duration(self, name: str, *, sample: int = 20) -> float | None:
        """Median duration (seconds) of the job's last ``sample`` successful runs."""
        recent = (
            self.succeeded()
            .filter(name=name, duration__isnull=False)
            .order_by("-started_at")
            .values_list("duration", flat=True)[:sample]
        )
        durations = [value for value in recent if value is not None]
        return statistics.median(durations) if durations else None

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
    attempts = models.PositiveIntegerField(_("attempts"), default=1)
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
            # NULL slots (unscheduled runs) never collide: NULLs are distinct in unique
            # indexes on PostgreSQL, MySQL/MariaDB and SQLite alike.
            models.UniqueConstraint(fields=["name", "slot"], name="exclusive_jobs_one_run_per_slot")
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


class SchedulerQuerySet(models.QuerySet["Scheduler"]):
    """Running ``exclusive_scheduler`` processes, judged on the database's clock."""

    def alive(self) -> SchedulerQuerySet:
        """Running schedulers whose last heartbeat is recent (``Scheduler.ALIVE_FOR``)."""
        return self.filter(stopped_at__isnull=True, last_beat_at__gt=now_plus(-Scheduler.ALIVE_FOR))

    def gone(self) -> SchedulerQuerySet:
        """Schedulers that stopped (``stopped_at`` set) or stopped beating (killed, cut off)."""
        return self.exclude(
            stopped_at__isnull=True, last_beat_at__gt=now_plus(-Scheduler.ALIVE_FOR)
        )

    def forgotten(self) -> SchedulerQuerySet:
        """Rows of schedulers gone so long they are deleted (``Scheduler.FORGET_AFTER``)."""
        return self.filter(last_beat_at__lte=now_plus(-Scheduler.FORGET_AFTER))


class Scheduler(models.Model):
    """One running ``manage.py exclusive_scheduler``: its heartbeat row.

    Written every ``BEAT`` on database time; a row whose last beat is older than
    ``ALIVE_FOR`` is a scheduler that is gone; rows gone for ``FORGET_AFTER`` are deleted,
    so "no scheduler since 02:14" can be told for a day.
    """

    BEAT = dt.timedelta(seconds=10)
    ALIVE_FOR = dt.timedelta(seconds=45)
    FORGET_AFTER = dt.timedelta(days=1)

    instance = models.CharField(_("instance"), max_length=32, unique=True)
    host = models.CharField(_("host"), max_length=255)
    pid = models.IntegerField(_("process id"))
    version = models.CharField(_("version"), max_length=64, blank=True)
    jobs = models.JSONField(_("jobs"), default=list, help_text=_("The jobs it serves."))
    started_at = models.DateTimeField(_("started at"))
    last_beat_at = models.DateTimeField(_("last heartbeat"))
    stopped_at = models.DateTimeField(_("stopped at"), null=True, blank=True)

    objects: ClassVar[SchedulerQuerySet] = SchedulerQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        verbose_name = _("scheduler")
        verbose_name_plural = _("schedulers")
        ordering = ["-last_beat_at"]
        indexes = [models.Index(fields=["last_beat_at"], name="exclusive_jobs_beat")]

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}"


class JobState(models.Model):
    """What operators decided about a job: paused or not, when and by whom.

    No row means never paused. The last pause's start and end are kept: the slots
    between them are not counted as missed.
    """

    name = JobNameField(_("name"), max_length=255, unique=True)
    paused = models.BooleanField(_("paused"), default=False)
    paused_at = models.DateTimeField(_("paused at"), null=True, blank=True)
    paused_by = models.CharField(_("paused by"), max_length=255, blank=True)
    resumed_at = models.DateTimeField(_("resumed at"), null=True, blank=True)
    resumed_by = models.CharField(_("resumed by"), max_length=255, blank=True)

    class Meta:
        verbose_name = _("job")
        # "All jobs" sorts first among the app's models on the admin's index.
        verbose_name_plural = _("all jobs")
        ordering = ["name"]

    def __str__(self) -> str:
        return str(self.name)


class RunRequest(models.Model):
    """A run asked for outside the schedule ("run now"): taken by exactly one run."""

    name = JobNameField(_("job"), max_length=255)
    requested_at = models.DateTimeField(_("asked at"))
    requested_by = models.CharField(_("asked for by"), max_length=255)
    taken_at = models.DateTimeField(_("taken at"), null=True, blank=True)
    taken_by = models.CharField(_("taken by"), max_length=255, blank=True)
    # No constraint: pruning old runs must stay one DELETE, and may leave this dangling.
    run = models.ForeignKey(
        JobRun,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="+",
    )

    class Meta:
        verbose_name = _("run request")
        verbose_name_plural = _("run requests")
        ordering = ["id"]
        indexes = [models.Index(fields=["taken_at"], name="exclusive_jobs_request_taken")]

    def __str__(self) -> str:
        return f"{self.name} asked by {self.requested_by}"

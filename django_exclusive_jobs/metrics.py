"""Prometheus metrics: every job and scheduler of the cluster, read from the database at
scrape time (the optional extra ``prometheus``: ``prometheus-client``).

What a job looks like comes from :func:`~django_exclusive_jobs.health.overview` (the one
judgement of its health); what its runs counted comes from
:meth:`JobRunQuerySet.tallies` over the rows kept plus the ``RunTotal`` rows pruning left
of the rows it deleted, so counters and histograms never go down. A scrape sends a fixed
number of queries, however many jobs and runs there are. Nothing here runs in a job's
process: a run pays nothing for it.

Two ways in: the view ``django_exclusive_jobs.views.metrics`` (its own registry, the
health view's access rules), or :class:`JobsCollector` registered in a project's own
registry (django-prometheus's ``/metrics``), which answers ``exclusive_jobs_database_up
0`` and logs one warning line when the database cannot be read, instead of failing the
whole page.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured

try:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImproperlyConfigured(
        "The metrics of django-exclusive-jobs need prometheus-client: "
        "pip install 'django-exclusive-jobs[prometheus]'."
    ) from exc

from .health import Health, JobHealth, Overview, overview
from .lock.errors import JobLockError
from .lock.retry import run_statement
from .lock.validation import resolve_alias
from .models import (
    DURATION_BUCKETS,
    INF,
    LATENESS_BUCKETS,
    JobRun,
    RunTotal,
    SchedulerState,
    bucket_key,
)
from .run.status import RunStatus

logger = logging.getLogger("django_exclusive_jobs")

PREFIX = "exclusive_jobs"
# How a run ended: the statuses of runs_total (missed and skipped slots have counters of
# their own: they are slots nobody ran, not runs, as paused ones are; running is no end).
NOT_ENDS = (RunStatus.RUNNING, *RunStatus.not_runs())
ENDS = [status for status in RunStatus.values if status not in NOT_ENDS]
# Each problem kind of the health checks, as a label value.
PROBLEMS = {kind: kind.value.replace(" ", "_") for kind in Health}
# The label of every per-job metric.
LABEL = ("job_name",)


@dataclass
class Histogram:
    """One job's histogram: non-cumulative counts by bucket key, and the sum."""

    buckets: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    total: float = 0.0

    def cumulative(self, bounds: tuple[float, ...]) -> list[tuple[str, float]]:
        """Prometheus buckets. A stored bucket whose bound is gone (the bounds changed)
        counts in the first bound above it, so no count ever goes down."""
        keys = [bucket_key(b) for b in bounds]
        counts = dict.fromkeys([*keys, INF], 0)
        for key, n in self.buckets.items():
            counts[key if key in counts else _next_bound(key, bounds)] += n
        out, running = [], 0
        for key in [*keys, INF]:
            running += counts[key]
            out.append((key, float(running)))
        return out


def _next_bound(key: str, bounds: tuple[float, ...]) -> str:
    try:
        value = float(key)
    except ValueError:
        return INF
    return next((bucket_key(b) for b in bounds if value <= b), INF)


@dataclass
class Totals:
    """What runs counted, per job: :meth:`JobRunQuerySet.tallies` of the rows kept plus
    the ``RunTotal`` rows, read in one statement."""

    runs: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    last: dict[tuple[str, str], dt.datetime] = field(default_factory=dict)
    duration: dict[str, Histogram] = field(default_factory=lambda: defaultdict(Histogram))
    lateness: dict[str, Histogram] = field(default_factory=lambda: defaultdict(Histogram))

    @classmethod
    def read(cls, using: str) -> Totals:
        totals = cls()
        kept = RunTotal.objects.using(using).tallies()
        for row in JobRun.objects.using(using).tallies(kept):
            totals.add(row)
        return totals

    def add(self, row: dict[str, Any]) -> None:
        job, status = row["job"], row["state"]
        self.runs[(job, status)] += row["n"]
        last, newest = row["last"], self.last.get((job, status))
        if last is not None and (newest is None or last > newest):
            self.last[(job, status)] = last
        if row["duration_le"]:
            self.duration[job].buckets[row["duration_le"]] += row["n"]
            self.duration[job].total += float(row["duration_sum"] or 0)
        if row["lateness_le"]:
            self.lateness[job].buckets[row["lateness_le"]] += row["n"]
            self.lateness[job].total += float(row["lateness_sum"] or 0)

    @property
    def jobs(self) -> set[str]:
        return {job for job, _ in self.runs} | set(self.duration) | set(self.lateness)

    def newest(self, job: str, statuses: Iterable[str]) -> float:
        """The newest end among ``statuses`` as a Unix time; 0 if there is none."""
        ends = [self.last[(job, s)] for s in statuses if (job, s) in self.last]
        return max(ends).timestamp() if ends else 0.0


def metric_families(using: str | None = None) -> list[Metric]:
    """Every metric, read from the database of the lock table (or ``using``); raises
    ``JobLockError`` when the database cannot be read."""
    alias = resolve_alias(using)
    jobs = run_statement(alias, lambda: overview(alias))
    totals = run_statement(alias, lambda: Totals.read(alias))
    return _families(jobs, totals)


def _families(jobs: Overview, totals: Totals) -> list[Metric]:
    described = {job.name: job for job in [*jobs.jobs, *jobs.undeclared]}
    names = sorted(set(described) | totals.jobs)
    return [
        *_run_families(names, totals),
        *_state_families(names, described),
        *_scheduler_families(jobs),
        _up(True),
    ]


def _gauge(name: str, doc: str, labels: Sequence[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=LABEL if labels is None else labels)


def _run_families(names: list[str], totals: Totals) -> list[Metric]:
    """What each job's runs counted: how they ended, the slots nobody ran, the last
    success and failure, the durations and the lateness."""
    runs = CounterMetricFamily(
        f"{PREFIX}_runs", "Runs that ended, by how they ended.", labels=["job_name", "status"]
    )
    missed = CounterMetricFamily(
        f"{PREFIX}_missed_slots", "Scheduled slots no server ran (recorded missed).", labels=LABEL
    )
    skipped = CounterMetricFamily(
        f"{PREFIX}_skipped_slots",
        "Scheduled slots skipped because the job's previous run still ran (its overlap policy).",
        labels=LABEL,
    )
    success = _gauge(
        "last_success_timestamp_seconds",
        "When the job's last run that succeeded (or enqueued its task) ended; 0: never.",
    )
    failure = _gauge(
        "last_failure_timestamp_seconds",
        "When the job's last failed, timed out or lost run ended; 0: never.",
    )
    duration = HistogramMetricFamily(
        f"{PREFIX}_run_duration_seconds", "How long runs lasted.", labels=LABEL
    )
    lateness = HistogramMetricFamily(
        f"{PREFIX}_start_lateness_seconds",
        "How long after its slot a scheduled slot's first attempt started (its jitter "
        "included; negative: a direct call a little before its slot).",
        labels=LABEL,
    )
    for name in names:
        for status in ENDS:
            runs.add_metric([name, status], totals.runs.get((name, status), 0))
        missed.add_metric([name], totals.runs.get((name, RunStatus.MISSED), 0))
        skipped.add_metric([name], totals.runs.get((name, RunStatus.SKIPPED), 0))
        success.add_metric([name], totals.newest(name, RunStatus.done()))
        failure.add_metric([name], totals.newest(name, RunStatus.failures()))
        for family, histograms, bounds in (
            (duration, totals.duration, DURATION_BUCKETS),
            (lateness, totals.lateness, LATENESS_BUCKETS),
        ):
            histogram = histograms.get(name, Histogram())
            family.add_metric([name], histogram.cumulative(bounds), histogram.total)
    return [runs, missed, skipped, success, failure, duration, lateness]


def _state_families(names: list[str], described: dict[str, JobHealth]) -> list[Metric]:
    """Each job now: its next slot, its lock, its current run, its pause, its problems."""
    next_slot = _gauge("next_slot_timestamp_seconds", "When the job's next slot comes.")
    held = _gauge("lock_held", "1 while a run holds the job's lock.")
    running = _gauge("running_seconds", "How long the job's current run has lasted; 0: none.")
    paused = _gauge("paused", "1 while an operator has paused the job.")
    problem = _gauge(
        "problem",
        "1 while the health checks find this problem with the job (exclusive_jobs --check).",
        ["job_name", "problem"],
    )
    for name in names:
        job = described.get(name) or JobHealth(name, declared=False)
        if job.next_slot is not None:
            next_slot.add_metric([name], job.next_slot.timestamp())
        held.add_metric([name], float(job.lock_state == "held"))
        running.add_metric([name], job.running_for or 0.0)
        paused.add_metric([name], float(job.paused))
        for kind, value in PROBLEMS.items():
            if kind not in (Health.OK, Health.PAUSED):
                problem.add_metric([name, value], float(kind in job.kinds))
    return [next_slot, held, running, paused, problem]


def _scheduler_families(jobs: Overview) -> list[Metric]:
    """Each scheduler: alive, its last beat; and how many beat now."""
    alive = _gauge("scheduler_alive", "1 while the scheduler beats.", ["scheduler"])
    beat = _gauge(
        "scheduler_last_heartbeat_timestamp_seconds",
        "When the scheduler last beat.",
        ["scheduler"],
    )
    seen: set[str] = set()
    for row in jobs.schedulers:  # newest beat first: a restarted host:pid shows its newest
        who = str(row)
        if who in seen:
            continue
        seen.add(who)
        alive.add_metric([who], float(row.state == SchedulerState.ALIVE))  # type: ignore[attr-defined]
        beat.add_metric([who], row.last_beat_at.timestamp())
    count = GaugeMetricFamily(
        f"{PREFIX}_schedulers_alive", "Schedulers beating now.", value=jobs.schedulers_alive
    )
    skipped = GaugeMetricFamily(
        f"{PREFIX}_schedules_skipped",
        "1 while scheduled slots are skipped: SKIP_SCHEDULES in the settings of the process "
        "serving this, or a live scheduler started with --skip-schedules.",
        value=float(jobs.skipped_here or bool(jobs.skipping)),
    )
    return [alive, beat, count, skipped]


def _up(up: bool) -> GaugeMetricFamily:
    return GaugeMetricFamily(
        f"{PREFIX}_database_up",
        "1 when the jobs' database could be read at this scrape.",
        value=float(up),
    )


class JobsCollector:
    """A collector for a project's own registry (django-prometheus's ``/metrics``)::

        from prometheus_client import REGISTRY
        REGISTRY.register(JobsCollector())

    A database that cannot be read gives ``exclusive_jobs_database_up 0`` and one
    warning line, never an error on the page.
    """

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    def describe(self) -> list[Metric]:
        return []  # registering it reads nothing; the names come at each scrape

    def collect(self) -> Iterator[Metric]:
        try:
            families = metric_families(self.using)
        except JobLockError as exc:
            logger.warning("exclusive_jobs metrics: the database could not be read: %s", exc)
            families = [_up(False)]
        yield from families


class Families:
    """A collector for the metrics already read (the view reads first, to answer 503)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families

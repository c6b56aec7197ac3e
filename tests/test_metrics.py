"""The Prometheus metrics: scraped from the real view, parsed with prometheus-client's own
parser, on every backend; counters that pruning cannot lower; a query count that does
not grow with jobs or runs; a database that cannot be read."""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from django_exclusive_jobs import exclusive_job
from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.metrics import JobsCollector, metric_families
from django_exclusive_jobs.models import JobLock, JobRun, RunTotal, Scheduler
from django_exclusive_jobs.run import control
from django_exclusive_jobs.run.pruning import prune_runs
from django_exclusive_jobs.run.registry import _jobs
from django_exclusive_jobs.run.schedules import Every

from .test_operate import insert_runs

TOKEN = "metrics-s3cret"
HOUR = dt.timedelta(hours=1)
JOB = "metrics_hourly"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(alias: str, **headers: str) -> Any:
    with override_settings(EXCLUSIVE_JOBS={"HEALTH_TOKEN": TOKEN, "DATABASE": alias}):
        return Client().get(
            "/jobs/metrics", headers={"Authorization": f"Bearer {TOKEN}", **headers}
        )


def parsed(alias: str) -> tuple[dict[str, str], Samples]:
    """The real endpoint's answer, parsed: each family's type, and every sample."""
    answer = scrape(alias)
    assert answer.status_code == 200, answer.content
    # What prometheus-client's own server answers a scraper that asks for nothing special.
    assert answer["Content-Type"] == choose_encoder("")[1]
    types: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(answer.content.decode()):
        types[family.name] = family.type
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in samples, f"duplicate sample {key}"
            samples[key] = sample.value
    return types, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


@pytest.fixture
def hourly() -> Iterator[str]:
    @exclusive_job(JOB, every="1h")
    def metrics_hourly() -> None:
        pass

    yield JOB
    _jobs.pop(JOB, None)


def test_a_scrape_shows_each_job_and_scheduler_as_the_database_has_them(
    alias: str, hourly: str
) -> None:
    now = database_now(alias)
    slot = Every(period=HOUR).slot_at(now)
    runs = JobRun.objects.using(alias)

    def run(status: str, back: int, late: float, duration: float | None) -> JobRun:
        start = slot - back * HOUR + dt.timedelta(seconds=late)
        end = None if duration is None else start + dt.timedelta(seconds=duration)
        return runs.create(
            name=JOB,
            slot=slot - back * HOUR,
            status=status,
            started_at=start,
            finished_at=end or start,
            duration=duration,
        )

    # (Lateness away from a bucket's bound: SQLite computes it in floating point.)
    run("succeeded", 4, late=1.5, duration=3.0)
    run("missed", 3, late=0, duration=None)
    run("skipped", 2, late=0, duration=None)
    failed = run("failed", 1, late=40, duration=0.2)
    runs.create(name=JOB, slot=slot, status="failed", attempt=2, started_at=now, duration=0.1)
    JobLock.objects.using(alias).create(
        name=JOB, token=3, host="web-1", pid=7, acquired_at=now, expires_at=now + HOUR
    )
    control.pause(JOB, by="alice", using=alias)
    Scheduler.objects.using(alias).create(
        instance="a" * 32, host="web-1", pid=7, jobs=[JOB], started_at=now, last_beat_at=now
    )
    gone = now - dt.timedelta(hours=2)
    Scheduler.objects.using(alias).create(
        instance="b" * 32, host="web-2", pid=9, jobs=[JOB], started_at=gone, last_beat_at=gone
    )

    types, samples = parsed(alias)

    assert value(samples, "exclusive_jobs_runs_total", job_name=JOB, status="succeeded") == 1
    assert value(samples, "exclusive_jobs_runs_total", job_name=JOB, status="failed") == 2
    assert value(samples, "exclusive_jobs_runs_total", job_name=JOB, status="timed_out") == 0
    assert value(samples, "exclusive_jobs_missed_slots_total", job_name=JOB) == 1
    assert value(samples, "exclusive_jobs_skipped_slots_total", job_name=JOB) == 1
    duration = "exclusive_jobs_run_duration_seconds"
    assert value(samples, f"{duration}_bucket", job_name=JOB, le="0.5") == 2
    assert value(samples, f"{duration}_bucket", job_name=JOB, le="5.0") == 3
    assert value(samples, f"{duration}_bucket", job_name=JOB, le="+Inf") == 3
    assert value(samples, f"{duration}_count", job_name=JOB) == 3
    assert value(samples, f"{duration}_sum", job_name=JOB) == pytest.approx(3.3)
    # Lateness: first attempts of scheduled slots that ran (not the retry, not missed).
    lateness = "exclusive_jobs_start_lateness_seconds"
    assert value(samples, f"{lateness}_bucket", job_name=JOB, le="1.0") == 0
    assert value(samples, f"{lateness}_bucket", job_name=JOB, le="2.0") == 1
    assert value(samples, f"{lateness}_bucket", job_name=JOB, le="60.0") == 2
    assert value(samples, f"{lateness}_sum", job_name=JOB) == pytest.approx(41.5, abs=0.01)
    assert value(samples, "exclusive_jobs_last_failure_timestamp_seconds", job_name=JOB) == (
        pytest.approx(failed.finished_at.timestamp() + 0.0, abs=0.01)  # type: ignore[union-attr]
    )
    assert value(samples, "exclusive_jobs_last_success_timestamp_seconds", job_name=JOB) > 0
    next_slot = value(samples, "exclusive_jobs_next_slot_timestamp_seconds", job_name=JOB)
    assert now.timestamp() < next_slot <= (now + HOUR).timestamp() and next_slot % 3600 == 0
    assert value(samples, "exclusive_jobs_lock_held", job_name=JOB) == 1
    assert value(samples, "exclusive_jobs_paused", job_name=JOB) == 1
    assert value(samples, "exclusive_jobs_problem", job_name=JOB, problem="failing") == 1
    assert value(samples, "exclusive_jobs_problem", job_name=JOB, problem="stale_lock") == 0
    assert value(samples, "exclusive_jobs_scheduler_alive", scheduler="web-1:7") == 1
    assert value(samples, "exclusive_jobs_scheduler_alive", scheduler="web-2:9") == 0
    beat = value(
        samples, "exclusive_jobs_scheduler_last_heartbeat_timestamp_seconds", scheduler="web-2:9"
    )
    assert beat == pytest.approx(gone.timestamp(), abs=0.01)
    assert value(samples, "exclusive_jobs_schedulers_alive") == 1
    assert value(samples, "exclusive_jobs_database_up") == 1
    # A declared job that never ran is there, at zero: a rate() sees its first failure.
    assert value(samples, "exclusive_jobs_runs_total", job_name="quick", status="failed") == 0

    assert types["exclusive_jobs_runs"] == "counter"
    assert types["exclusive_jobs_missed_slots"] == "counter"
    assert types[duration] == types[lateness] == "histogram"
    assert types["exclusive_jobs_lock_held"] == "gauge"
    for name, labels in samples:
        assert name.startswith("exclusive_jobs_")
        assert {label for label, _ in labels} <= {
            "job_name",
            "status",
            "problem",
            "scheduler",
            "le",
        }


def test_counters_and_histograms_do_not_go_down_when_history_is_pruned(alias: str) -> None:
    now = database_now(alias)
    runs = JobRun.objects.using(alias)
    for days, status, duration in [
        (40, "succeeded", 2.0),
        (39, "failed", 700.0),
        (38, "succeeded", 0.1),
    ]:
        start = now - dt.timedelta(days=days)
        runs.create(
            name="quick",
            slot=start,
            status=status,
            started_at=start,
            finished_at=start,
            duration=duration,
        )
    runs.create(name="quick", status="succeeded", started_at=now, finished_at=now, duration=1.0)
    _, before = parsed(alias)

    assert prune_runs(dt.timedelta(days=30), using=alias) == 2  # the last slotted run stays
    assert runs.count() == 2
    _, after = parsed(alias)
    assert counted(after) == counted(before)
    assert sum(RunTotal.objects.using(alias).values_list("count", flat=True)) == 2
    assert value(after, "exclusive_jobs_runs_total", job_name="quick", status="failed") == 1

    # What pruning kept adds up with what runs after it.
    runs.create(name="quick", status="failed", started_at=now, finished_at=now, duration=0.3)
    _, later = parsed(alias)
    assert value(later, "exclusive_jobs_runs_total", job_name="quick", status="failed") == 2
    duration = "exclusive_jobs_run_duration_seconds"
    assert value(later, f"{duration}_count", job_name="quick") == 5
    assert value(later, f"{duration}_bucket", job_name="quick", le="0.5") == 2
    assert value(later, f"{duration}_sum", job_name="quick") == pytest.approx(703.4)
    for (name, labels), number in before.items():
        if name.endswith(("_total", "_bucket", "_count", "_sum")):
            assert later[(name, labels)] >= number, name


def test_a_second_prune_of_the_same_runs_adds_nothing(alias: str) -> None:
    now = database_now(alias)
    runs = JobRun.objects.using(alias)
    old = now - dt.timedelta(days=40)
    ids = [
        runs.create(name="quick", status="failed", started_at=old, finished_at=old).pk
        for _ in range(3)
    ]
    from django_exclusive_jobs.run.pruning import delete_runs

    assert delete_runs(ids, using=alias) == 3
    assert delete_runs(ids, using=alias) == 0  # another server's prune, a moment later
    [total] = RunTotal.objects.using(alias).all()
    assert (total.name, total.status, total.count) == ("quick", "failed", 3)


@pytest.mark.django_db(transaction=True)
def test_runs_deleted_in_the_admin_still_count() -> None:
    from django.urls import reverse

    from .test_admin import client_for, make_user

    now = database_now("default")
    ids = [
        JobRun.objects.create(name="quick", status="failed", started_at=now, finished_at=now).pk
        for _ in range(2)
    ]
    _, before = parsed("default")
    admin = client_for(make_user("admin", perms=("view_jobrun", "delete_jobrun")))
    changelist = reverse("admin:django_exclusive_jobs_jobrun_changelist")
    answer = admin.post(
        changelist,
        {"action": "delete_selected", "_selected_action": ids, "post": "yes"},
    )
    assert answer.status_code == 302
    assert not JobRun.objects.exists()
    _, after = parsed("default")
    assert counted(after) == counted(before)
    assert value(after, "exclusive_jobs_runs_total", job_name="quick", status="failed") == 2


def counted(samples: Samples) -> Samples:
    """The counters, the histograms and the last ends (the rest moves with time)."""
    kinds = ("_total", "_bucket", "_count", "_sum", "_timestamp_seconds")
    return {
        key: number
        for key, number in samples.items()
        if key[0].endswith(kinds) and "next_slot" not in key[0] and "heartbeat" not in key[0]
    }


def count_queries(alias: str) -> tuple[int, list[Any]]:
    with CaptureQueriesContext(connections[alias]) as queries:
        families = metric_families(alias)
    slowest = sorted(queries.captured_queries, key=lambda q: -float(q["time"]))[:2]
    logging.getLogger(__name__).warning(
        "slowest: %s", [(q["time"], q["sql"][:80]) for q in slowest]
    )
    return len(queries), families


def bulk_jobs(alias: str, jobs: int, runs: int) -> list[str]:
    names = [f"bulk_{n:04d}" for n in range(jobs)]
    for name in names:
        exclusive_job(name, every="1h")(lambda: None)
    JobLock.objects.using(alias).bulk_create(
        [JobLock(name=name, token=1) for name in names], batch_size=500
    )
    insert_runs(alias, names, runs)
    return names


def scrape_costs_the_same(alias: str, jobs: int, runs: int) -> None:
    JobLock.objects.using(alias).create(name="quick", token=1)
    now = database_now(alias)
    JobRun.objects.using(alias).create(
        name="quick", status="succeeded", started_at=now, finished_at=now, duration=1.0
    )
    metric_families(alias)  # the first look makes the declared jobs' missing lock rows
    few, _ = count_queries(alias)
    bulk_jobs(alias, jobs, runs)
    assert JobRun.objects.using(alias).count() == runs + 1
    took = scrape_as_before(alias, few, jobs=jobs, runs=runs)
    logging.getLogger(__name__).warning(
        "%s: a scrape of %s jobs and %s runs: %s queries, %.2fs", alias, jobs, runs, few, took
    )


def scrape_as_before(alias: str, few: int, *, jobs: int, runs: int) -> float:
    """A scrape, after ``runs`` runs of ``jobs`` bulk jobs were written: it sends ``few``
    queries, as before them, and bulk_0007's histogram counts its runs. Its seconds."""
    started = time.monotonic()
    many, found = count_queries(alias)
    took = time.monotonic() - started
    assert many == few
    families = {family.name: family for family in found}
    [sample] = [
        s
        for s in families["exclusive_jobs_run_duration_seconds"].samples
        if s.labels == {"job_name": "bulk_0007", "le": "+Inf"}
    ]
    assert sample.value == math.ceil((runs - 7) / jobs)
    return took


@pytest.mark.usefixtures("forget_bulk_jobs")
def test_scrape_query_count_does_not_grow_with_jobs_or_runs(alias: str) -> None:
    scrape_costs_the_same(alias, jobs=100, runs=20_000)


def test_the_view_is_closed_without_the_token_and_speaks_openmetrics_when_asked(
    alias: str,
) -> None:
    with override_settings(EXCLUSIVE_JOBS={"HEALTH_TOKEN": TOKEN, "DATABASE": alias}):
        assert Client().get("/jobs/metrics").status_code == 403
        wrong = Client().get("/jobs/metrics", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 403
    answer = scrape(alias, Accept="application/openmetrics-text; version=1.0.0")
    assert answer.status_code == 200
    assert answer["Content-Type"].startswith("application/openmetrics-text")
    assert "no-cache" in answer["Cache-Control"]
    names = {family.name for family in openmetrics_families(answer.content.decode())}
    assert {"exclusive_jobs_runs", "exclusive_jobs_run_duration_seconds"} <= names


@pytest.mark.django_db(transaction=True)
def test_staff_who_may_view_jobs_see_the_metrics_as_they_see_health() -> None:
    from .test_admin import client_for, make_user

    viewer = client_for(make_user("viewer", perms=("view_jobstate",)))
    assert viewer.get("/jobs/metrics").status_code == 200
    stranger = client_for(make_user("stranger", perms=()))
    assert stranger.get("/jobs/metrics").status_code == 403


@pytest.fixture
def unreachable(django_db_blocker: Any) -> Iterator[str]:
    """An alias whose database cannot be opened."""
    name = "metrics_unreachable"
    connections.settings[name] = {
        **connections.settings["default"],
        "NAME": "/nonexistent-directory/jobs.sqlite3",
    }
    try:
        with django_db_blocker.unblock():
            yield name
    finally:
        connections[name].close()
        del connections[name]
        del connections.settings[name]


def test_a_database_that_cannot_be_read_is_a_503_with_one_line(unreachable: str) -> None:
    answer = scrape(unreachable)
    assert answer.status_code == 503
    text = answer.content.decode()
    assert text.startswith("database: ") and text.count("\n") == 1
    assert "Traceback" not in text


def test_the_collector_in_a_projects_registry_says_database_down_in_one_line(
    alias: str, unreachable: str, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    registry.register(JobsCollector(using=alias))
    text = generate_latest(registry).decode()
    assert "exclusive_jobs_database_up 1.0" in text
    assert 'exclusive_jobs_runs_total{job_name="quick",status="succeeded"} 0.0' in text

    broken = CollectorRegistry()
    broken.register(JobsCollector(using=unreachable))
    with caplog.at_level(logging.WARNING, logger="django_exclusive_jobs"):
        text = generate_latest(broken).decode()
    assert "exclusive_jobs_database_up 0.0" in text
    ours = [r for r in caplog.records if r.name == "django_exclusive_jobs"]
    assert len(ours) == 1 and "\n" not in ours[0].getMessage()
    assert ours[0].getMessage().startswith("exclusive_jobs metrics: the database could not be read")

"""OpenTelemetry traces (``EXCLUSIVE_JOBS["OPENTELEMETRY"]``): one span per run on the
server that won it, events for its steps, nothing for a skip but an event.

In this process: the SDK's in-memory exporter. In real ``run_exclusive`` processes (with
``tests.settings_observe``): an exporter that writes each span to a file.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_exclusive_jobs import exclusive_job, try_acquire
from django_exclusive_jobs.integrations import opentelemetry as traces
from django_exclusive_jobs.models import JobRun, RunStatus
from django_exclusive_jobs.run import registry

from .conftest import clean_tables, seconds_to_wait_out_the_hours_edge
from .observers import read
from .test_command import command_env, manage, marker

__all__ = ["marker"]  # fixture

WEEK = "7d"  # slots a week apart: a test never crosses one


class Failing(SpanProcessor):
    """A span processor that raises at each span's end while ``failing`` is set."""

    failing = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.failing:
            raise ConnectionError("collector at 10.0.0.9:4317 refused the span")


EXPORTER = InMemorySpanExporter()
FAILING = Failing()


def _provider() -> None:
    """One tracer provider for the process (OpenTelemetry sets it once)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        provider.add_span_processor(FAILING)
        trace.set_tracer_provider(provider)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on, the exporter empty; the jobs a test declares are gone after it."""
    _provider()
    jobs = dict(registry._jobs)
    EXPORTER.clear()
    traces.connect()
    try:
        yield EXPORTER
    finally:
        traces.disconnect()
        EXPORTER.clear()
        FAILING.failing = False
        registry._jobs.clear()
        registry._jobs.update(jobs)


@pytest.fixture
def sqlite(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    """The SQLite test database, its tables clean after the test."""
    with django_db_blocker.unblock():
        try:
            yield "default"
        finally:
            clean_tables("default")


def runs_of(spans: InMemorySpanExporter) -> list[ReadableSpan]:
    return [span for span in spans.get_finished_spans() if span.name.startswith("exclusive_job ")]


def events(span: ReadableSpan) -> list[str]:
    return [event.name for event in span.events]


# --- a run, on each backend -------------------------------------------------------------


def test_a_run_is_one_span_with_its_job_slot_token_attempt_and_status(
    alias: str, spans: InMemorySpanExporter
) -> None:
    name = "traced-run"
    job = exclusive_job(name, using=alias, cron="30 6 * * *", timezone="Europe/Paris")(
        lambda: "done"
    )
    assert job() == "done"
    [span] = runs_of(spans)
    [run] = JobRun.objects.using(alias).filter(name=name)
    assert span.name == f"exclusive_job {name}"
    assert span.kind == trace.SpanKind.CONSUMER
    assert span.parent is None  # a cron line's run is the root of its trace
    attributes = dict(span.attributes or {})
    assert attributes["exclusive_jobs.job"] == name
    assert attributes["exclusive_jobs.slot"] == run.slot.isoformat()
    assert attributes["exclusive_jobs.token"] == run.token
    assert attributes["exclusive_jobs.attempt"] == run.attempt == 1
    assert attributes["exclusive_jobs.status"] == RunStatus.SUCCEEDED
    assert attributes["exclusive_jobs.database"] == alias
    assert attributes["faas.trigger"] == "timer"
    assert attributes["faas.cron"] == "30 6 * * *"
    assert attributes["exclusive_jobs.timezone"] == "Europe/Paris"
    assert dt.datetime.fromisoformat(str(attributes["faas.time"])) == run.slot
    assert events(span) == ["exclusive_jobs.take", "exclusive_jobs.claim", "exclusive_jobs.release"]
    assert span.status.status_code == trace.StatusCode.UNSET
    assert span.start_time is not None and span.end_time is not None
    assert span.start_time <= span.events[1].timestamp <= span.end_time


def test_a_failed_run_has_status_error_and_its_exception(
    alias: str, spans: InMemorySpanExporter
) -> None:
    def fails() -> None:
        raise ValueError("the ledger does not balance")

    job = exclusive_job("traced-failure", using=alias, every=WEEK)(fails)
    with pytest.raises(ValueError, match="ledger"):
        job()
    [span] = runs_of(spans)
    assert span.status.status_code == trace.StatusCode.ERROR
    assert "the ledger does not balance" in str(span.status.description)
    assert (span.attributes or {})["exclusive_jobs.status"] == RunStatus.FAILED
    assert "exception" in events(span)


def test_a_skipped_start_makes_no_span_only_an_event_on_the_callers_span(
    alias: str, spans: InMemorySpanExporter
) -> None:
    name = "traced-skip"
    calls: list[int] = []
    job = exclusive_job(name, using=alias, every=WEEK)(lambda: calls.append(1))
    holder = try_acquire(name, using=alias, ttl=60)  # another server runs it
    assert holder is not None
    try:
        job()  # a cron line's start: no span at all
        assert spans.get_finished_spans() == ()
        with trace.get_tracer("tests").start_as_current_span("a request"):
            job()  # a web request's call: an event on the request's span
    finally:
        holder.release()
    assert calls == []
    [request] = spans.get_finished_spans()
    assert request.name == "a request"
    [skip] = request.events
    assert skip.name == "exclusive_jobs.skip"
    assert (skip.attributes or {})["exclusive_jobs.holder"] == holder.holder


def test_the_jobs_own_spans_nest_in_its_run_span_and_the_caller_gets_its_context_back(
    alias: str, spans: InMemorySpanExporter
) -> None:
    tracer = trace.get_tracer("tests")

    def body() -> None:
        with tracer.start_as_current_span("a query"):
            pass

    job = exclusive_job("traced-nesting", using=alias, every=WEEK)(body)
    with tracer.start_as_current_span("a request") as request:
        job()
        assert trace.get_current_span() is request
    query, run, outer = spans.get_finished_spans()
    assert query.name == "a query" and outer.name == "a request"
    assert query.parent is not None and run.context is not None
    assert query.parent.span_id == run.context.span_id
    assert run.parent is not None and outer.context is not None
    assert run.parent.span_id == outer.context.span_id
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_a_manual_run_is_not_a_timer(alias: str, spans: InMemorySpanExporter) -> None:
    job = exclusive_job("traced-manual", using=alias)(lambda: None)
    job()
    [span] = runs_of(spans)
    attributes = dict(span.attributes or {})
    assert attributes["faas.trigger"] == "other"
    assert "exclusive_jobs.slot" not in attributes and "faas.time" not in attributes


def test_the_same_statements_run_with_tracing_on_as_off(
    alias: str, spans: InMemorySpanExporter
) -> None:
    job = exclusive_job("traced-statements", using=alias)(lambda: None)

    def statements() -> int:
        with CaptureQueriesContext(connections[alias]) as queries:
            job()
        return len(queries.captured_queries)

    job()  # the lock's row exists from now on: each run below takes the same path
    traced = statements()
    traces.disconnect()
    plain = statements()
    assert len(runs_of(spans)) == 2
    assert traced == plain


def test_a_failing_tracer_is_one_warning_line_and_the_job_runs(
    alias: str, spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    name = "traced-broken-collector"
    job = exclusive_job(name, using=alias, every=WEEK)(lambda: "done")
    FAILING.failing = True
    with caplog.at_level(logging.WARNING, logger="django_exclusive_jobs"):
        assert job() == "done"
    [run] = JobRun.objects.using(alias).filter(name=name)
    assert run.status == RunStatus.SUCCEEDED
    [line] = [r for r in caplog.records if r.name == "django_exclusive_jobs"]
    assert line.levelno == logging.WARNING
    assert line.getMessage().startswith(f"OpenTelemetry: could not report the end of {name}")
    assert "collector at 10.0.0.9:4317 refused the span" in line.getMessage()
    assert "\n" not in line.getMessage() and line.exc_info is None


# --- real run_exclusive processes --------------------------------------------------------


def observed_env(marker: Path, output: Path, **extra: str) -> dict[str, str]:
    return command_env(
        marker, DJANGO_SETTINGS_MODULE="tests.settings_observe", OBSERVED=str(output), **extra
    )


def test_run_exclusive_exports_one_span_and_the_next_server_none(
    alias: str, marker: Path, tmp_path: Path
) -> None:
    output = tmp_path / "observed.jsonl"
    # Both lines serve one slot of the */5 job: not started where the second would come
    # inside the next slot's early allowance (it then rightly waits for it and runs it).
    time.sleep(seconds_to_wait_out_the_hours_edge(time.time(), period=300))
    first = manage(alias, "observed", env=observed_env(marker, output))
    assert first.returncode == 0, first.stderr
    second = manage(alias, "observed", env=observed_env(marker, output))
    assert second.returncode == 0, second.stderr
    assert "skipped observed" in second.stdout + second.stderr
    spans, _ = read(output)
    inside, run = spans
    [row] = JobRun.objects.using(alias).filter(name="observed")
    assert run["name"] == "exclusive_job observed" and run["parent_id"] is None
    assert run["attributes"]["exclusive_jobs.token"] == row.token
    assert run["attributes"]["faas.cron"] == "*/5 * * * *"
    assert run["events"] == [
        "exclusive_jobs.take",
        "exclusive_jobs.claim",
        "exclusive_jobs.release",
    ]
    assert inside["name"] == "inside the job" and inside["parent_id"] == run["span_id"]
    assert inside["trace_id"] == run["trace_id"]


def test_a_failed_run_exclusive_exports_an_error_span(
    alias: str, marker: Path, tmp_path: Path
) -> None:
    output = tmp_path / "observed.jsonl"
    result = manage(alias, "observed", env=observed_env(marker, output, OBSERVED_FAILS="1"))
    assert result.returncode == 1
    _, run = read(output)[0]
    assert run["status"] == "ERROR"
    assert run["attributes"]["exclusive_jobs.status"] == RunStatus.FAILED


@pytest.mark.parametrize(
    ("settings", "imported"), [("tests.settings", False), ("tests.settings_observe", True)]
)
def test_a_run_imports_the_integrations_only_when_they_are_on(
    sqlite: str, marker: Path, tmp_path: Path, settings: str, imported: bool
) -> None:
    env = command_env(marker, DJANGO_SETTINGS_MODULE=settings, OBSERVED=str(tmp_path / "o.jsonl"))
    result = manage(sqlite, "modules_probe", env=env)
    assert result.returncode == 0, result.stderr
    modules = marker.read_text().split()[:-1]  # the last word is the pid
    assert ("django_exclusive_jobs.integrations.opentelemetry" in modules) is imported
    assert ("django_exclusive_jobs.integrations.sentry" in modules) is imported
    if not imported:
        assert modules == ["none"]


def test_the_scheduler_exports_a_span_per_run_and_none_for_a_job_too_fast_for_sentry(
    alias: str, marker: Path, tmp_path: Path
) -> None:
    from .helpers import reaped
    from .test_command import wait_for
    from .test_scheduler import start_scheduler, stop

    output = tmp_path / "observed.jsonl"
    with reaped() as started:
        scheduler = start_scheduler(
            started, alias, "--jobs", "tick", env=observed_env(marker, output)
        )
        wait_for(lambda: marker.exists() and len(marker.read_text().splitlines()) >= 2)
        stop(scheduler)
    spans, check_ins = read(output)
    ran = list(  # each run that ended (the stop may have interrupted the last one)
        JobRun.objects.using(alias)
        .filter(name="tick", token__isnull=False, finished_at__isnull=False)
        .exclude(status__in=(RunStatus.MISSED, RunStatus.SKIPPED))
    )
    runs = [span for span in spans if span["name"] == "exclusive_job tick"]
    assert len(ran) >= 2
    assert sorted(span["attributes"]["exclusive_jobs.token"] for span in runs) == sorted(
        run.token for run in ran
    )
    assert all(span["parent_id"] is None for span in runs)  # never nested in one another
    assert check_ins == []  # every 2 s: Sentry has no such schedule (W004)


def test_what_a_scheduled_job_traces_in_its_own_process_nests_in_the_runs_span(
    alias: str, marker: Path, tmp_path: Path
) -> None:
    from .helpers import reaped
    from .test_command import wait_for
    from .test_scheduler import start_scheduler, stop

    output = tmp_path / "observed.jsonl"
    with reaped() as started:
        scheduler = start_scheduler(
            started, alias, "--jobs", "observed_tick", env=observed_env(marker, output)
        )
        wait_for(lambda: marker.exists() and len(marker.read_text().splitlines()) >= 2)
        stop(scheduler)
    spans, _ = read(output)
    runs = {
        span["span_id"]: span for span in spans if span["name"] == "exclusive_job observed_tick"
    }
    inner = [span for span in spans if span["name"] == "inside the scheduled job"]
    assert len(inner) >= 2 and runs
    for span in inner:  # made in the child, exported there, under the scheduler's span
        parent = runs[span["parent_id"]]
        assert parent["trace_id"] == span["trace_id"]
        assert parent["start"] <= span["start"] <= span["end"] <= parent["end"]

"""``warn_after=``: a run that lasts that long is running long (a line, a signal, the
health problem, Sentry's max runtime) and goes on. On every backend; the run is a real
one, waited for by conditions (the signal), not by sleeps."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_exclusive_jobs import LockConfigurationError, exclusive_job, signals
from django_exclusive_jobs.health import Health, overview
from django_exclusive_jobs.integrations import sentry as monitors
from django_exclusive_jobs.models import JobLock, JobRun, running_long
from django_exclusive_jobs.run import registry
from django_exclusive_jobs.run.long_runs import LongRunWatch


@pytest.fixture
def jobs() -> Iterator[None]:
    """The jobs a test declares are gone after it."""
    before = dict(registry._jobs)
    try:
        yield
    finally:
        registry._jobs.clear()
        registry._jobs.update(before)


def test_warn_after_replaces_the_median_rule_for_its_job() -> None:
    assert running_long(10.0, 1.0)  # ten times the median, the factor 3
    assert not running_long(10.0, 1.0, warn_after=60.0)  # its own limit, not the median
    assert running_long(60.0, None, warn_after=60.0)  # at the limit: no median needed
    assert not running_long(None, 1.0, warn_after=60.0)  # not running


def test_warn_after_is_positive_and_shorter_than_the_timeout(jobs: None) -> None:
    def refused(**options: Any) -> str:
        with pytest.raises(LockConfigurationError) as caught:
            exclusive_job("warned", **options)(lambda: None)
        return str(caught.value)

    assert refused(warn_after="0s") == "warn_after must be positive, got 0s."
    assert refused(warn_after="999999999d") == "warn_after must be at most 3653d, got '999999999d'."
    assert refused(warn_after="1h", timeout="1h") == (
        "warn_after (3600s) must be shorter than the timeout (3600s): a run is stopped at its "
        "timeout."
    )
    assert "warned" not in registry._jobs
    exclusive_job("warned", warn_after="90m", timeout="2h")(lambda: None)
    assert registry.warn_afters()["warned"] == 5400.0


def test_sentry_s_max_runtime_is_the_warn_after(jobs: None) -> None:
    declared = exclusive_job("warned_monitor", cron="0 * * * *", warn_after="90s", timeout="1h")
    job = declared(lambda: None).job  # type: ignore[attr-defined]
    config = monitors.monitor_config(job)
    assert config is not None and config["max_runtime"] == 2  # 90 s, in whole minutes


def test_a_watch_stopped_before_its_moment_says_nothing(alias: str) -> None:
    said: list[str] = []
    heard: list[dict[str, Any]] = []

    def receiver(**kwargs: Any) -> None:
        heard.append(kwargs)

    signals.job_running_long.connect(receiver, dispatch_uid="stopped-watch")
    try:
        lock = type("Held", (), {"token": 1, "holder": "h:1:i"})()
        watch = LongRunWatch("quick_one", lock, None, 0.01, said.append)  # type: ignore[arg-type]
        watch.stop()  # the run ended first
        watch.begin()  # the waker's call, due now
    finally:
        signals.job_running_long.disconnect(dispatch_uid="stopped-watch")
    assert not [thread for thread in threading.enumerate() if "running-long" in thread.name]
    assert said == [] and heard == []


def test_a_run_past_its_warn_after_is_said_signalled_shown_and_goes_on(
    alias: str, jobs: None, caplog: pytest.LogCaptureFixture
) -> None:
    heard: list[dict[str, Any]] = []
    told = threading.Event()
    seen: dict[str, Any] = {}

    def receiver(**kwargs: Any) -> None:
        heard.append(kwargs)
        told.set()

    def long_job() -> str:
        assert told.wait(30), "no job_running_long within 30 s of a 0.2 s warn_after"
        # Still running: every view of the job says running long.
        [health] = [job for job in overview(alias).jobs if job.name == "long_one"]
        seen["badge"], seen["problems"] = health.badge, health.problems
        long_ones = JobLock.objects.using(alias).running_long(warn_after=registry.warn_afters())
        seen["locks"] = list(long_ones.values_list("name", flat=True))
        return "done"

    call = exclusive_job("long_one", warn_after=0.2, using=alias)(long_job)
    signals.job_running_long.connect(receiver, dispatch_uid="long-run")
    started = time.monotonic()
    try:
        with caplog.at_level(logging.INFO, logger="django_exclusive_jobs"):
            assert call() == "done"  # not stopped: it went on to its end
    finally:
        signals.job_running_long.disconnect(dispatch_uid="long-run")
    [kwargs] = heard  # once
    assert kwargs["sender"] == kwargs["name"] == "long_one"
    assert kwargs["warn_after"] == 0.2
    assert 0.2 <= kwargs["running_for"] <= time.monotonic() - started
    assert kwargs["slot"] is None and kwargs["lock"].name == "long_one"
    assert seen["badge"] == Health.RUNNING_LONG
    [problem] = [line for line in seen["problems"] if "running long" in line]
    assert problem.startswith("running long: running for ")
    assert problem.endswith("s, past its warn_after of 0.2s")
    assert seen["locks"] == ["long_one"]
    [record] = [r for r in caplog.records if r.getMessage().startswith("running long long_one")]
    assert record.levelno == logging.WARNING
    assert record.getMessage().endswith("past its warn_after of 0.2s; it goes on")
    [run] = JobRun.objects.using(alias).filter(name="long_one")
    assert run.status == "succeeded"
    assert run.duration is not None and run.duration >= 0.2
    assert dt.timedelta(seconds=run.duration) < dt.timedelta(seconds=30)


def test_a_receiver_that_raises_is_one_error_line_and_the_run_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    said: list[str] = []

    def broken(**kwargs: Any) -> None:
        raise RuntimeError("the pager is down")

    signals.job_running_long.connect(broken, dispatch_uid="broken-receiver")
    try:
        lock = type("Held", (), {"token": 1, "holder": "h:1:i"})()
        watch = LongRunWatch("slow_one", lock, None, 0.01, said.append)  # type: ignore[arg-type]
        with caplog.at_level(logging.ERROR, logger="django_exclusive_jobs"):
            watch._tell()  # what the waker's thread runs: raises nothing
    finally:
        signals.job_running_long.disconnect(dispatch_uid="broken-receiver")
    assert [line.split(":")[0] for line in said] == ["running long slow_one"]
    ours = [r for r in caplog.records if r.name == "django_exclusive_jobs"]  # not Django's own
    [record] = [r for r in ours if r.levelno == logging.ERROR]
    assert record.getMessage().startswith("job_running_long receiver <function ")
    assert record.getMessage().endswith(" raised")
    assert record.exc_info is not None and "the pager is down" in str(record.exc_info[1])
    assert record.job_name == "slow_one"  # type: ignore[attr-defined]

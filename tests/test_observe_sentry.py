"""Sentry cron monitors (``EXCLUSIVE_JOBS["SENTRY_MONITORS"]``): the winning run of each
slot checks in (``in_progress``, then ``ok`` or ``error``) with its monitor's
configuration from the job's declaration; a skipped server sends nothing.

A real ``sentry_sdk.init`` whose transport keeps the envelopes (no network).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sentry_sdk
from sentry_sdk.envelope import Envelope

from django_exclusive_jobs import exclusive_job, try_acquire
from django_exclusive_jobs.checks import check_settings
from django_exclusive_jobs.integrations import sentry as monitors
from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.models import JobRun, RunStatus
from django_exclusive_jobs.run import registry
from django_exclusive_jobs.run.schedules import Cron, Every, make_schedule
from django_exclusive_jobs.run.shutdown import KILL_AFTER

from .observers import CapturingTransport, read
from .test_command import command_env, manage, marker

__all__ = ["marker"]  # fixture

WEEK = "7d"  # slots a week apart: a test never crosses one


class Refusing(CapturingTransport):
    def capture_envelope(self, envelope: Envelope) -> None:
        raise ConnectionError("sentry.invalid: Name or service not known")


def init(transport: CapturingTransport) -> None:
    sentry_sdk.init(
        dsn="https://public@sentry.invalid/1", transport=transport, default_integrations=False
    )


@pytest.fixture
def check_ins() -> Iterator[list[dict[str, Any]]]:
    """Sentry on with a capturing transport; the jobs a test declares are gone after it."""
    transport = CapturingTransport()
    init(transport)
    jobs = dict(registry._jobs)
    monitors.connect()
    try:
        yield transport.check_ins
    finally:
        monitors.disconnect()
        sentry_sdk.init()  # no DSN: nothing is sent any more
        registry._jobs.clear()
        registry._jobs.update(jobs)


def statuses(sent: list[dict[str, Any]]) -> list[str]:
    return [check_in["status"] for check_in in sent]


# --- the winning run, on each backend -----------------------------------------------------


def test_the_winning_run_checks_in_progress_then_ok_with_its_monitor(
    alias: str, check_ins: list[dict[str, Any]]
) -> None:
    name = "monitored.Nightly Report"
    job = exclusive_job(
        name, using=alias, cron="30 6 * * *", timezone="Europe/Paris", timeout="10m"
    )(lambda: None)
    job()
    started, ended = check_ins
    assert statuses(check_ins) == ["in_progress", "ok"]
    assert started["monitor_slug"] == ended["monitor_slug"] == "monitored-nightly-report"
    assert started["check_in_id"] == ended["check_in_id"]
    config = started["monitor_config"]
    assert config["schedule"] == {"type": "crontab", "value": "30 6 * * *"}
    assert config["timezone"] == "Europe/Paris"
    assert config["checkin_margin"] == 1  # the default slot tolerance (30 s), in whole minutes
    assert config["max_runtime"] == math.ceil((10 * 60 + KILL_AFTER) / 60)
    [run] = JobRun.objects.using(alias).filter(name=name)
    assert ended["duration"] == pytest.approx(run.duration)
    assert started["check_in_id"] == monitors.check_in_id(name, run.slot)


def test_a_failed_run_checks_in_error(alias: str, check_ins: list[dict[str, Any]]) -> None:
    def fails() -> None:
        raise RuntimeError("the bank's API said 503")

    job = exclusive_job("monitored-failure", using=alias, every=WEEK)(fails)
    with pytest.raises(RuntimeError):
        job()
    assert statuses(check_ins) == ["in_progress", "error"]
    assert check_ins[0]["monitor_config"]["schedule"] == {"type": "crontab", "value": "0 0 * * 4"}


def test_a_skipped_server_sends_nothing(alias: str, check_ins: list[dict[str, Any]]) -> None:
    name = "monitored-skip"
    job = exclusive_job(name, using=alias, every=WEEK)(lambda: None)
    holder = try_acquire(name, using=alias, ttl=60)  # another server runs the slot
    assert holder is not None
    try:
        job()
    finally:
        holder.release()
    assert check_ins == []
    job()  # wins the slot
    job()  # the slot already ran: skips
    assert statuses(check_ins) == ["in_progress", "ok"]


def test_a_retried_slot_keeps_one_check_in_open_until_its_last_attempt(
    alias: str, check_ins: list[dict[str, Any]]
) -> None:
    calls: list[int] = []

    def fails() -> None:
        calls.append(1)
        raise RuntimeError(f"attempt {len(calls)} fails")

    job = exclusive_job("monitored-retries", using=alias, every=WEEK, retries=1, retry_backoff=0)(
        fails
    )
    for _ in (1, 2):
        with pytest.raises(RuntimeError):
            job()
    assert statuses(check_ins) == ["in_progress", "in_progress", "error"]
    assert len({check_in["check_in_id"] for check_in in check_ins}) == 1
    assert check_ins[-1]["duration"] is None  # Sentry measures the slot from its start


def test_a_missed_slot_is_left_to_sentry_and_reported_once(
    alias: str, check_ins: list[dict[str, Any]]
) -> None:
    name = "monitored-missed"
    job = exclusive_job(name, using=alias, every="1h")(lambda: None)
    schedule = make_schedule(every="1h")
    assert schedule is not None
    current = schedule.slot_at(database_now(alias))
    before = current - dt.timedelta(hours=2)
    JobRun.objects.using(alias).create(
        name=name, slot=before, status=RunStatus.SUCCEEDED, started_at=before, finished_at=before
    )
    job()
    missed = JobRun.objects.using(alias).filter(name=name, status=RunStatus.MISSED)
    assert missed.count() == 1
    # Sentry marked that slot missed when no check-in came: nothing more is sent for it.
    assert statuses(check_ins) == ["in_progress", "ok"]
    assert check_ins[0]["check_in_id"] == monitors.check_in_id(name, current)


def test_runs_asked_for_now_and_jobs_without_a_schedule_send_nothing(
    alias: str, check_ins: list[dict[str, Any]]
) -> None:
    exclusive_job("unscheduled", using=alias)(lambda: None)()
    assert check_ins == []


def test_a_refusing_transport_is_one_warning_line_per_check_in_and_the_job_runs(
    alias: str, check_ins: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    init(Refusing())
    name = "monitored-offline"
    job = exclusive_job(name, using=alias, every=WEEK)(lambda: "done")
    with caplog.at_level(logging.WARNING, logger="django_exclusive_jobs"):
        assert job() == "done"
    assert JobRun.objects.using(alias).get(name=name).status == RunStatus.SUCCEEDED
    lines = [r.getMessage() for r in caplog.records if r.name == "django_exclusive_jobs"]
    assert [line.split(" (")[0] for line in lines] == [
        f"Sentry: could not report the start of {name}",
        f"Sentry: could not report the end of {name}",
    ]
    assert all("Name or service not known" in line and "\n" not in line for line in lines)


# --- the monitor's configuration ---------------------------------------------------------


@pytest.mark.parametrize("every", ["1m", "15m", "1h", "2h", "6h", "1d", "7d"])
def test_an_every_schedule_becomes_the_crontab_with_the_same_slots(every: str) -> None:
    schedule = make_schedule(every=every)
    assert isinstance(schedule, Every)
    sentry = monitors.every_schedule(schedule.period)
    assert sentry is not None and sentry["type"] == "crontab"
    crontab = Cron(expression=sentry["value"], timezone="UTC")
    moment = dt.datetime(2026, 3, 29, 0, 59, 59, tzinfo=dt.UTC)
    ours, theirs = schedule.slots_after(moment), crontab.slots_after(moment)
    assert [next(ours) for _ in range(5)] == [next(theirs) for _ in range(5)]


@pytest.mark.parametrize(
    ("every", "expected"),
    [
        ("90m", {"type": "interval", "value": 90, "unit": "minute"}),
        ("5h", {"type": "interval", "value": 5, "unit": "hour"}),
        ("3d", {"type": "interval", "value": 3, "unit": "day"}),
        ("14d", {"type": "interval", "value": 2, "unit": "week"}),
        ("30s", None),
        ("90s", None),
    ],
)
def test_other_periods_are_intervals_and_sentry_has_none_under_a_minute(
    every: str, expected: dict[str, Any] | None
) -> None:
    schedule = make_schedule(every=every)
    assert isinstance(schedule, Every)
    assert monitors.every_schedule(schedule.period) == expected


def test_the_check_in_margin_covers_the_jitter_and_the_slot_tolerance() -> None:
    job = exclusive_job("monitored-margin", cron="0 * * * *", jitter="4m", slot_tolerance="50s")(
        lambda: None
    )
    try:
        config = monitors.monitor_config(job.job)  # type: ignore[attr-defined]
    finally:
        registry._jobs.pop("monitored-margin")
    assert config is not None
    assert config["checkin_margin"] == math.ceil((4 * 60 + 50) / 60)
    assert "max_runtime" not in config  # no timeout: Sentry's own default


@pytest.mark.parametrize(
    ("name", "slug"),
    [
        ("billing.jobs.send_invoices", "billing-jobs-send_invoices"),
        ("report:daily", "report-daily"),
        ("2024", "job-2024"),
        ("ÉTÉ  sync", "t-sync"),
    ],
)
def test_a_monitor_slug_is_the_job_name_as_sentry_spells_slugs(name: str, slug: str) -> None:
    assert monitors.monitor_slug(name) == slug


def test_a_long_name_keeps_a_distinct_slug_of_at_most_50_characters() -> None:
    one, two = (monitors.monitor_slug("x" * 60 + suffix) for suffix in ("a", "b"))
    assert one != two and len(one) == len(two) == monitors.SLUG_MAX


def test_a_job_that_cannot_have_a_monitor_is_a_warning(settings: Any) -> None:
    jobs = dict(registry._jobs)
    settings.EXCLUSIVE_JOBS = {"SENTRY_MONITORS": True}
    try:
        exclusive_job("monitored-fast", every="20s")(lambda: None)
        exclusive_job("monitored.twin", every="1h")(lambda: None)
        exclusive_job("monitored-twin", every="1h")(lambda: None)
        messages = [
            m.msg
            for m in check_settings()
            if m.id == "django_exclusive_jobs.W004" and "'monitored" in m.msg
        ]
    finally:
        registry._jobs.clear()
        registry._jobs.update(jobs)
    assert messages == [
        "No Sentry cron monitor for job 'monitored-fast': it runs every 0:00:20, and "
        "Sentry's schedules are whole minutes.",
        "No Sentry cron monitor for job 'monitored.twin': its slug 'monitored-twin' is taken "
        "by job 'monitored-twin'; rename one.",
    ]


@pytest.mark.parametrize("key", ["OPENTELEMETRY", "SENTRY_MONITORS"])
def test_an_integration_setting_must_be_a_bool(settings: Any, key: str) -> None:
    settings.EXCLUSIVE_JOBS = {key: "yes"}
    [message] = [m for m in check_settings() if m.id == "django_exclusive_jobs.E017"]
    assert key in message.msg


def test_an_integration_whose_package_is_missing_is_a_warning(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_exclusive_jobs import integrations

    monkeypatch.setitem(integrations.PACKAGES, "OPENTELEMETRY", "opentelemetry_not_installed")
    settings.EXCLUSIVE_JOBS = {"OPENTELEMETRY": True}
    [message] = [m for m in check_settings() if m.id == "django_exclusive_jobs.W003"]
    assert "opentelemetry-api is not installed" in message.msg
    assert "django-exclusive-jobs[opentelemetry]" in (message.hint or "")


# --- real run_exclusive processes --------------------------------------------------------


def test_run_exclusive_checks_in_twice_and_the_next_server_not_at_all(
    alias: str, marker: Path, tmp_path: Path
) -> None:
    output = tmp_path / "observed.jsonl"
    env = command_env(marker, DJANGO_SETTINGS_MODULE="tests.settings_observe", OBSERVED=str(output))
    for _ in (1, 2):
        result = manage(alias, "observed", env=env)
        assert result.returncode == 0, result.stderr
    _, sent = read(output)
    assert statuses(sent) == ["in_progress", "ok"]
    [run] = JobRun.objects.using(alias).filter(name="observed")
    assert (
        sent[0]["check_in_id"]
        == sent[1]["check_in_id"]
        == monitors.check_in_id("observed", run.slot)
    )
    assert sent[0]["monitor_config"]["schedule"] == {"type": "crontab", "value": "*/5 * * * *"}

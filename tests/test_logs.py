"""Every line the app prints has a machine-readable form (django_exclusive_jobs/logs.py):
its fields on the log record, ``JSONFormatter``, and ``LOG_FORMAT="json"`` for what the
commands print. Real commands in real processes; the fields named as the metrics' labels.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_exclusive_jobs import exclusive_job
from django_exclusive_jobs.logs import EVENTS, FIELDS, JSONFormatter
from django_exclusive_jobs.run.registry import _jobs

from .test_command import ROOT, argv, command_env, marker, wait_for
from .test_scheduler import executions, scheduler_env, schedulers, start_scheduler

__all__ = ["marker", "schedulers"]  # fixtures


def json_settings(tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` for a process whose settings say LOG_FORMAT="json", in a project that
    configured no logging for the app (the test settings show its warnings as text)."""
    (tmp_path / "json_log_settings.py").write_text(
        "from tests.settings import *  # noqa: F403\nEXCLUSIVE_JOBS = {'LOG_FORMAT': 'json'}\n"
        "LOGGING = {'version': 1, 'disable_existing_loggers': False}\n"
    )
    return {
        **env,
        "PYTHONPATH": f"{tmp_path}:{ROOT}",
        "DJANGO_SETTINGS_MODULE": "json_log_settings",
    }


def objects(output: str) -> list[dict[str, Any]]:
    """Each printed line, which must be one JSON object with a known event and fields."""
    printed = [json.loads(text) for text in output.splitlines() if text.strip()]
    for data in printed:
        assert data["event"] in EVENTS, data
        assert set(data) <= {"time", "level", "logger", "message", *FIELDS}, data
    return printed


def test_a_cron_lines_decisions_print_as_json_objects_with_their_fields(
    alias: str, marker: Path, tmp_path: Path
) -> None:
    env = json_settings(tmp_path, command_env(marker, TICK_EVERY="1h"))
    first = subprocess.run(
        argv(alias, "tick"), env=env, capture_output=True, text=True, timeout=120
    )
    assert first.returncode == 0, first.stdout + first.stderr
    acquired, finished = objects(first.stdout)
    assert (acquired["event"], acquired["job_name"]) == ("acquired", "tick")
    assert acquired["message"].startswith("acquired tick token=")
    assert finished["event"] == "finished" and finished["status"] == "succeeded"
    assert finished["token"] == acquired["token"] and finished["slot"] == acquired["slot"]
    assert isinstance(finished["duration"], float) and finished["attempt"] == 1
    again = subprocess.run(
        [*argv(alias, "tick"), "--verbosity", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    [skipped] = objects(again.stdout)
    assert (skipped["event"], skipped["job_name"], skipped["slot"]) == (
        "skipped",
        "tick",
        acquired["slot"],
    )
    assert "already run by" in skipped["message"]


def test_a_warning_that_is_no_decision_line_prints_as_json_too(
    alias: str, marker: Path, tmp_path: Path
) -> None:
    # A run left 'running' by a crashed holder: the next holder marks it lost, a warning
    # of the history's own (not a decision line), which must not come out as plain text.
    from django_exclusive_jobs.lock.clock import database_now
    from django_exclusive_jobs.models import JobLock, JobRun

    now = database_now(alias)
    JobLock.objects.using(alias).create(
        name="tick", token=1, host="gone", pid=1, acquired_at=now, expires_at=now
    )
    JobRun.objects.using(alias).create(
        name="tick", slot=None, status="running", token=1, host="gone", started_at=now
    )
    env = json_settings(tmp_path, command_env(marker, TICK_EVERY="1h"))
    done = subprocess.run(argv(alias, "tick"), env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    warnings = objects(done.stderr)
    assert [(w["event"], w["job_name"], w["level"]) for w in warnings] == [
        ("lost", "tick", "WARNING")
    ]
    assert "marked lost" in warnings[0]["message"]
    assert [data["event"] for data in objects(done.stdout)] == ["acquired", "finished"]


@pytest.mark.slow
def test_everything_a_scheduler_prints_is_json_with_its_name(
    alias: str, marker: Path, tmp_path: Path, schedulers: list[subprocess.Popen[str]]
) -> None:
    env = json_settings(tmp_path, scheduler_env(marker))
    server = start_scheduler(schedulers, alias, "--jobs", "tick", env=env)
    wait_for(lambda: len(executions(marker, "tick")) >= 2, timeout=60)
    server.send_signal(signal.SIGTERM)
    out, err = server.communicate(timeout=40)
    assert server.returncode == 0, out + err
    printed = objects(out) + objects(err)
    events = {data["event"] for data in printed}
    assert {"scheduler", "acquired", "finished"} <= events, events
    assert {data["scheduler"] for data in printed} == {f"{data_host(printed)}:{server.pid}"}
    # "stopping" (a job was still running at SIGTERM) goes to stderr; start and end to stdout
    statuses = [data["status"] for data in objects(out) if data["event"] == "scheduler"]
    assert statuses[0] == "started" and statuses[-1] == "stopped", statuses


def data_host(printed: list[dict[str, Any]]) -> str:
    """The host part of the holder of a run (the scheduler's own host)."""
    holder = next(data["holder"] for data in printed if data["event"] == "acquired")
    return str(holder.split(":")[0])


def test_the_json_formatter_writes_the_fields_of_the_apps_records(alias: str) -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    @exclusive_job("logged_job", every="1h", using=alias)
    def logged_job() -> None:
        raise RuntimeError("it broke")

    handler = Keep(level=logging.INFO)
    logger = logging.getLogger("django_exclusive_jobs")
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        with pytest.raises(RuntimeError):
            logged_job()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
        _jobs.pop("logged_job", None)
    formatted = [json.loads(JSONFormatter().format(record)) for record in records]
    assert all(data["logger"] == "django_exclusive_jobs" for data in formatted)
    by_event = {data["event"]: data for data in formatted}
    assert {"acquired", "finished"} <= set(by_event), formatted
    failed = [data for data in formatted if data.get("status") == "failed"]
    assert any("exception" in data and "it broke" in data["exception"] for data in failed)
    finished = by_event["finished"]
    assert (finished["job_name"], finished["error"], finished["level"]) == (
        "logged_job",
        "RuntimeError",
        "WARNING",
    )
    # The fields are attributes of the record too, for a plain formatter.
    record = next(r for r in records if r.getMessage().startswith("finished "))
    assert logging.Formatter("%(event)s %(job_name)s %(status)s").format(record) == (
        "finished logged_job failed"
    )


def test_a_records_message_is_one_line_and_the_json_formatter_keeps_it_as_made(
    alias: str,
) -> None:
    """A project's text formatter shows a decision line escaped (a job's message cannot
    forge a line in its log file); JSONFormatter keeps the sentence as it was made."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    @exclusive_job("forging_job", using=alias)
    def forging_job() -> None:
        raise RuntimeError("no\nfinished forging_job status=succeeded\x1b[2J")

    handler = Keep(level=logging.INFO)
    logger = logging.getLogger("django_exclusive_jobs")
    logger.addHandler(handler)
    try:
        with pytest.raises(RuntimeError):
            forging_job()
    finally:
        logger.removeHandler(handler)
        _jobs.pop("forging_job", None)
    record = next(r for r in records if r.getMessage().startswith("finished forging_job "))
    assert record.getMessage().endswith(
        "error=RuntimeError: no\\nfinished forging_job status=succeeded\\e[2J"
    )
    assert "\n" not in logging.Formatter("%(message)s").format(record)
    data = json.loads(JSONFormatter().format(record))
    assert data["message"].endswith(
        "error=RuntimeError: no\nfinished forging_job status=succeeded\x1b[2J"
    )


def test_a_bad_log_format_is_one_clear_error() -> None:
    from django.core.management.base import SystemCheckError

    with (
        override_settings(EXCLUSIVE_JOBS={"LOG_FORMAT": "yaml"}),
        pytest.raises(SystemCheckError, match="E016"),
    ):
        call_command("check")


def test_a_plain_run_exclusive_prints_sentences_as_before(alias: str, marker: Path) -> None:
    done = subprocess.run(
        argv(alias, "tick"), env=command_env(marker), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("acquired tick token=")

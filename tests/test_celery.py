"""Celery tasks sent once per slot (``schedule_celery_task``): Celery beat, highly available.

Real schedulers on every backend send the test app's ``celery_tick`` job's task to the
machine's RabbitMQ, and a real Celery worker (tests/celery_app.py) runs it and writes
what it was sent: each slot's task arrives once, with the slot in its headers.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from django_exclusive_jobs import schedule_celery_task
from django_exclusive_jobs.lock.errors import LockConfigurationError
from django_exclusive_jobs.models import JobRun
from django_exclusive_jobs.run.celery_tasks import TASK_IDS, sender
from django_exclusive_jobs.run.run_info import RunInfo
from django_exclusive_jobs.run.status import RunStatus

from .test_command import command_env, launch, marker, processes, wait_for
from .test_scheduler import schedulers, start_scheduler, stop

__all__ = ["marker", "processes", "schedulers"]  # fixtures


class Sent:
    """What a fake Celery app was asked to send (the pure test of the sender)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, object]]] = []

    def send_task(self, name: str, **options: object) -> object:
        self.calls.append((name, options))
        return type("Result", (), {"id": options["task_id"]})()


def test_the_task_goes_by_name_with_the_runs_facts_in_its_headers() -> None:
    app = Sent()
    send = sender("reports.send_digest", app, ["weekly"], "reports")
    slot = dt.datetime(2026, 12, 7, 8, tzinfo=dt.UTC)
    run = RunInfo(
        "digest", slot, 2, 41, "retry", requested_by=None, lease_until=None, deadline=None
    )
    enqueued = send(run=run, limit=5)
    [(name, options)] = app.calls
    task_id = str(uuid.uuid5(TASK_IDS, "digest 2026-12-07T08:00:00+00:00 2"))
    assert (name, enqueued.result_id, enqueued.backend) == (
        "reports.send_digest",
        task_id,
        "celery",
    )
    assert options == {
        "args": ["weekly"],
        "kwargs": {"limit": 5},
        "queue": "reports",
        "task_id": task_id,
        "headers": {
            "exclusive_jobs_name": "digest",
            "exclusive_jobs_slot": "2026-12-07T08:00:00+00:00",
            "exclusive_jobs_attempt": 2,
            "exclusive_jobs_token": 41,
        },
    }


@pytest.mark.parametrize(
    ("task", "options", "said"),
    [
        ("", {"every": "1h"}, "task must be a Celery task's name"),
        ("reports.send", {}, "needs every= or cron="),
        ("reports.send", {"every": "1h", "args": "x"}, "args must be a list"),
        ("reports.send", {"every": "0s"}, "every"),
    ],
)
def test_a_bad_declaration_is_refused_in_one_line(
    task: str, options: dict[str, object], said: str
) -> None:
    with pytest.raises(LockConfigurationError, match=said) as raised:
        schedule_celery_task("bad_celery", task, **options)  # type: ignore[arg-type]
    assert "\n" not in str(raised.value)


def sent(marker: Path) -> list[list[str]]:
    """What the worker ran: label, slot, task id, job name, kwargs, per line."""
    text = marker.read_text() if marker.exists() else ""
    return [line.split(" ", 4) for line in text.splitlines()]


@pytest.mark.slow
def test_two_schedulers_send_each_slot_once_and_a_real_worker_runs_it(
    alias: str,
    marker: Path,
    processes: list[subprocess.Popen[str]],
    schedulers: list[subprocess.Popen[str]],
) -> None:
    queue = f"exclusive_jobs_{uuid.uuid4().hex[:12]}"
    env = command_env(marker, CELERY_QUEUE=queue, TICK_EVERY="2s")
    worker = [sys.executable, "-m", "celery", "-A", "tests.celery_app", "worker"]
    quiet = ["--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "warning"]
    # A node name of its own: two workers of one name (tests side by side) clash.
    named = ["--pool=solo", "-Q", queue, "-n", f"{queue}@%h"]
    launch(processes, [*worker, *named, *quiet], env)
    for _ in range(2):
        start_scheduler(schedulers, alias, "--jobs", "celery_tick", env=env)
    try:
        wait_for(lambda: len(sent(marker)) >= 3, timeout=90)
    except AssertionError as late:
        said = [stop(scheduler) for scheduler in schedulers]
        got = sent(marker)
        raise AssertionError(f"the worker got {got}; the schedulers said {said}") from late
    for scheduler in schedulers:
        stop(scheduler)
    # The runs that sent their task (on a loaded machine a slot may also be recorded
    # missed: no server started it in time, and nothing was sent for it).
    rows = list(JobRun.objects.using(alias).filter(name="celery_tick", status="enqueued"))
    wait_for(lambda: len(sent(marker)) >= len(rows), timeout=60)  # the last ones sent
    received = sent(marker)
    slots = [slot for _, slot, *_ in received]
    assert len(slots) == len(set(slots)) == len(rows), received
    by_id = {row.task_result_id: row for row in rows}
    for label, slot, task_id, name, kwargs in received:
        row = by_id[task_id]  # the run that sent it recorded its task's id
        assert (label, name, kwargs) == ("tick", "celery_tick", "[('size', 3)]")
        assert row.slot is not None and slot == row.slot.isoformat()
        assert row.status == RunStatus.ENQUEUED and row.task_backend == "celery"

"""Nothing fails silently, and a routine deploy pages nobody: a job nobody runs, a job no
live scheduler serves, a crashed scheduler, a run-now request nobody will take; an
interrupted run that is only a deploy. On every backend, judged on the database's clock.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.test import Client
from django.test.utils import override_settings

from django_exclusive_jobs import exclusive_job
from django_exclusive_jobs.health import Health, overview
from django_exclusive_jobs.lock.acquire import prepare_locks
from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.models import (
    JobLock,
    JobRun,
    RunRequest,
    Scheduler,
    SchedulerState,
)
from django_exclusive_jobs.run import control, registry
from django_exclusive_jobs.run.registry import Job
from django_exclusive_jobs.run.runner import Run
from django_exclusive_jobs.run.schedules import Every
from django_exclusive_jobs.run.start import Start

from .test_command import ROOT, argv, command_env, marker, runs
from .test_operate import exclusive_jobs

__all__ = ["marker"]  # a fixture

HOUR = dt.timedelta(hours=1)
MINUTE = dt.timedelta(minutes=1)


@pytest.fixture
def jobs() -> Iterator[dict[str, Job]]:
    """An empty registry for the test to declare its own jobs in; the old one after."""
    before = dict(registry._jobs)
    registry._jobs.clear()
    try:
        yield registry._jobs
    finally:
        registry._jobs.clear()
        registry._jobs.update(before)


def hourly(name: str) -> str:
    exclusive_job(name, every="1h")(lambda: None)
    return name


def seen(alias: str, name: str, ago: dt.timedelta) -> None:
    """Make ``name``'s lock row as if this database first saw the job ``ago``."""
    rows = JobLock.objects.using(alias)
    rows.update_or_create(name=name, defaults={"created_at": database_now(alias) - ago})


def ran(alias: str, name: str, slot: dt.datetime | None, status: str = "succeeded") -> JobRun:
    now = database_now(alias)
    return JobRun.objects.using(alias).create(
        name=name, slot=slot, status=status, started_at=now, finished_at=now
    )


def scheduler(alias: str, instance: str, jobs: list[str], **times: dt.datetime) -> Scheduler:
    now = database_now(alias)
    values = {"started_at": now - HOUR, "last_beat_at": now, **times}
    return Scheduler.objects.using(alias).create(
        instance=instance, host=f"host-{instance}", pid=1, jobs=jobs, **values
    )


def problems_of(alias: str, name: str) -> list[str]:
    return [line for line in overview(alias).problems if line.startswith(f"{name}: ")]


def health_of(alias: str, name: str) -> str:
    [job] = [job for job in overview(alias).jobs if job.name == name]
    return job.badge


def latest_slot(alias: str) -> dt.datetime:
    """The newest hourly slot that is past its grace (five minutes) now. Not ``slot_at``:
    that is the slot a start serves, early allowance included (from HH:04:30 it named the
    coming hour's slot, and four tests failed on each database there)."""
    slot, _ = Every(period=HOUR).latest_at_or_before(database_now(alias) - 5 * MINUTE)
    return slot


# --- first sight ---------------------------------------------------------------------


def test_the_database_notes_when_it_first_sees_a_job(alias: str, jobs: object) -> None:
    before = database_now(alias)
    assert prepare_locks(["first"], using=alias) == 1
    first = JobLock.objects.using(alias).get(name="first").created_at
    assert before - dt.timedelta(seconds=1) <= first <= database_now(alias)
    hourly("looked_at")
    overview(alias)  # the first look at a job with no lock row makes it
    assert JobLock.objects.using(alias).get(name="looked_at").created_at >= before
    assert prepare_locks(["first", "looked_at"], using=alias) == 0


# --- never ran ---------------------------------------------------------------------------


def test_a_job_nobody_ran_since_its_first_slot_and_the_grace_is_a_problem(
    alias: str, jobs: object
) -> None:
    name = hourly("nightly")
    seen(alias, name, ago=MINUTE)  # no slot of it has passed its grace yet
    assert health_of(alias, name) == Health.NEVER_RAN
    assert problems_of(alias, name) == []
    seen(alias, name, ago=2 * HOUR)
    slot = latest_slot(alias).isoformat()
    [line] = problems_of(alias, name)
    assert line.startswith(f"{name}: never ran: first seen ")
    assert line.endswith(f", no run for the slot of {slot}")
    ran(alias, name, slot=None)  # a manual run does not run its slots
    assert problems_of(alias, name) == [line]
    ran(alias, name, slot=latest_slot(alias))
    assert problems_of(alias, name) == []
    assert health_of(alias, name) == Health.OK


def test_a_paused_job_that_never_ran_is_no_problem(alias: str, jobs: object) -> None:
    name = hourly("paused_never")
    seen(alias, name, ago=3 * HOUR)
    control.pause(name, by="ops", using=alias)
    assert problems_of(alias, name) == []
    assert health_of(alias, name) == Health.PAUSED


def test_check_exits_1_and_the_health_view_says_503_for_a_job_that_never_ran(
    alias: str,
) -> None:
    JobLock.objects.using(alias).all().delete()
    prepare_locks([job.name for job in registry.all_jobs()], using=alias)
    JobLock.objects.using(alias).update(created_at=database_now(alias) - HOUR)
    result = exclusive_jobs(alias, "--check")  # "tick" runs every 2 s; nobody ran it
    assert result.returncode == 1, result.stdout + result.stderr
    assert any(
        line.startswith("tick: never ran: first seen ") for line in result.stdout.splitlines()
    )
    with override_settings(EXCLUSIVE_JOBS={"DATABASE": alias, "HEALTH_TOKEN": "t0ken"}):
        answer = Client().get("/jobs/health", HTTP_AUTHORIZATION="Bearer t0ken")
    assert answer.status_code == 503
    assert any(line.startswith("tick: never ran: ") for line in answer.json()["problems"])


# --- unserved ---------------------------------------------------------------------------


def test_a_job_no_live_scheduler_serves_and_no_cron_runs_is_unserved(
    alias: str, jobs: object
) -> None:
    name, other = hourly("report"), hourly("cleanup")
    for job in (name, other):
        seen(alias, job, ago=3 * HOUR)
        ran(alias, job, slot=latest_slot(alias) - 2 * HOUR)
    # Schedulers run here, but the one alive was started with --jobs cleanup.
    scheduler(alias, "a", [other])
    slot = latest_slot(alias).isoformat()
    expected = f"{name}: unserved: no live scheduler serves it, and no run for the slot of {slot}"
    assert problems_of(alias, name) == [expected]
    assert problems_of(alias, other) == [f"{other}: missed: no run for the slot of {slot}"]
    ran(alias, name, slot=latest_slot(alias))  # a cron line runs it: served after all
    assert problems_of(alias, name) == []


def test_a_job_whose_schedulers_all_stopped_is_unserved_once_a_slot_goes_unrun(
    alias: str, jobs: object
) -> None:
    name = hourly("served_before")
    seen(alias, name, ago=3 * HOUR)
    ran(alias, name, slot=latest_slot(alias) - HOUR)
    now = database_now(alias)
    scheduler(alias, "s", [name], last_beat_at=now - HOUR, stopped_at=now - HOUR)
    [line] = problems_of(alias, name)
    assert line.startswith(f"{name}: unserved: no live scheduler serves it")
    [job] = [job for job in overview(alias).jobs if job.name == name]
    assert (job.schedulers, job.served, job.badge) == (0, False, Health.UNSERVED)


# --- schedulers: alive, stopped, gone ---------------------------------------------------


def test_scheduler_states_have_one_definition(alias: str) -> None:
    now = database_now(alias)
    scheduler(alias, "alive", ["x"])
    scheduler(alias, "stopped", ["x"], last_beat_at=now - HOUR, stopped_at=now - HOUR)
    scheduler(alias, "gone", ["x"], last_beat_at=now - MINUTE)
    rows = Scheduler.objects.using(alias)
    assert [row.instance for row in rows.alive()] == ["alive"]
    assert [row.instance for row in rows.stopped()] == ["stopped"]
    assert [row.instance for row in rows.gone()] == ["gone"]
    states = {row.instance: row.state for row in rows.with_state()}  # type: ignore[attr-defined]
    assert states == {
        "alive": SchedulerState.ALIVE,
        "stopped": SchedulerState.STOPPED,
        "gone": SchedulerState.GONE,
    }
    assert [row.instance for row in rows.unacknowledged()] == ["gone"]


def test_a_crash_is_a_problem_until_acknowledged(alias: str, jobs: object) -> None:
    now = database_now(alias)
    gone = scheduler(alias, "k9", [], last_beat_at=now - 2 * MINUTE)
    [line] = overview(alias).problems
    assert line.startswith("scheduler host-k9:1: gone: no beat since ")
    assert line.endswith(
        " and no clean stop; acknowledge it, or start a scheduler on host-k9 again"
    )
    rows = Scheduler.objects.using(alias)
    assert control.acknowledge(rows.all(), by="alice", using=alias) == 1
    assert control.acknowledge(rows.all(), by="bob", using=alias) == 0  # once
    assert overview(alias).problems == []
    gone.refresh_from_db()
    assert gone.acknowledged_by == "alice" and gone.acknowledged_at is not None


def test_a_crash_is_no_problem_once_a_scheduler_starts_again_on_its_host(alias: str) -> None:
    now = database_now(alias)
    scheduler(alias, "old", [], last_beat_at=now - 10 * MINUTE, started_at=now - HOUR)
    assert len(overview(alias).scheduler_problems) == 1
    Scheduler.objects.using(alias).create(  # the same host, started after the last beat
        instance="new", host="host-old", pid=2, jobs=[], started_at=now, last_beat_at=now
    )
    assert overview(alias).scheduler_problems == []


def test_an_unacknowledged_crash_is_remembered_past_a_day(alias: str) -> None:
    now = database_now(alias)
    days = dt.timedelta(days=3)
    scheduler(alias, "crashed", [], last_beat_at=now - days, started_at=now - days)
    scheduler(alias, "ended", [], last_beat_at=now - days, stopped_at=now - days)
    rows = Scheduler.objects.using(alias)
    assert [row.instance for row in rows.forgotten()] == ["ended"]
    rows.forgotten().delete()
    assert [row.instance for row in rows.known()] == ["crashed"]
    control.acknowledge(rows.all(), by="ops", using=alias)
    rows.forgotten().delete()  # what the heartbeats do
    assert not rows.exists()


# --- run now, waiting -----------------------------------------------------------------


def test_a_waiting_request_no_live_scheduler_serves_is_a_problem(alias: str, jobs: object) -> None:
    exclusive_job("export")(lambda: None)
    waiting = control.request_run("export", by="carol", using=alias)
    [job] = overview(alias).jobs
    assert [request.pk for request in job.requests] == [waiting.pk]
    [line] = overview(alias).problems
    assert line.startswith("export: unserved: run now asked by carol at ")
    assert line.endswith(" waits, and no live scheduler serves it")
    assert job.as_dict()["requests"][0]["requested_by"] == "carol"
    scheduler(alias, "serving", ["export"])
    assert overview(alias).problems == []


def test_a_cancelled_request_is_never_run_and_says_who_cancelled_it(alias: str) -> None:
    waiting = control.request_run("quick", by="carol", using=alias)
    assert control.cancel(waiting.pk, by="dave", using=alias)
    assert not control.cancel(waiting.pk, by="erin", using=alias)  # once
    assert control.pending(["quick"], using=alias) == []
    waiting.refresh_from_db()
    assert waiting.cancelled_by == "dave" and waiting.cancelled_at is not None
    calls: list[int] = []
    job = Job("quick", lambda: None, using=alias, keepalive=False)
    late = Run(job, start=Start.run_now(request=waiting))  # a late poller
    result = late.call(lambda lock: calls.append(1))
    assert (calls, result.status) == ([], "skipped")
    assert not JobRun.objects.using(alias).exists()


def test_a_request_taken_by_a_run_cannot_be_cancelled(alias: str) -> None:
    waiting = control.request_run("quick", by="carol", using=alias)
    job = Job("quick", lambda: None, using=alias, keepalive=False)
    Run(job, start=Start.run_now(request=waiting)).call(lambda lock: None)
    assert not control.cancel(waiting.pk, by="dave", using=alias)
    taken = RunRequest.objects.using(alias).get(pk=waiting.pk)
    assert taken.cancelled_by == "" and taken.run_id is not None


# --- interrupted: a deploy pages nobody ---------------------------------------------------


def test_one_interrupted_run_is_no_problem_two_in_a_row_are(alias: str, jobs: object) -> None:
    name = hourly("deployed")
    seen(alias, name, ago=3 * HOUR)
    ran(alias, name, slot=latest_slot(alias) - HOUR)
    ran(alias, name, slot=latest_slot(alias), status="interrupted")
    assert problems_of(alias, name) == []
    assert health_of(alias, name) == Health.INTERRUPTED
    ran(alias, name, slot=None, status="interrupted")  # and again
    [line] = problems_of(alias, name)
    assert line.startswith(f"{name}: interrupted: its last 2 runs were interrupted, the last at ")
    ran(alias, name, slot=None)
    assert problems_of(alias, name) == []


def test_an_interrupted_run_whose_next_slot_goes_unrun_is_missed(alias: str, jobs: object) -> None:
    name = hourly("left")
    seen(alias, name, ago=3 * HOUR)
    ran(alias, name, slot=latest_slot(alias) - HOUR, status="interrupted")
    scheduler(alias, "serving", [name])  # alive, but the slot went unrun
    slot = latest_slot(alias).isoformat()
    assert problems_of(alias, name) == [f"{name}: missed: no run for the slot of {slot}"]


def test_a_run_stopped_by_sigterm_is_interrupted_not_failing(alias: str, marker: Path) -> None:
    """A deploy stops a cron line's run: exit 143, the run is interrupted, nobody paged;
    the second in a row is a problem."""
    for attempt in (1, 2):
        process = subprocess.Popen(
            argv(alias, "slow"),
            cwd=ROOT,
            env=command_env(marker, JOB_SECONDS="30"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while runs(marker, "slow-start") < attempt:
                assert time.monotonic() < deadline, "the job did not start"
                time.sleep(0.05)
            os.kill(process.pid, signal.SIGTERM)
            assert process.wait(timeout=60) == 143
        finally:
            if process.poll() is None:
                process.kill()
            process.communicate(timeout=30)
        lines = [
            line
            for line in exclusive_jobs(alias, "--check").stdout.splitlines()
            if line.startswith("slow: ")
        ]
        if attempt == 1:
            assert lines == []
    assert [line.split(", the last at")[0] for line in lines] == [
        "slow: interrupted: its last 2 runs were interrupted"
    ]
    statuses = JobRun.objects.using(alias).filter(name="slow").values_list("status", flat=True)
    assert list(statuses) == ["interrupted", "interrupted"]

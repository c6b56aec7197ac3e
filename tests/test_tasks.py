"""A django.tasks Task scheduled with @exclusive_job: enqueued once per slot, run by a real
worker (django-tasks-db's db_worker) once, whoever's cron line or scheduler fires."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connections
from django_tasks_db.models import DBTaskResult

from django_exclusive_jobs.models import JobRun
from django_exclusive_jobs.run.registry import get_job

from .helpers import reaped
from .test_command import argv, command_env, launch, manage, marker, wait_for
from .test_faults import TcpProxy, proxied_env, proxy, server_alias
from .test_scheduler import executions, schedulers, start_scheduler, stop

__all__ = ["marker", "proxy", "schedulers", "server_alias"]  # fixtures

WORKER_OPTIONS = ["--interval", "0.2", "--no-startup-delay", "--no-reload"]


def test_a_task_is_registered_as_a_job_and_stays_a_task() -> None:
    from .testapp import jobs

    job = get_job("enqueue_tick")
    assert job is not None and job.task is jobs.enqueue_tick and job.schedule is not None
    assert hasattr(jobs.enqueue_tick, "enqueue")  # the Task itself, not a wrapper


def test_immediate_backend_runs_the_task_in_process_once_per_slot(
    alias: str, marker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MARKER", str(marker))
    for _ in range(2):  # a second start of the same slot skips
        call_command("run_exclusive", "enqueue_now", "--database", alias, verbosity=0)
    ran = executions(marker, "enqueue_now")
    assert list(ran.values()) == [1]
    [run] = JobRun.objects.using(alias).filter(name="enqueue_now")
    assert (run.status, run.task_backend) == ("enqueued", "immediate")
    assert run.task_result_id and run.slot in ran


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[str]]]:
    with reaped() as started:
        yield started


def start_worker(started: list[subprocess.Popen[str]], env: dict[str, str]) -> None:
    launch(started, [sys.executable, "-m", "django", "db_worker", *WORKER_OPTIONS], env)


def results(alias: str) -> list[DBTaskResult]:
    return list(DBTaskResult.objects.using(alias).all())


@pytest.mark.slow
def test_racing_schedulers_enqueue_once_per_slot_and_the_worker_runs_each_once(
    alias: str,
    marker: Path,
    schedulers: list[subprocess.Popen[str]],
    workers: list[subprocess.Popen[str]],
) -> None:
    if connections[alias].vendor == "mysql":
        pytest.skip("the task tests cover SQLite and PostgreSQL, as the issue asks")
    env = command_env(marker, TICK_EVERY="2s", EXCLUSIVE_JOBS_TEST_TASKS_DB=alias)
    for _ in range(3):
        start_scheduler(schedulers, alias, "--jobs", "enqueue_tick", env=env)
    start_worker(workers, env)
    enqueued = JobRun.objects.using(alias).filter(name="enqueue_tick", status="enqueued")
    wait_for(lambda: enqueued.count() >= 11, timeout=120)
    for process in schedulers:
        stop(process, timeout=40)
    runs = list(enqueued)
    wait_for(lambda: len(executions(marker, "enqueue_tick")) >= len(runs), timeout=60)
    workers[0].send_signal(signal.SIGTERM)
    workers[0].communicate(timeout=30)

    ran = executions(marker, "enqueue_tick")
    assert set(ran.values()) == {1}  # each slot's task ran once
    assert set(ran) == {run.slot for run in runs}
    tasks = results(alias)
    assert len(tasks) == len(runs)  # one task result per slot
    assert {str(task.id) for task in tasks} == {run.task_result_id for run in runs}
    assert {str(task.status) for task in tasks} == {"SUCCESSFUL"}


@pytest.mark.slow
def test_a_failed_enqueue_is_recorded_failed_and_retried_once(
    marker: Path, proxy: TcpProxy, server_alias: str
) -> None:
    if server_alias != "postgres":
        pytest.skip("the task table sits on PostgreSQL behind a proxy that can be cut")
    env = proxied_env(
        "postgres",
        proxy.port,
        MARKER=str(marker),
        TICK_EVERY="7d",  # a retry ten minutes on stays in the slot
        RETRY_BACKOFF="10m",
        EXCLUSIVE_JOBS_TEST_TASKS_DB="postgres",
    )
    proxy.cut("refuse")  # the task backend is down; the lock table (SQLite) is not
    with reaped() as started:
        down = launch(started, argv("default", "enqueue_tick"), env)
        failed = JobRun.objects.using("default").filter(name="enqueue_tick", retry_at__isnull=False)
        wait_for(failed.exists, timeout=60)
        down.send_signal(signal.SIGTERM)  # stop waiting for the retry: another start runs it
        out, err = down.communicate(timeout=30)
    assert down.returncode == 128 + signal.SIGTERM, out + err
    [run] = JobRun.objects.using("default").filter(name="enqueue_tick")
    assert run.status == "failed" and run.task_result_id == ""
    proxy.restore()
    JobRun.objects.using("default").filter(pk=run.pk).update(retry_at=run.started_at)  # due
    again = manage("default", "enqueue_tick", env=env)  # retries=1: the slot's attempt 2
    assert again.returncode == 0, again.stdout + again.stderr
    third = manage("default", "enqueue_tick", env=env)
    assert third.returncode == 0 and "already run" in third.stdout
    run = JobRun.objects.using("default").get(name="enqueue_tick", attempt=2)
    assert run.status == "enqueued"
    [task] = results("postgres")
    assert str(task.id) == run.task_result_id  # enqueued once for the slot, never twice

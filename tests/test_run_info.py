"""The run, given to the job: ``run=`` (a ``RunInfo``) wherever the job runs (a direct
call, a cron line, the scheduler's child process, Run now), and the same facts in the
environment of a program or a management command run under the lock. Real processes on
every backend."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from django_exclusive_jobs import RunInfo, current_run, exclusive_job
from django_exclusive_jobs.models import JobRun, Scheduler
from django_exclusive_jobs.run import control, registry
from django_exclusive_jobs.run.run_info import ENVIRONMENT

from .test_command import argv, command_env, marker, wait_for
from .test_operate import exclusive_jobs
from .test_scheduler import scheduler_env, schedulers, start_scheduler, stop

__all__ = ["marker", "schedulers"]  # fixtures

PRINT_ENVIRONMENT = (
    "import json, os; "
    "print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('EXCLUSIVE_JOBS_')}))"
)


def facts(marker: Path) -> list[dict[str, Any]]:
    """Each ``facts`` line the jobs wrote, in order."""
    lines = marker.read_text().splitlines() if marker.exists() else []
    return [json.loads(line.removeprefix("facts ")) for line in lines if line.startswith("facts ")]


def when(text: str | None) -> dt.datetime | None:
    return None if text is None else dt.datetime.fromisoformat(text)


def ours(environment: dict[str, str]) -> dict[str, str]:
    """The run's variables (not the tests' own EXCLUSIVE_JOBS_TEST_*)."""
    return {k: v for k, v in environment.items() if k in ENVIRONMENT.values()}


def test_a_direct_call_is_given_its_run(alias: str) -> None:
    told: list[Any] = []

    def job(run: RunInfo, token: int) -> None:
        told.append((run, token, current_run()))

    try:
        exclusive_job("told_call", every="1h", using=alias)(job)()
    finally:
        registry._jobs.pop("told_call", None)
    [(run, token, current)] = told
    [row] = JobRun.objects.using(alias).filter(name="told_call")
    assert current is run and token == run.token == row.token
    assert (run.name, run.attempt, run.why, run.requested_by) == ("told_call", 1, "call", None)
    assert run.slot == row.started_at.replace(minute=0, second=0, microsecond=0)
    assert run.lease_until is not None and run.lease_until > row.started_at
    assert run.deadline is None  # a direct call is not stopped at a timeout
    assert current_run() is None  # only while the job runs
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.attempt = 2  # type: ignore[misc]


def test_a_cron_line_gives_its_job_the_run_and_slot_and_token_are_its_spellings(
    alias: str, marker: Path
) -> None:
    done = subprocess.run(argv(alias, "run_facts"), env=command_env(marker), capture_output=True)
    assert done.returncode == 0, done.stderr
    [told] = facts(marker)
    [row] = JobRun.objects.using(alias).filter(name="run_facts")
    assert (told["name"], told["why"], told["attempt"], told["requested_by"]) == (
        "run_facts",
        "scheduled",
        1,
        None,
    )
    assert when(told["slot"]) == row.slot and told["slot_given"] == str(row.slot)
    assert told["token"] == told["token_given"] == row.token
    assert told["current"] is True
    lease_until, deadline = when(told["lease_until"]), when(told["deadline"])
    assert lease_until is not None and deadline is not None
    assert row.started_at < lease_until <= row.started_at + dt.timedelta(minutes=6)
    # Its timeout (10 minutes) from when it took the lock (a little before the row's start).
    assert abs(deadline - (row.started_at + dt.timedelta(minutes=10))) < dt.timedelta(seconds=5)


def test_a_program_and_a_command_under_the_lock_get_the_facts_in_their_environment(
    alias: str, marker: Path
) -> None:
    env = command_env(marker)
    program = argv(alias, "nightly_sync", "--", sys.executable, "-c", PRINT_ENVIRONMENT)
    done = subprocess.run(program, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    [printed] = [line for line in done.stdout.splitlines() if line.startswith("{")]
    given = ours(json.loads(printed))
    [row] = JobRun.objects.using(alias).filter(name="nightly_sync")
    assert given.keys() == {
        "EXCLUSIVE_JOBS_NAME",
        "EXCLUSIVE_JOBS_ATTEMPT",
        "EXCLUSIVE_JOBS_TOKEN",
        "EXCLUSIVE_JOBS_WHY",
        "EXCLUSIVE_JOBS_LEASE_UNTIL",
    }  # no slot (no schedule), no one asked, no timeout: unset
    assert given["EXCLUSIVE_JOBS_NAME"] == "nightly_sync"
    assert given["EXCLUSIVE_JOBS_TOKEN"] == str(row.token)
    assert (given["EXCLUSIVE_JOBS_ATTEMPT"], given["EXCLUSIVE_JOBS_WHY"]) == ("1", "scheduled")
    assert dt.datetime.fromisoformat(given["EXCLUSIVE_JOBS_LEASE_UNTIL"]) > row.started_at

    command = subprocess.run(argv(alias, "run_environment"), env=env, capture_output=True)
    assert command.returncode == 0, command.stderr
    [from_command] = [ours(told) for told in facts(marker)]
    [command_row] = JobRun.objects.using(alias).filter(name="run_environment")
    assert from_command["EXCLUSIVE_JOBS_NAME"] == "run_environment"
    assert from_command["EXCLUSIVE_JOBS_TOKEN"] == str(command_row.token)


def test_run_now_here_and_by_a_scheduler_s_child_says_who_asked(
    alias: str, marker: Path, schedulers: list[subprocess.Popen[str]]
) -> None:
    here = exclusive_jobs(alias, "run", "run_facts", "--by", "alice", marker=marker)
    assert here.returncode == 0, here.stdout + here.stderr
    [told] = facts(marker)
    assert (told["why"], told["requested_by"]) == ("run_now", "alice")

    # A scheduler's Run now, in a child process of its own (its hourly slot is not due:
    # a job first seen now has no slot to catch up).
    started = start_scheduler(schedulers, alias, "--jobs", "run_facts", env=scheduler_env(marker))
    wait_for(Scheduler.objects.using(alias).filter(pid=started.pid).exists, 60)
    control.request_run("run_facts", by="bob", using=alias)
    wait_for(lambda: len(facts(marker)) >= 2, 60)
    stop(started)
    [asked] = facts(marker)[1:]
    [row] = JobRun.objects.using(alias).filter(name="run_facts", requested_by="bob")
    assert asked["pid"] != started.pid == row.pid  # the scheduler holds the lock; a child runs it
    assert (asked["why"], asked["requested_by"], asked["attempt"]) == ("run_now", "bob", 1)
    assert asked["current"] is True and asked["token"] == asked["token_given"] == row.token
    deadline = when(asked["deadline"])  # its timeout, in the child as in the scheduler
    assert deadline is not None
    assert abs(deadline - (row.started_at + dt.timedelta(minutes=10))) < dt.timedelta(seconds=5)

"""``in_process=True``: the scheduler runs a light job in a thread of its own process.

Real scheduler processes on every backend (tests/testapp/jobs.py's ``light_tick`` and
``light_broken``); the job marks its pid, so a test sees where it really ran.
"""

from __future__ import annotations

import subprocess
import time
from contextlib import suppress
from pathlib import Path

import pytest
from django.test import override_settings
from django.utils import timezone

from django_exclusive_jobs import exclusive_job
from django_exclusive_jobs.lock.acquire import force_release
from django_exclusive_jobs.lock.errors import LockConfigurationError
from django_exclusive_jobs.models import JobLock, JobRun, JobState
from django_exclusive_jobs.run import overrides
from django_exclusive_jobs.run.registry import get_job

from .test_command import marker, wait_for
from .test_scheduler import (
    assert_every_slot_once,
    executions,
    history,
    scheduler_env,
    schedulers,
    start_scheduler,
    statuses_until,
    stop,
    succeeded,
)

__all__ = ["marker", "schedulers"]  # fixtures


def pids(marker: Path, word: str) -> set[int]:
    """The processes the job ran in."""
    lines = marker.read_text().splitlines() if marker.exists() else []
    return {int(line.split()[-1]) for line in lines if line.split()[0] == word}


def test_two_schedulers_run_each_slot_of_an_in_process_job_once_in_their_own_process(
    alias: str, marker: Path, schedulers: list[subprocess.Popen[str]]
) -> None:
    env = scheduler_env(marker)
    for _ in range(2):
        start_scheduler(schedulers, alias, "--jobs", "light_tick", "light_broken", env=env)
    wait_for(lambda: succeeded(alias, "light_tick") >= 4, timeout=60)
    wait_for(lambda: JobRun.objects.using(alias).filter(name="light_broken").count() >= 3)
    # No fork server (nor anything else) was started: every job runs in the scheduler.
    assert all(children(process.pid) == [] for process in schedulers)
    stopping = timezone.now()  # a run the stop caught is rightly recorded interrupted
    for process in schedulers:
        stop(process)

    rows = history(alias, "light_tick")
    assert_every_slot_once(rows)
    assert statuses_until(rows, stopping) == {"succeeded"}
    ran = executions(marker, "light_tick")
    assert set(ran) == {run.slot for run in rows} and set(ran.values()) == {1}
    # In the schedulers themselves: no child process ran it.
    schedulers_pids = {process.pid for process in schedulers}
    assert pids(marker, "light_tick") <= schedulers_pids
    # A job that raises is recorded failed with its traceback; the scheduler goes on.
    broken = history(alias, "light_broken")
    assert statuses_until(broken, stopping) == {"failed"}
    failed = [run for run in broken if run.status == "failed"]
    assert {run.error_type for run in failed} == {"RuntimeError"}
    assert all("the light job fell over" in run.error for run in failed)
    assert pids(marker, "light_broken") <= schedulers_pids
    assert_every_slot_once(broken)


@pytest.mark.slow
@pytest.mark.parametrize("job", ["light_tick", "light_async"])
def test_an_in_process_run_past_the_grace_is_left_to_its_lease_and_taken_over(
    alias: str, marker: Path, schedulers: list[subprocess.Popen[str]], job: str
) -> None:
    env = scheduler_env(marker, JOB_SECONDS="120")
    first = start_scheduler(schedulers, alias, "--jobs", job, "--grace", "1", env=env)
    wait_for(lambda: sum(executions(marker, job).values()) == 1, timeout=60)
    began = time.monotonic()
    _, err = stop(first, timeout=30)
    # The process ended at once, though the job's thread (or an async job's event loop
    # thread, which the interpreter's exit would wait for) still ran.
    assert time.monotonic() - began < 15
    assert f"leaving 1 in-process run(s) to their lease: {job}" in err
    # Nothing can stop the thread, so nothing was released: the lock stays held until its
    # lease ends, and no other server runs the job meanwhile.
    [left] = history(alias, job)
    assert left.status == "running"
    lock = JobLock.objects.using(alias).get(name=job)
    assert lock.released_at is None and lock.token == left.token

    second_env = scheduler_env(marker, JOB_SECONDS="0")
    second = start_scheduler(schedulers, alias, "--jobs", job, env=second_env)
    wait_for(lambda: succeeded(alias, job) >= 1, timeout=60)
    stop(second)
    left.refresh_from_db()
    assert left.status == "lost"  # as a crashed server's run
    later = [run for run in history(alias, job) if run.pk != left.pk]
    assert later and all(run.token > left.token for run in later)
    assert len(pids(marker, job)) == 2  # one run in each scheduler, none in a child


def test_an_overridden_timeout_runs_an_in_process_job_in_a_process_and_stops_it(
    alias: str, marker: Path, schedulers: list[subprocess.Popen[str]]
) -> None:
    job = get_job("light_tick")
    assert job is not None
    overrides.override(job, {"timeout": 1}, reason="test", by="ops", using=alias)
    env = scheduler_env(marker, JOB_SECONDS="30")
    process = start_scheduler(schedulers, alias, "--jobs", "light_tick", env=env)
    wait_for(lambda: JobRun.objects.using(alias).filter(status="timed_out").exists())
    stop(process)
    runs = [run for run in history(alias, "light_tick") if run.status == "timed_out"]
    durations = [run.duration for run in runs if run.duration is not None]
    assert durations and len(durations) == len(runs)
    assert min(durations) < 10  # stopped at its 1 s timeout, not after its 30 s
    # It ran in a process of its own, which the timeout could stop.
    assert process.pid not in pids(marker, "light_tick")


def test_an_in_process_run_whose_lock_is_lost_goes_on_until_it_returns_and_is_lost(
    alias: str, marker: Path, schedulers: list[subprocess.Popen[str]]
) -> None:
    env = scheduler_env(marker, JOB_SECONDS="4")
    process = start_scheduler(schedulers, alias, "--jobs", "light_tick", env=env)
    wait_for(lambda: sum(executions(marker, "light_tick").values()) == 1, timeout=60)
    assert force_release("light_tick", using=alias)  # an operator, in the admin
    wait_for(lambda: JobRun.objects.using(alias).filter(status="lost").exists(), timeout=30)
    stop(process)
    [lost, *_] = history(alias, "light_tick")
    # Nothing could stop it: it ran its 4 s, as a job under run_exclusive would.
    assert lost.status == "lost" and lost.duration is not None and lost.duration >= 4


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with suppress(FileNotFoundError, ProcessLookupError):  # a thread that just ended
            found += [int(child) for child in (task / "children").read_text().split()]
    return found


# --- what may run in a thread -----------------------------------------------------------


def test_the_decorator_refuses_what_could_not_stop_an_in_process_run() -> None:
    with pytest.raises(LockConfigurationError, match=r"in_process=True .* so timeout= could"):
        exclusive_job("light_timeout", every="1m", timeout="5m", in_process=True)
    with pytest.raises(LockConfigurationError, match="overlap='cancel_other' could not stop"):
        exclusive_job("light_cancel", every="1m", overlap="cancel_other", in_process=True)
    with pytest.raises(LockConfigurationError, match="in_process must be True or False"):
        exclusive_job("light_yes", every="1m", in_process="yes")  # type: ignore[call-overload]


def test_a_timeout_from_the_settings_or_an_override_runs_it_in_a_process_after_all() -> None:
    job = get_job("light_tick")
    assert job is not None and job.in_process and job.runs_in_thread
    with override_settings(EXCLUSIVE_JOBS={"TIMEOUT": "1m"}):
        assert job.time_limit == 60 and not job.runs_in_thread
    overridden = overrides.in_force(job, JobState(name=job.name, override={"timeout": 30.0}))
    assert overridden.in_process and overridden.time_limit == 30
    assert not overridden.runs_in_thread


def test_a_timeout_setting_over_in_process_jobs_is_a_warning_naming_them() -> None:
    from django_exclusive_jobs.checks import check_jobs

    assert not [m for m in check_jobs() if m.id.endswith("W005")]
    with override_settings(EXCLUSIVE_JOBS={"TIMEOUT": "1m"}):
        [warning] = [m for m in check_jobs() if m.id.endswith("W005")]
    assert "light_broken, light_tick" in warning.msg

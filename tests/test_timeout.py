"""``timeout=``: a run past its deadline is stopped wherever it runs, and recorded.

Real processes on every backend: the scheduler's child (stopped by its guard), a Python
job under ``run_exclusive`` (TimedOut raised in it; the process ended if it will not
stop), and a program under ``run_exclusive`` (its process group stopped). The job
``overrun`` (tests/testapp/jobs.py) runs 30 s past a 1-s timeout; with STUBBORN set it
ignores SIGTERM and catches what is raised in it.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_exclusive_jobs import exclusive_job
from django_exclusive_jobs.health import overview
from django_exclusive_jobs.lock.errors import LockConfigurationError
from django_exclusive_jobs.models import JobLock, JobRun
from django_exclusive_jobs.run.runner import EXIT_TIMED_OUT

from .test_command import ROOT, command_env, manage, marker, runs, wait_for
from .test_scheduler import history, scheduler_env, schedulers, start_scheduler, stop

__all__ = ["marker", "schedulers"]  # fixtures


def released(alias: str, name: str) -> bool:
    return JobLock.objects.using(alias).get(name=name).released_at is not None


def the_run(alias: str, name: str) -> JobRun:
    [run] = JobRun.objects.using(alias).filter(name=name)
    return run


# --- run_exclusive ----------------------------------------------------------------------


def test_a_python_job_past_its_timeout_is_stopped_and_recorded_timed_out(
    alias: str, marker: Path
) -> None:
    done = manage(alias, "overrun", "--timeout", "1", env=command_env(marker))
    assert done.returncode == EXIT_TIMED_OUT, done.stderr
    run = the_run(alias, "overrun")
    assert run.status == "timed_out"
    assert run.error_type == "TimedOut"
    assert run.duration is not None and 1 <= run.duration < 15
    assert released(alias, "overrun")
    assert runs(marker, "overrun-start") == 1 and runs(marker, "overrun-end") == 0
    lines = [line for line in done.stderr.splitlines() if "status=timed_out" in line]
    assert len(lines) == 1, done.stderr
    assert "passed its timeout of 1s" in lines[0]
    assert "Traceback" not in done.stderr


def test_a_python_job_that_will_not_stop_ends_its_process_after_the_grace(
    alias: str, marker: Path
) -> None:
    env = command_env(marker, STUBBORN="1")
    began = time.monotonic()
    done = manage(alias, "overrun", "--timeout", "1", "--grace", "1", env=env)
    assert done.returncode == EXIT_TIMED_OUT, done.stderr
    assert time.monotonic() - began < 25  # not the job's 30 s
    assert runs(marker, "overrun-ignored") >= 1 and runs(marker, "overrun-end") == 0
    run = the_run(alias, "overrun")
    assert (run.status, run.error_type) == ("timed_out", "TimedOut")
    assert released(alias, "overrun")
    assert "did not stop within 1s of its timeout: ending the process" in done.stderr


@pytest.mark.parametrize("stubborn", [False, True], ids=["stops", "ignores-sigterm"])
def test_a_program_past_its_timeout_is_stopped_with_its_children(
    alias: str, tmp_path: Path, stubborn: bool
) -> None:
    pids = tmp_path / "pids"
    trap = "trap '' TERM; " if stubborn else ""
    script = f"{trap}sleep 60 & echo $! > {pids}; echo $$ >> {pids}; wait"
    done = manage(
        alias, "backup", "--timeout", "1", "--grace", "1", "--", "sh", "-c", script, timeout=60
    )
    assert done.returncode == EXIT_TIMED_OUT, done.stderr
    run = the_run(alias, "backup")
    assert (run.status, run.error_type) == ("timed_out", "TimedOut")
    assert released(alias, "backup")
    for pid in map(int, pids.read_text().split()):
        wait_for(lambda pid=pid: not _alive(pid), timeout=10)  # the whole process group


def test_exclusive_jobs_run_honours_the_timeout(alias: str, marker: Path) -> None:
    done = subprocess.run(
        [*_django(), "exclusive_jobs", "run", "overrun", "--database", alias],
        cwd=ROOT,
        env=command_env(marker),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == EXIT_TIMED_OUT, done.stderr
    assert the_run(alias, "overrun").status == "timed_out"


def test_a_run_within_its_timeout_is_not_touched(alias: str, marker: Path) -> None:
    env = command_env(marker, JOB_SECONDS="0.2")
    done = manage(alias, "overrun", "--timeout", "5", env=env)
    assert done.returncode == 0, done.stderr
    assert the_run(alias, "overrun").status == "succeeded"
    assert runs(marker, "overrun-end") == 1


# --- the scheduler ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("stubborn", [False, True], ids=["stops", "ignores-sigterm"])
def test_the_schedulers_job_past_its_timeout_is_stopped_and_the_next_slot_runs(
    alias: str, marker: Path, schedulers: list[subprocess.Popen[str]], stubborn: bool
) -> None:
    extra = {"STUBBORN": "1"} if stubborn else {}
    env = scheduler_env(marker, **extra)
    process = start_scheduler(schedulers, alias, "--jobs", "overrun", env=env)
    wait_for(lambda: JobRun.objects.using(alias).filter(status="timed_out").count() >= 2, 60)
    stop(process)
    rows = history(alias, "overrun")
    ended = [run for run in rows if run.status == "timed_out"]
    assert all(run.error_type == "TimedOut" for run in ended)
    # Stopped at 1 s (+ 5 s to SIGKILL when it ignores SIGTERM), never its 30 s.
    assert all(run.duration is not None and 1 <= run.duration < 10 for run in ended)
    assert runs(marker, "overrun-end") == 0
    assert released(alias, "overrun")


# --- in this process --------------------------------------------------------------------


def test_a_direct_call_is_never_stopped(alias: str) -> None:
    @exclusive_job("direct_call_with_timeout", timeout=0.2, using=alias)
    def slow_view_helper() -> str:
        time.sleep(0.5)
        return "done"

    assert slow_view_helper() == "done"
    assert the_run(alias, "direct_call_with_timeout").status == "succeeded"


def test_a_timed_out_run_is_a_health_problem(alias: str) -> None:
    from django.db.models.functions import Now

    JobRun.objects.using(alias).create(
        name="overrun", status="timed_out", started_at=Now(), finished_at=Now(), duration=1
    )
    [health] = [job for job in overview(alias).jobs if job.name == "overrun"]
    assert health.badge == "failing"
    assert any("its last run timed out at" in line for line in health.problems)


@pytest.mark.parametrize("value", [0, -1, "soon"])
def test_a_bad_timeout_is_refused_when_declared(value: object) -> None:
    with pytest.raises(LockConfigurationError, match="timeout"):
        exclusive_job("bad_timeout", timeout=value)  # type: ignore[arg-type]


def test_a_bad_timeout_option_is_one_line_and_exit_2(alias: str, marker: Path) -> None:
    done = manage(alias, "overrun", "--timeout", "-5", env=command_env(marker))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "timeout must be positive" in done.stderr
    assert not JobRun.objects.using(alias).exists()


@pytest.mark.parametrize("value", [0, -1, "0s"])
def test_a_bad_timeout_setting_is_check_e015(value: object) -> None:
    from django.core.management.base import SystemCheckError

    with (
        override_settings(EXCLUSIVE_JOBS={"TIMEOUT": value}),
        pytest.raises(SystemCheckError, match="E015"),
    ):
        call_command("check")


def _django() -> list[str]:
    import sys

    return [sys.executable, "-m", "django"]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X") and os.path.exists(f"/proc/{pid}")


def test_a_stop_that_comes_after_the_job_returned_interrupts_nothing() -> None:
    """A shutdown racing a job's end: the child has returned and exited, the scheduler
    has not reaped it yet when it stops its runs. The run is the job's: it returned. A
    stop while the job runs still interrupts it. Real child processes of the fork server."""
    from django_exclusive_jobs.run import process
    from django_exclusive_jobs.run.runner import _stopped_while_running

    def ended(child: process.JobProcess) -> process.Outcome:
        deadline = time.monotonic() + 30
        while (outcome := child.poll()) is None:
            assert time.monotonic() < deadline, "the job's process did not end"
            time.sleep(0.02)
        return outcome

    lease = {"grace": 5.0, "deadline": time.monotonic() + 60, "margin": 5.0}
    try:
        returned = process.JobProcess("quick", None, **lease)  # type: ignore[arg-type]
        assert returned.child.sentinel is not None
        assert select.select([returned.child.sentinel], [], [], 30)[0], "it did not exit"
        returned.stop()
        outcome = ended(returned)
        assert (outcome.finished, outcome.returncode) == (True, 0)
        assert returned.stopped_by is not None
        assert not _stopped_while_running(returned, outcome)

        stopped = process.JobProcess("slow", None, **lease)  # type: ignore[arg-type]
        time.sleep(1.0)  # it has begun its 30 s
        stopped.stop()
        outcome = ended(stopped)
        assert not outcome.finished and outcome.interrupted_by is not None
        assert _stopped_while_running(stopped, outcome)
    finally:
        process.shut_down()


def test_a_sigterm_just_after_the_job_returned_is_held_until_the_child_exits() -> None:
    """In a job's process, a SIGTERM that lands as soon as the job has returned (before
    its spans are exported, its handlers put back, its report sent) is held: the report
    says it returned and the process exits 0, instead of the run turning into an
    interrupted one or a kill. A real forked process and a real signal."""
    from django_exclusive_jobs.run import process
    from django_exclusive_jobs.run.shutdown import stop_on_signals

    def stop_now() -> None:
        process._hold_stops()  # what a job's process does as soon as its job returns
        os.kill(os.getpid(), signal.SIGTERM)  # a stop that lands right then

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the job's process
        try:
            os.close(read)
            said = process.execute(
                "quick", None, {}, None, {}, around=stop_on_signals, after_job=stop_now
            )
            os.write(write, repr(sorted(said)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as reader:
        said = reader.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert said == repr(["ended", "enqueued", "finished"])

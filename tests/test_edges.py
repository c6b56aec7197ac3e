"""The scheduler at the edges, with real processes on every backend: started the ways
people deploy it, and frozen (SIGSTOP) while its job runs.

The jobs (tests/testapp/jobs.py) append lines to $MARKER, so the tests see what really ran
and when it stopped.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from django.utils import timezone

from benchmarks.proxy import TcpProxy
from django_exclusive_jobs import try_acquire
from django_exclusive_jobs.models import JobLock, JobRun, Scheduler

from .helpers import reaped
from .test_command import ROOT, command_env, marker, wait_for
from .test_faults import proxied_env, proxy, server_alias
from .test_scheduler import (
    assert_every_slot_once,
    executions,
    history,
    process_gone,
    scheduler_env,
    start_scheduler,
    statuses_until,
    stop,
)

__all__ = ["marker", "proxy", "server_alias"]  # fixtures

# --- deployment shapes ------------------------------------------------------------------

# A project of its own, outside the repository: its settings module is importable only
# because the main script's folder is on sys.path (as for any manage.py).
SETTINGS = "from tests.settings import *  # noqa: F403\n"
MANAGE_WITHOUT_GUARD = f"""
import os, sys
sys.path.append({str(ROOT)!r})  # where tests.settings lives
with open(os.environ["MAIN_RUNS"], "a") as runs:
    runs.write(f"{{os.getpid()}}\\n")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shape_settings")
from django.core.management import execute_from_command_line
execute_from_command_line(sys.argv)
"""
CALL_COMMAND_SCRIPT = f"""
import os, sys
sys.path.append({str(ROOT)!r})
with open(os.environ["MAIN_RUNS"], "a") as runs:
    runs.write(f"{{os.getpid()}}\\n")
os.environ["DJANGO_SETTINGS_MODULE"] = "shape_settings"
import django
django.setup()
from django.core.management import call_command
call_command("exclusive_scheduler", *sys.argv[1:])
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "srv" / "app"
    folder.mkdir(parents=True)
    (folder / "shape_settings.py").write_text(SETTINGS)
    (folder / "manage.py").write_text(textwrap.dedent(MANAGE_WITHOUT_GUARD))
    (folder / "cron_script.py").write_text(textwrap.dedent(CALL_COMMAND_SCRIPT))
    return folder


def shape_command(shape: str, project: Path, alias: str) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of one way of starting the scheduler."""
    args = ["--database", alias, "--jobs", "tick"]
    env = command_env(project / "marker.txt", MAIN_RUNS=str(project / "main-runs.txt"))
    if shape == "manage.py without a main guard, from another folder":
        del env["PYTHONPATH"], env["DJANGO_SETTINGS_MODULE"]
        return [sys.executable, str(project / "manage.py"), "exclusive_scheduler", *args], env
    if shape == "a script calling call_command":
        del env["PYTHONPATH"], env["DJANGO_SETTINGS_MODULE"]
        return [sys.executable, str(project / "cron_script.py"), *args], env
    assert shape == "django-admin with DJANGO_SETTINGS_MODULE and PYTHONPATH"
    env.update(PYTHONPATH=f"{project}{os.pathsep}{ROOT}", DJANGO_SETTINGS_MODULE="shape_settings")
    admin = Path(sys.executable).parent / "django-admin"
    return [str(admin), "exclusive_scheduler", *args], env


@pytest.mark.parametrize(
    "shape",
    [
        "manage.py without a main guard, from another folder",
        "django-admin with DJANGO_SETTINGS_MODULE and PYTHONPATH",
        "a script calling call_command",
    ],
)
def test_scheduler_runs_jobs_however_it_is_started(alias: str, project: Path, shape: str) -> None:
    """Started from "/" (a systemd unit without WorkingDirectory), the scheduler's job
    processes import the same project, and the main script runs once, in the scheduler."""
    command, env = shape_command(shape, project, alias)
    marker = project / "marker.txt"
    with reaped() as started:
        process = subprocess.Popen(
            command, cwd="/", env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        started.append(process)
        try:
            wait_for(lambda: len(executions(marker, "tick")) >= 2, timeout=40)
        except AssertionError:
            process.kill()
            out, err = process.communicate(timeout=30)
            pytest.fail(f"no tick ran:\n{out}\n{err}")
        out, err = stop(process)
    assert "Error" not in out + err, out + err
    if "django-admin" not in shape:
        main_runs = (project / "main-runs.txt").read_text().split()
        assert main_runs == [str(process.pid)], "the main script ran again in a job's process"
    # Every run succeeded. A slot that came while the run before it still went is
    # recorded skipped by tick's overlap policy, as it should be: fresh-clone CI's
    # Django 6.1 run (4 test processes on 2 cores) saw one, a run that outlasted tick's
    # 2 s. Nothing else may appear (no failed, lost or missed run), and at least two
    # runs succeeded.
    ticks = JobRun.objects.using(alias).filter(name="tick")
    rows = list(ticks.values_list("status", "error"))
    succeeded = [row for row in rows if row[0] == "succeeded"]
    others = [row for row in rows if row[0] != "succeeded"]
    overlap = [row for row in others if row[0] == "skipped" and row[1].startswith("Overlap:")]
    assert len(succeeded) >= 2 and others == overlap, rows


# --- a frozen scheduler ------------------------------------------------------------------


def beats(marker: Path) -> list[float]:
    """The wall-clock times at which long_tick's process was still running."""
    if not marker.exists():
        return []
    lines = marker.read_text().splitlines()
    return [float(line.split()[1]) for line in lines if line.startswith("long_tick-beat")]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), the children first."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            found += [child, *descendants(child)]
    return found


@contextmanager
def frozen(pids: list[int]) -> Iterator[None]:
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def lease_end(alias: str, token: int) -> float:
    """When the lease of ``token`` ends (or ended), on the database's clock, as a time()."""
    lock = JobLock.objects.using(alias).get(name="long_tick")
    assert lock.token == token, "another holder took the lock"
    assert lock.expires_at is not None
    return lock.expires_at.timestamp()


def test_a_frozen_schedulers_job_stops_before_its_lease_ends(alias: str, marker: Path) -> None:
    """SIGSTOP of the scheduler alone (its keep-alive stops renewing): the job's guard
    stops the job before the lease can end; the run says it lost its lease, with the
    duration the job really ran, not the time the scheduler was frozen."""
    env = scheduler_env(marker, JOB_SECONDS="30")
    with reaped() as started:
        scheduler = start_scheduler(started, alias, "--jobs", "long_tick", env=env)
        wait_for(lambda: len(beats(marker)) >= 5, timeout=40)
        run = JobRun.objects.using(alias).get(name="long_tick", status="running")
        with frozen([scheduler.pid]):
            time.sleep(5)  # the lease (3 s) ends while the scheduler is stopped
            end = lease_end(alias, run.token)
            last = beats(marker)[-1]
            time.sleep(1)
            assert beats(marker)[-1] == last, "the job still runs after its lease ended"
        assert last < end, f"the job ran {last - end:.3f}s past its lease"
        wait_for(lambda: JobRun.objects.using(alias).get(pk=run.pk).status != "running", 20)
        stop(scheduler)
    run.refresh_from_db()
    assert run.status == "lost", run.status
    assert "no renewal reached" in run.error
    ran = last - beats(marker)[0]
    assert run.duration is not None
    # The run started (started_at, then the job's process) before its first beat and
    # ended (the guard's stop) after its last: the duration covers the beats. It ends
    # where the job was stopped, before the lease's end, not when the scheduler, thawed
    # at least 3 s after that end, learned of it. (No allowance for a slow start: a
    # loaded machine may take seconds to start the job's process.)
    assert run.duration > ran, f"recorded {run.duration:.2f}s for {ran:.2f}s of work"
    recorded_end = run.started_at.timestamp() + run.duration
    past = recorded_end - end
    assert past < 1.0, f"the recorded end is {past:.2f}s past the lease's"


def test_a_job_holding_the_gil_still_stops_before_its_lease_ends(
    postgres: str, marker: Path
) -> None:
    """A job in one long call into C holds the GIL, so its guard's thread cannot take in
    the scheduler's renewals: the guard's timer (the kernel's, needing no GIL) ends the
    job's process before the lease it knows of ends. The run is recorded lost, the
    scheduler goes on, and the next slot runs. (One backend: the guard knows none.)"""
    alias = postgres
    with reaped() as started:
        scheduler = start_scheduler(started, alias, "--jobs", "gil_hog", env=scheduler_env(marker))
        runs = JobRun.objects.using(alias).filter(name="gil_hog")
        wait_for(lambda: runs.exclude(status="running").exists(), timeout=60)
        first = runs.exclude(status="running").order_by("slot").first()
        assert first is not None
        wait_for(lambda: runs.filter(slot__gt=first.slot).exists(), timeout=30)
        stop(scheduler)
    assert first.status == "lost", (first.status, first.error)
    assert "no renewal reached" in first.error
    pid = int(marker.read_text().split()[2])
    assert process_gone(pid)
    # Stopped at the end of the lease it knew of (3 s after its start at the latest).
    assert first.duration is not None and first.duration < 3.0, first.duration


def test_a_whole_frozen_tree_is_fenced_by_the_token(alias: str, marker: Path) -> None:
    """SIGSTOP of the scheduler, its fork server and the job's process (its guard is a
    thread of it): nothing on this machine runs to stop the job in time, so another
    server takes the lock with a higher token (which a fenced write accepts instead of
    ours). When the job's process resumes (the scheduler still stopped), its guard (the
    thread, or the timer the kernel fires at the thaw) stops the job at once."""
    env = scheduler_env(marker, JOB_SECONDS="30")
    with reaped() as started:
        scheduler = start_scheduler(started, alias, "--jobs", "long_tick", env=env)
        wait_for(lambda: len(beats(marker)) >= 5, timeout=40)
        run = JobRun.objects.using(alias).get(name="long_tick", status="running")
        [fork_server, *job] = descendants(scheduler.pid)
        assert len(job) == 1, job  # one process per run: no guard process beside it
        with frozen([scheduler.pid, fork_server]):
            with frozen(job):
                time.sleep(4)
                other = try_acquire("long_tick", using=alias, ttl=60)
                assert other is not None, "the frozen holder's lease did not end"
                assert other.token > run.token
            thawed = time.time()
            time.sleep(1.5)  # the scheduler is still stopped: only the guard can act
            assert beats(marker)[-1] < thawed + 1.0, "the job went on after the thaw"
        wait_for(lambda: JobRun.objects.using(alias).get(pk=run.pk).status != "running", 20)
        other.release()
        stop(scheduler)
    run.refresh_from_db()
    assert run.status == "lost", run.status


def test_a_dead_fork_server_leaves_running_jobs_alone(alias: str, marker: Path) -> None:
    """kill -9 of the fork server while a job runs: the job goes on to its end and is
    recorded as it ended, and the next start gets a new fork server."""
    env = scheduler_env(marker, JOB_SECONDS="3")
    with reaped() as started:
        scheduler = start_scheduler(started, alias, "--jobs", "long_tick", env=env)
        wait_for(lambda: len(beats(marker)) >= 5, timeout=40)
        run = JobRun.objects.using(alias).get(name="long_tick", status="running")
        fork_server = descendants(scheduler.pid)[0]
        os.kill(fork_server, signal.SIGKILL)
        wait_for(lambda: JobRun.objects.using(alias).get(pk=run.pk).status != "running", 20)
        runs = JobRun.objects.using(alias).filter(name="long_tick", status="succeeded")
        wait_for(lambda: runs.count() >= 2, timeout=40)  # a later slot, a new fork server
        stop(scheduler)
    run.refresh_from_db()
    assert run.status == "succeeded", (run.status, run.error)
    assert marker.read_text().count("long_tick-end") >= 2


# --- a database outage -------------------------------------------------------------------


def first_run_after(alias: str, name: str, moment: float) -> JobRun | None:
    runs = JobRun.objects.using(alias).filter(name=name, status="succeeded")
    after = runs.filter(started_at__gt=dt.datetime.fromtimestamp(moment, dt.UTC))
    return after.order_by("started_at").first()


@pytest.mark.slow
def test_an_outage_costs_only_the_slots_inside_it(
    marker: Path, proxy: TcpProxy, server_alias: str
) -> None:
    """A 12-s cut of an every-2-s job: the scheduler notices the return within about a
    second, runs the latest slot at once (catch_up="latest"), records the others missed,
    runs every slot after the return, beats at once, and starts no run before its slot."""
    alias = server_alias
    env = proxied_env(alias, proxy.port, MARKER=str(marker), TICK_EVERY="2s")
    with reaped() as started:
        process = start_scheduler(started, alias, "--jobs", "tick", env=env)
        wait_for(lambda: len(executions(marker, "tick")) >= 3, timeout=60)
        proxy.cut("refuse")
        cut = time.time()
        time.sleep(12)
        proxy.restore()
        back = time.time()
        wait_for(lambda: first_run_after(alias, "tick", back) is not None, timeout=30)
        first = first_run_after(alias, "tick", back)
        time.sleep(7)  # three slots after the return
        beat = Scheduler.objects.using(alias).get(pid=process.pid).last_beat_at
        stopping = timezone.now()  # a run the stop caught is rightly interrupted
        _, err = stop(process)
    assert first is not None and first.started_at is not None
    assert first.started_at.timestamp() - back < 2.5, "the return was noticed late"
    rows = history(alias, "tick")
    assert_every_slot_once(rows)
    for run in rows:
        assert run.slot is not None and run.started_at is not None
        if run.status == "succeeded":
            assert run.started_at >= run.slot, f"{run.slot} started {run.started_at} (early)"
    inside = [run for run in rows if cut < run.slot.timestamp() < back]  # type: ignore[union-attr]
    assert inside, "no slot fell inside the cut"
    assert [run.status for run in inside[:-1]] == ["missed"] * (len(inside) - 1)
    after = [run for run in rows if run.slot.timestamp() > back + 1]  # type: ignore[union-attr]
    assert len(after) >= 2
    assert statuses_until(after, stopping) == {"succeeded"}, [(r.slot, r.status) for r in after]
    assert beat.timestamp() > back, "no heartbeat since the return"
    assert err.count("database reachable again") == 1, err


@pytest.mark.slow
def test_a_run_whose_end_could_not_be_written_is_written_on_the_return(
    marker: Path, proxy: TcpProxy, server_alias: str
) -> None:
    """The job ends during a cut (its lease, 30 s, outlasts the cut): the scheduler writes
    its end once the database answers, instead of leaving it 'running' for the next
    holder to call lost."""
    alias = server_alias
    env = proxied_env(alias, proxy.port, MARKER=str(marker), TICK_EVERY="3s", JOB_SECONDS="2")
    with reaped() as started:
        process = start_scheduler(started, alias, "--jobs", "steady", env=env)
        wait_for(lambda: marker.exists() and "steady-start" in marker.read_text(), 30)
        began = time.monotonic()  # the job had started by now
        proxy.cut("refuse")
        slot = dt.datetime.fromisoformat(marker.read_text().split()[1])
        wait_for(lambda: "steady-end" in marker.read_text(), 10)
        time.sleep(4)  # the end cannot be written
        restored = time.monotonic()  # an end taken when written comes after this
        proxy.restore()
        runs = JobRun.objects.using(alias).filter(name="steady", slot=slot)
        wait_for(lambda: runs.exclude(status="running").exists(), 10)
        _, err = stop(process)
    run = runs.get()
    assert run.status == "succeeded", (run.status, run.error, err)
    # The duration is the job's own (it ended 4 s before the return), not the time until
    # its end could be written, whatever the machine's load made of the job's 2 s.
    assert run.duration is not None and run.duration < restored - began, (run.duration, err)


CONFIGURED_IN_CODE = """
import django
from django.conf import settings
from django.core.management import CommandError, call_command
settings.configure(
    INSTALLED_APPS=["django_exclusive_jobs"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    USE_TZ=True,
)
django.setup()
try:
    call_command("exclusive_scheduler")
except CommandError as exc:
    print(exc.returncode, exc)
"""


def test_settings_made_in_code_are_refused_with_one_line() -> None:
    """A job's process cannot load settings made by settings.configure(): the scheduler
    says so before it starts, instead of failing every run."""
    env = command_env()
    del env["DJANGO_SETTINGS_MODULE"]
    result = subprocess.run(
        [sys.executable, "-c", CONFIGURED_IN_CODE],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.startswith("2 The scheduler runs each job in a process"), result
    assert "DJANGO_SETTINGS_MODULE" in result.stdout

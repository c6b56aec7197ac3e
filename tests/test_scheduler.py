"""`manage.py exclusive_scheduler` as real processes on every backend: each slot once.

The jobs (tests/testapp/jobs.py) append "<word> <slot> <pid>" to $MARKER each time they
really run, so the tests count executions, not only history rows.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connections

from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.models import JobLock, JobRun, Scheduler

from .helpers import reaped
from .process_output import Output
from .test_bad_input import complaint
from .test_command import ROOT, command_env, launch, marker, wait_for
from .test_faults import TcpProxy, proxied_env, proxy, server_alias

__all__ = ["marker", "proxy", "server_alias"]  # fixtures

FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
TWO_SECONDS = dt.timedelta(seconds=2)


def scheduler_env(marker: Path, *, shift: str | None = None, **extra: str) -> dict[str, str]:
    """The test settings; with ``shift`` (e.g. "+1h"), this server's clock is that far off."""
    env = command_env(marker, **{"TICK_EVERY": "2s", **extra})
    if shift is not None:
        assert os.path.exists(FAKETIME), "libfaketime is missing (scripts/test.sh installs it)"
        env.update(LD_PRELOAD=FAKETIME, FAKETIME=shift)
    return env


@pytest.fixture
def schedulers() -> Iterator[list[subprocess.Popen[str]]]:
    with reaped() as started:
        yield started


def start_scheduler(
    started: list[subprocess.Popen[str]], alias: str, *args: str, env: dict[str, str]
) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "django", "exclusive_scheduler", "--database", alias]
    return launch(started, [*command, *args], env)


def stop(process: subprocess.Popen[str], timeout: float = 30) -> tuple[str, str]:
    """SIGTERM; its output once it exited (an exit code other than 0 fails the test)."""
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"exit {process.returncode}\n{out}\n{err}"
    return out, err


def executions(marker: Path, word: str) -> Counter[dt.datetime]:
    """How many times the job really ran for each slot."""
    ran: Counter[dt.datetime] = Counter()
    if marker.exists():
        for line in marker.read_text().splitlines():
            fields = line.split()
            if fields[0] == word:
                ran[dt.datetime.fromisoformat(fields[1])] += 1
    return ran


def wait_for_the_next_slot(alias: str, marker: Path, word: str, every: float = 2.0) -> None:
    """Until the slot after the one the job first marked ``word`` for has begun, on the
    database's clock (the one a cron line's slot is read on)."""
    wait_for(lambda: executions(marker, word), timeout=30)
    next_slot = min(executions(marker, word)) + dt.timedelta(seconds=every)
    wait_for(lambda: database_now(alias) >= next_slot, timeout=30)


def history(alias: str, name: str) -> list[JobRun]:
    return list(JobRun.objects.using(alias).filter(name=name).order_by("slot", "attempt"))


def statuses_until(rows: list[JobRun], stopping: dt.datetime) -> set[str]:
    """The statuses of the runs that ended before the test stopped their scheduler. One
    that ended after may have been interrupted by that stop, or ended as those did."""
    ended = [run for run in rows if run.finished_at is not None and run.finished_at < stopping]
    before = {run.status for run in ended}
    caught = {run.status for run in rows if run not in ended}
    assert caught <= before | {"interrupted"}, caught
    return before


def assert_every_slot_once(rows: list[JobRun], step: dt.timedelta = TWO_SECONDS) -> None:
    """One row per slot, no slot left out, from the first row to the last."""
    slots = [run.slot for run in rows]
    assert all(slot is not None for slot in slots)
    assert len(set(slots)) == len(slots)
    gaps = [b - a for a, b in itertools.pairwise(slots)]  # type: ignore[operator]
    assert set(gaps) <= {step}, f"slots not consecutive: gaps {sorted(set(gaps))[:5]}"


def succeeded(alias: str, name: str) -> int:
    return JobRun.objects.using(alias).filter(name=name, status="succeeded").count()


# --- each slot once --------------------------------------------------------------------


@pytest.mark.slow
def test_three_schedulers_run_each_slot_once_with_clocks_an_hour_off(
    alias: str, marker: Path, schedulers: list[subprocess.Popen[str]]
) -> None:
    # SQLite's clock is the machine's: every process using the file runs on that machine.
    shifts = (None, "+1h", "-1h") if connections[alias].vendor != "sqlite" else (None,) * 3
    # A slot every 3 s: three servers (two under libfaketime) on a busy machine were once
    # all over 2 s late for a 2-s slot, which was rightly skipped.
    every = dt.timedelta(seconds=3)
    for shift in shifts:
        # A lease of 10 s: the subject is the slots, not the lease (3 s was lost once, its
        # renewals over 2 s late on a loaded machine, and the slot after it missed).
        env = scheduler_env(marker, shift=shift, TICK_TTL="10", TICK_EVERY="3s")
        start_scheduler(schedulers, alias, "--jobs", "tick", env=env)
    wait_for(lambda: succeeded(alias, "tick") >= 8, timeout=120)
    for process in schedulers:
        stop(process, timeout=40)

    rows = history(alias, "tick")
    assert len(rows) >= 8
    assert_every_slot_once(rows, every)
    assert {run.status for run in rows} == {"succeeded"}  # none missed, none failed
    ran = executions(marker, "tick")
    assert set(ran) == {run.slot for run in rows} and set(ran.values()) == {1}
    # Started on database time within the slot's interval, whatever the servers' clocks.
    late = [run.started_at - run.slot for run in rows if run.slot is not None]
    assert max(late) < every, late
    beats = Scheduler.objects.using(alias).all()
    assert len(beats) == 3 and all(beat.stopped_at is not None for beat in beats)
    assert {tuple(beat.jobs) for beat in beats} == {("tick",)}


def test_sigterm_lets_a_running_job_finish_within_the_grace(
    alias: str, marker: Path, schedulers: list[subprocess.Popen[str]]
) -> None:
    env = scheduler_env(marker, JOB_SECONDS="3", TICK_TTL="10")  # the grace, not the lease
    process = start_scheduler(schedulers, alias, "--jobs", "tick", "--grace", "30", env=env)
    wait_for(lambda: sum(executions(marker, "tick").values()) == 1, timeout=60)
    _, err = stop(process, timeout=40)
    assert "stopping: waiting up to 30s for 1 running job(s): tick" in err
    [run] = history(alias, "tick")
    assert run.status == "succeeded" and run.duration is not None and run.duration >= 3
    lock = JobLock.objects.using(alias).get(name="tick")
    assert lock.released_at is not None


def test_sigterm_stops_a_job_past_the_grace_and_records_it_interrupted(
    alias: str, marker: Path, schedulers: list[subprocess.Popen[str]]
) -> None:
    env = scheduler_env(marker, JOB_SECONDS="120", TICK_TTL="10")  # the grace, not the lease
    process = start_scheduler(schedulers, alias, "--jobs", "tick", "--grace", "1", env=env)
    wait_for(lambda: sum(executions(marker, "tick").values()) == 1, timeout=60)
    began = time.monotonic()
    stop(process, timeout=40)
    assert time.monotonic() - began < 1 + 10  # the grace, then SIGTERM gets the job out
    [run] = history(alias, "tick")
    assert run.status == "interrupted"
    assert JobLock.objects.using(alias).get(name="tick").released_at is not None
    assert Scheduler.objects.using(alias).get().stopped_at is not None


# --- faults ----------------------------------------------------------------------------


def process_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


@pytest.mark.slow
def test_killed_scheduler_mid_run_is_lost_retried_and_later_slots_run_once(
    alias: str, marker: Path, schedulers: list[subprocess.Popen[str]]
) -> None:
    # The retry must be claimed within the killed slot: the kill comes once the job's
    # process has started, its lease (ttl 3 s, renewed every second) ends up to 3 s
    # later, and the survivor takes over then; past the slot, the newer slot gives the
    # retry up, as it should. Every 8 s leaves a loaded machine over 4 s to start the
    # job's process (every 6 s failed once in CI without saying why: its runs are now
    # printed).
    env = scheduler_env(marker, TICK_EVERY="8s", JOB_SECONDS="4")
    for _ in range(2):
        start_scheduler(schedulers, alias, "--jobs", "tick_retry", env=env)
    wait_for(lambda: executions(marker, "tick_retry-start"), timeout=60)
    [slot] = executions(marker, "tick_retry-start")
    holder = JobLock.objects.using(alias).get(name="tick_retry")
    [victim] = [process for process in schedulers if process.pid == holder.pid]
    child = int(marker.read_text().split()[2])
    victim.kill()
    victim.communicate(timeout=30)
    wait_for(lambda: process_gone(child), timeout=2)  # the job (4 s) died with its scheduler
    # The survivor takes over when the lease ends, marks attempt 1 lost with its
    # retry_at, and runs attempt 2 (retries=1).
    try:
        wait_for(lambda: executions(marker, "tick_retry")[slot] == 1, timeout=30)
    except AssertionError:
        rows = [
            (r.slot, r.attempt, r.status, r.retry_at, r.started_at, r.token, r.holder)
            for r in history(alias, "tick_retry")
        ]
        raise AssertionError(f"slot {slot} was not retried; runs: {rows}") from None
    wait_for(lambda: succeeded(alias, "tick_retry") >= 3, timeout=60)
    [survivor] = [process for process in schedulers if process is not victim]
    stop(survivor, timeout=40)

    assert executions(marker, "tick_retry-start")[slot] == 2  # killed once, retried once
    assert f"tick_retry {slot.isoformat()} {child}" not in marker.read_text()
    rows = history(alias, "tick_retry")
    lost, *rows = rows  # attempt 1 of the killed slot: a run of its own
    assert (lost.slot, lost.status, lost.attempt) == (slot, "lost", 1)
    assert lost.retry_at is not None
    assert_every_slot_once(rows, dt.timedelta(seconds=8))
    first = rows[0]
    assert (first.slot, first.status, first.attempt) == (slot, "succeeded", 2)
    assert first.retry_at is None
    ran = executions(marker, "tick_retry")
    # A slot that came while the late retry ran is skipped (overlap="skip"), not run late.
    assert {run.status for run in rows} <= {"succeeded", "skipped"}
    assert set(ran.values()) == {1}
    assert set(ran) == {run.slot for run in rows if run.status == "succeeded"}


@pytest.mark.slow
def test_all_schedulers_down_for_five_slots_then_each_policy_decides(
    alias: str, marker: Path, schedulers: list[subprocess.Popen[str]]
) -> None:
    jobs = ("tick", "tick_all", "tick_skip")
    # A slot every 2 s: the gap's five slots in 10 s. (Every second, a run of a loaded
    # machine, its process and guard forked, lasted past the next slot: skipped.)
    step = TWO_SECONDS
    env = scheduler_env(marker)
    first = start_scheduler(schedulers, alias, "--jobs", *jobs, env=env)
    wait_for(lambda: all(succeeded(alias, name) >= 2 for name in jobs), timeout=60)
    stop(first)
    # Five slots and more with no scheduler up: the database's clock past the fifth slot
    # after the latest one served.
    served = max(run.slot for name in jobs for run in history(alias, name) if run.slot)
    wait_for(lambda: database_now(alias) > served + 6 * step, timeout=60)
    back = dt.datetime.now(dt.UTC)  # the database is on this machine: the same clock
    again = start_scheduler(schedulers, alias, "--jobs", *jobs, env=env)
    wait_for(lambda: all(succeeded(alias, name) >= 7 for name in jobs), timeout=60)
    stop(again)

    for name in jobs:
        rows = history(alias, name)
        assert_every_slot_once(rows, step)  # the history shows every slot: run or missed
        ran = executions(marker, name)
        assert set(ran.values()) == {1}
        assert set(ran) == {run.slot for run in rows if run.status == "succeeded"}
        assert {run.status for run in rows} <= {"succeeded", "missed"}
    statuses = {name: "".join(run.status[0] for run in history(alias, name)) for name in jobs}
    # latest: the gap's slots missed but the newest, which runs once, when a scheduler is
    # back. How many slots the gap holds depends on how long the restart took (7 on a
    # loaded machine), so the run after the gap is judged by its slot: one current when
    # the scheduler was started again, or later, not an older one of the gap. (Not by its
    # start less its slot: on a loaded machine its run row was once written 2.005 s after
    # its slot, the slot current when the scheduler began.)
    assert "mmmm" in statuses["tick"]
    assert statuses["tick"].endswith("s")
    current_at_restart = back - dt.timedelta(seconds=back.timestamp() % step.total_seconds())

    def first_after_the_gap(name: str) -> dt.datetime:
        rows = history(alias, name)
        gap = [run.status for run in rows].index("missed")
        after_gap = next(run for run in rows[gap:] if run.status == "succeeded")
        assert after_gap.started_at is not None and after_gap.slot is not None
        return after_gap.slot

    # all: every slot of the gap run, in order: nothing missed.
    assert "m" not in statuses["tick_all"]
    assert len(statuses["tick_all"]) >= len(statuses["tick"])
    # skip: every slot of the gap missed (and the one at the restart, if it was late).
    assert "mmmmm" in statuses["tick_skip"]
    # latest and skip: the first run after the gap serves a slot current at the restart or
    # later, none of the gap's. Each is judged by the restart, not against the other's:
    # the jobs' first starts after it may fall on either side of a slot's beginning (on
    # a loaded machine latest's once came a slot after skip's, and missed one more).
    for name in ("tick", "tick_skip"):
        first = first_after_the_gap(name)
        assert first >= current_at_restart - dt.timedelta(milliseconds=1), (name, first, back)
    missed_before = [run for run in history(alias, "tick") if run.status == "missed"]
    assert all("No server ran this slot" in run.error for run in missed_before)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("crash", "error_type", "says"),
    [
        ("raise", "RuntimeError", "the job fell over"),
        ("exit", "ProcessDied", "exited with code 3 before the job returned"),
        ("segfault", "ProcessDied", "killed by SIGSEGV"),
    ],
)
def test_a_crashing_job_never_stops_the_scheduler_or_its_other_jobs(
    marker: Path,
    schedulers: list[subprocess.Popen[str]],
    crash: str,
    error_type: str,
    says: str,
    django_db_setup: None,
    django_db_blocker: object,
) -> None:
    from .conftest import clean_tables

    alias = "default"
    with django_db_blocker.unblock():  # type: ignore[attr-defined]
        clean_tables(alias)
        env = scheduler_env(marker, CRASH=crash)
        process = start_scheduler(schedulers, alias, "--jobs", "tick", "crash", env=env)
        wait_for(lambda: succeeded(alias, "tick") >= 3, timeout=60)
        wait_for(lambda: JobRun.objects.using(alias).filter(name="crash").count() >= 3)
        stop(process)
        crashed = history(alias, "crash")
        assert {run.status for run in crashed} == {"failed"}
        assert {run.error_type for run in crashed} == {error_type}
        assert all(says in run.error for run in crashed), crashed[0].error
        assert_every_slot_once(history(alias, "tick"))
        clean_tables(alias)


# --- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--jobs", "nope"], "Unknown job 'nope'"),
        (["--max-concurrent", "0"], "--max-concurrent: must be a whole number of at least 1"),
        (["--grace", "-1"], "--grace must not be negative, got -1s."),
        (["--database", "nowhere"], "Unknown database alias 'nowhere'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_and_nothing_runs(
    marker: Path, args: list[str], message: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "django", "exclusive_scheduler", *args],
        cwd=ROOT,
        env=scheduler_env(marker),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result
    [line] = complaint(result.stderr)
    assert message in line
    assert not marker.exists()


@pytest.mark.slow
def test_database_outage_is_one_line_each_way_and_no_slot_runs_twice(
    marker: Path, schedulers: list[subprocess.Popen[str]], proxy: TcpProxy, server_alias: str
) -> None:
    alias = server_alias
    env = proxied_env(alias, proxy.port, MARKER=str(marker), TICK_EVERY="2s")
    env["PYTHONUNBUFFERED"] = "1"  # its lines read as they come
    process = start_scheduler(schedulers, alias, "--jobs", "tick", env=env)
    output = Output(process)
    wait_for(lambda: succeeded(alias, "tick") >= 3, timeout=60)
    proxy.cut("refuse")
    # Three slots and more with the database gone: from the scheduler's noticing it, the
    # database's clock (the test reaches it directly) past three slot starts.
    wait_for(lambda: output.count("database unreachable") == 1, timeout=30)
    noticed = database_now(alias)
    wait_for(lambda: database_now(alias) > noticed + 3 * TWO_SECONDS, timeout=30)
    assert process.poll() is None, output.tail()  # still running
    before = succeeded(alias, "tick")
    proxy.restore()
    wait_for(lambda: succeeded(alias, "tick") >= before + 3, timeout=60)
    err = output.stop()

    assert err.count("database unreachable") == 1, err
    assert err.count("database reachable again") == 1, err
    rows = history(alias, "tick")
    assert_every_slot_once(rows)  # the slots of the outage are recorded, as run or missed
    ran = executions(marker, "tick")
    assert set(ran.values()) == {1}
    assert set(ran) == {run.slot for run in rows if run.status == "succeeded"}


@pytest.mark.slow
def test_a_job_holding_the_gil_dies_with_its_killed_scheduler(
    marker: Path, schedulers: list[subprocess.Popen[str]], django_db_setup: None
) -> None:
    process = start_scheduler(schedulers, "default", "--jobs", "spin", env=scheduler_env(marker))
    wait_for(lambda: marker.exists() and marker.read_text().startswith("spin "), timeout=60)
    child = int(marker.read_text().split()[2])
    process.kill()
    process.communicate(timeout=30)
    wait_for(lambda: process_gone(child), timeout=5)


def test_receivers_that_raise_never_stop_the_scheduler(
    alias: str, marker: Path, schedulers: list[subprocess.Popen[str]]
) -> None:
    env = scheduler_env(marker, RAISING_RECEIVERS="1")
    process = start_scheduler(schedulers, alias, "--jobs", "tick", env=env)
    wait_for(lambda: len(executions(marker, "tick")) >= 2, timeout=60)
    _, err = stop(process)
    assert "a receiver that raises" in err
    assert process.returncode == 0

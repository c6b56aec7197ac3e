"""``overlap="allow_all"``: each slot takes a lock of its own, so slots run side by side,
each once across all servers (run/slot_locks.py).

The plan and the declaration are pure; direct calls exercise the slot's lock on each
backend; real schedulers and cron lines run ``overlong`` (tests/testapp/jobs.py: every
2 s, its first run lasts 5 s) side by side, and one is killed with SIGKILL mid-run.
"""

from __future__ import annotations

import datetime as dt
import itertools
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command

from django_exclusive_jobs import exclusive_job
from django_exclusive_jobs.health import overview
from django_exclusive_jobs.lock.acquire import exclusive_lock
from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.lock.errors import LockConfigurationError
from django_exclusive_jobs.models import JobLock, JobRun
from django_exclusive_jobs.run import slot_locks
from django_exclusive_jobs.run.catchup import CatchUp, plan
from django_exclusive_jobs.run.policies import OVERLAP
from django_exclusive_jobs.run.registry import _jobs
from django_exclusive_jobs.run.schedules import Every

from .test_command import argv, command_env, launch, marker, wait_for
from .test_scheduler import (
    executions,
    scheduler_env,
    schedulers,
    start_scheduler,
    stop,
    wait_for_the_next_slot,
)

__all__ = ["marker", "schedulers"]  # fixtures

HOUR = dt.timedelta(hours=1)


def at(hour: int, minute: int = 0) -> dt.datetime:
    return dt.datetime(2026, 11, 24, hour, minute, tzinfo=dt.UTC)


# --- pure ---------------------------------------------------------------------------------


def test_no_slot_comes_during_a_run_the_slots_nobody_ran_are_missed() -> None:
    # The 08:00 run lasted until 10:30. Under allow_all 09:00 and 10:00 were due at their
    # time beside it; a start at 11:40 that finds no row for them records them missed.
    result = plan(
        Every(period=HOUR),
        CatchUp(),
        at(11, 40),
        at(8),
        overlap=OVERLAP["allow_all"],
        ran=(at(8), at(10, 30)),
    )
    assert (result.run, result.skipped, result.missed, result.more) == (
        at(11),
        [],
        [at(9), at(10)],
        False,
    )


def test_a_slots_lock_is_named_after_the_job_and_the_slot_in_utc() -> None:
    paris = dt.timezone(dt.timedelta(hours=1))
    name = slot_locks.lock_name("report", dt.datetime(2026, 11, 25, 11, 0, tzinfo=paris))
    assert name == "report@2026-11-25T10:00:00Z"
    assert len(name) - len("report") == slot_locks.LENGTH


def test_allow_all_with_catch_up_all_or_a_name_too_long_is_one_clear_error() -> None:
    with pytest.raises(LockConfigurationError, match="catch_up='all' does not go with it"):
        exclusive_job("side_by_side_all", every="1h", overlap="allow_all", catch_up="all")
    longest = 255 - slot_locks.LENGTH
    with pytest.raises(LockConfigurationError, match=f"has at most {longest} characters"):
        exclusive_job("x" * (longest + 1), every="1h", overlap="allow_all")(noop)
    exclusive_job("y" * (longest + 1), every="1h")(noop)  # other policies: the job's lock
    _jobs.pop("y" * (longest + 1))


def noop() -> None:
    pass


# --- direct calls on each backend ---------------------------------------------------------


@pytest.fixture
def side_by_side(alias: str) -> Iterator[tuple[object, list[dt.datetime]]]:
    calls: list[dt.datetime] = []

    @exclusive_job("side_by_side", every="1h", overlap="allow_all", using=alias, ttl=60)
    def job(slot: dt.datetime) -> None:
        calls.append(slot)

    yield job, calls
    _jobs.pop("side_by_side", None)


def test_a_run_takes_its_slots_lock_and_leaves_the_jobs_lock_alone(
    alias: str, side_by_side: tuple[object, list[dt.datetime]]
) -> None:
    job, calls = side_by_side
    job()  # type: ignore[operator]
    [slot] = calls
    [run] = JobRun.objects.using(alias).filter(name="side_by_side")
    assert (run.slot, run.status) == (slot, "succeeded")
    lock = JobLock.objects.using(alias).get(name=slot_locks.lock_name("side_by_side", slot))
    assert (lock.token, lock.released_at is not None) == (run.token, True)
    # The job's own lock stays free for runs with no slot, and the next slot's lock is
    # free whatever this slot's run does: holding the job's lock blocks no slot.
    with exclusive_lock("side_by_side", using=alias, ttl=60, keepalive=False) as held:
        assert held
        job()  # type: ignore[operator]
    assert calls == [slot]  # the slot ran once: the second start found its row
    # The jobs page shows one job, not one per slot.
    jobs = overview(alias)
    assert not [row.name for row in jobs.undeclared]


def test_a_held_slot_lock_skips_that_slot_only(
    alias: str, side_by_side: tuple[object, list[dt.datetime]]
) -> None:
    job, calls = side_by_side
    slot = Every(period=HOUR).slot_at(database_now(alias))
    with exclusive_lock(
        slot_locks.lock_name("side_by_side", slot), using=alias, ttl=60, keepalive=False
    ) as held:
        assert held  # another server's run of this slot
        job()  # type: ignore[operator]
    assert calls == []
    assert not JobRun.objects.using(alias).filter(name="side_by_side").exists()


def test_a_new_slots_first_token_is_above_the_jobs_history(
    alias: str, side_by_side: tuple[object, list[dt.datetime]]
) -> None:
    job, calls = side_by_side
    earlier = Every(period=HOUR).slot_at(database_now(alias)) - HOUR
    JobRun.objects.using(alias).create(
        name="side_by_side", slot=earlier, status="succeeded", token=41, started_at=earlier
    )
    job()  # type: ignore[operator]
    run = JobRun.objects.using(alias).get(name="side_by_side", slot=calls[0])
    assert run.token == 42


def test_prune_deletes_free_slot_locks_and_keeps_held_ones(
    alias: str, side_by_side: tuple[object, list[dt.datetime]]
) -> None:
    job, calls = side_by_side
    job()  # type: ignore[operator]
    old = slot_locks.lock_name("side_by_side", calls[0])
    held_slot = calls[0] + HOUR
    with exclusive_lock(
        slot_locks.lock_name("side_by_side", held_slot), using=alias, ttl=60, keepalive=False
    ):
        time.sleep(0.05)  # both were taken before the cutoff
        call_command("prune_job_runs", "--older-than", "0s", "--database", alias, verbosity=0)
        names = set(JobLock.objects.using(alias).values_list("name", flat=True))
    assert old not in names
    assert slot_locks.lock_name("side_by_side", held_slot) in names


# --- real processes -----------------------------------------------------------------------


def overlong_runs(alias: str) -> list[JobRun]:
    return list(JobRun.objects.using(alias).filter(name="overlong").order_by("slot"))


def long_slot(marker: Path) -> dt.datetime:
    """The slot of the job's first execution, the long one (``overlong``). On a loaded
    machine the next slot's process may reach the job first: it is then that slot."""
    return next(iter(executions(marker, "overlong-start")))  # in the marker's order


def assert_side_by_side(alias: str, marker: Path) -> list[JobRun]:
    """One row per slot, consecutive slots, each executed once; the job's first execution
    (5 s long) overlapped the runs of the slots that came during it."""
    rows = overlong_runs(alias)
    slots = [row.slot for row in rows]
    assert len(set(slots)) == len(slots), [(r.slot, r.status) for r in rows]
    assert all(b - a == dt.timedelta(seconds=2) for a, b in itertools.pairwise(slots))  # type: ignore[operator]
    assert all(count == 1 for count in executions(marker, "overlong-start").values())
    [head] = [row for row in rows if row.slot == long_slot(marker)]
    assert head.finished_at is not None and head.duration is not None and head.duration >= 5
    beside = [
        row
        for row in rows
        if row is not head
        and row.started_at < head.finished_at
        and (row.finished_at is None or row.finished_at > head.started_at)
    ]
    assert beside, "no run ran while the long one ran"
    assert all(row.status == "succeeded" for row in beside)
    assert not [row for row in rows if row.status in ("skipped", "failed")]
    return rows


@pytest.mark.slow
def test_two_schedulers_run_the_slots_side_by_side_each_once(
    alias: str, marker: Path, schedulers: list[subprocess.Popen[str]]
) -> None:
    # A 10-s lease: the lease is not the subject (on a loaded machine a 3-s one was lost).
    env = scheduler_env(marker, OVERLAP="allow_all", OVERLONG_TTL="10")
    servers = [start_scheduler(schedulers, alias, "--jobs", "overlong", env=env) for _ in "ab"]
    wait_for(lambda: sum(r.status == "succeeded" for r in overlong_runs(alias)) >= 5, timeout=90)
    for server in servers:
        stop(server)
    rows = assert_side_by_side(alias, marker)
    assert not [row for row in rows if row.status in ("missed", "lost")]


@pytest.mark.slow
def test_a_cron_line_runs_its_slot_while_the_previous_slots_line_still_runs(
    alias: str, marker: Path
) -> None:
    # The first run lasts 10 s: the second line has almost 8 s to start its own, which a
    # loaded machine needs (a cron line sets Django up before it takes its lock).
    env = command_env(
        marker, OVERLAP="allow_all", TICK_EVERY="2s", LONG_SECONDS="10", OVERLONG_TTL="10"
    )
    started: list[subprocess.Popen[str]] = []
    try:
        first = launch(started, argv(alias, "overlong"), env)
        wait_for_the_next_slot(alias, marker, "overlong-start")
        second = launch(started, argv(alias, "overlong"), env)
        out, err = second.communicate(timeout=30)
        assert second.returncode == 0 and " lock=overlong@" in out, out + err
        assert first.poll() is None, "the first line should still be running"
        out, err = first.communicate(timeout=30)
        assert first.returncode == 0, out + err
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.communicate()
    rows = overlong_runs(alias)
    # Two runs; a slot between them (a loaded machine starts the second line late) is
    # recorded missed, as no line ran it.
    ran = [row for row in rows if row.status != "missed"]
    assert [row.status for row in ran] == ["succeeded", "succeeded"], [r.status for r in rows]
    assert all(count == 1 for count in executions(marker, "overlong-start").values())
    assert ran[1].started_at < ran[0].finished_at  # type: ignore[operator]


@pytest.mark.slow
def test_kill_9_during_a_run_beside_others_doubles_no_slot(
    alias: str, marker: Path, schedulers: list[subprocess.Popen[str]]
) -> None:
    env = scheduler_env(marker, OVERLAP="allow_all", LONG_SECONDS="8")
    servers = [start_scheduler(schedulers, alias, "--jobs", "overlong", env=env) for _ in "ab"]
    wait_for(lambda: executions(marker, "overlong-start"), timeout=30)
    slot = long_slot(marker)  # the next slot's run may be running too
    [running] = [r for r in overlong_runs(alias) if r.slot == slot]
    assert running.status == "running", running.status
    victim = next(server for server in servers if server.pid == running.pid)
    victim.send_signal(signal.SIGKILL)  # its run dies with it; its slot's lock stays held
    victim.communicate(timeout=30)
    survivor = next(server for server in servers if server is not victim)

    # The survivor runs the next slots beside the dead one, and once the dead run's
    # lease has run out (ttl=3), the next slot's start marks it lost.
    def the_long_run() -> JobRun:
        return next(row for row in overlong_runs(alias) if row.slot == slot)

    wait_for(lambda: the_long_run().status == "lost", timeout=60)
    wait_for(lambda: sum(r.status == "succeeded" for r in overlong_runs(alias)) >= 3, timeout=60)
    stop(survivor)
    rows = overlong_runs(alias)
    slots = [row.slot for row in rows]
    assert len(set(slots)) == len(slots)
    assert all(count == 1 for count in executions(marker, "overlong-start").values())
    assert "slot's lock lease ran out" in the_long_run().error
    assert {row.status for row in rows if row.slot != slot} <= {"succeeded", "missed"}

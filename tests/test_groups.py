"""Concurrency groups (``group=``): no two jobs of a group run at the same time anywhere.

The decision is pure (``claim.held_by_group``); then real cron lines and real schedulers
on every backend, with the test app's two members of the group ``maintenance``:
``group_skip`` (``overlap="skip"``) and ``group_wait`` (``overlap="buffer_one"``, also in
``nightly``). Each marks its start and end with this machine's clock.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from django_exclusive_jobs import exclusive_job
from django_exclusive_jobs.lock.errors import LockConfigurationError
from django_exclusive_jobs.models import JobLock, JobRun
from django_exclusive_jobs.run import claim, groups
from django_exclusive_jobs.run.claim import Decision, Insert, Record
from django_exclusive_jobs.run.status import RunStatus
from django_exclusive_jobs.values import groups as group_names

from .test_command import ROOT, argv, command_env, launch, marker, processes, wait_for
from .test_scheduler import schedulers, start_scheduler, stop

__all__ = ["marker", "processes", "schedulers"]  # fixtures

SLOT = dt.datetime(2026, 12, 6, 2, tzinfo=dt.UTC)
BUSY = groups.Busy("maintenance", "web-1:42:abcdef12", "vacuum", SLOT)


# --- the decision: pure -----------------------------------------------------------------


def test_a_skip_member_records_its_slot_skipped_naming_the_run_that_holds_the_group() -> None:
    missed = Record((SLOT - dt.timedelta(hours=1),), RunStatus.MISSED, "no server ran it")
    decided = Decision(current=SLOT, slot=SLOT, records=(missed,), insert=Insert(SLOT))
    held = claim.held_by_group(decided, BUSY, skips=True)
    assert held.insert is None and not held.waits
    assert held.records == (
        missed,
        Record(
            (SLOT,),
            RunStatus.SKIPPED,
            "Group maintenance: the run of vacuum (slot 2026-12-06T02:00:00+00:00) by "
            "web-1:42:abcdef12 was running.",
        ),
    )
    assert held.together and held.why == (
        "group maintenance is held: the run of vacuum (slot 2026-12-06T02:00:00+00:00) by "
        "web-1:42:abcdef12 is running"
    )


@pytest.mark.parametrize(
    "insert",
    [
        Insert(SLOT, attempt=2),  # a retry: its slot has a row already
        Insert(None, requested_by="ops"),  # run now
        Insert(SLOT, requested_by="ops", backfill=True),  # a backfill
        Insert(None),  # a job without a schedule
    ],
)
def test_what_is_not_a_new_slot_waits_its_turn_even_under_skip(insert: Insert) -> None:
    held = claim.held_by_group(Decision(insert=insert, more=True), BUSY, skips=True)
    assert (held.insert, held.records, held.waits, held.more) == (None, (), True, False)


def test_a_member_that_buffers_waits_and_keeps_what_the_claim_found() -> None:
    missed = Record((SLOT - dt.timedelta(hours=1),), RunStatus.MISSED, "no server ran it")
    decided = Decision(current=SLOT, slot=SLOT, records=(missed,), insert=Insert(SLOT))
    held = claim.held_by_group(decided, BUSY, skips=False)
    assert (held.insert, held.records, held.waits) == (None, (missed,), True)


def test_a_busy_group_whose_run_was_not_found_names_its_holder() -> None:
    busy = groups.Busy("maintenance", "web-1:42:abcdef12")
    assert busy.text == "Group maintenance: a run by web-1:42:abcdef12 was running."


# --- the door ---------------------------------------------------------------------------


def test_groups_are_a_name_or_names_sorted_once() -> None:
    assert group_names("db") == ("db",)
    assert group_names(["nightly", "db", "nightly"]) == ("db", "nightly")


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ([], "group must be a name or a list of names"),
        (5, "group must be a name or a list of names, not 5"),
        ("", "Group name must not be empty"),
        (["db", 3], "Group name must be a string"),
        ("x" * 250, "is 250 characters long; the limit is 249"),
        ("db\nx", "contains a control character"),
    ],
)
def test_a_bad_group_is_refused_in_one_line(given: object, said: str) -> None:
    with pytest.raises(LockConfigurationError, match=said) as raised:
        exclusive_job("bad_group", group=given)  # type: ignore[arg-type]
    assert "\n" not in str(raised.value)


def test_a_job_may_not_take_a_groups_lock_name() -> None:
    with pytest.raises(LockConfigurationError, match="may not start with 'group:'"):
        exclusive_job("group:maintenance", every="1h")(lambda: None)


def test_allow_all_cannot_be_in_a_group() -> None:
    with pytest.raises(LockConfigurationError, match="choose one"):
        exclusive_job("side_by_side", every="1h", overlap="allow_all", group="db")


# --- real cron lines, real schedulers ---------------------------------------------------


def marks(marker: Path) -> list[tuple[str, float, float]]:
    """Each run's (job, start, end) by this machine's clock, from the marker file."""
    started: dict[tuple[str, str], float] = {}
    runs = []
    for line in marker.read_text().splitlines() if marker.exists() else []:
        word, when, *rest = line.split()
        job, _, edge = word.rpartition("-")
        key = (job, rest[-1])  # its process
        if edge == "start":
            started[key] = float(when)
        else:
            runs.append((job, started.pop(key), float(when)))
    return runs


def assert_never_together(runs: list[tuple[str, float, float]]) -> None:
    ordered = sorted(runs, key=lambda run: run[1])
    for before, after in itertools.pairwise(ordered):
        assert before[2] <= after[1], f"{before} and {after} ran at the same time"


def started(marker: Path, job: str) -> bool:
    return f"{job}-start" in (marker.read_text() if marker.exists() else "")


def row(alias: str, name: str) -> JobRun:
    [found] = JobRun.objects.using(alias).filter(name=name)
    return found


@pytest.mark.slow
def test_a_cron_line_of_a_skip_member_records_its_slot_skipped_with_the_holder(
    alias: str, marker: Path, processes: list[subprocess.Popen[str]]
) -> None:
    env = command_env(marker, JOB_SECONDS="60")
    holder = launch(processes, argv(alias, "group_wait"), env)
    wait_for(lambda: started(marker, "group_wait"))
    skipped = subprocess.run(argv(alias, "group_skip"), env=env, capture_output=True, text=True)
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert "skipped group_skip: group maintenance is held: the run of group_wait" in (
        skipped.stdout
    )
    found = row(alias, "group_skip")
    assert found.status == RunStatus.SKIPPED
    assert found.error.startswith("Group maintenance: the run of group_wait (slot ")
    assert f":{holder.pid}:" in found.error
    assert "group_skip-start" not in marker.read_text()
    holder.kill()


def output_to(path: Path, command: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """``command`` with its output in ``path`` (read while it runs: unbuffered), in the
    project."""
    with path.open("w") as out:
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )


def ended_before(alias: str, first: str, then: str) -> None:
    """The run of ``first`` ended (its job's end: started_at + duration, before its
    locks' release) before the run of ``then`` began."""
    before, after = row(alias, first), row(alias, then)
    assert before.started_at is not None and before.duration is not None
    assert after.started_at is not None
    assert before.started_at + dt.timedelta(seconds=before.duration) <= after.started_at


@pytest.mark.slow
def test_a_cron_line_that_buffers_waits_its_turn_then_runs(
    alias: str, marker: Path, processes: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    holder = launch(processes, argv(alias, "group_skip"), command_env(marker, JOB_SECONDS="600"))
    wait_for(lambda: started(marker, "group_skip"))
    said = tmp_path / "waiter.txt"
    waiter = output_to(said, argv(alias, "group_wait"), command_env(marker))
    processes.append(waiter)
    waiting = "waiting for group_wait: group maintenance is held: the run of group_skip"
    wait_for(lambda: waiting in said.read_text())
    assert not started(marker, "group_wait")
    holder.send_signal(signal.SIGTERM)  # its run ends; then the waiter's turn comes
    holder.communicate(timeout=60)
    assert waiter.wait(timeout=60) == 0, said.read_text()
    assert row(alias, "group_wait").status == RunStatus.SUCCEEDED
    ended_before(alias, "group_skip", "group_wait")


@pytest.mark.slow
def test_a_member_killed_mid_run_holds_its_group_until_the_lease_ends(
    alias: str, marker: Path, processes: list[subprocess.Popen[str]]
) -> None:
    env = command_env(marker, JOB_SECONDS="600")
    killed = launch(processes, argv(alias, "group_skip"), env)
    wait_for(lambda: started(marker, "group_skip"))
    os.kill(killed.pid, signal.SIGKILL)
    killed.communicate(timeout=30)
    held = JobLock.objects.using(alias).get(name="group:maintenance")
    waiter = subprocess.run(
        argv(alias, "group_wait"), env=command_env(marker), capture_output=True, text=True
    )
    assert waiter.returncode == 0, waiter.stdout + waiter.stderr
    ran = row(alias, "group_wait")
    # It ran once the killed run's lease of the group (ttl=3) had ended, not before.
    assert held.expires_at is not None and ran.started_at >= held.expires_at
    assert ran.status == RunStatus.SUCCEEDED


@pytest.mark.slow
def test_members_on_two_schedulers_never_run_at_the_same_time(
    alias: str, marker: Path, schedulers: list[subprocess.Popen[str]]
) -> None:
    env = command_env(marker, GROUP_EVERY="3s", JOB_SECONDS="1")
    for _ in range(2):
        start_scheduler(schedulers, alias, "--jobs", "group_skip", "group_wait", env=env)

    def both_ran_and_six_runs() -> bool:
        # group_skip runs only at a slot where it takes the group before group_wait does:
        # a race between the two schedulers, which one of them may win several slots in
        # a row on a loaded machine (once, six).
        runs = marks(marker)
        return len(runs) >= 6 and {job for job, _, _ in runs} == {"group_skip", "group_wait"}

    wait_for(both_ran_and_six_runs, timeout=150)
    for scheduler in schedulers:
        stop(scheduler)
    runs = marks(marker)
    assert_never_together(runs)
    rows = JobRun.objects.using(alias).filter(name__in=["group_skip", "group_wait"])
    succeeded = {r.name for r in rows if r.status == RunStatus.SUCCEEDED}
    assert succeeded == {"group_skip", "group_wait"}, [(r.name, r.status) for r in rows]
    # group_skip's slots that came while group_wait ran are recorded skipped, naming it.
    for skipped in rows.filter(name="group_skip", status=RunStatus.SKIPPED):
        assert skipped.error.startswith("Group maintenance: "), skipped.error
    # No run of either is left running, and the group's lock is free.
    assert not rows.filter(status=RunStatus.RUNNING).exists()
    group = JobLock.objects.using(alias).get(name="group:maintenance")
    assert group.released_at is not None


@pytest.mark.slow
def test_run_now_of_a_member_waits_in_its_table_until_the_group_is_free(
    alias: str, marker: Path, processes: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    from django_exclusive_jobs.models import RunRequest
    from django_exclusive_jobs.run import control

    holder = launch(processes, argv(alias, "group_skip"), command_env(marker, JOB_SECONDS="600"))
    wait_for(lambda: started(marker, "group_skip"))
    said = tmp_path / "scheduler.txt"
    command = [sys.executable, "-m", "django", "exclusive_scheduler", "--database", alias]
    scheduler = output_to(said, [*command, "--jobs", "group_wait"], command_env(marker))
    processes.append(scheduler)
    control.request_run("group_wait", by="ops", using=alias)
    waiting = "waiting for group_wait: group maintenance is held: the run of group_skip"
    wait_for(lambda: waiting in said.read_text())
    assert RunRequest.objects.using(alias).pending().exists()  # still in its table
    assert not started(marker, "group_wait")
    holder.send_signal(signal.SIGTERM)
    holder.communicate(timeout=60)
    wait_for(lambda: not RunRequest.objects.using(alias).pending().exists(), timeout=60)
    ran = JobRun.objects.using(alias).filter(name="group_wait", status=RunStatus.SUCCEEDED)
    wait_for(ran.exists, timeout=60)
    scheduler.send_signal(signal.SIGTERM)
    assert scheduler.wait(timeout=60) == 0, said.read_text()
    assert row(alias, "group_wait").requested_by == "ops"
    ended_before(alias, "group_skip", "group_wait")

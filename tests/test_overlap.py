"""``overlap=``: what becomes of slots that come while the job's previous run still runs.

The plan is pure (the table in catchup.py); then real schedulers and cron lines on every
backend. The job ``overlong`` (tests/testapp/jobs.py) runs every 2 s; its first run
lasts 5 s, so the two or three slots after it come while it runs.
"""

from __future__ import annotations

import datetime as dt
import itertools
import signal
import subprocess
from pathlib import Path

import pytest

from django_exclusive_jobs import exclusive_job
from django_exclusive_jobs.lock.errors import LockConfigurationError
from django_exclusive_jobs.models import JobRun
from django_exclusive_jobs.run.catchup import CatchUp, plan
from django_exclusive_jobs.run.policies import OVERLAP
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
EVERY_HOUR = Every(period=HOUR)


def at(hour: int, minute: int = 0) -> dt.datetime:
    return dt.datetime(2026, 11, 24, hour, minute, tzinfo=dt.UTC)


# --- the plan: pure ---------------------------------------------------------------------

# The 08:00 run lasted until 10:30; the next start is at 11:40 (or 10:40).


@pytest.mark.parametrize(
    ("overlap", "run", "skipped", "more"),
    [
        ("skip", at(11), [at(9), at(10)], False),
        ("buffer_one", at(10), [at(9)], True),  # then 11:00, the current slot
        ("buffer_all", at(9), [], True),  # then 10:00, then 11:00
    ],
)
def test_slots_that_came_during_a_run_follow_the_overlap_policy(
    overlap: str, run: dt.datetime, skipped: list[dt.datetime], more: bool
) -> None:
    result = plan(
        EVERY_HOUR,
        CatchUp("latest"),
        at(11, 40),
        at(8),
        overlap=OVERLAP[overlap],
        ran=(at(8), at(10, 30)),
    )
    assert (result.run, result.skipped, result.missed, result.more) == (run, skipped, [], more)


def test_a_start_right_after_an_overrun_serves_the_slot_that_came_during_it() -> None:
    now, ran = at(10, 40), (at(8), at(10, 30))
    skip = plan(EVERY_HOUR, CatchUp(), now, at(8), overlap=OVERLAP["skip"], ran=ran)
    assert (skip.run, skip.skipped) == (None, [at(9), at(10)])
    one = plan(EVERY_HOUR, CatchUp(), now, at(8), overlap=OVERLAP["buffer_one"], ran=ran)
    assert (one.run, one.skipped, one.more) == (at(10), [at(9)], False)


def test_buffer_all_runs_at_most_the_limit_and_skips_the_older() -> None:
    result = plan(
        EVERY_HOUR,
        CatchUp("latest", limit=2),
        at(11, 40),
        at(6),
        overlap=OVERLAP["buffer_all"],
        ran=(at(6), at(10, 30)),
    )
    assert (result.run, result.skipped, result.missed) == (at(9), [at(7), at(8)], [])


@pytest.mark.parametrize("policy", ["latest", "skip"])
def test_buffer_all_runs_every_buffered_slot_one_start_after_another(policy: str) -> None:
    # Every 5 min; the 10:00 run lasted until 10:17: 10:05, 10:10 and 10:15 came during it.
    every = Every(period=dt.timedelta(minutes=5))
    first = plan(
        every,
        CatchUp(policy),
        at(10, 17),
        at(10),
        overlap=OVERLAP["buffer_all"],
        ran=(at(10), at(10, 17)),
    )
    assert (first.run, first.more, first.skipped, first.missed) == (at(10, 5), True, [], [])
    # The next start (its run of 10:05 ran from 10:17 to 10:18) runs 10:10, then 10:15:
    # they came before that run began, while the 10:00 run ran.
    ran = (at(10, 17), at(10, 18))
    second = plan(
        every, CatchUp(policy), at(10, 18), at(10, 5), overlap=OVERLAP["buffer_all"], ran=ran
    )
    assert (second.run, second.more, second.skipped, second.missed) == (at(10, 10), True, [], [])
    ran = (at(10, 18), at(10, 19))
    third = plan(
        every, CatchUp(policy), at(10, 19), at(10, 10), overlap=OVERLAP["buffer_all"], ran=ran
    )
    assert (third.run, third.more, third.skipped, third.missed) == (at(10, 15), False, [], [])


def test_buffer_all_leaves_no_slot_for_later_older_than_one_it_records_missed() -> None:
    # Every 5 min; the 10:00 run lasted until 10:12 (10:05 and 10:10 came during it); no
    # server was up for 10:15; a start at 10:20. Each start below claims as history.claim
    # does: it looks after the newest row at or before its slot, and writes the rows
    # planned.
    every = Every(period=dt.timedelta(minutes=5))
    rows = {at(10): (at(10), at(10, 12))}  # slot -> (started, ended): the run's
    now = at(10, 20)
    for _ in range(10):
        latest = max(slot for slot in rows if slot <= every.slot_at(now))
        step = plan(every, CatchUp(), now, latest, overlap=OVERLAP["buffer_all"], ran=rows[latest])
        rows.update(dict.fromkeys(step.missed + step.skipped, None))
        if step.run is None:
            break
        rows[step.run] = (now, now + dt.timedelta(seconds=30))  # each run is short
        now += dt.timedelta(seconds=30)
        if not step.more:
            break
    # Every slot has a row: 10:10 was not left for later behind 10:15's missed row, which
    # hid it from the next start's look; it is skipped. catch_up decided 10:15 (missed).
    assert sorted(rows) == [at(10, minute) for minute in range(0, 25, 5)]
    ran = [slot for slot, run in sorted(rows.items()) if run is not None]
    assert ran == [at(10), at(10, 5), at(10, 20)]
    first = plan(
        every, CatchUp(), at(10, 20), at(10), overlap=OVERLAP["buffer_all"], ran=rows[at(10)]
    )
    assert (first.run, first.skipped, first.missed) == (at(10, 5), [at(10, 10)], [at(10, 15)])


def test_catch_up_slots_before_a_late_run_run_before_its_buffered_ones() -> None:
    # Down 09:10-11:40; at 11:40 the 10:00 slot ran late, until 12:05 (catch_up="all"):
    # 11:00 came before it began (catch-up's), 12:00 during it (buffered). 11:00 first,
    # or the next start would take 12:00 for the latest recorded slot and lose 11:00.
    result = plan(
        EVERY_HOUR,
        CatchUp("all"),
        at(12, 5),
        at(10),
        overlap=OVERLAP["buffer_one"],
        ran=(at(11, 40), at(12, 5)),
    )
    assert (result.run, result.more, result.skipped, result.missed) == (at(11), True, [], [])


def test_a_slot_that_came_during_a_short_late_run_is_catch_ups_not_skipped() -> None:
    # Down 09:10-11:40; catch_up="all" ran 10:00 late, from 11:59:59 to 12:00:01 (two
    # seconds: no overrun). 11:00 and 12:00 are catch-up's: run in order, not skipped.
    ran = (at(11, 59) + dt.timedelta(seconds=59), at(12) + dt.timedelta(seconds=1))
    result = plan(EVERY_HOUR, CatchUp("all"), at(12, 1), at(10), overlap=OVERLAP["skip"], ran=ran)
    assert (result.run, result.more, result.skipped, result.missed) == (at(11), True, [], [])


def test_slots_after_the_run_ended_are_catch_ups_business() -> None:
    # The run ended at 08:30; 09:00 and 10:00 came while no server ran: missed.
    result = plan(
        EVERY_HOUR,
        CatchUp("latest"),
        at(11, 40),
        at(8),
        overlap=OVERLAP["skip"],
        ran=(at(8), at(8, 30)),
    )
    assert (result.run, result.skipped, result.missed) == (at(11), [], [at(9), at(10)])


def test_slots_before_a_late_run_started_are_catch_ups_business() -> None:
    # The 08:00 slot ran late, from 10:20 to 10:30: 09:00 and 10:00 came before it began.
    result = plan(
        EVERY_HOUR,
        CatchUp("all"),
        at(11, 40),
        at(8),
        overlap=OVERLAP["skip"],
        ran=(at(10, 20), at(10, 30)),
    )
    assert (result.run, result.skipped, result.missed) == (at(9), [], [])


def test_a_run_with_no_known_end_leaves_its_slots_to_catch_up() -> None:
    # Its server died: a later holder closed it, with no end of its own.
    result = plan(EVERY_HOUR, CatchUp("latest"), at(11, 40), at(8), overlap=OVERLAP["buffer_one"])
    assert (result.run, result.skipped, result.missed) == (at(11), [], [at(9), at(10)])


def test_a_bad_overlap_is_one_clear_error() -> None:
    with pytest.raises(LockConfigurationError, match="overlap must be one of"):
        exclusive_job("bad_overlap", every="1h", overlap="queue")
    with pytest.raises(LockConfigurationError, match="overlap only applies with every="):
        exclusive_job("bad_overlap", overlap="buffer_one")


# --- real processes ---------------------------------------------------------------------


def runs_of(alias: str) -> list[JobRun]:
    return list(JobRun.objects.using(alias).filter(name="overlong").order_by("slot"))


def assert_each_slot_once(alias: str, marker: Path) -> list[JobRun]:
    """One row per slot, consecutive; each slot executed at most once, and runs never
    side by side."""
    rows = runs_of(alias)
    slots = [row.slot for row in rows]
    assert len(set(slots)) == len(slots), [(r.slot, r.status) for r in rows]
    assert all(b - a == dt.timedelta(seconds=2) for a, b in itertools.pairwise(slots))  # type: ignore[operator]
    assert all(count == 1 for count in executions(marker, "overlong-start").values())
    ran = sorted((r.started_at, r.finished_at) for r in rows if r.status == "succeeded")
    for (_, end), (start, _) in itertools.pairwise(ran):
        assert end is not None and start >= end, "two runs overlapped"
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("overlap", ["skip", "buffer_one", "buffer_all"])
def test_two_schedulers_apply_the_policy_to_the_slots_that_came_during_a_run(
    alias: str, marker: Path, schedulers: list[subprocess.Popen[str]], overlap: str
) -> None:
    # A 10 s lease: on a loaded machine a renewal on SQLite can wait for the other
    # scheduler's writes longer than a 3 s lease allows (the run is then lost, rightly).
    env = scheduler_env(marker, OVERLAP=overlap, OVERLONG_TTL="10")
    servers = [start_scheduler(schedulers, alias, "--jobs", "overlong", env=env) for _ in "ab"]
    wait_for(lambda: sum(r.status == "succeeded" for r in runs_of(alias)) >= 5, timeout=90)
    for server in servers:
        stop(server)
    rows = assert_each_slot_once(alias, marker)
    first = rows[0]
    assert first.status == "succeeded" and first.duration is not None and first.duration >= 5
    assert first.finished_at is not None
    # The run's end as the claim reads it (claim.ran): its own duration, not when the
    # end was written, after the release (a slot between the two is after the run).
    ended = first.started_at + dt.timedelta(seconds=first.duration)
    during = [row for row in rows[1:] if row.slot is not None and row.slot <= ended]
    assert len(during) >= 2, "the first run should have outlasted two slots"
    statuses = [row.status for row in during]
    if overlap == "skip":
        assert statuses == ["skipped"] * len(during)
        assert all("Overlap: the run of slot" in row.error for row in during)
    elif overlap == "buffer_one":
        assert statuses == ["skipped"] * (len(during) - 1) + ["succeeded"]
        assert during[-1].started_at >= ended
    else:
        assert statuses == ["succeeded"] * len(during)
    bad = [(r.slot, r.status, r.error) for r in rows if r.status in ("missed", "failed", "lost")]
    assert not bad


@pytest.mark.slow
def test_a_cron_line_runs_the_buffered_slot_after_its_run(alias: str, marker: Path) -> None:
    # The first run lasts 7 s: the next slot's cron line, started as that slot begins,
    # has some 5 s to set Django up and find the lock held, as a loaded machine needs.
    env = command_env(
        marker, OVERLAP="buffer_one", TICK_EVERY="2s", LONG_SECONDS="7", OVERLONG_TTL="10"
    )
    started: list[subprocess.Popen[str]] = []
    try:
        first = launch(started, argv(alias, "overlong"), env)
        wait_for_the_next_slot(alias, marker, "overlong-start")  # its line finds the lock held
        second = launch(started, argv(alias, "overlong"), env)
        out, err = second.communicate(timeout=30)
        assert second.returncode == 0 and "skipped overlong: held by" in out, out + err
        out, err = first.communicate(timeout=30)
        assert first.returncode == 0, out + err
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.communicate()
    rows = assert_each_slot_once(alias, marker)
    head = rows[0]
    assert head.finished_at is not None and head.duration is not None and head.duration >= 5
    during = [row for row in rows[1:] if row.slot <= head.finished_at]  # type: ignore[operator]
    statuses = [row.status for row in during]
    assert statuses == ["skipped"] * (len(during) - 1) + ["succeeded"], statuses
    assert during[-1].started_at >= head.finished_at
    # The cron line that found the lock held ran nothing; the first one ran the rest.
    assert {row.pid for row in rows if row.status == "succeeded"} == {first.pid}, out


@pytest.mark.slow
def test_kill_9_during_a_buffered_run_doubles_no_slot(
    alias: str, marker: Path, schedulers: list[subprocess.Popen[str]]
) -> None:
    env = scheduler_env(marker, OVERLAP="buffer_one", LONG_SECONDS="8")
    servers = [start_scheduler(schedulers, alias, "--jobs", "overlong", env=env) for _ in "ab"]
    wait_for(lambda: executions(marker, "overlong-start"), timeout=30)
    [running] = [r for r in runs_of(alias) if r.status == "running"]
    victim = next(server for server in servers if server.pid == running.pid)
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=30)
    survivor = next(server for server in servers if server is not victim)
    wait_for(lambda: sum(r.status == "succeeded" for r in runs_of(alias)) >= 3, timeout=90)
    stop(survivor)
    rows = assert_each_slot_once(alias, marker)
    assert rows[0].status == "lost"
    assert {row.status for row in rows[1:]} <= {"succeeded", "missed"}


# --- cancel_other -----------------------------------------------------------------------

# The job ``superseded`` runs every 2 s; its first run would last 60 s, so the next
# slot's start asks it to stop.


def superseded_runs(alias: str) -> list[JobRun]:
    return list(JobRun.objects.using(alias).filter(name="superseded").order_by("slot"))


def assert_cancelled_then_ran(alias: str, marker: Path) -> list[JobRun]:
    """The first run was cancelled by the next slot, which ran after it ended; no slot
    ran twice, no run overlapped another, and no stop request is left waiting."""
    from django_exclusive_jobs.models import RunRequest

    rows = superseded_runs(alias)
    slots = [row.slot for row in rows]
    assert len(set(slots)) == len(slots)
    assert all(count == 1 for count in executions(marker, "superseded-start").values())
    head = rows[0]
    assert head.status == "cancelled", [(r.slot, r.status, r.error) for r in rows]
    assert head.error_type == "Cancelled" and "a newer slot could run" in head.error
    assert head.duration is not None and head.duration < 30  # not its 60 s
    after = [row for row in rows[1:] if row.status == "succeeded"]
    assert after and after[0].started_at >= head.finished_at  # type: ignore[operator]
    ran = sorted((r.started_at, r.finished_at) for r in rows if r.status == "succeeded")
    for (_, end), (start, _) in itertools.pairwise(ran):
        assert end is not None and start >= end, "two runs overlapped"
    assert not RunRequest.objects.using(alias).pending().exists()
    return rows


@pytest.mark.slow
def test_a_newer_slot_cancels_the_run_on_another_scheduler(
    alias: str, marker: Path, schedulers: list[subprocess.Popen[str]]
) -> None:
    env = scheduler_env(marker)
    servers = [start_scheduler(schedulers, alias, "--jobs", "superseded", env=env) for _ in "ab"]
    wait_for(lambda: sum(r.status == "succeeded" for r in superseded_runs(alias)) >= 2, 90)
    outputs = [stop(server) for server in servers]
    assert_cancelled_then_ran(alias, marker)
    said = "".join(out + err for out, err in outputs)
    # The holder's own scheduler stops it at the next slot, or the other's request does.
    assert "stopping superseded: " in said


@pytest.mark.slow
def test_a_lone_scheduler_cancels_its_own_run_for_the_newer_slot(
    alias: str, marker: Path, schedulers: list[subprocess.Popen[str]]
) -> None:
    server = start_scheduler(schedulers, alias, "--jobs", "superseded", env=scheduler_env(marker))
    wait_for(lambda: sum(r.status == "succeeded" for r in superseded_runs(alias)) >= 2, 90)
    out, err = stop(server)
    assert_cancelled_then_ran(alias, marker)
    assert "is due (overlap=cancel_other)" in out + err


@pytest.mark.slow
def test_a_cron_lines_newer_slot_cancels_the_cron_line_running_the_older(
    alias: str, marker: Path
) -> None:
    # (A scheduler holding the run stops it itself when the next slot comes: above.)
    env = command_env(marker, TICK_EVERY="2s")
    started: list[subprocess.Popen[str]] = []
    try:
        first = launch(started, argv(alias, "superseded"), env)
        wait_for_the_next_slot(alias, marker, "superseded-start")
        second = launch(started, argv(alias, "superseded"), env)
        out, err = second.communicate(timeout=60)
        assert second.returncode == 0, out + err
        assert "cancelling superseded" in err and "acquired superseded" in out, out + err
        out, err = first.communicate(timeout=30)
        assert first.returncode == 0, out + err  # cancelled: by design, not a failure
        assert "runs a newer slot" in out + err
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert_cancelled_then_ran(alias, marker)


@pytest.mark.slow
def test_kill_9_during_a_cancelled_run_doubles_no_slot(
    alias: str, marker: Path, schedulers: list[subprocess.Popen[str]]
) -> None:
    from django_exclusive_jobs.models import RunRequest

    env = scheduler_env(marker)
    victim = start_scheduler(schedulers, alias, "--jobs", "superseded", env=env)
    wait_for(lambda: executions(marker, "superseded-start"), timeout=30)
    victim.send_signal(signal.SIGKILL)  # its job dies with it; the lock stays held
    victim.communicate(timeout=30)
    survivor = start_scheduler(schedulers, alias, "--jobs", "superseded", env=env)
    wait_for(lambda: sum(r.status == "succeeded" for r in superseded_runs(alias)) >= 2, 60)
    stop(survivor)
    rows = superseded_runs(alias)
    assert rows[0].status == "lost"
    assert {row.status for row in rows[1:]} <= {"succeeded", "missed", "skipped"}
    assert all(count == 1 for count in executions(marker, "superseded-start").values())
    assert not RunRequest.objects.using(alias).pending().exists()


def test_a_short_run_whose_end_was_written_late_did_not_overrun(alias: str) -> None:
    """The end of a run is written after its lock's release, so a slow database can
    write it long after the job ended: what says whether it overran its interval is its
    duration, not when its end was written. (The protocol's model found it: the next
    slot was recorded skipped and not run.)"""
    from django_exclusive_jobs.lock.clock import database_now

    ran: list[str] = []

    @exclusive_job("late_end", every="1h", using=alias)
    def late_end() -> None:
        ran.append("ran")

    now = database_now(alias)
    current = EVERY_HOUR.slot_at(now)
    previous = current - HOUR
    JobRun.objects.using(alias).create(
        name="late_end",
        slot=previous,
        status="succeeded",
        token=1,
        started_at=previous,
        duration=1.0,
        finished_at=current + dt.timedelta(minutes=5),  # written late, after the slot
    )
    late_end()
    assert ran == ["ran"]
    statuses = dict(JobRun.objects.using(alias).values_list("slot", "status"))
    assert statuses == {previous: "succeeded", current: "succeeded"}

"""Jitter: each slot starts at slot + an offset in [0, jitter) that every server computes
alike from the job and the slot; the slot a run serves (and so de-duplication) is
unchanged. Used by the scheduler and by run_exclusive on a cron line; not by a direct call."""

from __future__ import annotations

import datetime as dt
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connections

from django_exclusive_jobs import LockConfigurationError, exclusive_job
from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.models import JobLock, JobRun
from django_exclusive_jobs.run import catchup
from django_exclusive_jobs.run.catchup import CatchUp
from django_exclusive_jobs.run.jitter import make_jitter, offset
from django_exclusive_jobs.run.registry import get_job
from django_exclusive_jobs.run.runner import Run
from django_exclusive_jobs.run.scheduler import Scheduler
from django_exclusive_jobs.run.schedules import Every, make_schedule
from django_exclusive_jobs.run.start import Start

from .test_command import ROOT, argv, command_env, manage, marker, processes
from .test_scheduler import scheduler_env

__all__ = ["marker", "processes"]  # fixtures

UTC = dt.UTC
HOUR = dt.timedelta(hours=1)
SLOTS = [dt.datetime(2026, 11, 22, tzinfo=UTC) + n * HOUR for n in range(200)]


# --- the offset -----------------------------------------------------------------------


def test_offsets_are_within_the_jitter_and_spread_over_it() -> None:
    jitter = dt.timedelta(minutes=5)
    offsets = [offset("report", slot, jitter) for slot in SLOTS]
    assert all(dt.timedelta(0) <= each < jitter for each in offsets)
    assert len(set(offsets)) > 150  # not all alike
    assert min(offsets) < jitter / 4 and max(offsets) > jitter * 3 / 4
    # another job, same slots: other offsets (fifty jobs at "0 * * * *" spread out)
    assert [offset("export", slot, jitter) for slot in SLOTS] != offsets


def test_an_offset_depends_on_the_instant_not_the_time_zone_it_is_written_in() -> None:
    slot = SLOTS[0]
    paris = slot.astimezone(dt.timezone(dt.timedelta(hours=1)))
    assert offset("report", paris, HOUR) == offset("report", slot, HOUR)
    assert offset("report", slot, dt.timedelta(0)) == dt.timedelta(0)


def test_every_process_computes_the_same_offsets() -> None:
    """Python's hash() is salted per process; the offset must not be."""
    code = (
        "import datetime as dt, json, sys\n"
        "from django_exclusive_jobs.run.jitter import offset\n"
        "slots = [dt.datetime.fromisoformat(s) for s in json.loads(sys.argv[1])]\n"
        "print(json.dumps([offset('report', s, dt.timedelta(minutes=5)).total_seconds()"
        " for s in slots]))\n"
    )
    slots = json.dumps([slot.isoformat() for slot in SLOTS])
    mine = [offset("report", slot, dt.timedelta(minutes=5)).total_seconds() for slot in SLOTS]
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        out = subprocess.run(
            [sys.executable, "-c", code, slots], env=env, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == mine


# --- declaring it -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("jitter", "schedule", "says"),
    [
        ("5m", None, "jitter only applies with every= or cron="),
        (-1, {"every": "1h"}, "jitter must not be negative, got -1s."),
        ("31m", {"every": "1h"}, "is more than half the smallest gap between the slots"),
        ("soon", {"every": "1h"}, "jitter 'soon' is not a duration"),
        # a cron's smallest gap: 15 minutes between 6:45 and 7:00
        ("8m", {"cron": "0,45 6,7 * * *"}, "smallest gap between the slots of cron"),
        # Paris springs forward: a 02:30 daily job runs 23h30 after the last one
        ("710m", {"cron": "30 2 * * *", "timezone": "Europe/Paris"}, "(23:30:00)"),
    ],
)
def test_a_bad_jitter_is_one_clear_error(jitter: object, schedule: dict | None, says: str) -> None:
    with pytest.raises(LockConfigurationError) as raised:
        make_jitter(jitter, make_schedule(**(schedule or {})))  # type: ignore[arg-type]
    assert says in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_jitter_up_to_half_the_gap_is_taken() -> None:
    assert make_jitter("30m", make_schedule(every="1h")) == dt.timedelta(minutes=30)
    assert make_jitter("7m", make_schedule(cron="0,45 6,7 * * *")) == dt.timedelta(minutes=7)
    assert make_jitter(None, None) == make_jitter(0, make_schedule(every="1h")) == dt.timedelta(0)


def test_the_decorator_checks_jitter_and_records_it_on_the_job() -> None:
    with pytest.raises(LockConfigurationError, match="jitter only applies with every="):
        exclusive_job("jitter_without_schedule", jitter="5m")
    job = get_job("jittery")
    assert job is not None and job.jitter == dt.timedelta(seconds=2)
    slot = SLOTS[3]
    assert job.start_of(slot) == slot + offset("jittery", slot, job.jitter)


def test_a_start_late_only_by_its_jitter_is_on_time_for_catch_up_skip() -> None:
    """``catch_up="skip"`` runs a slot only when its start is on time (the slot
    tolerance): lateness counts from the slot's start, slot + its offset."""
    schedule = Every(period=HOUR)
    skip = CatchUp("skip")
    slot, previous = SLOTS[5], SLOTS[4]
    start = slot + dt.timedelta(minutes=20)  # its jittered start
    on_time = catchup.plan(
        schedule, skip, start + dt.timedelta(seconds=2), previous, start_of=lambda s: start
    )
    assert (on_time.run, on_time.missed) == (slot, [])
    late = catchup.plan(
        schedule, skip, start + dt.timedelta(minutes=2), previous, start_of=lambda s: start
    )
    assert (late.run, late.missed) == (None, [slot])


# --- the scheduler ----------------------------------------------------------------------


def test_the_scheduler_starts_each_slot_at_its_jittered_start_and_serves_the_slot(
    alias: str, marker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MARKER", str(marker))
    job = get_job("jittery")
    assert job is not None and job.schedule is not None
    scheduler = Scheduler([job.but(using=alias)], using=alias, max_runs=3, run_for=90)
    assert scheduler.run() == 0
    runs = list(JobRun.objects.using(alias).filter(name="jittery").order_by("slot"))
    assert [run.status for run in runs] == ["succeeded"] * 3  # none missed: on time
    for run in runs:
        assert run.slot is not None and run.slot.timestamp() % 4 == 0  # the slot, not shifted
        assert run.started_at >= job.start_of(run.slot)  # never before its start
        assert run.started_at < run.slot + dt.timedelta(seconds=4)  # ... and within its slot
    assert marker.read_text().split()[1::3] == [run.slot.isoformat() for run in runs]


# --- run_exclusive on a cron line --------------------------------------------------------


def aligned(alias: str, wait: float) -> tuple[str, str, dt.datetime, dt.datetime]:
    """``--every`` and ``--jitter`` for ``jittery`` whose next slot S, fired at by a cron
    line one second early, starts ``wait`` seconds or more after the line: (every,
    jitter, S, when to fire). Found among periods of 4 to 60 s, so no test waits long."""
    for _ in range(30):
        now = database_now(alias)
        for seconds in range(4, 61):
            period = dt.timedelta(seconds=seconds)
            slot = Every(period=period).next_after(now + dt.timedelta(seconds=1.5))
            fire = slot - dt.timedelta(seconds=1)  # early, within the slot tolerance (P/3)
            waits = offset("jittery", slot, period / 2) + dt.timedelta(seconds=1)
            if fire - now <= dt.timedelta(seconds=5) and waits >= dt.timedelta(seconds=wait):
                return f"{seconds}s", f"{seconds / 2:g}s", slot, fire
        time.sleep(1)
    raise AssertionError("no period gave a slot to fire at")


def sleep_until(alias: str, moment: dt.datetime) -> None:
    time.sleep(max(0.0, (moment - database_now(alias)).total_seconds()))


def test_run_exclusive_waits_for_the_slots_start_then_serves_the_slot(
    alias: str, marker: Path
) -> None:
    # Room for a slow start of the command (a loaded machine) before the slot's start.
    every, jitter, slot, fire = aligned(alias, wait=6)
    sleep_until(alias, fire)
    result = manage(alias, "jittery", "--every", every, "--jitter", jitter, env=command_env(marker))
    assert result.returncode == 0, result.stderr
    assert f"waiting for jittery: slot={slot.isoformat()} starts at " in result.stdout
    [run] = JobRun.objects.using(alias).filter(name="jittery")
    start = slot + offset("jittery", slot, dt.timedelta(seconds=float(jitter[:-1])))
    assert run.slot == slot and run.status == "succeeded"
    assert run.started_at >= start
    assert marker.read_text().split()[:2] == ["jittery", slot.isoformat()]


def test_sigterm_while_waiting_for_the_start_exits_143_and_takes_nothing(
    alias: str, marker: Path, processes: list[subprocess.Popen[str]]
) -> None:
    # Room for a slow start of the command (a loaded machine) before the slot's start.
    every, jitter, _slot, fire = aligned(alias, wait=6)
    sleep_until(alias, fire)
    process = subprocess.Popen(
        argv(alias, "jittery", "--every", every, "--jitter", jitter),
        cwd=ROOT,
        env=command_env(marker, PYTHONUNBUFFERED="1"),  # its line as soon as it is written
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    processes.append(process)
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 30)
    assert ready, "no line from run_exclusive"
    assert process.stdout.readline().startswith("waiting for jittery: slot=")
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert not marker.exists()
    assert not JobRun.objects.using(alias).filter(name="jittery").exists()
    assert not JobLock.objects.using(alias).filter(name="jittery", token__gt=0).exists()


def test_a_cron_line_that_fires_early_waits_for_its_slot_on_the_databases_clock(
    alias: str, marker: Path
) -> None:
    """A server whose clock is 12 s ahead fires its cron line 12 s before the slot
    (within the slot tolerance, a third of a 45-s or longer interval): the run waits for
    the slot on the database's clock and serves it, never starting before it. A job
    with no jitter; libfaketime gives the command its clock (not on SQLite, whose clock is
    the machine's)."""
    ahead = dt.timedelta(seconds=12)
    # The soonest slot at least 12.5 s away, among intervals of 45 to 90 s.
    after = database_now(alias) + ahead + dt.timedelta(seconds=0.5)
    slot, seconds = min(
        (Every(period=dt.timedelta(seconds=seconds)).next_after(after), seconds)
        for seconds in range(45, 91)
    )
    sleep_until(alias, slot - ahead)
    skewed = connections[alias].vendor != "sqlite"
    env = scheduler_env(marker, shift="+12s" if skewed else None)
    result = manage(alias, "quick", "--every", f"{seconds}s", env=env)
    assert result.returncode == 0, result.stderr
    # Its own clock said the slot had come; the database's did not.
    assert f"waiting for quick: slot={slot.isoformat()} starts at " in result.stdout
    assert "(jitter)" not in result.stdout
    [run] = JobRun.objects.using(alias).filter(name="quick")
    assert run.slot == slot and run.status == "succeeded"
    assert run.started_at >= slot
    assert marker.read_text().split()[0] == "quick"


def test_a_cron_line_a_moment_early_waits_for_its_slot_without_a_word(alias: str) -> None:
    """Fired 1.2 s before a 6-s slot (its tolerance: 2 s): the run waits and starts at
    the slot, saying nothing of a wait the scheduler, too, makes without a word."""
    exclusive_job("early_quiet", every="6s", using=alias)(lambda: None)
    declared = get_job("early_quiet")
    assert declared is not None and declared.schedule is not None
    six = dt.timedelta(seconds=6)
    slot = Every(period=six).next_after(database_now(alias) + dt.timedelta(seconds=1.5))
    sleep_until(alias, slot - dt.timedelta(seconds=1.2))
    said: list[str] = []
    result = Run(declared, start=Start.cron(), report=lambda line, _: said.append(str(line))).call()
    assert result.status == "succeeded"
    [run] = JobRun.objects.using(alias).filter(name="early_quiet")
    assert run.slot == slot and run.started_at >= slot
    assert not [line for line in said if line.startswith("waiting")], said


def test_jitter_0_on_the_command_line_starts_at_once(alias: str, marker: Path) -> None:
    result = manage(alias, "jittery", "--jitter", "0", env=command_env(marker))
    assert result.returncode == 0, result.stderr
    assert "waiting for" not in result.stdout
    assert JobRun.objects.using(alias).filter(name="jittery", status="succeeded").count() == 1


def test_a_jitter_too_long_for_the_schedule_on_the_command_line_exits_2() -> None:
    result = manage("default", "jittery", "--every", "1m", "--jitter", "45s")
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert "jitter 0:00:45 is more than half the smallest gap" in line

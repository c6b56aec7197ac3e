"""A job's next slots: ``manage.py exclusive_jobs next NAME [-n N]``, on every backend."""

from __future__ import annotations

import datetime as dt
import io
import json
from collections.abc import Iterator
from itertools import islice
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_exclusive_jobs import exclusive_job
from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.management.commands import exclusive_jobs as command
from django_exclusive_jobs.run.preview import upcoming
from django_exclusive_jobs.run.registry import Job, _jobs, get_job

from .test_operate import exclusive_jobs
from .test_schedules import changes_of

UTC = dt.UTC


def next_slots(alias: str, *args: str) -> list[str]:
    out = io.StringIO()
    call_command("exclusive_jobs", "next", *args, "--database", alias, stdout=out)
    return out.getvalue().splitlines()


def job(name: str) -> Job:
    found = get_job(name)
    assert found is not None
    return found


def expected(name: str, after: dt.datetime, count: int) -> list[dt.datetime]:
    schedule = job(name).schedule
    assert schedule is not None
    return list(islice(schedule.slots_after(after), count))


@pytest.fixture
def lord_howe() -> Iterator[Job]:
    """An hourly job on Lord Howe Island's clock, whose changes are 30 minutes."""
    exclusive_job("lord_howe_hourly", cron="0 * * * *", timezone="Australia/Lord_Howe")(noop)
    try:
        yield job("lord_howe_hourly")
    finally:
        _jobs.pop("lord_howe_hourly", None)


def noop() -> None:
    return None


def test_next_lists_the_slots_after_the_database_time_in_utc_and_the_jobs_zone(
    alias: str,
) -> None:
    before = database_now(alias)
    header, columns, *rows = next_slots(alias, "summary:weekly", "-n", "3")
    after = database_now(alias)
    assert columns.split() == ["UTC", "Europe/Paris"]
    assert header.startswith("next 3 slot(s) of summary:weekly after ")
    now = dt.datetime.fromisoformat(header.split(" after ")[1].split(" (database time)")[0])
    assert before.replace(microsecond=0) <= now <= after
    slots = [dt.datetime.fromisoformat(row.split()[0]) for row in rows]
    assert slots in (expected("summary:weekly", before, 3), expected("summary:weekly", after, 3))
    paris = ZoneInfo("Europe/Paris")
    assert [row.split()[1] for row in rows] == [
        slot.astimezone(paris).isoformat() for slot in slots
    ]


def test_next_shows_ten_slots_unless_told(alias: str) -> None:
    _, _, *rows = next_slots(alias, "tick")
    assert len(rows) == command.NEXT_SLOTS
    _, _, *rows = next_slots(alias, "tick", "--count", "25")
    assert len(rows) == 25


def test_next_of_a_jittered_job_shows_when_each_slot_starts(alias: str) -> None:
    header, columns, *rows = next_slots(alias, "jittery", "-n", "5")
    jittery = job("jittery")
    assert header.endswith(f" jitter {jittery.jitter}")
    assert columns.split() == ["UTC", "UTC", "START", "(UTC)"]
    for row in rows:
        slot, _, start = (dt.datetime.fromisoformat(cell) for cell in row.split())
        assert start == jittery.start_of(slot)
    assert any(row.split()[0] != row.split()[2] for row in rows)


def test_next_crosses_a_dst_change_on_the_zones_clock(
    alias: str, lord_howe: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the database's time 90 minutes before Lord Howe's 2026 changes, the slots
    change their UTC offset by 30 minutes, and the local times are the real ones."""
    zone = ZoneInfo("Australia/Lord_Howe")
    for change in changes_of("Australia/Lord_Howe", 2026):
        now = change - dt.timedelta(minutes=90)
        monkeypatch.setattr(command, "database_now", lambda using, now=now: now)
        _, _, *rows = next_slots(alias, lord_howe.name, "-n", "4")
        cells = [row.split() for row in rows]
        slots = [dt.datetime.fromisoformat(utc) for utc, _ in cells]
        assert slots == expected(lord_howe.name, now, 4)
        assert [local for _, local in cells] == [s.astimezone(zone).isoformat() for s in slots]
        offsets = {dt.datetime.fromisoformat(local).utcoffset() for _, local in cells}
        assert len(offsets) == 2
        assert max(offsets) - min(offsets) == dt.timedelta(minutes=30)  # type: ignore[operator]


def test_next_as_json(alias: str) -> None:
    answer = json.loads("\n".join(next_slots(alias, "summary:weekly", "-n", "2", "--json")))
    now = dt.datetime.fromisoformat(answer["now"])
    assert answer["name"] == "summary:weekly" and answer["timezone"] == "Europe/Paris"
    assert answer["schedule"] == job("summary:weekly").schedule.describe()  # type: ignore[union-attr]
    assert answer["slots"] == [slot.as_dict() for slot in upcoming(job("summary:weekly"), now, 2)]


def test_an_every_job_is_shown_in_time_zone(alias: str) -> None:
    with override_settings(TIME_ZONE="America/New_York"):
        _, columns, *rows = next_slots(alias, "digest", "-n", "1")
    assert columns.split() == ["UTC", "America/New_York"]
    [(utc, local)] = [row.split() for row in rows]
    new_york = ZoneInfo("America/New_York")
    assert dt.datetime.fromisoformat(utc).astimezone(new_york).isoformat() == local


# --- exit codes and one-line answers, through the real command ---------------------------


def test_a_job_without_a_schedule_says_so_in_one_line_and_exits_0(alias: str) -> None:
    result = exclusive_jobs(alias, "next", "quick")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "quick has no schedule (every= or cron=): no slot comes; it runs only when it is started."
    ]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["next", "no_such_job"], "Unknown job 'no_such_job': 'manage.py exclusive_jobs' lists"),
        (["next", "summary"], "Unknown job 'summary'"),  # several schedules: name one
        (["next"], "next needs the job's NAME."),
        (["next", "tick", "-n", "0"], "-n must be a whole number from 1 to 1000, got '0'."),
        (["next", "tick", "-n", "ten"], "-n must be a whole number from 1 to 1000, got 'ten'."),
        (["next", "tick", "-n", "1001"], "-n must be a whole number from 1 to 1000"),
        (["pause", "tick", "-n", "3"], "-n goes with next."),
        (["next", "tick", "--check"], "--check goes with list."),
        (["next", "tick", "--from", "2026-01-01"], "go with backfill."),
    ],
)
@pytest.mark.usefixtures("django_db_setup")
def test_usage_errors_are_one_line_and_exit_2(args: list[str], said: str) -> None:
    result = exclusive_jobs("default", *args)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert said in line
    assert result.stdout == ""

"""Missed slots: what a late start runs and records, by policy, on every backend."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from typing import Any

import pytest
from django.core.management import call_command

from django_exclusive_jobs import signals
from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.lock.errors import LockConfigurationError
from django_exclusive_jobs.models import JobRun
from django_exclusive_jobs.run.catchup import MAX_RECORDED, CatchUp, make_catch_up, plan
from django_exclusive_jobs.run.decorator import exclusive_job
from django_exclusive_jobs.run.registry import Job, _jobs
from django_exclusive_jobs.run.runner import Run
from django_exclusive_jobs.run.schedules import Every, make_schedule
from django_exclusive_jobs.run.status import RunStatus

HOUR = dt.timedelta(hours=1)
EVERY_HOUR = Every(period=HOUR)
T = dt.datetime(2026, 11, 24, 11, 40, tzinfo=dt.UTC)  # servers back at 11:40


def at(hour: int, minute: int = 0) -> dt.datetime:
    return dt.datetime(2026, 11, 24, hour, minute, tzinfo=dt.UTC)


# --- the plan: pure, the table in the docs ----------------------------------------------


def test_latest_runs_the_most_recent_missed_slot_and_records_the_others() -> None:
    result = plan(EVERY_HOUR, CatchUp("latest"), T, last_recorded=at(8))
    assert (result.run, result.missed, result.more) == (at(11), [at(9), at(10)], False)


def test_skip_runs_nothing_late_and_records_every_slot_missed() -> None:
    result = plan(EVERY_HOUR, CatchUp("skip"), T, last_recorded=at(8))
    assert (result.run, result.missed) == (None, [at(9), at(10), at(11)])


def test_skip_runs_a_slot_started_on_time() -> None:
    on_time = at(11) + dt.timedelta(seconds=5)
    result = plan(EVERY_HOUR, CatchUp("skip"), on_time, last_recorded=at(10))
    assert (result.run, result.missed) == (at(11), [])


def test_all_runs_the_oldest_first_and_says_more_are_due() -> None:
    result = plan(EVERY_HOUR, CatchUp("all"), T, last_recorded=at(8))
    assert (result.run, result.missed, result.more) == (at(9), [], True)
    # After 09:00 ran, the next start goes on with 10:00, then 11:00 (the last).
    assert plan(EVERY_HOUR, CatchUp("all"), T, last_recorded=at(9)).run == at(10)
    last = plan(EVERY_HOUR, CatchUp("all"), T, last_recorded=at(10))
    assert (last.run, last.more) == (at(11), False)


def test_all_runs_at_most_the_limit_newest_and_records_older_missed() -> None:
    result = plan(EVERY_HOUR, CatchUp("all", limit=2), T, last_recorded=at(6))
    assert (result.run, result.missed, result.more) == (at(10), [at(7), at(8), at(9)], True)


def test_window_bounds_how_late_a_slot_may_still_run() -> None:
    window = dt.timedelta(minutes=90)  # 10:10 onwards
    result = plan(EVERY_HOUR, CatchUp("all", window=window), T, last_recorded=at(8))
    assert (result.run, result.missed) == (at(11), [at(9), at(10)])
    late = plan(EVERY_HOUR, CatchUp("latest", window=dt.timedelta(minutes=30)), T, at(8))
    assert (late.run, late.missed) == (None, [at(9), at(10), at(11)])


def test_a_first_run_has_nothing_before_it_to_account_for() -> None:
    result = plan(EVERY_HOUR, CatchUp("all"), T, last_recorded=None)
    assert (result.run, result.missed, result.more) == (at(11), [], False)


def test_an_on_time_start_after_the_previous_slot_records_nothing() -> None:
    on_time = at(11) + dt.timedelta(seconds=1)
    for policy in ("latest", "skip", "all"):
        result = plan(EVERY_HOUR, CatchUp(policy), on_time, last_recorded=at(10))
        assert (result.run, result.missed) == (at(11), []), policy


def test_a_very_long_outage_records_only_the_newest_slots() -> None:
    every_second = Every(period=dt.timedelta(seconds=1))
    result = plan(every_second, CatchUp("latest"), T, last_recorded=T - dt.timedelta(days=7))
    assert len(result.missed) == MAX_RECORDED - 1
    assert result.missed[-1] == T - dt.timedelta(seconds=1) and result.run == T


def test_cron_schedules_missed_slots_across_a_dst_change() -> None:
    # Europe/Paris at 03:00 on 2026-10-25 goes back to 02:00: a daily 02:30 job still has
    # one slot per day, whatever the length of the day.
    daily = make_schedule(cron="30 2 * * *", timezone="Europe/Paris")
    assert daily is not None
    now = dt.datetime(2026, 10, 28, 12, 0, tzinfo=dt.UTC)
    before = dt.datetime(2026, 10, 24, 0, 30, tzinfo=dt.UTC)  # 02:30 in Paris (summer)
    result = plan(daily, CatchUp("latest"), now, last_recorded=before)
    paris = zoneinfo.ZoneInfo("Europe/Paris")

    def local(slot: dt.datetime) -> str:
        return slot.astimezone(paris).strftime("%d %H:%M")

    assert [local(slot) for slot in result.missed] == ["25 02:30", "26 02:30", "27 02:30"]
    assert result.run is not None and local(result.run) == "28 02:30"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policy": "some"}, "catch_up must be one of 'latest', 'skip', 'all', not 'some'."),
        ({"limit": 0}, "catch_up_limit must be a whole number from 1 to 1000, got 0."),
        ({"limit": True}, "catch_up_limit must be a whole number from 1 to 1000, got True."),
        ({"window": -60}, "catch_up_window must not be negative, got -60s."),
    ],
)
def test_bad_catch_up_arguments_are_one_clear_error(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(LockConfigurationError) as caught:
        make_catch_up(**kwargs)
    assert str(caught.value) == message


def test_catch_up_needs_a_schedule() -> None:
    with pytest.raises(LockConfigurationError, match="catch_up only applies with every= or cron="):
        exclusive_job("no_schedule_catch_up", catch_up="all")


# --- starts on a real database: rows, signals, run_exclusive ----------------------------


def hourly_runner(alias: str, policy: str) -> Run:
    job = Job(
        "hourly_catch_up",
        noop,
        using=alias,
        schedule=EVERY_HOUR,
        catch_up=CatchUp(policy),
        keepalive=False,
    )
    return Run(job)


def noop() -> None:
    return None


def seed_run(alias: str, name: str, slot: dt.datetime) -> None:
    JobRun.objects.using(alias).create(
        name=name, slot=slot, status=RunStatus.SUCCEEDED, started_at=slot, finished_at=slot
    )


def this_hour(alias: str) -> dt.datetime:
    now = database_now(alias)
    return EVERY_HOUR.slot_at(now)


def statuses(alias: str, name: str) -> dict[dt.datetime, str]:
    rows = JobRun.objects.using(alias).filter(name=name).order_by("slot")
    return {row.slot: row.status for row in rows if row.slot is not None}


def test_late_start_records_each_missed_slot_once_and_signals_it(alias: str) -> None:
    current = this_hour(alias)
    seed_run(alias, "hourly_catch_up", current - 4 * HOUR)
    heard: list[dt.datetime] = []

    def receiver(sender: str, slot: dt.datetime, **kwargs: Any) -> None:
        heard.append(slot)

    signals.slot_missed.connect(receiver)
    try:
        ran = hourly_runner(alias, "latest").call(lambda lock: "done")
        again = hourly_runner(alias, "latest").call(lambda lock: "twice?")
    finally:
        signals.slot_missed.disconnect(receiver)
    assert ran.status == RunStatus.SUCCEEDED and again.status == RunStatus.SKIPPED
    missed = [current - 3 * HOUR, current - 2 * HOUR, current - HOUR]
    assert heard == missed  # once each, though two starts came along
    assert statuses(alias, "hourly_catch_up") == {
        current - 4 * HOUR: "succeeded",
        **dict.fromkeys(missed, "missed"),
        current: "succeeded",
    }
    row = JobRun.objects.using(alias).get(name="hourly_catch_up", slot=missed[0])
    assert "No server ran this slot" in row.error and row.finished_at is not None


def test_skip_policy_late_start_runs_nothing_and_records_the_slot_missed(alias: str) -> None:
    current = this_hour(alias)
    seed_run(alias, "hourly_catch_up", current - 2 * HOUR)
    late = database_now(alias) - current > dt.timedelta(seconds=30)
    calls: list[int] = []
    result = hourly_runner(alias, "skip").call(lambda lock: calls.append(1))
    expected = {current - 2 * HOUR: "succeeded", current - HOUR: "missed"}
    if late:  # the current hour started more than the slot tolerance ago
        assert result.status == RunStatus.SKIPPED and calls == []
        expected[current] = "missed"
    else:
        assert result.status == RunStatus.SUCCEEDED and calls == [1]
        expected[current] = "succeeded"
    assert statuses(alias, "hourly_catch_up") == expected


@pytest.fixture
def catch_up_all_job() -> Any:
    ran: list[dt.datetime] = []

    @exclusive_job("catch_up_all_cmd", every="1h", catch_up="all", keepalive=False)
    def job(slot: dt.datetime) -> None:
        ran.append(slot)

    yield ran
    _jobs.pop("catch_up_all_cmd", None)


def test_run_exclusive_with_catch_up_all_runs_each_missed_slot_in_order(
    alias: str, catch_up_all_job: list[dt.datetime]
) -> None:
    current = this_hour(alias)
    seed_run(alias, "catch_up_all_cmd", current - 4 * HOUR)
    call_command("run_exclusive", "catch_up_all_cmd", "--database", alias, verbosity=0)
    expected = [current - 3 * HOUR, current - 2 * HOUR, current - HOUR, current]
    assert catch_up_all_job == expected
    runs = statuses(alias, "catch_up_all_cmd")
    assert [runs[slot] for slot in expected] == ["succeeded"] * 4

"""Which slot a start serves: tolerance, catch-up, cron in a zone with DST."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from itertools import islice

import pytest
from django.test import override_settings

from django_exclusive_jobs import LockConfigurationError
from django_exclusive_jobs.run.schedules import Cron, Every, make_schedule

UTC = dt.UTC
BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")


def at(text: str, zone: dt.tzinfo = UTC) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=zone)


@pytest.mark.parametrize(
    ("start", "slot"),
    [
        ("2026-11-22 12:00:00", "2026-11-22 12:00:00"),  # on time
        ("2026-11-22 12:00:01.400", "2026-11-22 12:00:00"),  # a little late
        ("2026-11-22 11:59:58.700", "2026-11-22 12:00:00"),  # a fast clock: early
        ("2026-11-22 12:20:00", "2026-11-22 12:00:00"),  # very late: still serves 12:00
        ("2026-11-22 12:59:31", "2026-11-22 13:00:00"),  # within 30 s of 13:00
        ("2026-11-22 12:59:29", "2026-11-22 12:00:00"),
    ],
)
def test_every_hour_slot(start: str, slot: str) -> None:
    assert Every(period=dt.timedelta(hours=1)).slot_at(at(start)) == at(slot)


def test_tolerance_is_capped_at_a_third_of_the_interval() -> None:
    every3 = Every(period=dt.timedelta(seconds=3))
    assert every3.slot_at(at("2026-11-22 12:00:02.100")) == at("2026-11-22 12:00:03")
    assert every3.slot_at(at("2026-11-22 12:00:01.900")) == at("2026-11-22 12:00:00")


def test_tolerance_setting_and_argument() -> None:
    start = at("2026-11-22 11:59:50")
    with override_settings(EXCLUSIVE_JOBS={"SLOT_TOLERANCE": "5s"}):
        assert Every(period=dt.timedelta(hours=1)).slot_at(start) == at("2026-11-22 11:00")
    wide = Every(tolerance=dt.timedelta(seconds=15), period=dt.timedelta(hours=1))
    assert wide.slot_at(start) == at("2026-11-22 12:00")


def test_cron_slot_is_in_the_schedules_time_zone() -> None:
    daily = Cron(expression="30 6 * * *", timezone="Europe/Berlin")
    assert daily.slot_at(at("2026-11-22 05:30:02")) == at("2026-11-22 05:30")  # 06:30 CET


def test_cron_spring_forward_runs_the_missing_time_once() -> None:
    """02:30 does not exist on 2026-03-29 in Berlin; the 02:30 job runs at 03:00 CEST."""
    daily = Cron(expression="30 2 * * *", timezone="Europe/Berlin")
    slot = daily.slot_at(at("2026-03-29 03:00:05", BERLIN))
    assert slot == at("2026-03-29 03:00", BERLIN).astimezone(UTC)
    # later that day the same slot is still the one to serve: no second run
    assert daily.slot_at(at("2026-03-29 20:00", BERLIN)) == slot


def test_cron_fall_back_runs_a_daily_job_once() -> None:
    """02:30 happens twice on 2026-10-25 in Berlin; a daily 02:30 job has one slot."""
    daily = Cron(expression="30 2 * * *", timezone="Europe/Berlin")
    first = at("2026-10-25 02:30:01", BERLIN)  # CEST, fold=0
    second = first.replace(fold=1)  # the repeated hour, CET
    assert second.astimezone(UTC) - first.astimezone(UTC) == dt.timedelta(hours=1)
    slot = at("2026-10-25 02:30", BERLIN).astimezone(UTC)
    assert daily.slot_at(first) == daily.slot_at(second) == slot


def test_cron_hourly_through_fall_back_has_distinct_slots() -> None:
    hourly = Cron(expression="0 * * * *", timezone="Europe/Berlin")
    first = at("2026-10-25 02:00:01", BERLIN)
    second = first.replace(fold=1)
    assert hourly.slot_at(first) != hourly.slot_at(second)
    assert hourly.slot_at(second) - hourly.slot_at(first) == dt.timedelta(hours=1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"every": "1h", "cron": "0 * * * *"}, "not both"),
        ({"every": "0"}, "at least 1s"),
        ({"every": "soon"}, "not a duration"),
        ({"cron": "61 * * * *"}, "not valid"),
        ({"cron": "* * *"}, "5 fields"),
        ({"cron": "0 * * * * *"}, "5 fields"),
        ({"cron": "0 * * * *", "timezone": "Mars/Olympus"}, "Unknown time zone"),
        ({"every": "1h", "timezone": "UTC"}, "only applies to a cron"),
        ({"tolerance": "5s"}, "only applies with every"),
        ({"every": "1h", "tolerance": -5}, "must not be negative"),
    ],
)
def test_bad_schedules_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(LockConfigurationError, match=message) as info:
        make_schedule(**kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_cron_default_time_zone_is_settings_time_zone() -> None:
    with override_settings(TIME_ZONE="America/New_York"):
        schedule = make_schedule(cron="0 9 * * *")
    assert isinstance(schedule, Cron)
    assert schedule.timezone == "America/New_York"


# Daylight-saving nights, minute by minute: (zone, expression, first minute, last minute
# checked, every slot from one before the first minute to one after the last, in UTC).
DST_NIGHTS = {
    "paris-spring-forward": (
        "Europe/Paris",
        "30 2 * * *",
        "2026-03-29 00:00",
        "2026-03-29 03:00",
        # 02:30 does not exist: the slot is 03:00 CEST
        ["2026-03-28 01:30", "2026-03-29 01:00", "2026-03-30 00:30"],
    ),
    "paris-fall-back": (
        "Europe/Paris",
        "30 2 * * *",
        "2026-10-25 00:00",
        "2026-10-25 03:00",
        # 02:30 happens twice: the slot is the first, 02:30 CEST
        ["2026-10-24 00:30", "2026-10-25 00:30", "2026-10-26 01:30"],
    ),
    "paris-fall-back-hourly": (
        "Europe/Paris",
        "30 * * * *",
        "2026-10-25 00:00",
        "2026-10-25 03:00",
        # a wildcard hour runs in both 02:00 hours
        [
            "2026-10-24 23:30",
            "2026-10-25 00:30",
            "2026-10-25 01:30",
            "2026-10-25 02:30",
            "2026-10-25 03:30",
        ],
    ),
    "paris-spring-forward-hourly": (
        "Europe/Paris",
        "0 * * * *",
        "2026-03-28 23:00",
        "2026-03-29 03:00",
        # 02:00 does not exist: a wildcard hour skips it, and the slots are one hour apart
        # in UTC all the same (01:00 +01:00 is 00:00 UTC, 03:00 +02:00 is 01:00 UTC)
        [f"2026-03-28 {hour}:00" for hour in ("22", "23")]
        + [f"2026-03-29 0{hour}:00" for hour in range(5)],
    ),
    "new-york-spring-forward": (
        "America/New_York",
        "30 2 * * *",
        "2026-03-08 05:00",
        "2026-03-08 09:00",
        ["2026-03-07 07:30", "2026-03-08 07:00", "2026-03-09 06:30"],
    ),
    "new-york-fall-back": (
        "America/New_York",
        "30 1 * * *",
        "2026-11-01 04:00",
        "2026-11-01 08:00",
        ["2026-10-31 05:30", "2026-11-01 05:30", "2026-11-02 06:30"],
    ),
    "new-york-fall-back-hourly": (
        "America/New_York",
        "30 * * * *",
        "2026-11-01 04:00",
        "2026-11-01 08:00",
        [
            "2026-11-01 03:30",
            "2026-11-01 04:30",
            "2026-11-01 05:30",
            "2026-11-01 06:30",
            "2026-11-01 07:30",
            "2026-11-01 08:30",
        ],
    ),
    "lord-howe-fall-back": (
        # 02:00 +11 becomes 01:30 +10:30: 01:45 happens twice, the slot is the first
        "Australia/Lord_Howe",
        "45 1 * * *",
        "2026-04-04 13:00",
        "2026-04-04 17:00",
        ["2026-04-03 14:45", "2026-04-04 14:45", "2026-04-05 15:15"],
    ),
    "lord-howe-fall-back-quarter-hours": (
        "Australia/Lord_Howe",
        "*/15 * * * *",
        "2026-04-04 14:00",
        "2026-04-04 16:00",
        # a wildcard hour runs in both 01:30-02:00 half hours: every 15 minutes in UTC
        [
            f"2026-04-04 {hour}:{minute}"
            for hour in ("14", "15")
            for minute in ("00", "15", "30", "45")
        ]
        + ["2026-04-04 13:45", "2026-04-04 16:00", "2026-04-04 16:15"],
    ),
    "lord-howe-fall-back-hourly": (
        # the repeated half hour (01:30-02:00) has no minute 0: 01:00 +11 is 14:00 UTC,
        # 02:00 +10:30 is 15:30 UTC, 90 minutes later
        "Australia/Lord_Howe",
        "0 * * * *",
        "2026-04-04 13:00",
        "2026-04-04 16:30",
        [f"2026-04-04 {time}" for time in ("13:00", "14:00", "15:30", "16:30")]
        + ["2026-04-04 17:30"],
    ),
    "lord-howe-spring-forward": (
        # 02:00 +10:30 becomes 02:30 +11: 02:15 does not exist, the slot is 02:30
        "Australia/Lord_Howe",
        "15 2 * * *",
        "2026-10-03 14:00",
        "2026-10-03 17:00",
        ["2026-10-02 15:45", "2026-10-03 15:30", "2026-10-04 15:15"],
    ),
    "lord-howe-spring-forward-hourly": (
        # 02:00 does not exist and the job does not run at 02:30 instead: 01:00 +10:30 is
        # 14:30 UTC, 03:00 +11 is 16:00 UTC, 90 minutes later
        "Australia/Lord_Howe",
        "0 * * * *",
        "2026-10-03 13:00",
        "2026-10-03 17:00",
        [f"2026-10-03 {time}" for time in ("12:30", "13:30", "14:30", "16:00", "17:00")]
        + ["2026-10-03 18:00"],
    ),
    "st-johns-fall-back-across-midnight": (
        # 00:01 -02:30 became 23:01 -03:30: midnight happens twice, and CronSim's own walk
        # gives the first midnight again and again
        "America/St_Johns",
        "*/20 0-3 * * *",
        "2010-11-07 02:00",
        "2010-11-07 04:30",
        [
            "2010-11-06 06:10",
            "2010-11-07 02:30",
            "2010-11-07 03:30",
            "2010-11-07 03:50",
            "2010-11-07 04:10",
            "2010-11-07 04:30",
            "2010-11-07 04:50",
        ],
    ),
    "st-johns-cronsim-goes-round-in-circles": (
        # 00:45 does not come before the fall-back; CronSim's own walk never gets past it
        "America/St_Johns",
        "45 */5 * * *",
        "2010-11-06 23:00",
        "2010-11-07 05:00",
        ["2010-11-06 18:15", "2010-11-06 23:15", "2010-11-07 04:15", "2010-11-07 09:15"],
    ),
}


@pytest.mark.parametrize("night", list(DST_NIGHTS))
def test_cron_slots_minute_by_minute_through_a_dst_night(night: str) -> None:
    zone, expression, first, last, slot_texts = DST_NIGHTS[night]
    schedule = Cron(expression=expression, timezone=zone)
    slots = sorted(at(text) for text in slot_texts)
    minute = at(first)
    while minute <= at(last):
        for moment in (minute, minute + dt.timedelta(seconds=30)):
            latest = max(slot for slot in slots if slot <= moment)
            upcoming = min(slot for slot in slots if slot > moment)
            found, gap = schedule.latest_at_or_before(moment)
            assert (found.astimezone(UTC), gap) == (latest, upcoming - latest), moment
            assert schedule.next_after(moment) == upcoming, moment
        minute += dt.timedelta(minutes=1)


@pytest.mark.parametrize("night", list(DST_NIGHTS))
def test_cron_slots_are_utc(night: str) -> None:
    """Callers compare slots with database times: a local time in a repeated hour would
    never be equal to the same instant in UTC."""
    zone, expression, first, _, _ = DST_NIGHTS[night]
    schedule = Cron(expression=expression, timezone=zone)
    latest, _ = schedule.latest_at_or_before(at(first))
    assert latest.tzinfo is UTC
    assert schedule.next_after(at(first)).tzinfo is UTC
    assert schedule.slot_at(at(first)).tzinfo is UTC
    assert all(slot.tzinfo is UTC for slot in islice(schedule.slots_back(latest), 3))


def changes_of(zone: str, year: int) -> list[dt.datetime]:
    """When ``zone`` changes its UTC offset in ``year``, from the tz database: each
    change as its first minute (UTC) on the new offset."""
    tz = zoneinfo.ZoneInfo(zone)

    def offset(moment: dt.datetime) -> dt.timedelta | None:
        return moment.astimezone(tz).utcoffset()

    changes = []
    hour = dt.datetime(year, 1, 1, tzinfo=UTC)
    while hour.year == year:
        following = hour + dt.timedelta(hours=1)
        if offset(following) != offset(hour):
            minute = hour
            while offset(minute) == offset(hour):
                minute += dt.timedelta(minutes=1)
            changes.append(minute)
        hour = following
    return changes


@pytest.mark.parametrize("night", [name for name in DST_NIGHTS if "st-johns" not in name])
def test_dst_nights_are_real_changes(night: str) -> None:
    """Each 2026 night above spans one of its zone's changes of UTC offset (the tz
    database's, not a guess), so its slots are tested across a real change."""
    zone, _, first, last, _ = DST_NIGHTS[night]
    assert any(at(first) < change <= at(last) for change in changes_of(zone, 2026))

"""Cron slots are right at every instant, in every zone, daylight-saving nights included.

The slots of a `Cron` are the instants CronSim's forward iteration produces. Whatever the
moment, `latest_at_or_before` must give the last of them at or before it and the gap to the
one after, `slots_back` must walk them back one by one, and `slot_at` must never serve a
slot further ahead than the early allowance.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import zoneinfo

import pytest
from cronsim import CronSim
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_exclusive_jobs.run.schedules import Cron

pytestmark = pytest.mark.no_deadline  # CPU only, no deadline: nice 10 (tests/cpu_report.py)

UTC = dt.UTC
ONE_MICROSECOND = dt.timedelta(microseconds=1)
NAMED_ZONES = [
    "Europe/Paris",
    "America/New_York",
    "Australia/Lord_Howe",  # 30-minute DST
    "America/Santiago",  # changes at midnight
    "Asia/Kolkata",
    "Pacific/Chatham",  # +12:45 / +13:45
    "Antarctica/Troll",  # 2-hour DST
    "America/St_Johns",  # fell back across midnight until 2011
    "America/Goose_Bay",  # the same
    "UTC",
]
ZONES = NAMED_ZONES + sorted(zoneinfo.available_timezones())[::15]
# expression -> how far back a reference walk starts (several slots, well past any
# daylight-saving change, so that where it starts makes no difference)
EXPRESSIONS = {
    "0 * * * *": dt.timedelta(hours=12),
    "30 2 * * *": dt.timedelta(days=4),
    "0 0 * * *": dt.timedelta(days=4),
    "*/7 * * * *": dt.timedelta(hours=12),
    "15 1-3 * * 0": dt.timedelta(days=22),
    "0 3 1 * *": dt.timedelta(days=70),
    "45 23 * * 5": dt.timedelta(days=22),
    "* * * * *": dt.timedelta(hours=12),
    "*/15 1,2 * * *": dt.timedelta(days=4),
    "0 */2 * * *": dt.timedelta(hours=24),
    "30 0,1,2,3 * * *": dt.timedelta(days=4),
    "*/20 0-3 * * *": dt.timedelta(days=4),
    "45 */5 * * *": dt.timedelta(days=2),
}


@functools.cache
def transitions(zone_name: str, year: int) -> tuple[dt.datetime, ...]:
    """The instants (UTC) in ``year`` at which the zone's UTC offset changes."""
    zone = zoneinfo.ZoneInfo(zone_name)

    def offset(seconds: int) -> dt.timedelta | None:
        return dt.datetime.fromtimestamp(seconds, zone).utcoffset()

    found = []
    start = int(dt.datetime(year, 1, 1, tzinfo=UTC).timestamp())
    end = int(dt.datetime(year + 1, 1, 1, tzinfo=UTC).timestamp())
    step = 6 * 3600
    for low in range(start, end, step):
        high = low + step
        if offset(low) == offset(high):
            continue
        while high - low > 1:  # the offset changes somewhere in (low, high]
            middle = (low + high) // 2
            if offset(middle) == offset(low):
                low = middle
            else:
                high = middle
        found.append(dt.datetime.fromtimestamp(high, UTC))
    return tuple(found)


class Step(CronSim):
    """One step of CronSim, noting the furthest instant it reaches; a step that goes round in
    circles (where a fall-back crosses midnight: St. John's and Goose Bay until 2011) stops."""

    def __init__(self, expression: str, start: dt.datetime, zone: zoneinfo.ZoneInfo) -> None:
        super().__init__(expression, start.astimezone(zone))
        self.ticks = 0
        self.furthest = start

    def tick(self, seconds: int = 1) -> None:
        super().tick(seconds)
        if self.dt.tzinfo is not None:
            self.furthest = max(self.furthest, self.dt.astimezone(UTC))
        self.ticks += 1
        if self.ticks > 10_000:
            raise RecursionError("CronSim goes round in circles")

    def next(self) -> dt.datetime | None:
        try:
            return next(self).astimezone(UTC)
        except RecursionError:
            return None


def cronsim_next(expression: str, zone: zoneinfo.ZoneInfo, slot: dt.datetime) -> dt.datetime | None:
    """CronSim's own next instant after ``slot`` (UTC), or None where it stalls."""
    following = Step(expression, slot, zone).next()
    return following if following is not None and following > slot else None


def slot_after(expression: str, zone: zoneinfo.ZoneInfo, slot: dt.datetime) -> dt.datetime:
    """The slot after ``slot``: CronSim's next instant; where CronSim stalls, its next instant
    from the minute after the furthest instant the stalled step reached, and so on."""
    start = resume = slot
    while True:
        step = Step(expression, start, zone)
        following = step.next()
        if following is not None and following > slot:
            return following
        resume = max(step.furthest, resume).replace(second=0) + dt.timedelta(minutes=1)
        start = resume - dt.timedelta(seconds=1)


def reference(expression: str, zone_name: str, moment: dt.datetime) -> tuple[dt.datetime, ...]:
    """(last slot <= moment, first slot > moment), walking forward from long before."""
    zone = zoneinfo.ZoneInfo(zone_name)
    latest = None
    following = slot_after(expression, zone, moment - EXPRESSIONS[expression])
    while following <= moment:
        latest, following = following, slot_after(expression, zone, following)
    assert latest is not None, "the reference walk must start before a slot"
    return latest, following


@st.composite
def moments(draw: st.DrawFn, zone_name: str) -> dt.datetime:
    """A moment near one of the zone's offset changes, or anywhere in 1990-2040."""
    year = draw(st.integers(1990, 2040))
    changes = transitions(zone_name, year)
    if changes and draw(st.booleans()):
        change = draw(st.sampled_from(changes))
        minutes = draw(st.integers(-5 * 60, 5 * 60))
        jitter = draw(st.sampled_from([0, -1, 1]) | st.integers(0, 60 * 10**6 - 1))
        return change + dt.timedelta(minutes=minutes, microseconds=jitter)
    naive = draw(st.datetimes(dt.datetime(year, 1, 1), dt.datetime(year, 12, 31, 23, 59, 59)))
    return naive.replace(tzinfo=UTC)


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, str, dt.datetime]:
    zone_name = draw(st.sampled_from(ZONES))
    expression = draw(st.sampled_from(sorted(EXPRESSIONS)))
    return zone_name, expression, draw(moments(zone_name))


def is_utc(moment: dt.datetime) -> bool:
    return moment.tzinfo is not None and moment.utcoffset() == dt.timedelta(0)


@settings(
    max_examples=600,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(cases())
def test_cron_slots_bracket_every_moment(case: tuple[str, str, dt.datetime]) -> None:
    zone_name, expression, moment = case
    zone = zoneinfo.ZoneInfo(zone_name)
    schedule = Cron(expression=expression, timezone=zone_name)

    latest, gap = schedule.latest_at_or_before(moment)
    upcoming = schedule.next_after(moment)
    assert latest <= moment < upcoming
    assert upcoming - latest == gap
    # the slots are CronSim's forward iteration: `upcoming` follows `latest` (unless CronSim
    # stalls there), and both are where a walk started long before finds them
    assert cronsim_next(expression, zone, latest) in (upcoming, None)
    assert reference(expression, zone_name, moment) == (latest, upcoming)
    # the same two slots from either end of the interval between them
    assert schedule.latest_at_or_before(upcoming - ONE_MICROSECOND) == (latest, gap)
    assert schedule.latest_at_or_before(upcoming)[0] == upcoming

    back = list(itertools.islice(schedule.slots_back(latest), 4))
    assert back[0] == latest
    for newer, older in itertools.pairwise(back):
        assert older < newer
        assert cronsim_next(expression, zone, older) in (newer, None)

    allowance = schedule.early_allowance(moment)
    assert schedule.slot_at(moment) <= moment + allowance

    assert all(is_utc(slot) for slot in [latest, upcoming, *back])

"""Schedules: which scheduled instant (slot) a run serves, computed on database time.

Every server's cron fires "at 12:00", but one starts at 11:59:59.6 (its clock is a little
fast) and another at 12:00:01.2 (slow start-up). Both must serve the slot 12:00, so a run
serves the latest scheduled instant at or before ``database now + tolerance``.
A run that starts late (even long after) still serves the slot it missed, once.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass, replace

from cronsim import CronSim, CronSimError
from django.conf import settings

from .. import values
from ..conf import app_settings
from ..lock.durations import DurationLike, parse_duration
from ..lock.errors import LockConfigurationError

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Schedule:
    """Base class: ``slot_at(now)`` gives the slot a run starting at ``now`` serves."""

    tolerance: dt.timedelta | None = None

    def describe(self) -> str:
        raise NotImplementedError

    def latest_at_or_before(self, moment: dt.datetime) -> tuple[dt.datetime, dt.timedelta]:
        """The latest scheduled instant <= moment (UTC), and the gap to the next one."""
        raise NotImplementedError

    def next_after(self, moment: dt.datetime) -> dt.datetime:
        """The first scheduled instant strictly after ``moment`` (UTC)."""
        slot, interval = self.latest_at_or_before(moment)
        return slot + interval

    def smallest_gap(self, moment: dt.datetime) -> dt.timedelta:
        """The shortest time between two slots, over the next ``GAP_SLOTS`` from ``moment``."""
        raise NotImplementedError

    def slots_after(self, moment: dt.datetime) -> Iterator[dt.datetime]:
        """The scheduled instants strictly after ``moment``, oldest first (UTC)."""
        slot = moment.astimezone(dt.UTC)  # local arithmetic would drop `fold`
        while True:
            slot = self.next_after(slot)
            yield slot

    def slots_back(self, slot: dt.datetime) -> Iterator[dt.datetime]:
        """``slot`` and the scheduled instants before it, newest first (UTC)."""
        slot = slot.astimezone(dt.UTC)  # local arithmetic would drop `fold`
        while True:
            yield slot
            slot, _ = self.latest_at_or_before(slot - dt.timedelta(microseconds=1))

    def early_allowance(self, moment: dt.datetime) -> dt.timedelta:
        """How early a start may be and still serve the coming slot (the slot tolerance,
        at most a third of the interval so a late and an early start never meet)."""
        _, interval = self.latest_at_or_before(moment)
        return min(self.early_limit(), interval / 3)

    def early_limit(self) -> dt.timedelta:
        """The most :meth:`early_allowance` is, whatever the interval: the slot
        tolerance (an operator's override of the schedule keeps it)."""
        if self.tolerance is not None:
            return self.tolerance
        return parse_duration(app_settings.SLOT_TOLERANCE, what="SLOT_TOLERANCE")

    def slot_at(self, now: dt.datetime) -> dt.datetime:
        """The slot (a UTC datetime) that a run starting at ``now`` serves."""
        now = now.astimezone(dt.UTC)  # local arithmetic would drop `fold`
        slot, _ = self.latest_at_or_before(now + self.early_allowance(now))
        return slot


@dataclass(frozen=True)
class Every(Schedule):
    """Every ``period``, at whole multiples of it counted from 1970-01-01 00:00 UTC."""

    period: dt.timedelta = dt.timedelta(hours=1)

    def describe(self) -> str:
        return f"every {self.period}"

    def latest_at_or_before(self, moment: dt.datetime) -> tuple[dt.datetime, dt.timedelta]:
        elapsed = moment.astimezone(dt.UTC) - EPOCH
        return EPOCH + (elapsed // self.period) * self.period, self.period

    def smallest_gap(self, moment: dt.datetime) -> dt.timedelta:
        return self.period


# A reverse walk started soon after a change of UTC offset may find an instant that the
# forward walk (the one that defines the slots) skips: "0 */2 * * *" on Lord Howe's 30-minute
# fall-back goes 00:00 -> 04:00, yet walking back from 02:10 finds 02:00. A forward walk
# starts from a slot this far clear of any change.
SETTLED = dt.timedelta(hours=3)
# One CronSim step takes a few dozen ticks; one that takes this many is going round in circles.
MAX_TICKS = 1000
STALL_LIMIT = dt.timedelta(days=2)
# Enough slots to cover a year of a daily job, with both changes of UTC offset.
GAP_SLOTS = 1000


class _Looping(Exception):
    """A CronSim step came back to where it had been: it would never end."""


class _Steps(CronSim):
    """CronSim, stopped when a step goes round in circles (it does where a fall-back crosses
    midnight, as in St. John's until 2011), and noting the furthest instant it reached."""

    def __init__(self, expression: str, start: dt.datetime, reverse: bool = False) -> None:
        super().__init__(expression, start, reverse=reverse)
        self.seen: set[tuple[dt.datetime, int, int]] = set()
        self.furthest = start.astimezone(dt.UTC)

    def tick(self, seconds: int = 1) -> None:
        super().tick(seconds)
        # back at a wall time, fold and stride it had: CronSim would go round forever
        state = (self.dt.replace(tzinfo=None), self.dt.fold, seconds)
        if state in self.seen or len(self.seen) > MAX_TICKS:
            raise _Looping
        self.seen.add(state)
        if self.dt.tzinfo is not None:  # a fixed-time walk ticks on naive local times
            self.furthest = max(self.furthest, self.dt.astimezone(dt.UTC))

    def __next__(self) -> dt.datetime:
        self.seen.clear()
        return super().__next__()


@dataclass(frozen=True)
class Cron(Schedule):
    """A cron expression, evaluated in ``timezone`` (DST handled as Debian cron does).

    The slots are exactly the instants CronSim's forward walk gives (see ``_slot_after`` for
    where it stalls): a fixed-time job whose time is skipped by a spring-forward runs once
    right after the jump, one whose time is repeated by a fall-back runs once, at the first;
    a wildcard-hour job runs in both hours.
    """

    expression: str = "0 * * * *"
    timezone: str = "UTC"

    def describe(self) -> str:
        return f"cron {self.expression!r} ({self.timezone})"

    def latest_at_or_before(self, moment: dt.datetime) -> tuple[dt.datetime, dt.timedelta]:
        zone = zoneinfo.ZoneInfo(self.timezone)
        moment = moment.astimezone(dt.UTC)
        # Walk forward, never back: CronSim drops `fold` when a fixed-time walk starts in a
        # repeated hour, and a reverse walk there finds yesterday's slot.
        latest = self._settled_slot(moment, zone)
        following = self._slot_after(latest, zone)
        while following <= moment:
            latest, following = following, self._slot_after(following, zone)
        return latest, following - latest

    def smallest_gap(self, moment: dt.datetime) -> dt.timedelta:
        zone = zoneinfo.ZoneInfo(self.timezone)
        slot, smallest = self.latest_at_or_before(moment)
        for _ in range(GAP_SLOTS):
            following = self._slot_after(slot, zone)
            smallest, slot = min(smallest, following - slot), following
        return smallest

    def _slot_after(self, slot: dt.datetime, zone: zoneinfo.ZoneInfo) -> dt.datetime:
        """The slot after ``slot`` (UTC): CronSim's next instant. Where CronSim stalls (gives
        an instant again or an earlier one, or goes round in circles), it resumes at the
        minute after the furthest instant the stalled step reached, and so on."""
        start = resume = slot
        while True:
            steps = _Steps(self.expression, start.astimezone(zone))
            try:
                following = next(steps).astimezone(dt.UTC)
            except StopIteration:
                raise self._no_slot(slot) from None
            except _Looping:
                following = slot
            if following > slot:
                return following
            resume = max(steps.furthest, resume).replace(second=0, microsecond=0)
            resume += dt.timedelta(minutes=1)
            if resume - slot > STALL_LIMIT:
                raise self._no_slot(slot)
            start = resume - dt.timedelta(seconds=1)  # CronSim gives instants after its start

    def _settled_slot(self, moment: dt.datetime, zone: zoneinfo.ZoneInfo) -> dt.datetime:
        """A slot (UTC) at or before ``moment`` with no change of UTC offset in the
        ``SETTLED`` before it: usually the latest slot, found in one reverse step."""
        before = moment
        while True:
            # CronSim's reverse walk gives instants strictly before its start. Add in UTC:
            # arithmetic on local times drops `fold` and would confuse a repeated hour.
            start = (before.replace(microsecond=0) + dt.timedelta(seconds=1)).astimezone(zone)
            try:
                candidate = next(_Steps(self.expression, start, reverse=True))
            except StopIteration:
                raise self._no_slot(moment) from None
            except _Looping:
                before -= SETTLED
                continue
            slot = candidate.astimezone(dt.UTC)
            if slot <= moment and _offset(slot - SETTLED, zone) == _offset(slot, zone):
                return slot
            before = min(slot, before) - SETTLED

    def _no_slot(self, moment: dt.datetime) -> LockConfigurationError:
        return LockConfigurationError(
            f"Cron expression {self.expression!r} ({self.timezone}) has no slot near "
            f"{moment:%Y-%m-%d}; check that it matches a date that exists."
        )


def _offset(moment: dt.datetime, zone: zoneinfo.ZoneInfo) -> dt.timedelta | None:
    return moment.astimezone(zone).utcoffset()


def make_schedule(
    *,
    every: DurationLike | None = None,
    cron: str | None = None,
    timezone: str | None = None,
    tolerance: DurationLike | None = None,
) -> Schedule | None:
    """Check the arguments and build the schedule (None when neither is given). Each
    value passes its one check in ``values``; then a cron expression's fields."""
    if every is not None and cron is not None:
        raise LockConfigurationError("Give either every= or cron=, not both.")
    if timezone is not None and cron is None:
        raise LockConfigurationError("A time zone only applies to a cron= schedule.")
    if tolerance is not None and every is None and cron is None:
        raise LockConfigurationError("A slot tolerance only applies with every= or cron=.")
    tolerance_delta = None if tolerance is None else slot_tolerance(tolerance)
    if every is not None:
        period = values.duration(every, what="every", least=dt.timedelta(seconds=1))
        return Every(tolerance=tolerance_delta, period=period)
    if cron is not None:
        expression = values.cron(cron)
        zone_name = values.zone(timezone or settings.TIME_ZONE or "UTC")
        fields = expression.split()
        if len(fields) != 5:
            raise LockConfigurationError(
                f"Cron expression {values.printable(repr(expression), limit=80)} must have "
                "5 fields (minute hour day month weekday)."
            )
        try:
            CronSim(expression, dt.datetime(2000, 1, 1, tzinfo=zoneinfo.ZoneInfo(zone_name)))
        except CronSimError as exc:
            raise LockConfigurationError(
                f"Cron expression {expression!r} is not valid: {exc}."
            ) from None
        return Cron(tolerance=tolerance_delta, expression=expression, timezone=zone_name)
    return None


def slot_tolerance(value: DurationLike) -> dt.timedelta:
    """A slot tolerance (``slot_tolerance=``, ``--slot-tolerance``): a duration, not
    negative, at most the longest (``values.duration``)."""
    return values.duration(value, what="slot tolerance")


def with_tolerance(schedule: Schedule, tolerance: DurationLike | None) -> Schedule:
    """``schedule`` with another slot tolerance (``run_exclusive --slot-tolerance`` for a
    job that declares its schedule); ``None`` leaves it as it is."""
    if tolerance is None:
        return schedule
    return replace(schedule, tolerance=slot_tolerance(tolerance))


# Between a job's name and the name of one of its several schedules: "report:daily".
SCHEDULE_SEPARATOR = ":"
# What one of a job's several schedules may say; the job's other settings are shared.
SCHEDULE_KEYS = ("cron", "every", "timezone", "kwargs")


def several_schedules(
    schedules: object, *, tolerance: DurationLike | None = None
) -> dict[str, tuple[Schedule, object]]:
    """Check ``@exclusive_job(schedules={"daily": {"cron": ..., "kwargs": ...}, ...})``:
    each schedule by its name, with its (not yet checked) keyword arguments."""
    if not isinstance(schedules, dict) or not schedules:
        raise LockConfigurationError(
            "schedules must be a dict of schedule names to settings, e.g. "
            '{"daily": {"cron": "0 6 * * *", "kwargs": {"period": "day"}}}.'
        )
    result: dict[str, tuple[Schedule, object]] = {}
    for key, entry in schedules.items():
        values.name(key, what="Schedule name")
        if SCHEDULE_SEPARATOR in key:
            raise LockConfigurationError(
                f"Schedule name {key!r} must be written without {SCHEDULE_SEPARATOR!r}: it "
                "separates the job's name from the schedule's."
            )
        if not isinstance(entry, dict) or set(entry) - set(SCHEDULE_KEYS):
            unknown = sorted(set(entry) - set(SCHEDULE_KEYS)) if isinstance(entry, dict) else []
            said = f" not {', '.join(map(repr, unknown))}" if unknown else ""
            raise LockConfigurationError(
                f"Schedule {key!r} must be a dict of {', '.join(SCHEDULE_KEYS)};{said}."
            )
        if "cron" not in entry and "every" not in entry:
            raise LockConfigurationError(f"Schedule {key!r} needs cron= or every=.")
        try:
            schedule = make_schedule(
                every=entry.get("every"),
                cron=entry.get("cron"),
                timezone=entry.get("timezone"),
                tolerance=tolerance,
            )
        except LockConfigurationError as exc:
            raise LockConfigurationError(f"Schedule {key!r}: {exc}") from None
        assert schedule is not None
        result[key] = (schedule, entry.get("kwargs", {}))
    return result

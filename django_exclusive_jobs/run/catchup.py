"""Missed slots: what a start does about scheduled slots that no server ran.

A slot is missed when no server ran it before a later start (a cron line, a scheduler)
came along: every server was down, a deploy took too long, a run overran the next slot.
The start that notices records each such slot once, as a run with status ``missed``,
then runs what the job's policy says (hourly job, servers down from 09:10 to 11:40):

=============  =====================================  ===================================
``catch_up``   runs at 11:40                          recorded ``missed``
=============  =====================================  ===================================
``"latest"``   11:00 (the most recent slot), once     10:00
``"skip"``     nothing; the next run is 12:00         10:00, 11:00
``"all"``      10:00, then 11:00, in order            none (unless over the limit/window)
=============  =====================================  ===================================

``catch_up_window`` bounds how late a slot may still be run (for ``"skip"``: how late a
start still counts as on time, by default the slot tolerance); ``catch_up_limit`` bounds
how many slots ``"all"`` runs, the newest ones. Slots outside them are recorded missed.
A job's first run has nothing before it to account for.

A slot that came while the job's previous run still ran (it overran its interval) is
not missed: the job's ``overlap`` policy decides it, whichever server starts next:

================  ===================================================================
``overlap``       slots that came during the run
================  ===================================================================
``"skip"``        recorded ``skipped`` (the default)
``"buffer_one"``  the latest runs right after the run; the others are skipped
``"buffer_all"``  each runs, in order, after the run (at most ``catch_up_limit``, the
                  newest; the others are skipped); when the servers were down after
                  the run, only the oldest runs: the others are skipped
``"cancel_other"``  the new slot's start asks the running run (on any server) to stop,
                  and takes the lock once it has (a cron line waits up to
                  :data:`CANCEL_WAIT`, a scheduler looks again each second), then
                  runs; as with
                  ``"buffer_one"``, the latest slot that came during the run runs
                  after it, the others are skipped
``"allow_all"``   none comes "during" a run: each slot takes a lock of its own and runs
                  at its time, beside the runs still going (see ``slot_locks.py``)
================  ===================================================================

A run whose server died has no known end: the slots after its start are missed, not
skipped, and ``catch_up`` decides them.

After an operator changed the job's schedule (an override, or back to the code), the
first start records missed the slots of the schedule it replaced that no server ran
before the change (:func:`replaced`). That work is bounded as a backfill's is: at most
:data:`MAX_RECORDED` slots are walked, the newest, each recorded missed; any older ones
are one missed-range record, at the oldest's slot, saying how many slots of which
schedule were missed from when to when, because the schedule changed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice

from .. import values
from ..lock.durations import DurationLike
from ..lock.errors import LockConfigurationError
from .policies import CATCH_UP, OVERLAP, CatchUp, Overlap, catch_up_class, overlap_policy
from .schedules import Every, Schedule

__all__ = ["CatchUp", "Overlap"]  # the policies, where the code has always found them
POLICIES = tuple(CATCH_UP)  # the catch_up names
OVERLAPS = tuple(OVERLAP)  # the names, in the order messages and choices give them
CANCEL_WAIT = 30.0  # seconds a cancel_other start waits for the run it asked to stop
# A job every second, down for a week, would need 600,000 rows: the newest are enough.
MAX_RECORDED = 1000
# How many older slots of a replaced cron schedule are counted, one by one, for its
# missed-range record (an every= schedule's are counted by arithmetic, at once).
MAX_COUNTED = 10 * MAX_RECORDED
_TICK = dt.timedelta(microseconds=1)


@dataclass(frozen=True)
class Plan:
    """What one start does: the slot it runs (if any) and the slots it records missed."""

    run: dt.datetime | None
    missed: list[dt.datetime] = field(default_factory=list)
    more: bool = False  # slots left to run after this one ("all", "buffer_all")
    skipped: list[dt.datetime] = field(default_factory=list)  # came during a run (overlap)


def make_catch_up(
    policy: str = "latest", limit: int = 10, window: DurationLike | None = None
) -> CatchUp:
    """Check the arguments of ``@exclusive_job(catch_up=..., ...)``."""
    kind = catch_up_class(policy)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_RECORDED:
        raise LockConfigurationError(
            f"catch_up_limit must be a whole number from 1 to {MAX_RECORDED}, got {limit!r}."
        )
    window_delta = None
    if window is not None:
        window_delta = values.duration(window, what="catch_up_window")
    return kind(limit=limit, window=window_delta)


def make_overlap(overlap: str, catch_up: CatchUp | None = None) -> Overlap:
    """Check ``@exclusive_job(overlap=...)`` (and that ``catch_up`` goes with it)."""
    policy = overlap_policy(overlap)
    if catch_up is not None and not policy.goes_with(catch_up):
        raise LockConfigurationError(
            f"overlap={policy.name!r} runs each slot at its time: catch_up={catch_up.name!r} "
            "does not go with it (use catch_up='latest' or 'skip', and "
            "`exclusive_jobs backfill` for past slots)."
        )
    return policy


def plan(
    schedule: Schedule,
    catch_up: CatchUp,
    now: dt.datetime,
    last_recorded: dt.datetime | None,
    *,
    quiet: list[tuple[dt.datetime, dt.datetime]] | None = None,
    current: dt.datetime | None = None,
    overlap: Overlap = OVERLAP["skip"],
    ran: tuple[dt.datetime, dt.datetime] | None = None,
    start_of: Callable[[dt.datetime], dt.datetime] | None = None,
) -> Plan:
    """What a start at ``now`` (database time) does, given the job's latest recorded slot.

    ``last_recorded`` is the newest slot with a row at or before the current slot; when it
    is the current slot itself there is nothing to plan (the caller skips or retries).
    Slots within a ``quiet`` span (the job's last pause, the time before its schedule
    came in force) are neither run nor missed.
    ``current``: the slot this start serves, when not ``schedule.slot_at(now)``.
    ``ran``: when the run of ``last_recorded`` started and ended, if it ran and ended by
    itself: the slots that came in between came during it, and ``overlap`` decides them.
    ``start_of``: when a slot starts (with its jitter); a start is late from then.
    """
    if current is None:
        current = schedule.slot_at(now)
    if last_recorded is None:
        return Plan(current)  # a job's first run: nothing before it, on time or not
    due = _unrecorded(schedule, current, last_recorded)
    for begin, end in quiet or ():
        due = [slot for slot in due if not begin <= slot <= end]
    start = start_of or (lambda slot: slot)
    during = _came_during(schedule, overlap, last_recorded, ran, due, start)
    buffered = overlap.slots_run_after(catch_up)
    cut = max(0, len(during) - buffered)
    skipped, buffered_slots = during[:cut], during[cut:]
    due = [slot for slot in due if slot not in during]  # missed unless catch_up runs them
    window = catch_up.window_at(schedule, now)
    runnable = [slot for slot in due if window is None or now - start(slot) <= window]
    runnable = catch_up.slots_to_run(runnable, current)
    missed = [slot for slot in due if slot not in runnable]
    runnable = sorted(buffered_slots + runnable)  # oldest first: each is then the latest
    runnable, skipped = _none_left_behind(runnable, missed, skipped)
    return Plan(runnable[0] if runnable else None, missed, len(runnable) > 1, skipped)


def _unrecorded(
    schedule: Schedule, current: dt.datetime, last_recorded: dt.datetime
) -> list[dt.datetime]:
    """The slots after ``last_recorded`` up to ``current`` that no server has a row for,
    oldest first (the newest ``MAX_RECORDED`` at most)."""
    due: list[dt.datetime] = []  # newest first
    for slot in schedule.slots_back(current):
        if slot <= last_recorded:
            break
        due.append(slot)
        if len(due) == MAX_RECORDED:
            break
    due.reverse()
    return due


def _came_during(
    schedule: Schedule,
    overlap: Overlap,
    last_recorded: dt.datetime,
    ran: tuple[dt.datetime, dt.datetime] | None,
    due: list[dt.datetime],
    start: Callable[[dt.datetime], dt.datetime],
) -> list[dt.datetime]:
    """The slots of ``due`` whose start (with its jitter) came while the run of
    ``last_recorded`` ran (``ran``): ``overlap`` decides them. Under buffer_all, a
    previous run that began after its slot was itself buffered, and the slots that came
    before it began were buffered with it: they run too (the start that planned them
    wrote no row for them)."""
    if ran is None or overlap.lock_per_slot:
        return []  # side by side: a slot that came during a run is run like any other
    if overlap.only_overruns_count and not _overran(schedule, last_recorded, ran):
        return []  # a slot came during it only because it began late: catch_up's
    since = None if overlap.counts_slots_before_run_began else ran[0]
    return [
        slot for slot in due if (since is None or since < start(slot)) and start(slot) <= ran[1]
    ]


def _none_left_behind(
    runnable: list[dt.datetime], missed: list[dt.datetime], skipped: list[dt.datetime]
) -> tuple[list[dt.datetime], list[dt.datetime]]:
    """The slots left to run after this one get no row now, and the starts that run
    them look only after the newest row written now: one older than a slot recorded
    missed or skipped would never be found. Under buffer_all a slot nobody ran (the
    servers were down after the run) is newer than the buffered ones (found by the
    protocol's model, docs/model.md); under catch_up="all" a slot that came during a run
    that overran is newer than the missed slots still to run (found by the claim's
    properties, tests/test_claim_properties.py): those not run now are skipped."""
    written = max(missed[-1:] + skipped[-1:], default=None)  # the newest row written now
    if written is None:
        return runnable, skipped
    passed = [slot for slot in runnable[1:] if slot < written]
    return [slot for slot in runnable if slot not in passed], sorted(skipped + passed)


def _overran(schedule: Schedule, slot: dt.datetime, ran: tuple[dt.datetime, dt.datetime]) -> bool:
    """The run of ``slot`` lasted its slot's interval or longer. A shorter one that a slot
    came during began late (a catch-up run): that slot is catch_up's, not overlap's."""
    return ran[1] - ran[0] >= schedule.next_after(slot) - slot


@dataclass(frozen=True)
class Replaced:
    """The slots of a replaced schedule (``schedule``, in words) that no server ran
    before the change at ``changed``: the newest (``slots``, oldest first, at most
    :data:`MAX_RECORDED`), and the older ones as one range (``earlier`` of them, from
    ``first`` to ``last``; ``counted``: all of them were counted, else at least so many)."""

    schedule: str
    changed: dt.datetime
    slots: list[dt.datetime] = field(default_factory=list)
    earlier: int = 0
    first: dt.datetime | None = None
    last: dt.datetime | None = None
    counted: bool = True

    @property
    def total(self) -> int:
        return len(self.slots) + self.earlier

    def how_many(self) -> str:
        return f"{self.total}" if self.counted else f"more than {self.total}"

    def range_record(self) -> str:
        """What the missed-range record says: how many, from when to when, why."""
        assert self.first is not None and self.last is not None
        many = f"{self.earlier}" if self.counted else f"More than {self.earlier}"
        return (
            f"{many} slots of the replaced schedule ({self.schedule}) were missed, from "
            f"{self.first.isoformat()} to {self.last.isoformat()}: no server ran them before "
            f"its schedule changed at {self.changed.isoformat(timespec='seconds')}; the "
            f"{len(self.slots)} newest are recorded one by one."
        )


def replaced(
    schedule: Schedule,
    described: str,
    since: dt.datetime,
    changed: dt.datetime,
    until: dt.datetime,
    pause: tuple[dt.datetime, dt.datetime] | None = None,
) -> Replaced:
    """The slots of ``schedule`` (replaced at ``changed``) after ``since`` (the job's
    latest recorded slot) and before ``until``, outside ``pause``: at most
    :data:`MAX_RECORDED` walked, from the newest back (each slot a step, a pause jumped
    over), and the older ones counted (see :class:`Replaced`)."""
    newest: list[dt.datetime] = []
    slot = _before(schedule, until, pause)
    while slot > since and len(newest) < MAX_RECORDED:
        newest.append(slot)
        slot = _before(schedule, slot, pause)
    newest.reverse()
    if slot <= since:
        return Replaced(described, changed, newest)
    first = schedule.next_after(since)
    if pause is not None and pause[0] <= first <= pause[1]:
        first = schedule.next_after(pause[1])
    earlier, counted = _count(schedule, since, slot, pause)
    return Replaced(described, changed, newest, earlier, first, slot, counted)


def _before(
    schedule: Schedule, moment: dt.datetime, pause: tuple[dt.datetime, dt.datetime] | None
) -> dt.datetime:
    """The latest slot strictly before ``moment``, outside ``pause`` (jumped over)."""
    slot, _ = schedule.latest_at_or_before(moment - _TICK)
    if pause is not None and pause[0] <= slot <= pause[1]:
        slot, _ = schedule.latest_at_or_before(pause[0] - _TICK)
    return slot


def _count(
    schedule: Schedule,
    since: dt.datetime,
    last: dt.datetime,
    pause: tuple[dt.datetime, dt.datetime] | None,
) -> tuple[int, bool]:
    """How many slots of ``schedule`` are after ``since`` and up to ``last``, outside
    ``pause``, and whether that is all of them (a cron schedule's are counted up to
    :data:`MAX_COUNTED`)."""
    if isinstance(schedule, Every):
        count = _multiples(schedule, since, last)
        if pause is not None and pause[0] <= last and pause[1] > since:
            inside = _multiples(schedule, max(since, pause[0] - _TICK), min(last, pause[1]))
            count -= inside
        return count, True
    slots = islice(schedule.slots_after(since), MAX_COUNTED + 1)
    count = 0
    for slot in slots:
        if slot > last:
            return count, True
        if pause is None or not pause[0] <= slot <= pause[1]:
            count += 1
    return count, False


def _multiples(schedule: Every, after: dt.datetime, upto: dt.datetime) -> int:
    """How many slots of ``schedule`` are after ``after`` and up to ``upto``."""
    if upto <= after:
        return 0
    top, _ = schedule.latest_at_or_before(upto)
    bottom, _ = schedule.latest_at_or_before(after)
    return max(0, (top - bottom) // schedule.period)

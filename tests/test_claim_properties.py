"""The claim's decisions (run/claim.py ``decide``) over generated histories on a virtual
clock, against a reference model written from the policies' definitions
(tests/claim_model.py). Pure: no database, no clock read.

A simulator keeps a virtual database of run rows and a virtual clock; each generated
start reads ``latest`` from the rows as history.claim does, decides, applies the
decision's writes, and "runs" the inserted run for a generated time, writing its end
as record_end would. After every start the properties are checked (each named, see
``check``): [model] the start runs the slot (and attempt) and writes the missed and
skipped rows the reference model predicts; [unique] never two rows for one (slot,
attempt); [not-after-current] no row for a slot after the start's current slot;
[no-gap] every slot between the first recorded and the newest has a row;
[succeeded-once] a slot whose run succeeded never runs again; [retry] attempt 1 only
for a slot without rows, a retry only as the next attempt once its retry_at has come.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from django_exclusive_jobs.models import JobRun
from django_exclusive_jobs.run.catchup import make_catch_up, make_overlap
from django_exclusive_jobs.run.claim import Decision, aim, decide
from django_exclusive_jobs.run.registry import Job
from django_exclusive_jobs.run.schedules import Schedule, make_schedule
from django_exclusive_jobs.run.start import Start

from .claim_model import Expected, Policy, Row, expect, latest_row

pytestmark = pytest.mark.no_deadline  # CPU only, no deadline: nice 10 (tests/cpu_report.py)

ME = "here:1:me"
NAME = "props"
UTC = dt.UTC
SETTINGS = settings(
    derandomize=True,
    deadline=None,
    database=None,
    max_examples=int(os.environ.get("CLAIM_PROPERTIES_EXAMPLES", "200")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    phases=[Phase.generate] if os.environ.get("CLAIM_PROPERTIES_ONLY") else list(Phase),
)
# Days with a change of UTC offset in 2026 in the zones the cron schedules use.
DST_DAYS = [
    dt.datetime(2026, 3, 8, tzinfo=UTC),  # New York, spring forward
    dt.datetime(2026, 11, 1, tzinfo=UTC),  # New York, fall back
    dt.datetime(2026, 3, 29, tzinfo=UTC),  # Paris, spring forward
    dt.datetime(2026, 10, 25, tzinfo=UTC),  # Paris, fall back
    dt.datetime(2026, 4, 4, 12, tzinfo=UTC),  # Lord Howe, back 30 minutes (Apr 5 local)
    dt.datetime(2026, 10, 3, 12, tzinfo=UTC),  # Lord Howe, forward 30 minutes (Oct 4 local)
    dt.datetime(2026, 6, 15, tzinfo=UTC),  # none
]
ZONES = ["Europe/Paris", "America/New_York", "Australia/Lord_Howe", "UTC"]
CRONS = ["0 * * * *", "30 2 * * *", "0 3 * * *", "0 */2 * * *", "*/30 * * * *", "15 1,2 * * *"]
EVERY_MINUTES = [1, 5, 7, 15, 60, 90, 360, 1440]
COUNTS = {"starts": 0, "predicted": 0, "abstained": 0}
# One property checked alone (to see each fail on its own under a mutation), and no
# shrinking (a mutation's failure is found, not minimised): CLAIM_PROPERTIES_ONLY=no-gap.
ONLY = os.environ.get("CLAIM_PROPERTIES_ONLY", "")


def check(tag: str, holds: bool, message: str) -> None:
    """One property: model, unique, not-after-current, no-gap, succeeded-once, retry."""
    if not ONLY or tag == ONLY:
        assert holds, f"[{tag}] {message}"


@dataclass
class World:
    """The virtual database and clock of one generated history."""

    job: Job
    policy: Policy
    rows: dict[tuple[dt.datetime, int], Row] = field(default_factory=dict)
    clock: dt.datetime = dt.datetime(2026, 1, 1, tzinfo=UTC)
    checked: set[tuple[dt.datetime, dt.datetime]] = field(default_factory=set)

    @property
    def schedule(self) -> Schedule:
        assert self.job.schedule is not None
        return self.job.schedule


def as_run(slot: dt.datetime, attempt: int, row: Row) -> JobRun:
    """A virtual row as the claim reads it: an unsaved JobRun."""
    return JobRun(
        name=NAME,
        slot=slot,
        attempt=attempt,
        status=row.status,
        started_at=row.started_at,
        duration=row.duration,
        finished_at=row.finished_at,
        retry_at=row.retry_at,
        host="there",
        pid=7,
        instance="it",
        token=3,
    )


# --- generation ---------------------------------------------------------------------------


@st.composite
def schedules(draw: st.DrawFn) -> tuple[Schedule, dt.datetime]:
    """A schedule and the moment its history begins (near a change of UTC offset)."""
    begin = draw(st.sampled_from(DST_DAYS)) - dt.timedelta(hours=draw(st.integers(2, 30)))
    if draw(st.booleans()):
        minutes = draw(st.sampled_from(EVERY_MINUTES) | st.integers(1, 1440))
        schedule = make_schedule(every=dt.timedelta(minutes=minutes))
    else:
        cron, zone = draw(st.sampled_from(CRONS)), draw(st.sampled_from(ZONES))
        schedule = make_schedule(cron=cron, timezone=zone)
    assert schedule is not None
    return schedule, begin


@st.composite
def policies(draw: st.DrawFn, overlaps: list[str], catch_ups: list[str]) -> Policy:
    overlap = draw(st.sampled_from(overlaps))
    choices = [c for c in catch_ups if not (overlap == "allow_all" and c == "all")]
    catch_up = draw(st.sampled_from(choices))
    window = draw(st.none() | st.integers(1, 48 * 60).map(lambda m: dt.timedelta(minutes=m)))
    return Policy(catch_up, overlap, draw(st.integers(1, 4)), window, draw(st.sampled_from([0, 2])))


def make_job(schedule: Schedule, policy: Policy, backoff: int) -> Job:
    catch_up = make_catch_up(policy.catch_up, policy.limit, policy.window)
    return Job(
        NAME,
        lambda: None,
        schedule=schedule,
        catch_up=catch_up,
        overlap=make_overlap(policy.overlap, catch_up),
        retries=policy.retries,
        retry_backoff=dt.timedelta(seconds=backoff),
    )


# A start: how it comes (kind), how late (a fraction of the interval or seconds), the
# run's length as a fraction of the interval (or seconds) and whether it succeeds.
def events(lengths: list[str]) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.tuples(
        st.sampled_from(
            ["on_time", "on_time", "early_lock", "late", "now", "gap", "retry", "cron"]
        ),
        st.integers(0, 3600),
        st.sampled_from(lengths),
        st.integers(1, 1000),
        st.booleans(),
    )


ALL_LENGTHS = ["short", "short", "part", "over", "long"]


# --- the simulator ------------------------------------------------------------------------


def interval(world: World, at: dt.datetime) -> dt.timedelta:
    return world.schedule.latest_at_or_before(at)[1]


def start_of_event(world: World, event: tuple[Any, ...]) -> tuple[Start, dt.datetime]:
    """The start the event is, and the database's time at its lock's acquisition."""
    kind, late, _, _, _ = event
    schedule, clock = world.schedule, world.clock
    gap = interval(world, clock)
    due = schedule.next_after(clock)
    if kind == "retry":
        key = latest_row(world.rows, clock + gap * 10)
        row = world.rows[key] if key else None
        if row is not None and row.retry_at is not None:
            when = max(clock, row.retry_at)
            return Start.slot(row.retry_at), when + dt.timedelta(seconds=late % 3)
        kind = "on_time"
    if kind == "on_time":
        return Start.slot(due), due + dt.timedelta(seconds=late % 5)
    if kind == "early_lock":  # the lock came a little before the due slot
        return Start.slot(due), due - dt.timedelta(seconds=1 + late % 2)
    if kind == "late":  # the scheduler was busy: up to three intervals late
        acquired = due + gap * (3 * late / 3600)
        return Start.slot(due), acquired
    if kind == "now":  # right after the last run (a buffered slot, a catch-up)
        acquired = clock + dt.timedelta(seconds=late % 4)
        return Start.slot(schedule.latest_at_or_before(acquired)[0]), acquired
    if kind == "gap":  # every server down: up to 50 intervals
        acquired = clock + gap * (50 * late / 3600)
        acquired = acquired.replace(microsecond=0)
        return Start.slot(schedule.latest_at_or_before(acquired)[0]), acquired
    acquired = (clock + gap * (2 * late / 3600)).replace(microsecond=0)  # a cron line's
    return Start.cron(), acquired


def length(world: World, event: tuple[Any, ...], at: dt.datetime) -> float:
    _, _, kind, size, _ = event
    gap = interval(world, at).total_seconds()
    if kind == "short":
        return float(1 + size % 20)
    if kind == "part":
        return round(gap * size / 1000 * 0.9, 3)
    if kind == "over":
        return round(gap * (1 + size / 1000), 3)
    return round(gap * (1 + 3 * size / 1000), 3)


def claim(world: World, start: Start, acquired: dt.datetime) -> tuple[Decision, dt.datetime]:
    """Decide as history.claim does: aim, read the latest, decide (in turn again under
    allow_all). Returns the decision and the slot the start served."""
    job = world.job
    slot = None
    if job.overlap.lock_per_slot:
        slot = world.schedule.latest_at_or_before(max(acquired, start.not_before or acquired))[0]
    aimed = aim(job, start, acquired, None, slot)
    assert aimed.look_up_to is not None
    current = aimed.look_up_to
    key = latest_row(world.rows, current)
    latest = as_run(*key, world.rows[key]) if key else None
    decided = decide(job, start, acquired, ME, latest, None, slot=slot)
    if decided.in_turn:
        newest = max(world.rows) if world.rows else None
        turn = as_run(*newest, world.rows[newest]) if newest else None
        decided = decide(job, start, acquired, ME, turn, None, slot=slot, turn=True)
    assert decided.final
    return decided, current


def moment(start: Start, acquired: dt.datetime) -> dt.datetime:
    return acquired if start.not_before is None else max(acquired, start.not_before)


def step(world: World, event: tuple[Any, ...]) -> None:
    start, acquired = start_of_event(world, event)
    now = moment(start, acquired)
    schedule = world.schedule
    COUNTS["starts"] += 1
    decided, current = claim(world, start, acquired)
    # The model's current slot: the scheduler's due slot, never a coming one; a cron
    # line's, the slot of its time (its early allowance).
    if start.not_before is not None:
        model_current = schedule.latest_at_or_before(now)[0]
    else:
        model_current = schedule.latest_at_or_before(now + schedule.early_allowance(now))[0]
    assert current == model_current, (current, model_current)
    if world.job.overlap.lock_per_slot and not world.rows:
        expected = Expected(run=current)
    elif world.job.overlap.lock_per_slot and max(world.rows)[0] > current:
        expected = Expected()  # the history began after this slot
    else:
        expected = expect(schedule, world.policy, world.rows, current, now)
    before = dict(world.rows)
    apply(world, decided, now)
    check_invariants(world, before, decided, current, now)
    new = [key for key in world.rows if key not in before]
    if expected.sure:
        COUNTS["predicted"] += 1
        insert = decided.insert
        got = (insert.slot, insert.attempt) if insert else (None, 1)
        check("model", got == (expected.run, expected.attempt), f"ran {got}, {expected}")
        # What the start wrote, not only what it says it found.
        wrote = {
            status: sorted(s for s, _ in new if world.rows[(s, 1)].status == status)
            for status in ("missed", "skipped")
        }
        check("model", wrote["missed"] == expected.missed, f"missed {wrote}, {expected}")
        check("model", wrote["skipped"] == expected.skipped, f"skipped {wrote}, {expected}")
        check("model", sorted(decided.missed) == expected.missed, f"{decided.missed}, {expected}")
    else:
        COUNTS["abstained"] += 1
    world.clock = max(world.clock, now)
    if decided.insert is not None:
        run_it(world, decided, event, now)


def apply(world: World, decided: Decision, now: dt.datetime) -> None:
    """The decision's writes on the virtual rows: give up, records, then the insert."""
    if decided.give_up is not None:
        key = (decided.give_up.slot, decided.give_up.attempt)
        assert key in world.rows
        world.rows[key].retry_at = None
    for record in decided.records:
        for slot in record.slots:
            check("unique", (slot, 1) not in world.rows, f"two rows for {slot} attempt 1")
            world.rows[(slot, 1)] = Row(record.status, now, None, now, None)
    insert = decided.insert
    if insert is not None:
        key = (insert.slot, insert.attempt)
        check("unique", key not in world.rows, f"two rows for {key}")
        world.rows[key] = Row("running", now)


def run_it(world: World, decided: Decision, event: tuple[Any, ...], now: dt.datetime) -> None:
    """The inserted run runs and ends, as record_end writes its end."""
    insert = decided.insert
    assert insert is not None and insert.slot is not None
    seconds = length(world, event, now)
    ok = event[4] or (world.policy.retries == 0 and event[3] % 3 == 0)
    ended = now + dt.timedelta(seconds=seconds)
    row = world.rows[(insert.slot, insert.attempt)]
    row.status = "succeeded" if ok else "failed"
    row.duration = seconds
    row.finished_at = ended + dt.timedelta(seconds=event[3] % 7)  # written a little later
    if not ok:
        row.retry_at = world.job.retry.retry_at(insert.slot, insert.attempt, ended)
    world.clock = row.finished_at


def check_invariants(
    world: World,
    before: dict[tuple[dt.datetime, int], Row],
    decided: Decision,
    current: dt.datetime,
    now: dt.datetime,
) -> None:
    schedule = world.schedule
    new = [key for key in world.rows if key not in before]
    # No row (a run or a record) for a slot after the start's current slot, and the
    # current slot itself has begun (a scheduler's) or is within the early allowance.
    for slot, _ in new:
        check("not-after-current", slot <= current, f"a row for {slot} after {current}")
    check("not-after-current", current <= now + schedule.early_allowance(now), f"{current}")
    insert = decided.insert
    if insert is not None:
        assert insert.slot is not None
        done = [key for key, row in before.items() if key[0] == insert.slot]
        # A slot whose run succeeded never runs again.
        again = any(before[key].status == "succeeded" for key in done)
        check("succeeded-once", not again, f"slot {insert.slot} ran again after it succeeded")
        if insert.attempt == 1:
            check("retry", not done, f"attempt 1 of {insert.slot}, which has rows")
        else:  # a retry: the next attempt, once its retry_at has come
            previous = before.get((insert.slot, insert.attempt - 1))
            newest = max((k[1] for k in done), default=0)
            check("retry", previous is not None and newest == insert.attempt - 1, "not next")
            when = previous.retry_at if previous is not None else None
            check("retry", when is not None and when <= now, f"retry before {when} (now {now})")
    # No gap: every slot between the first recorded slot and the newest has a row.
    slots = sorted({slot for slot, _ in world.rows})
    for older, newer in itertools.pairwise(slots):
        if (older, newer) in world.checked:
            continue
        following = schedule.next_after(older)
        check("no-gap", following == newer, f"no row for {following} ({older} to {newer})")
        world.checked.add((older, newer))


def simulate(scenario: tuple[Any, ...]) -> None:
    (schedule, begin), policy, backoff, events = scenario
    world = World(make_job(schedule, policy, backoff), policy, clock=begin)
    for event in events:
        step(world, event)


def scenarios(
    overlaps: list[str], catch_ups: list[str], lengths: list[str] = ALL_LENGTHS
) -> st.SearchStrategy[Any]:
    return st.tuples(
        schedules(),
        policies(overlaps, catch_ups),
        st.integers(1, 900),
        st.lists(events(lengths), min_size=3, max_size=25),
    )


# --- the properties -----------------------------------------------------------------------

BUFFERS = ["buffer_one", "buffer_all", "cancel_other"]


@SETTINGS
@given(scenarios(["skip"], ["latest", "skip"]))
def test_catch_up_latest_and_skip_with_overlap_skip(scenario: tuple[Any, ...]) -> None:
    simulate(scenario)


@SETTINGS
@given(scenarios(["skip"], ["all"], ["short", "part"]))
def test_catch_up_all_when_no_run_overran(scenario: tuple[Any, ...]) -> None:
    simulate(scenario)


@SETTINGS
@given(scenarios(BUFFERS, ["latest", "skip"]))
def test_buffers_after_a_run_that_overran(scenario: tuple[Any, ...]) -> None:
    simulate(scenario)


@SETTINGS
@given(scenarios([*BUFFERS, "skip", "allow_all"], ["latest"]))
def test_every_overlap_policy(scenario: tuple[Any, ...]) -> None:
    simulate(scenario)


@SETTINGS
@given(scenarios(["skip", *BUFFERS], ["all"]))
def test_catch_up_all_after_a_run_that_overran(scenario: tuple[Any, ...]) -> None:
    simulate(scenario)


@pytest.mark.parametrize("overlap", ["skip", "buffer_one"])
def test_the_smallest_gap_case(overlap: str) -> None:
    """Hourly, catch_up='all'. The run of 01:00 began late, at 03:00 (02:00 and 03:00
    still to run after it), and ran until 05:00:07. The start at 05:00:12 runs 02:00
    and records skipped 04:00 (and, under "skip", 05:00), which came during the run:
    03:00, left to run after it, would then be older than the newest row, and no start
    would find it (a gap, found by these properties): it is recorded skipped too."""
    hourly = make_schedule(every=dt.timedelta(hours=1))
    assert hourly is not None
    policy = Policy("all", overlap, 10, None, 0)
    world = World(make_job(hourly, policy, 60), policy)
    day = dt.datetime(2026, 3, 8, tzinfo=UTC)
    world.rows[(day.replace(hour=1), 1)] = Row(
        "failed", day.replace(hour=3), 7207.0, day.replace(hour=5, second=8)
    )
    now = day.replace(hour=5, second=12)
    decided, _ = claim(world, Start.slot(day.replace(hour=5)), now)
    assert decided.insert is not None and decided.insert.slot == day.replace(hour=2)
    assert decided.skipped[:2] == [day.replace(hour=3), day.replace(hour=4)]
    apply(world, decided, now)
    slots = sorted(slot for slot, _ in world.rows)
    assert slots == [day.replace(hour=h) for h in range(1, slots[-1].hour + 1)], slots


@pytest.fixture(scope="module", autouse=True)
def _counted() -> Any:
    yield
    print(f"\nclaim properties: {COUNTS}")

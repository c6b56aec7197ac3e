"""A small reference model of what one scheduled start does, written from the policies'
definitions (docs/policies.md, run/catchup.py's docstring), not from the code that
decides (run/claim.py, catchup.plan): tests/test_claim_properties.py drives the pure
decision against it. It reads only the virtual rows and the schedule's slots."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from django_exclusive_jobs.run.schedules import Schedule

RUNS_NOT = ("missed", "skipped", "paused")
UNSUCCESSFUL = ("failed", "timed_out", "interrupted", "lost")
SURE = dt.timedelta(seconds=1)  # closer than this to a window's edge: the model abstains


@dataclass
class Row:
    """A virtual run row: what a claim and record_end wrote."""

    status: str
    started_at: dt.datetime
    duration: float | None = None
    finished_at: dt.datetime | None = None
    retry_at: dt.datetime | None = None


@dataclass(frozen=True)
class Policy:
    catch_up: str  # latest, skip, all
    overlap: str  # skip, buffer_one, buffer_all, allow_all
    limit: int
    window: dt.timedelta | None
    retries: int


@dataclass
class Expected:
    """What the start does: the slot it runs (and which attempt), the slots it records
    missed and skipped; ``sure``: False when the model abstains (a corner it does not
    decide, counted by the test)."""

    run: dt.datetime | None = None
    attempt: int = 1
    missed: list[dt.datetime] = field(default_factory=list)
    skipped: list[dt.datetime] = field(default_factory=list)
    sure: bool = True


def slots_between(schedule: Schedule, after: dt.datetime, upto: dt.datetime) -> list[dt.datetime]:
    """The schedule's slots after ``after`` and up to ``upto``, oldest first."""
    found = []
    slot = schedule.next_after(after)
    while slot <= upto:
        found.append(slot)
        slot = schedule.next_after(slot)
    return found


def latest_row(
    rows: dict[tuple[dt.datetime, int], Row], current: dt.datetime
) -> tuple[dt.datetime, int] | None:
    """The current slot's newest attempt, else the newest attempt of the newest slot
    before it (as history.claim reads it)."""
    keys = [key for key in rows if key[0] <= current]
    return max(keys) if keys else None


def expect(
    schedule: Schedule,
    policy: Policy,
    rows: dict[tuple[dt.datetime, int], Row],
    current: dt.datetime,
    now: dt.datetime,
) -> Expected:
    """What a start at ``now`` serving ``current`` does, by the policies' definitions."""
    key = latest_row(rows, current)
    if key is None:
        return Expected(run=current)  # a job's first run: nothing before it
    slot, attempt = key
    row = rows[key]
    if slot == current:  # the slot has a row: its retry once due, else nothing
        if (
            row.status in UNSUCCESSFUL
            and row.retry_at is not None
            and attempt <= policy.retries
            and row.retry_at <= now
        ):
            return Expected(run=current, attempt=attempt + 1)
        return Expected()
    due = slots_between(schedule, slot, current)
    # The run of the newest slot, if it ran and ended by itself: the slots that came
    # while it ran are the overlap policy's ("not missed").
    during: list[dt.datetime] = []
    if policy.overlap != "allow_all" and row.status not in (*RUNS_NOT, "running"):
        assert row.duration is not None
        end = row.started_at + dt.timedelta(seconds=row.duration)
        lasted = end - row.started_at
        overran = lasted >= schedule.next_after(slot) - slot
        if policy.overlap == "buffer_all":  # a late run was itself buffered: all count
            during = [s for s in due if s <= end]
        elif policy.overlap != "skip" or overran:
            during = [s for s in due if row.started_at < s <= end]
    nobody = [s for s in due if s not in during]  # no server ran them: catch_up's
    window = policy.window
    if policy.catch_up == "skip" and window is None:
        window = schedule.early_allowance(now)  # "on time": within the slot tolerance
    sure = True
    if window is not None:
        sure = all(abs((now - s) - window) >= SURE for s in nobody)
        nobody_in = [s for s in nobody if now - s <= window]
    else:
        nobody_in = nobody
    if policy.catch_up == "all":
        caught = nobody_in[-policy.limit :]  # each, oldest first, at most limit (newest)
    else:  # latest: the most recent slot, once; skip: only a start on time
        caught = [s for s in nobody_in[-1:] if s == current]
    missed = [s for s in nobody if s not in caught]
    keep = {"buffer_one": 1, "cancel_other": 1, "buffer_all": policy.limit}.get(policy.overlap, 0)
    buffered = during[max(0, len(during) - keep) :] if keep else []
    skipped = [s for s in during if s not in buffered]
    if buffered and missed:
        sure = False  # the servers were down after an overrun: a corner left to the code
    runnable = sorted(buffered + caught)
    # No gap: a slot left to run after this start gets no row now, and a start looks only
    # after the newest row; one older than a row written now would never be found, so it
    # is recorded skipped instead.
    written = max(missed + skipped, default=None)
    if written is not None:
        passed = [s for s in runnable[1:] if s < written]
        skipped = sorted(skipped + passed)
        runnable = [s for s in runnable if s not in passed]
    return Expected(
        run=runnable[0] if runnable else None, missed=missed, skipped=skipped, sure=sure
    )

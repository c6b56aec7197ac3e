"""When a scheduler starts each job next (run/when.py): pure, on a virtual clock. The
rows are unsaved model instances; no database, no real time."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from django_exclusive_jobs.models import JobRun
from django_exclusive_jobs.run import when
from django_exclusive_jobs.run.catchup import make_overlap
from django_exclusive_jobs.run.registry import Job
from django_exclusive_jobs.run.schedules import make_schedule

HOURLY = make_schedule(every="1h")


def at(hour: int, minute: int = 0, second: int = 0) -> dt.datetime:
    return dt.datetime(2026, 11, 24, hour, minute, second, tzinfo=dt.UTC)


def job(**settings: Any) -> Job:
    return Job("nightly", lambda: None, schedule=HOURLY, **settings)


def ran(slot: dt.datetime, **fields: Any) -> JobRun:
    return JobRun(name="nightly", slot=slot, attempt=1, status="succeeded", **fields)


# --- at start-up -------------------------------------------------------------------------


def test_a_job_that_never_ran_waits_for_its_next_slot() -> None:
    assert when.first_due(job(), at(11, 20), None) == at(12)


def test_a_job_whose_latest_slot_ran_waits_for_its_next_slot() -> None:
    assert when.first_due(job(), at(11, 20), ran(at(11))) == at(12)


def test_a_job_with_a_slot_unrun_since_its_latest_run_is_due_now() -> None:
    """Its catch-up decides what the start runs."""
    assert when.first_due(job(), at(11, 20), ran(at(9))) == at(11, 20)


def test_a_pending_retry_is_due_at_its_retry_at_unless_the_next_slot_comes_first() -> None:
    retrying = job(retries=2)
    assert when.first_due(retrying, at(11, 20), ran(at(11), retry_at=at(11, 30))) == at(11, 30)
    assert when.first_due(retrying, at(11, 20), ran(at(11), retry_at=at(12, 30))) == at(12)


def test_a_retry_at_is_not_followed_without_retries() -> None:
    """A row written with retries, read by a job declared without them."""
    assert when.first_due(job(), at(11, 20), ran(at(11), retry_at=at(11, 30))) == at(12)


def test_a_latest_slot_whose_jittered_start_is_still_to_come_is_due_then() -> None:
    """With a jitter, the slot of 11:00 may start after 11:00: a scheduler that comes up
    in between waits for that start, whether the job ran before or never did."""
    jittered = job(jitter=dt.timedelta(minutes=30))
    start = jittered.start_of(at(11))
    assert at(11) < start <= at(11, 30), "the test needs a slot that starts late"
    just_before = start - dt.timedelta(seconds=1)
    assert when.first_due(jittered, just_before, None) == start
    assert when.first_due(jittered, just_before, ran(at(9))) == start
    # Once it has started, the slot is unrun: due now.
    assert when.first_due(jittered, start, ran(at(9))) == start


# --- after a skip ------------------------------------------------------------------------


def test_after_a_skip_the_next_slots_start() -> None:
    assert when.after_skip(job(), None, None, at(11, 0, 2)) == at(12)


def test_after_a_skip_a_pending_retry_comes_first_but_never_before_now() -> None:
    assert when.after_skip(job(retries=1), at(11, 10), None, at(11, 0, 2)) == at(11, 10)
    assert when.after_skip(job(retries=1), at(10, 59), None, at(11, 0, 2)) == at(11, 0, 2)
    assert when.after_skip(job(retries=1), at(13), None, at(11, 0, 2)) == at(12)


@pytest.mark.parametrize(
    ("settings", "looks_again"),
    [({}, False), ({"retries": 1}, True), ({"overlap": make_overlap("buffer_one")}, True)],
    ids=["skip", "retries", "buffer_one"],
)
def test_a_job_that_rechecks_looks_again_just_after_the_holders_lease_ends(
    settings: dict[str, Any], looks_again: bool
) -> None:
    """Its run may fail and be retried, or its server may have died."""
    spec = job(**settings)
    expected = at(11, 20) + dt.timedelta(milliseconds=100) if looks_again else at(12)
    assert when.after_skip(spec, None, at(11, 20), at(11, 0, 2)) == expected
    # A lease that ends after the next slot's start: the next slot's start.
    assert when.after_skip(spec, None, at(12, 20), at(11, 0, 2)) == at(12)


def test_without_a_schedule_nothing_is_due() -> None:
    bare = Job("nightly", lambda: None)
    assert when.following(bare, at(11)) is None
    assert when.after_skip(bare, at(11, 10), None, at(11)) is None


def test_a_slot_and_its_start() -> None:
    jittered = job(jitter=dt.timedelta(minutes=30))
    slot, start = when.slot_and_start(jittered, at(11, 45))
    assert slot == at(11) and start == jittered.start_of(at(11))
    assert when.slot_and_start(job(), at(11, 45)) == (at(11), at(11))

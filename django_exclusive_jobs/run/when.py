"""When a scheduler starts each job next, as values: at start-up (its catch-up, a
pending retry, or its next slot) and after a skip (its next slot, or sooner). Each is a
computation of the job's schedule, so it may raise for a schedule that cannot be
computed; the scheduler makes such a job misconfigured."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..models import JobRun
    from .registry import Job


def first_due(job: Job, now: dt.datetime, last: JobRun | None) -> dt.datetime:
    """A job with slots unrun since its latest run (``last``) is due now (its catch-up);
    one whose current slot awaits a retry is due at its ``retry_at``; any other waits
    for its next slot's start. A job that never ran waits too. A latest slot whose start
    (with its jitter) is still to come is due then."""
    assert job.schedule is not None
    previous, _ = job.schedule.latest_at_or_before(now)
    following = job.start_of(job.schedule.next_after(now))
    last_slot = last.slot if last is not None else None
    unrun = last_slot is None or last_slot < previous
    if unrun and job.start_of(previous) > now:
        return job.start_of(previous)
    if last_slot is not None and last_slot < previous:
        return now
    if last is not None and last.retry_at is not None and job.retries:
        return min(last.retry_at, following)  # claim() decides
    return following


def following(job: Job, moment: dt.datetime) -> dt.datetime | None:
    """When the next slot after ``moment`` starts (with its jitter); None without a
    schedule."""
    schedule = job.schedule
    return None if schedule is None else job.start_of(schedule.next_after(moment))


def after_skip(
    job: Job, retry_at: dt.datetime | None, held_until: dt.datetime | None, now: dt.datetime
) -> dt.datetime | None:
    """When to try again after a skip: the next slot's start. With ``retries`` or a
    buffering ``overlap``, sooner: when the slot's pending retry (``retry_at``) is due,
    or when the holder's lease ends (``held_until``: its run may fail and be retried, or
    its server may have died: its run is then lost, and retried, or the slot that came
    during it is run). None without a schedule."""
    next_start = following(job, now)
    if next_start is None:
        return None
    if retry_at is not None:
        return min(max(retry_at, now), next_start)
    if job.rechecks and held_until is not None and held_until < next_start:
        return max(held_until, now) + dt.timedelta(milliseconds=100)
    return next_start


def slot_and_start(job: Job, due: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """The slot of ``job`` at or before ``due``, and when it starts (its jitter)."""
    assert job.schedule is not None
    slot = job.schedule.latest_at_or_before(due)[0]
    return slot, job.start_of(slot)

"""A job's next slots, as ``exclusive_jobs next`` and the admin's jobs page show them.

Each slot in UTC (what the history stores and compares) and on the clock of the job's
time zone, with its UTC offset: across a daylight-saving change a local time can be
missing or come twice, and only the offset tells which one a slot is. The slots are the
schedule's own (``Schedule.slots_after``); the start adds the job's jitter
(``Job.start_of``). Nothing here reads the database: the caller gives the time to start
from, on the database's clock.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from itertools import islice
from typing import Any

from .registry import Job

# More is refused: a long list is a job to script against the schedule, not a preview.
MAX_SLOTS = 1000


@dataclass(frozen=True)
class Upcoming:
    """One coming slot of a job."""

    slot: dt.datetime  # UTC
    local: dt.datetime  # the same instant on the job's zone's clock
    start: dt.datetime  # UTC: the slot plus the job's jitter for it

    def as_dict(self) -> dict[str, Any]:
        return {
            "slot": self.slot.isoformat(),
            "local": self.local.isoformat(),
            "start": self.start.isoformat(),
        }


def upcoming(job: Job, after: dt.datetime, count: int) -> list[Upcoming]:
    """The first ``count`` slots of ``job`` strictly after ``after``; none for a job
    without a schedule."""
    if job.schedule is None:
        return []
    zone = job.zone
    return [
        Upcoming(slot, slot.astimezone(zone), job.start_of(slot))
        for slot in islice(job.schedule.slots_after(after), count)
    ]

"""Retries: a failed run of a scheduled slot is run again, at most ``retries`` times.

Each attempt is a run of its own (same job and slot, ``attempt`` one higher). An attempt
that ended unsuccessful (failed, timed out, interrupted or lost) with attempts left gets
``retry_at``: its end plus the backoff, on the database's clock. Whichever start comes
first after that (any server's scheduler, the ``run_exclusive`` that ran it) runs the
next attempt. The backoff doubles per attempt (``retry_backoff * 2 ** (attempt - 1)``),
at most :data:`MAX_DELAY`; a retry that would come at or after the job's next slot is
not made: the newer slot wins and this attempt is the slot's last.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from .. import values
from ..lock.durations import DurationLike
from ..lock.errors import LockConfigurationError
from .schedules import Schedule

DEFAULT_BACKOFF = dt.timedelta(seconds=30)
MAX_DELAY = dt.timedelta(hours=1)
MAX_RETRIES = 100


@dataclass(frozen=True)
class Retries:
    """A job's retry policy (see the module docstring)."""

    count: int = 0
    backoff: dt.timedelta = DEFAULT_BACKOFF
    schedule: Schedule | None = None

    def delay(self, attempt: int) -> dt.timedelta:
        """How long after attempt ``attempt`` ended the next one may start."""
        doubled: dt.timedelta = self.backoff * 2 ** min(attempt - 1, 30)
        return min(doubled, MAX_DELAY)

    def retry_at(
        self, slot: dt.datetime | None, attempt: int, ended: dt.datetime
    ) -> dt.datetime | None:
        """When the attempt after ``attempt`` of ``slot`` may start (database time), or
        None when ``attempt`` is the slot's last: no attempts left, no slot, or the
        retry would not come before the next slot. Never before the slot itself: a cron
        line may start a slot a little early (its slot tolerance), and a retry served
        before its slot's time would be taken for the slot before."""
        if self.schedule is None or slot is None or attempt > self.count:
            return None
        when = max(ended + self.delay(attempt), slot)
        return when if when < self.schedule.next_after(slot) else None

    def describe(self, attempt: int, ended: str, retry_at: dt.datetime | None) -> str:
        """``attempt 1 of 3 failed; retry at T``: how an attempt ended, for its log line."""
        line = f"attempt {attempt} of {self.count + 1} {ended}"
        if retry_at is not None:
            line += f"; retry at {retry_at.isoformat(timespec='seconds')}"
        return line


def make_retries(retries: int, backoff: DurationLike | None) -> tuple[int, dt.timedelta]:
    """Check ``@exclusive_job(retries=..., retry_backoff=...)``."""
    if isinstance(retries, bool) or not isinstance(retries, int):
        raise LockConfigurationError(f"retries must be a whole number, got {retries!r}.")
    if not 0 <= retries <= MAX_RETRIES:
        raise LockConfigurationError(f"retries must be from 0 to {MAX_RETRIES}, got {retries}.")
    if backoff is None:
        return retries, DEFAULT_BACKOFF
    if not retries:
        raise LockConfigurationError("retry_backoff only applies with retries=N (N >= 1).")
    delta = values.duration(backoff, what="retry_backoff")
    return retries, delta

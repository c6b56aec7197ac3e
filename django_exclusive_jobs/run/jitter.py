"""Jitter: each slot's start, spread over ``[slot, slot + jitter)``.

Fifty hourly jobs would otherwise start in the same second on the same server. A slot's
offset is a pure function of the job's name and the slot, so every server (and every cron
line) computes the same start, and the slot a run serves is unchanged: de-duplication
works as without jitter.
"""

from __future__ import annotations

import datetime as dt
import hashlib

from .. import values
from ..lock.durations import DurationLike
from ..lock.errors import LockConfigurationError
from .schedules import Schedule

NONE = dt.timedelta(0)
MILLISECOND = dt.timedelta(milliseconds=1)


def offset(name: str, slot: dt.datetime, jitter: dt.timedelta) -> dt.timedelta:
    """How long after ``slot`` job ``name`` starts: in ``[0, jitter)``, whole milliseconds,
    the same in every process (a hash of the name and the UTC slot, never ``hash()``,
    which is salted per process)."""
    steps = jitter // MILLISECOND
    if steps <= 0:
        return NONE
    key = f"{name}\n{slot.astimezone(dt.UTC).isoformat()}".encode()
    number = int.from_bytes(hashlib.sha256(key).digest()[:8], "big")
    return (number * steps >> 64) * MILLISECOND  # integer arithmetic: never ``jitter``


def make_jitter(jitter: DurationLike | None, schedule: Schedule | None) -> dt.timedelta:
    """Check ``jitter=`` against the schedule it spreads; no jitter is ``timedelta(0)``.

    At most half the smallest gap between two slots (a cron's, over its next slots): a
    start delayed by its jitter then never passes for an early start of the next slot
    (which may come a third of a gap early, see ``Schedule.early_allowance``).
    """
    if jitter is None:
        return NONE
    delta = values.duration(jitter, what="jitter")
    if delta == NONE:
        return NONE
    if schedule is None:
        raise LockConfigurationError("jitter only applies with every= or cron=.")
    gap = schedule.smallest_gap(dt.datetime.now(dt.UTC))
    if delta > gap / 2:
        raise LockConfigurationError(
            f"jitter {delta} is more than half the smallest gap between the slots of "
            f"{schedule.describe()} ({gap}); use at most {gap / 2}."
        )
    return delta

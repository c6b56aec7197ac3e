"""Why a run starts: one value (:class:`Start`), with one constructor per reason.

A run serves its schedule's slot, started by a scheduler (:meth:`Start.slot`), by a
cron line (:meth:`Start.cron`), or by a direct call of the job (:meth:`Start.call`);
or it runs outside its schedule, asked for by someone (:meth:`Start.run_now`), or it
runs a past slot again (:meth:`Start.backfill`); a cron line's wait for a retry's
``retry_at`` starts the slot's next attempt (:meth:`Start.retry`). The run and its
claim ask the value what they need to know (its properties), never how it was built.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..models import RunRequest
    from .policies import Overlap
    from .schedules import Schedule


@dataclass(frozen=True)
class Start:
    """Why a run starts. Build it with a constructor: ``Start.slot(due)``, ``Start.cron()``,
    ``Start.call()``, ``Start.retry(due)``, ``Start.run_now(by, request=None)``,
    ``Start.backfill(slot, by)``."""

    reason: str = "call"  # slot, cron, call, retry, run_now, backfill (for messages, tests)
    # The scheduler's due slot, a retry's due time, or a cron line's slot start once it
    # was waited for: never served before it on the database's clock.
    due: dt.datetime | None = None
    waits: bool = False  # a cron line's start: wait first for the slot's start
    by: str = ""  # who asked (run now, a backfill): at most 255 characters
    request: RunRequest | None = None  # the row a scheduler serves (run now, a backfill)
    past_slot: dt.datetime | None = None  # the slot a backfill runs again, here

    # --- one constructor per reason -----------------------------------------------------

    @classmethod
    def call(cls) -> Start:
        """A direct call of the job (the decorated function, ``Run(job)``): the slot of
        the database's time, at once."""
        return cls()

    @classmethod
    def slot(cls, due: dt.datetime) -> Start:
        """The scheduler's start of a due slot (or of a retry's due time): never served
        before ``due`` on the database's clock."""
        return cls("slot", due=due)

    @classmethod
    def cron(cls, retry_at: dt.datetime | None = None) -> Start:
        """A cron line's start: first wait for the slot's start (the slot, or later by
        its jitter; a line that fires early waits for it too); with ``retry_at``, the
        start of the slot's next attempt (:meth:`retry`)."""
        return cls("cron", waits=True) if retry_at is None else cls.retry(retry_at)

    @classmethod
    def retry(cls, due: dt.datetime) -> Start:
        """A cron line's start of its slot's next attempt, once its ``retry_at`` (``due``)
        came: the same slot, never a later one, and no slot start to wait for."""
        return cls("retry", due=due)

    @classmethod
    def run_now(cls, by: str = "", request: RunRequest | None = None) -> Start:
        """A run outside the schedule, asked for by ``by`` and started here (``exclusive_jobs
        run-now``); or the run-now ``request`` a scheduler serves (with a slot: a backfill
        of that slot), asked for by whoever wrote it."""
        if request is not None:
            reason = "backfill" if request.slot is not None else "run_now"
            return cls(reason, by=request.requested_by[:255], request=request)
        return cls("run_now", by=by[:255])

    @classmethod
    def backfill(cls, slot: dt.datetime, by: str) -> Start:
        """A past ``slot`` run again, asked for by ``by``, here (``run/backfill.py``)."""
        return cls("backfill", by=by[:255], past_slot=slot)

    # --- what the run and its claim ask -------------------------------------------------

    @property
    def not_before(self) -> dt.datetime | None:
        """The slot's due time, never served before it on the database's clock (None:
        the slot of the database's time)."""
        return self.due

    @property
    def waits_for_start(self) -> bool:
        """A cron line's start: it waits for its slot's start first."""
        return self.waits

    @property
    def by_scheduler(self) -> bool:
        """A scheduler started it (a due slot, a request it serves): it looks again
        itself, in its loop, at a start that must wait."""
        return self.reason == "slot" or self.request is not None

    @property
    def requested_by(self) -> str:
        """Who asked for a run started here (run now, a backfill); "" otherwise (a
        request a scheduler serves says it on its row)."""
        return "" if self.request is not None else self.by

    @property
    def backfilled(self) -> bool:
        """It serves a past slot a backfill asked for, not its schedule's."""
        return self.past_slot is not None or (
            self.request is not None and self.request.slot is not None
        )

    @property
    def asked(self) -> bool:
        """Someone asked for it (run now, a backfill): it runs paused or not, outside
        the schedule's slots."""
        return bool(self.request or self.past_slot or self.by)

    @property
    def slot_asked(self) -> dt.datetime | None:
        """The slot a backfill runs (here, or a request's), if any."""
        return self.past_slot or (self.request.slot if self.request else None)

    def serves_its_slot(self, schedule: Schedule | None, overlap: Overlap) -> bool:
        """Whether it serves its schedule's slot: it asks in its look at the history
        whether any run was abandoned, and may read the job's operator row in the same
        statement. Run now, backfills, jobs without a schedule and
        ``overlap="allow_all"`` close abandoned runs first."""
        return not (overlap.lock_per_slot or schedule is None or self.asked)

    def waited(self, start: dt.datetime | None) -> Start:
        """After a cron line's wait for its slot's start: served from ``start``, as the
        scheduler serves its due slot (None: the slot of the database's time, for a due
        slot the database's clock was far from)."""
        return replace(self, due=start)

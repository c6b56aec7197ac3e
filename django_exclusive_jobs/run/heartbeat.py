"""The scheduler's heartbeat: one ``Scheduler`` row per running scheduler.

Operators and the health check tell "three schedulers alive" from "none since 02:14"
with it. Beats are written on the database's clock; rows of schedulers gone for a day
are deleted by the beats of the others.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db import connections

from .. import __version__
from ..lock.clock import DatabaseNow, database_time
from ..lock.lock import process
from ..lock.retry import run_statement

if TYPE_CHECKING:
    from ..models import SchedulerQuerySet

FORGET_EVERY = 60  # beats between two clean-ups of forgotten rows


@dataclass(frozen=True)
class Pulse:
    """What a beat read beside it on PostgreSQL, in the same statement: the live
    schedulers (instance, jobs, free) and the database's time (with the monotonic and
    wall times around the statement, for :meth:`DatabaseClock.observe`). Elsewhere the
    beat reads nothing: ``alive`` and ``clock`` are None, the caller reads them itself."""

    alive: list[tuple[str, list[str] | None, int | None]] | None = None
    clock: tuple[dt.datetime, float, float, float] | None = None


class Heartbeat:
    """Writes this scheduler's row: one UPDATE per beat (an INSERT the first time); on
    PostgreSQL the same statement reads the live schedulers and the clock."""

    def __init__(self, using: str, jobs: list[str]) -> None:
        self.using = using
        self.jobs = jobs
        self.beats = 0

    def _rows(self) -> SchedulerQuerySet:
        from ..models import Scheduler

        return Scheduler.objects.using(self.using)

    def beat(self, free: int | None = None) -> Pulse:
        """Say "alive" now, and how many more runs it could start (``free``, which work
        spread weighs: spread.py); may raise ``LockDatabaseError`` (the caller retries)."""
        forget = self.beats % FORGET_EVERY == 0
        pulse = Pulse()
        if connections[self.using].vendor == "postgresql":
            pulse, changed = self._beat_and_read(free, forget)
        else:
            said = {"last_beat_at": DatabaseNow(), "free": free}
            rows = self._rows()
            changed = run_statement(self.using, lambda: rows.record_beat(process.instance, **said))
            if forget:
                run_statement(self.using, lambda: self._rows().forgotten().delete())
        if not changed:
            self._first(free)
        self.beats += 1
        return pulse

    def _beat_and_read(self, free: int | None, forget: bool) -> tuple[Pulse, int]:
        """The beat, the live list and the clock: one statement (PostgreSQL)."""
        before, wall = time.monotonic(), time.time()
        beat = self._rows().beat_and_read
        changed, at, alive = run_statement(
            self.using, lambda: beat(process.instance, free, forget=forget)
        )
        clock = (database_time(connections[self.using], at), before, time.monotonic(), wall)
        if changed and not any(instance == process.instance for instance, _, _ in alive):
            alive.append((process.instance, self.jobs, free))  # its row, stale before the beat
        return Pulse(alive, clock), changed

    def _first(self, free: int | None) -> None:
        """The first beat: its row."""
        run_statement(
            self.using,
            lambda: self._rows().create(
                instance=process.instance,
                host=process.host,
                pid=process.pid,
                version=__version__,
                jobs=self.jobs,
                free=free,
                started_at=DatabaseNow(),
                last_beat_at=DatabaseNow(),
            ),
        )

    def stopped(self) -> None:
        """Mark this scheduler stopped (a clean exit), so it is not mistaken for a crash."""
        now = DatabaseNow()
        run_statement(
            self.using,
            lambda: self._rows().record_stop(process.instance, last_beat_at=now, stopped_at=now),
        )

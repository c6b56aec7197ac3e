"""The scheduler's heartbeat: one ``Scheduler`` row per running scheduler, and the look
for what changed that rides on it where the scheduler polls.

Operators and the health check tell "three schedulers alive" from "none since 02:14"
with it. Beats are written on the database's clock; rows of schedulers gone for a day
are deleted by the beats of the others. The statements are in ``models/beats.py``.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import connections

from .. import __version__
from ..lock.clock import DatabaseNow, database_time
from ..lock.lock import process
from ..lock.retry import run_statement

if TYPE_CHECKING:
    from ..models import SchedulerQuerySet
    from ..models.beats import Alive

FORGET_EVERY = 60  # beats between two clean-ups of forgotten rows
_T = TypeVar("_T")


@dataclass(frozen=True)
class Pulse:
    """What a beat or a look read beside it, in the same statement. ``alive``: the live
    schedulers (None: not read); ``clock``: the database's time, with the monotonic
    times around the statement and the wall clock before it (for
    :meth:`DatabaseClock.observe`; None: not read); ``waiting`` and ``overrides``: a
    look's (None: no look), how many requests of the jobs wait and their overrides'
    text."""

    alive: Alive | None = None
    clock: tuple[dt.datetime, float, float, float] | None = None
    waiting: int | None = None
    overrides: str | None = None


class Heartbeat:
    """Writes this scheduler's row: one statement per beat (an INSERT the first time);
    on PostgreSQL the same statement reads the live schedulers and the clock; where the
    scheduler polls, it can carry the look (:meth:`beat` with ``names``)."""

    def __init__(self, using: str, jobs: list[str], *, skips_schedules: bool = False) -> None:
        self.using = using
        self.jobs = jobs
        self.skips_schedules = skips_schedules
        self.beats = 0

    def _rows(self) -> SchedulerQuerySet:
        from ..models import Scheduler

        return Scheduler.objects.using(self.using)

    def _timed(self, statement: Callable[[], _T]) -> tuple[_T, float, float, float]:
        """``statement()`` (retried), with the monotonic times around it and the wall clock."""
        before, wall = time.monotonic(), time.time()
        result = run_statement(self.using, statement)
        return result, before, time.monotonic(), wall

    def _clock(
        self, at: Any, before: float, after: float, wall: float
    ) -> tuple[dt.datetime, float, float, float]:
        return (database_time(connections[self.using], at), before, after, wall)

    def beat(self, free: int | None = None, names: list[str] | None = None) -> Pulse:
        """Say "alive" now, and how many more runs it could start (``free``, which work
        spread weighs: spread.py); with ``names``, look for what changed for those jobs
        in the same statement where the database can (PostgreSQL: with the live list
        and the clock too). May raise ``LockDatabaseError`` (the caller retries)."""
        forget = self.beats % FORGET_EVERY == 0
        self.beats += 1
        if connections[self.using].vendor == "postgresql" and names is not None:
            return self._beat_and_read(free, names, forget)
        if forget:
            run_statement(self.using, lambda: self._rows().forgotten().delete())
        if names is not None:
            from ..models import beats

            row = self._row(free)
            looked, *timing = self._timed(lambda: beats.beat_and_look(self.using, row, names))
            if looked is not None:
                clock = self._clock(looked.at, *timing)
                return Pulse(None, clock, looked.waiting, looked.overrides)
        said = {"last_beat_at": DatabaseNow(), "free": free}
        rows = self._rows()
        if not run_statement(self.using, lambda: rows.record_beat(process.instance, **said)):
            self._first(free)
        return Pulse()

    def look(self, names: list[str]) -> Pulse:
        """One statement: how many requests of ``names`` wait, their overrides' text, the
        clock and the live schedulers (where it polls)."""
        from ..models import beats

        looked, *timing = self._timed(lambda: beats.look(self.using, names))
        clock = self._clock(looked.at, *timing)
        return Pulse(looked.alive, clock, looked.waiting, looked.overrides)

    def _beat_and_read(self, free: int | None, names: list[str], forget: bool) -> Pulse:
        """The beat, the live list, the clock and a look: one statement (PostgreSQL)."""
        from ..models import beats

        def read() -> tuple[int, Alive, beats.Look]:
            return beats.beat_and_read(self.using, process.instance, free, names, forget=forget)

        (changed, alive, looked), *timing = self._timed(read)
        if not changed:
            self._first(free)
        elif not any(instance == process.instance for instance, _, _ in alive):
            alive.append((process.instance, self.jobs, free))  # its row, stale before the beat
        return Pulse(alive, self._clock(looked.at, *timing), looked.waiting, looked.overrides)

    def _row(self, free: int | None) -> dict[str, Any]:
        """What its row says of it (beside the times its first beat writes)."""
        return {"instance": process.instance, "host": process.host, "pid": process.pid,
                "version": __version__, "jobs": self.jobs, "free": free,
                "skips_schedules": self.skips_schedules}  # fmt: skip

    def _first(self, free: int | None) -> None:
        """The first beat: its row."""
        row = {**self._row(free), "started_at": DatabaseNow(), "last_beat_at": DatabaseNow()}
        run_statement(self.using, lambda: self._rows().create(**row))

    def serve(self, jobs: list[str], *, written: bool) -> None:
        """It serves ``jobs`` now (a run-time schedule was added or went): its row says
        so (one statement, if ``written``), for work spread's view of who serves what."""
        self.jobs = jobs
        if written:
            rows = self._rows()
            run_statement(self.using, lambda: rows.record_beat(process.instance, jobs=jobs))

    def stopped(self) -> None:
        """Mark this scheduler stopped (a clean exit), so it is not mistaken for a crash."""
        now = DatabaseNow()
        run_statement(
            self.using,
            lambda: self._rows().record_stop(process.instance, last_beat_at=now, stopped_at=now),
        )

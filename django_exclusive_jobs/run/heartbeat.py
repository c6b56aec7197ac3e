"""The scheduler's heartbeat: one ``Scheduler`` row per running scheduler.

Operators and the health check tell "three schedulers alive" from "none since 02:14"
with it. Beats are written on the database's clock; rows of schedulers gone for a day
are deleted by the beats of the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import __version__
from ..lock.clock import DatabaseNow
from ..lock.lock import process
from ..lock.retry import run_statement

if TYPE_CHECKING:
    from ..models import SchedulerQuerySet

FORGET_EVERY = 60  # beats between two clean-ups of forgotten rows


class Heartbeat:
    """Writes this scheduler's row: one UPDATE per beat (an INSERT the first time)."""

    def __init__(self, using: str, jobs: list[str]) -> None:
        self.using = using
        self.jobs = jobs
        self.beats = 0

    def _rows(self) -> SchedulerQuerySet:
        from ..models import Scheduler

        return Scheduler.objects.using(self.using)

    def beat(self, free: int | None = None) -> None:
        """Say "alive" now, and how many more runs it could start (``free``, which work
        spread weighs: spread.py); may raise ``LockDatabaseError`` (the caller retries)."""
        said = {"last_beat_at": DatabaseNow(), "free": free}
        if not run_statement(
            self.using, lambda: self._rows().record_beat(process.instance, **said)
        ):
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
        if self.beats % FORGET_EVERY == 0:
            run_statement(self.using, lambda: self._rows().forgotten().delete())
        self.beats += 1

    def stopped(self) -> None:
        """Mark this scheduler stopped (a clean exit), so it is not mistaken for a crash."""
        now = DatabaseNow()
        run_statement(
            self.using,
            lambda: self._rows().record_stop(process.instance, last_beat_at=now, stopped_at=now),
        )

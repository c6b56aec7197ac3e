"""The runs one scheduler started and whose child has not ended yet, by the name of
their lock: the job's, so a job runs once at a time, or under ``overlap="allow_all"``
its slot's, so its slots run side by side. What is done to them: stopped when their lock
is lost, when a newer slot is due or asked for (``overlap="cancel_other"``), at shutdown;
reaped when they end."""

from __future__ import annotations

import datetime as dt
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..lock.lock import Lock
from ..logs import Line, line
from ..models import RunRequest
from . import control
from .process import JobProcess, Outcome
from .registry import Job
from .runner import Run
from .shutdown import KILL_AFTER
from .thread import JobThread

LOST_KILL_AFTER = 0.5  # seconds a job whose lock was lost gets before SIGKILL


@dataclass
class Active:
    """A run this scheduler started and whose child has not ended yet."""

    job: Job
    run: Run
    process: JobProcess | JobThread  # in_process=True: a thread of this process


class Running(dict[str, Active]):
    """The runs started here, by the name of their lock."""

    def waitables(self) -> list[Any]:
        """What the loop waits on besides its own wake-up: each child's end and reports."""
        return [waitable for active in self.values() for waitable in active.process.waitables()]

    def ended(self) -> list[tuple[str, Active, Outcome]]:
        """The runs whose child has exited, taken out (each with how it ended)."""
        done = []
        for name, active in list(self.items()):
            outcome = active.process.poll()
            if outcome is not None:
                del self[name]
                done.append((name, active, outcome))
        return done

    def lost(self, lock: Lock) -> None:
        """A running job's lock was found lost (keep-alive's thread): SIGTERM, then
        SIGKILL within a second, before another server can take the lock over (the
        watchdog gives up ahead of the lease's end)."""
        active = self.get(lock.name)
        if active is not None and active.run.lock is lock:
            active.process.stop(signal.SIGTERM, kill_after=LOST_KILL_AFTER)

    def stop_all(self) -> None:
        """Stop every run (the grace has ended)."""
        for active in self.values():
            active.process.stop(signal.SIGTERM, kill_after=KILL_AFTER)

    @property
    def stoppable(self) -> bool:
        """Whether a run it can still stop is going (in-process runs cannot be stopped)."""
        return any(active.process.stoppable for active in self.values())

    def supersede(
        self, active: Active, slot: dt.datetime, say: Callable[[Line, bool], None]
    ) -> None:
        """``overlap="cancel_other"``: ``slot``, a newer slot of a job running here, is
        due, so its run (of an older slot) is stopped; the newer slot starts once it has
        ended."""
        job, run = active.job, active.run
        if run.slot is None or run.slot >= slot or run.lock is None:
            return
        run.cancelled_by = run.lock.holder
        said = f"stopping {job.name}: slot {slot.isoformat()} is due (overlap=cancel_other)"
        say(line("stopping", said, job_name=job.name, slot=slot, token=run.lock.token), False)
        active.process.stop(signal.SIGTERM, kill_after=KILL_AFTER)

    def stop_asked(
        self, request: RunRequest, using: str, say: Callable[[Line, bool], None]
    ) -> None:
        """A newer slot's start asks the run holding ``request.stop_token`` to stop
        (``overlap="cancel_other"``): if it runs here, take the request and stop it.
        Raises LockDatabaseError if the request cannot be taken."""
        active = self.get(request.name)
        lock = active.run.lock if active is not None else None
        if active is None or lock is None or lock.token != request.stop_token:
            return  # another server's run, or one that has ended
        if not active.process.stoppable:
            return  # an in-process run (see thread.py): the request waits, unanswered
        if control.take(request, by=lock.holder, using=using):
            active.run.cancelled_by = request.requested_by
            said = f"stopping {request.name}: {request.requested_by} runs a newer slot"
            say(line("stopping", said, job_name=request.name, token=lock.token), False)
            active.process.stop(signal.SIGTERM, kill_after=KILL_AFTER)

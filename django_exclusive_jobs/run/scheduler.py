"""The scheduler: ``manage.py exclusive_scheduler`` on every server, each slot run once.

Every server runs the same scheduler. For each job with a schedule it sleeps until the
job's next slot on the database's clock, then starts the job as a cron line would (a
:class:`Run`: take the lock, claim the slot, record the run). One server wins the
slot and the others skip it. The winner runs the job in a child process
(:class:`JobProcess`), or for ``in_process=True`` in a thread (:class:`JobThread`), and
keeps the lease alive until it ends.

One thread decides and writes the history, on one connection; it waits on the next
slot, the children and the signals at once, so an idle scheduler sends nothing but its
heartbeat and a clock check.

This module is the loop; it stands on ``starts.py`` (starting the jobs due), which
stands on ``upkeep.py`` (the scheduler's state, heartbeat, clock and waits).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from contextlib import suppress
from typing import TYPE_CHECKING

from ..lock.acquire import prepare_locks
from ..lock.errors import LockDatabaseError
from ..lock.retry import run_statement
from ..logs import line
from . import control, overrides, runtime_schedules
from .heartbeat import Pulse
from .process import Outcome, shut_down, warm_up
from .running import Active
from .shutdown import stop_on_signals
from .starts import Starts
from .upkeep import beat_seconds

if TYPE_CHECKING:
    from ..models import RunRequest

logger = logging.getLogger("django_exclusive_jobs")

# Seconds between two looks for runs asked for now and operators' changes (one query,
# and one for what it found): always where it cannot listen, and on PostgreSQL while a
# request waits.
REQUEST_POLL = 5.0


class Scheduler(Starts):
    """Runs ``jobs`` at each of their slots, in cooperation with every other scheduler.

    :meth:`run` returns when :meth:`stop` is called (SIGTERM, SIGINT) and the running
    jobs have ended, or ``grace`` seconds later, after stopping them.
    """

    # --- the loop -----------------------------------------------------------------------

    def run(self) -> int:
        """Serve the jobs until stopped; 0 after a clean stop."""
        # SIGTERM and SIGINT only call stop(): nothing is raised inside a statement.
        try:
            with stop_on_signals(self.stop):
                self._begin()
                if self.run_for is not None:
                    self.deadline = time.monotonic() + self.run_for
                while not self.stopping:
                    self._reap()
                    if self._done():
                        self.stop()
                        break
                    self._keep_time()
                    self._start_requested()
                    self._start_due()
                    self._sleep()
                self._shut_down()
        finally:
            os.close(self._wake_read)
            os.close(self._wake_write)
        return 0

    def _done(self) -> bool:
        enough = self.max_runs is not None and self.ended_runs >= self.max_runs
        return enough or time.monotonic() >= self.deadline

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Take no new slot; let running jobs end within the grace (a second stop: now).

        Called from a signal handler: it only sets flags and wakes the loop, which does
        the stopping (nothing here may take a lock the interrupted code holds).
        """
        self.stops += 1
        self.stopping, self.stop_signal = True, signum
        if self.starting is not None:  # a start under way claims nothing more
            self.starting.pending_signal = signum
        with suppress(OSError):
            os.write(self._wake_write, b"x")

    def _begin(self) -> None:
        """Read the clock and each job's first due slot, waiting out a database outage."""
        while not self.stopping:
            try:
                run_statement(self.using, self.clock.sync)
                self._read_overrides()
                run_statement(self.using, self._first_due)
                prepare_locks(self.served.jobs, using=self.using)  # the first take logs no error
                self._beat(sync=False)
                self._listen()
            except LockDatabaseError as exc:
                self._pause(self.outage.failed(exc))
                continue
            self.outage.ended()
            self.began = True
            self.next_beat = time.monotonic() + beat_seconds()
            served = [*self.served.jobs.values(), *self.served.on_request.values()]
            if not all(job.runs_in_thread for job in served):
                warm_up()  # else started on first use (an override's timeout, say)
            said = (
                f"scheduler started: {len(self.served.jobs)} job(s), max {self.max_concurrent} at "
                f"once; the database's clock is {self.clock.offset:+.3f}s from this server's"
            )
            if self.skip_schedules:
                said += (
                    f"; schedules skipped (SKIP_SCHEDULES or --skip-schedules): no slot "
                    f"starts here, {len(self.served.on_request)} job(s) run when asked for now"
                )
            self.say(line("scheduler", said, status="started"))
            return

    def _start_requested(self) -> None:
        """Start the runs asked for now and the backfilled slots (``control.pending``: a
        job's slots oldest first), those it can, one per job at a time, as it learns of
        them (:meth:`_requests`). A request with a slot runs as a backfill of that slot,
        or is used up without a run if the slot has succeeded meanwhile
        (``history.claim``)."""
        fresh, self.fresh_look = self.fresh_look, None
        if self.stopping or not self._polls_requests:
            return
        if fresh is None and time.monotonic() < self.next_poll:
            return
        self.next_poll = time.monotonic() + REQUEST_POLL
        try:
            self._listen()  # again first, if its connection was cut: nothing is missed
            requests = self._requests(fresh)
        except LockDatabaseError as exc:
            self._database_down(exc)
            return
        for request in requests:  # stops first: a full scheduler still honours them
            if request.stop_token is not None:
                self._stop_asked(request)
        for request in requests:
            if request.stop_token is not None:
                continue
            if len(self.running) >= self.max_concurrent:
                return
            if request.name in self.served.misconfigured:
                continue  # waits until its row is put right
            if request.name not in self.running:
                self._start(self.served.on_request[request.name], self.clock.now(), request=request)

    def _requests(self, fresh: Pulse | None) -> list[RunRequest]:
        """The requests waiting, having followed the operators' overrides. Listening
        (PostgreSQL): both read at a NOTIFY, and while a request waits. Else one look
        (``fresh``: the one the beat of this turn carried) says whether any waits and
        whether an override changed; each is read only then."""
        names = sorted(self.served.on_request)
        if not self._looks:
            self._read_overrides()
            requests = control.pending(names, using=self.using)
            if self.listener.listening and not requests:
                self.next_poll = float("inf")  # until the next NOTIFY (listening.py)
            return requests
        look = fresh or self._look()
        if look.overrides != self.overrides_seen:
            self._read_overrides()
            self.overrides_seen = look.overrides
        return control.pending(names, using=self.using) if look.waiting else []

    def _read_overrides(self) -> None:
        """Follow the run-time schedules of its jobs and each job's operators' override
        (a query each, at each poll that finds a change); a job whose schedule changed,
        or that was put right, is due again from its schedule."""
        rows = runtime_schedules.read(list(self.served.code), using=self.using)
        added, gone = self.served.take_added(rows, self.clock.now(), self._misconfigure)
        for name in gone:
            self.due.pop(name, None)
            self.handoffs.forget(name)
            self.waiting.pop(name, None)
        if added or gone:
            self._serving()
        states = overrides.read(self.served.names, using=self.using)
        moved = self.served.follow(states, self.clock.now(), self._misconfigure)
        if (moved or added) and self.began:
            self._first_due(sorted({*moved, *added}))

    def _reap(self) -> None:
        """Finish the runs whose child has exited."""
        for name, active, outcome in self.running.ended():
            self.ended_runs += 1
            try:
                self._finish(active, outcome)
            except Exception as exc:  # a job_finished receiver that raises, say
                said = f"{name}: finishing its run failed: {exc}"
                fields = {"job_name": active.job.name, "error": type(exc).__name__}
                self.say(line("unrecorded", said, **fields), False)

    def _finish(self, active: Active, outcome: Outcome) -> None:
        """Release, record and report a run whose child exited, as run_exclusive would."""
        try:
            active.run.end_child(active.process, outcome)
        finally:  # even if a job_finished receiver raised
            self._keep_unwritten(active.run)
            if active.run.request is not None:
                # The job's next waiting request (a backfill's next slot) starts at once,
                # not at the next poll.
                self.next_poll = 0.0
            if active.run.retry_at is not None:
                # The slot's next attempt: here too, whichever server comes first.
                self._next(active.job, active.run.request, active.run.retry_at)
            self._its_turn(active.job)

    def _shut_down(self) -> None:
        """Let running jobs end within the grace, then stop them; mark this scheduler gone."""
        if self.running:
            said = (
                f"stopping: waiting up to {self.grace:g}s for {len(self.running)} running "
                f"job(s): {', '.join(sorted(self.running))}"
            )
            self.say(line("scheduler", said, status="stopping"), False)
        deadline = time.monotonic() + self.grace
        while self.running and time.monotonic() < deadline and self.stops < 2:
            self._wait(min(1.0, deadline - time.monotonic()))
            self._reap()
            self._keep_time()  # still alive while its jobs end
        self.running.stop_all()
        while self.running.stoppable:
            self._wait(0.2)
            self._reap()
        try:
            self._write_unwritten_ends()
        except LockDatabaseError as exc:
            said = f"could not record the end of {len(self.unwritten)} run(s): {exc}"
            self.say(line("unrecorded", said, error=type(exc).__name__), False)
        try:
            if self.began:  # a scheduler that never reached the database has no row
                self.heartbeat.stopped()
        except LockDatabaseError as exc:
            said = f"could not mark this scheduler stopped: {exc}"
            self.say(line("scheduler", said, status="stopped", error=type(exc).__name__), False)
        shut_down()
        self._reap()  # an in-process run that has just ended is recorded, not left
        if self.running:  # in-process runs: nothing can stop them (see thread.py)
            self.left_running = sorted(self.running)
            said = (
                f"leaving {len(self.running)} in-process run(s) to their lease: "
                f"{', '.join(self.left_running)} (not released; the server that takes "
                "the lock over records the run)"
            )
            self.say(line("scheduler", said, status="stopping"), False)
        self.say(line("scheduler", "scheduler stopped", status="stopped"))

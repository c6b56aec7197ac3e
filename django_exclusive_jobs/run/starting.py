"""How a run starts: a cron line waits for its slot's start, take the job's lock (or, under
``overlap="cancel_other"``, have an older slot's run stop), claim its slot in the history
(recording missed ones), and say so; or why it does not run (a SKIPPED result)."""

from __future__ import annotations

import datetime as dt
import time
from typing import TYPE_CHECKING, Any

from .. import signals
from ..conf import app_settings
from ..lock.acquire import acquire_or_raise
from ..lock.clock import DatabaseClock, database_now
from ..lock.errors import LockHeld
from ..lock.lock import Lock, process
from ..lock.retry import run_statement
from ..lock.validation import resolve_alias
from ..logs import Line, line
from ..naming import holder_name
from . import claim, end_rows, groups, history, overrides, run_requests, slot_locks
from .ending import RunResult
from .finishing import Finishing
from .long_runs import LongRunWatch
from .status import RunStatus

if TYPE_CHECKING:
    from ..models import JobState

EARLY_WAIT_LIMIT = 2.0  # seconds a start that came early waits for its slot without a word
JITTER_TICK = 0.1  # seconds between two looks for a stop while waiting for a slot's start


class Starting(Finishing):
    """The run's start (the floor above :class:`Finishing`: a start that cannot go on
    once it holds the lock finishes the run)."""

    def start(self) -> Lock | RunResult:
        """Take the lock and claim the run; a SKIPPED result if another has either.

        Never re-entrant: a second run of the job in this thread (a job calling itself,
        or another async call sharing Django's sync thread) skips like any other server.
        A start that waits its turn in its concurrency group (``groups.py``) looks again
        here, unless a scheduler started it (it looks again itself).
        """
        if self.reason.waits_for_start:
            stopped = self._wait_for_start()
            if stopped is not None:
                return stopped
        said = False
        while True:
            started = self._start_once()
            if not isinstance(started, RunResult) or not started.waiting:
                return started
            if self.reason.by_scheduler:
                return started
            if not said:
                said = True
                waiting = f"waiting for {self.name}: {started.waiting}"
                self._say(line("waiting", waiting, job_name=self.name, slot=self.slot))
            if not self._turn_came():
                return RunResult(self.name, RunStatus.INTERRUPTED, signum=self.pending_signal)

    def _turn_came(self) -> bool:
        """Wait until the job's groups are free (a look each ``groups.LOOK`` seconds);
        False: a stop came first."""
        while True:
            looked = time.monotonic()
            while self.pending_signal is None and time.monotonic() - looked < groups.LOOK:
                time.sleep(JITTER_TICK)
            if self.pending_signal is not None:
                return False
            if groups.free(self.job):
                return True

    def _start_once(self) -> Lock | RunResult:
        """One take of the lock and claim of the run."""
        self.lock_slot = self._slot_of_lock()
        if self.lock_slot is not None:
            using = resolve_alias(self.job.using)
            self.lock_name = slot_locks.prepare(self.name, self.lock_slot, using=using)
        lock = self._take_or_skip()
        if isinstance(lock, RunResult):
            return lock
        acquired = time.monotonic()  # just after acquired_at on the database's clock
        keepalive = app_settings.KEEPALIVE if self.job.keepalive is None else self.job.keepalive
        if keepalive:  # from now: writing history may be slow (busy retries)
            lock.start_keepalive()
        try:
            skipped = self._claim(lock)
        except BaseException:
            groups.release(self.group_locks)
            lock.release()  # never leave the lock held because history failed
            raise
        if skipped is not None:
            groups.release(self.group_locks)
            self.group_locks = []
            lock.release()
            return skipped
        if keepalive:
            for group in self.group_locks:
                group.start_keepalive()
        self.lock = lock
        self._started = time.monotonic()
        self._acquired = acquired
        if self.job.warn_seconds is not None:
            self._long = LongRunWatch(
                self.name, lock, self.slot, self.job.warn_seconds, self._say_long
            )
            self._long.start()
        try:
            self._say_acquired(lock)
        except BaseException as exc:
            # A failing job_started receiver (or a log handler): the run ends here,
            # recorded and released, never left 'running' under a renewed lease.
            result = self.begin(lock)
            self.record(result, exc)
            self.finish(result)
            raise
        return lock

    def _take_groups(self, decided: claim.Decision) -> claim.Decision:
        """What the claim ``decided``, once the job's groups (``groups.py``) are taken if
        it runs; else what it does while another member's run holds one."""
        if decided.insert is None:
            return decided
        taken = groups.take(self.job)
        if isinstance(taken, groups.Busy):
            return claim.held_by_group(decided, taken, not self.job.overlap.waits_for_group)
        self.group_locks = taken
        return decided

    def _take_or_skip(self) -> Lock | RunResult:
        """The job's lock (under ``overlap="cancel_other"``, perhaps once its holder, an
        older slot's run, has stopped); else the run's end: INTERRUPTED if a stop came
        while it waited, else SKIPPED (held by another)."""
        try:
            return self._take(self.job.wait)
        except LockHeld as held:
            if self.pending_signal is not None:
                return RunResult(self.name, RunStatus.INTERRUPTED, signum=self.pending_signal)
            taken = self._cancel_other(held)
            if taken is not None:
                return taken
            until = held.expires_at.isoformat(timespec="seconds") if held.expires_at else "?"
            return self._skipped(
                f"held by {held.holder or '?'} until {until}", held.holder, held.expires_at
            )

    def _say_acquired(self, lock: Lock) -> None:
        """The run has its lock and its slot: one line, and job_started."""
        slot = f" slot={self.slot.isoformat()}" if self.slot else ""
        own = f" lock={lock.name}" if lock.name != self.name else ""  # allow_all's
        said = f"acquired {self.name} token={lock.token} holder={lock.holder}{slot}{own}"
        self._say(
            line(
                "acquired",
                said,
                job_name=self.name,
                token=lock.token,
                holder=lock.holder,
                slot=self.slot,
                attempt=self.attempt,
                lock=lock.name if own else None,
            )
        )
        signals.lock_lost.connect(self._lost_receiver, sender=Lock)
        signals.job_started.send(
            sender=self.name,
            name=self.name,
            lock=lock,
            slot=self.slot,
            attempt=self.attempt,
            backfill=self.backfilled,
            in_process=self.in_process,
        )

    def _say_long(self, said: Line) -> None:
        self._say(said, normal=False)

    def _slot_of_lock(self) -> dt.datetime | None:
        """``overlap="allow_all"``: the slot whose own lock this run takes (see
        ``slot_locks.py``); None: the job's lock (every other policy, a run with no slot)."""
        if not self.job.overlap.lock_per_slot or self.job.schedule is None:
            return None
        if self.reason.asked:  # a backfill's slot; None: run now
            return self.reason.slot_asked
        return self._due_slot()

    def _due_slot(self) -> dt.datetime:
        """The slot this start is for, before its lock is taken: the scheduler's due
        slot (``not_before``), else the slot of the database's time, as the claim finds
        it (one read of the clock)."""
        self._in_force()  # the slot is the schedule's in force
        schedule = self.job.schedule
        assert schedule is not None
        if self.reason.not_before is not None:
            return schedule.latest_at_or_before(self.reason.not_before)[0]
        using = resolve_alias(self.job.using)
        return schedule.slot_at(run_statement(using, lambda: database_now(using)))

    def _take(self, wait: Any) -> Lock:
        return acquire_or_raise(
            self.lock_name,
            ttl=self.job.ttl,
            min_hold=self.job.min_hold,
            wait=wait,
            using=self.job.using,
            reentrant=False,
            stop_waiting=lambda: self.pending_signal is not None,
        )

    def _cancel_other(self, held: LockHeld) -> Lock | None:
        """``overlap="cancel_other"``: if the holder runs an older slot than this start's
        (one look at its run, by its token), ask it to stop and take the lock once it has,
        within ``cancel_wait``. None: a skip as any other (the holder serves this slot or
        a newer one, is a manual run, has not claimed its slot yet, or did not stop in
        time)."""
        schedule = self.job.schedule
        if not self.job.overlap.stops_older_run or self.cancel_wait is None or schedule is None:
            return None
        if held.token is None:
            return None
        from ..models import JobRun  # models: not before apps are ready

        using = resolve_alias(self.job.using)
        slot = self._due_slot()
        runs, token = JobRun.objects.using(using), held.token
        older = run_statement(using, lambda: runs.slot_running_under(self.name, token))
        if older is None or older >= slot:
            return None
        me = holder_name(process.host, process.pid, process.instance)
        if run_requests.ask_to_stop(self.name, token=held.token, by=me, using=using):
            said = (
                f"cancelling {self.name}: asked its run token={held.token} by {held.holder} to "
                f"stop, for slot {slot.isoformat()} (overlap=cancel_other)"
            )
            fields = {"token": held.token, "holder": held.holder, "slot": slot}
            self._say(line("cancelling", said, job_name=self.name, **fields), normal=False)
        self.stop_asked = True
        if self.cancel_wait <= 0:
            return None
        try:
            return self._take(self.cancel_wait)
        except LockHeld:
            return None

    def _claim(self, lock: Lock) -> RunResult | None:
        """Write this run's history row; a SKIPPED result if its slot already has a run.

        A stop asked for while the lock was being taken ends here, before the slot is
        used up: the result is INTERRUPTED and nothing is written.
        """
        if self.pending_signal is not None:
            return RunResult(self.name, RunStatus.INTERRUPTED, signum=self.pending_signal)
        if not lock.held:  # taking it took longer than its lease: claim nothing
            return self._skipped("the lease ran out while the lock was being taken", "", None)
        not_before = self._on_time(lock)
        looked = None
        declared = self.job
        its_slot = self.reason.serves_its_slot(declared.schedule, declared.overlap)
        if its_slot and not self._state_read:  # the operator row, read with the look
            assert declared.schedule is not None
            looked = history.look(lock, self.name, declared.schedule, not_before)
        state = self._in_force(looked)
        if self.job.overlap.stops_older_run:  # stops asked of runs before ours are moot
            run_requests.close_stops(self.name, below=lock.token, using=lock.using)
        # The start as served now: a due slot the database's clock was far from is the
        # slot of its time (see _on_time).
        start = self.reason.waited(not_before)
        claimed = history.claim(
            lock,
            self.job,
            start,
            slot=self.lock_slot,
            state=state,
            looked=looked,
            groups=self._take_groups if self.job.groups else None,
        )
        self.slot, self.more_due = claimed.slot, claimed.more
        self.retry_at = claimed.retry_at
        self._say_missed(lock, claimed.missed, claimed.replaced)
        self._say_skipped(claimed.skipped)
        if claimed.waits:  # said once by whoever looks again
            return RunResult(self.name, RunStatus.SKIPPED, holder=lock.holder, waiting=claimed.why)
        if claimed.run is None:
            return self._skipped(claimed.why, lock.holder, None)
        if end_rows.is_ours(claimed.run, lock):
            self.run_id, self.attempt = claimed.run.pk, claimed.run.attempt
            return None
        slot = self.slot.isoformat() if self.slot else "?"
        run = claimed.run
        return self._skipped(
            f"slot {slot} already run by {run.holder} ({run.status})", run.holder, None
        )

    def _in_force(self, looked: history.Look | None = None) -> JobState | None:
        """Read what operators decided about the job (once per run: a pause, an
        override), unless it was read with the look at the history (``looked``), and
        run the job as they override it (see ``overrides.py``)."""
        if not self._state_read:
            if looked is not None:
                self._state = looked.state
            else:
                self._state = history.job_state(self.name, using=resolve_alias(self.job.using))
            self.job = overrides.in_force(self.job, self._state)
            self._state_read = True
        return self._state

    def _wait_for_start(self) -> RunResult | None:
        """A cron line fires at the slot; the slot starts then, or later by its jitter:
        wait for that on the database's clock, then serve the slot as the scheduler does
        (from ``not_before``). A line that fires early (a clock ahead: within the slot
        tolerance) waits too, so that no run starts before its slot; it says so when it
        waits longer than the scheduler would without a word (``EARLY_WAIT_LIMIT``). A
        line that fires after the start goes at once. A stop while waiting ends the run
        before anything is taken: an INTERRUPTED result."""
        if self.job.schedule is None:
            return None
        self._in_force()  # the slot to wait for is the schedule's in force
        schedule = self.job.schedule
        assert schedule is not None
        clock = DatabaseClock(resolve_alias(self.job.using))
        run_statement(clock.using, clock.sync)
        slot = schedule.slot_at(clock.now())
        start = self.job.start_of(slot)
        if (wait := clock.seconds_until(start)) <= 0:
            return None
        if self.job.jitter or wait > EARLY_WAIT_LIMIT:
            why = " (jitter)" if self.job.jitter else ""
            said = (
                f"waiting for {self.name}: slot={slot.isoformat()} starts at "
                f"{start.isoformat(timespec='milliseconds')}{why}"
            )
            self._say(line("waiting", said, job_name=self.name, slot=slot, until=start))
        while self.pending_signal is None and (left := clock.seconds_until(start)) > 0:
            time.sleep(min(left, JITTER_TICK))
        if self.pending_signal is not None:
            return RunResult(self.name, RunStatus.INTERRUPTED, signum=self.pending_signal)
        self.reason = self.reason.waited(start)
        return None

    def _on_time(self, lock: Lock) -> dt.datetime | None:
        """The scheduler's due slot (``not_before``), once the database's clock has
        reached it: a lock taken a little early waits the difference. Taken far earlier
        (the scheduler's estimate of the clock is off, or the job's database has a clock
        of its own): None, and the run serves the slot of the database's time, as a cron
        line would (``early`` tells the scheduler to read the clock again)."""
        not_before = self.reason.not_before
        if not_before is None or lock.acquired_at is None:
            return not_before
        early = (not_before - lock.acquired_at).total_seconds()
        if early > EARLY_WAIT_LIMIT:
            self.early = True
            return None
        if early > 0:
            time.sleep(early)
        return not_before

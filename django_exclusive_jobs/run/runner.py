"""The run layer: take a job's lock, run it with keep-alive, say one line per decision.

Used by ``@exclusive_job`` and ``manage.py run_exclusive``. The lock engine decides who
holds a lock; this module decides what a run looks like: history, signals, log lines,
how it ended, shutdown on SIGTERM/SIGINT, and exit codes.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import signals
from ..lock.acquire import acquire_or_raise
from ..lock.durations import DurationLike
from ..lock.errors import JobLockError, LockHeld, LockLost
from ..lock.lock import Lock
from . import history
from .catchup import CatchUp
from .child import ChildExit
from .schedules import Schedule
from .shutdown import Interrupted
from .status import RunStatus
from .tasks import Enqueued

if TYPE_CHECKING:
    from ..models import RunRequest

logger = logging.getLogger("django_exclusive_jobs")

# Exit codes of ``manage.py run_exclusive`` (documented in the README and --help).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_DATABASE = 3
EXIT_LOST = 4

EARLY_WAIT_LIMIT = 2.0  # seconds a start that came early waits for its slot; more: retry


@dataclass
class RunResult:
    """How one call of a job went: ``status`` is a :class:`RunStatus` value."""

    name: str
    status: RunStatus
    value: Any = None
    exception: BaseException | None = None
    duration: float = 0.0
    token: int | None = None
    holder: str = ""
    held_until: dt.datetime | None = None
    returncode: int | None = None  # a child program's own exit code
    signum: int | None = None
    enqueued: Enqueued | None = None  # the task result, for a django.tasks job

    @property
    def exit_code(self) -> int:
        if self.status in (RunStatus.SUCCEEDED, RunStatus.SKIPPED, RunStatus.ENQUEUED):
            return EXIT_OK
        if self.status == RunStatus.INTERRUPTED and self.signum:
            return 128 + self.signum
        if self.status == RunStatus.LOST:
            return EXIT_LOST
        if self.returncode:
            return self.returncode if self.returncode > 0 else 128 - self.returncode
        return EXIT_FAILED


@dataclass
class JobRunner:
    """Runs one job under its lock. One instance per run; not shared between threads.

    The lifecycle, shared by sync and async callers: :meth:`start` (take the lock, claim
    the slot); :meth:`begin`; inside one ``try``, :meth:`ensure_lease_left` and the job,
    with :meth:`record` for its exception; then :meth:`finish` (release, history, signals).
    """

    name: str
    ttl: DurationLike | None = None
    min_hold: DurationLike | None = None
    wait: DurationLike | None = None
    using: str | None = None
    keepalive: bool = True
    # Called with each decision line and whether it is the normal path (True) or not.
    report: Callable[[str, bool], None] | None = None
    on_lost: Callable[[Lock], None] | None = None
    schedule: Schedule | None = None
    catch_up: CatchUp = field(default_factory=CatchUp)
    retry_failed: bool = False
    lock: Lock | None = field(default=None, init=False)
    run_id: int | None = field(default=None, init=False)
    in_job: bool = field(default=False, init=False)
    pending_signal: int | None = field(default=None, init=False)
    slot: dt.datetime | None = field(default=None, init=False)
    more_due: bool = field(default=False, init=False)  # catch_up="all" has more to run
    request: RunRequest | None = field(default=None, init=False)  # a run asked for now
    requested_by: str = field(default="", init=False)  # a manual run started here
    # The scheduler's due slot: the run never serves a slot before its time on the
    # database's clock. ``early``: the lock came too early for it (nothing was claimed).
    not_before: dt.datetime | None = field(default=None, init=False)
    early: bool = field(default=False, init=False)
    # Writes this run's end later, when the database could not be reached at its end.
    unwritten_end: Callable[[], None] | None = field(default=None, init=False)
    _started: float = field(default=0.0, init=False)

    def run(self, target: Callable[[Lock], Any]) -> RunResult:
        """Start, run ``target(lock)``, finish. The job's errors become the result."""
        started = self.start()
        if isinstance(started, RunResult):
            return started
        result = self.begin(started)
        try:
            self.in_job = True
            if self.pending_signal is not None:  # arrived while taking the lock
                raise Interrupted(self.pending_signal)
            self.ensure_lease_left(started)
            result.value = target(started)
        except BaseException as exc:
            self.record(result, exc)
            if not isinstance(exc, (Exception, Interrupted)):
                self.in_job = False
                self.finish(result)
                raise
        finally:
            self.in_job = False
        self.finish(result)
        if self.pending_signal is not None and result.status != RunStatus.INTERRUPTED:
            # The signal came while the lock was being released: the job had ended, but
            # the process was still asked to stop.
            result.status, result.signum = RunStatus.INTERRUPTED, self.pending_signal
        return result

    def start(self) -> Lock | RunResult:
        """Take the lock and claim the run; a SKIPPED result if another has either.

        Never re-entrant: a second run of the job in this thread (a job calling itself,
        or another async call sharing Django's sync thread) skips like any other server.
        """
        try:
            lock = acquire_or_raise(
                self.name,
                ttl=self.ttl,
                min_hold=self.min_hold,
                wait=self.wait,
                using=self.using,
                reentrant=False,
                stop_waiting=lambda: self.pending_signal is not None,
            )
        except LockHeld as held:
            if self.pending_signal is not None:
                return RunResult(self.name, RunStatus.INTERRUPTED, signum=self.pending_signal)
            until = held.expires_at.isoformat(timespec="seconds") if held.expires_at else "?"
            return self._skipped(
                f"held by {held.holder or '?'} until {until}", held.holder, held.expires_at
            )
        if self.keepalive:  # from now: writing history may be slow (busy retries)
            lock.start_keepalive()
        try:
            skipped = self._claim(lock)
        except BaseException:
            lock.release()  # never leave the lock held because history failed
            raise
        if skipped is not None:
            lock.release()
            return skipped
        self.lock = lock
        self._started = time.monotonic()
        try:
            slot = f" slot={self.slot.isoformat()}" if self.slot else ""
            self._say(f"acquired {self.name} token={lock.token} holder={lock.holder}{slot}")
            signals.lock_lost.connect(self._lost_receiver, sender=Lock)
            signals.job_started.send(sender=self.name, name=self.name, lock=lock)
        except BaseException as exc:
            # A failing job_started receiver (or a log handler): the run ends here,
            # recorded and released, never left 'running' under a renewed lease.
            result = self.begin(lock)
            self.record(result, exc)
            self.finish(result)
            raise
        return lock

    def begin(self, lock: Lock) -> RunResult:
        """The result the job's run fills in."""
        return RunResult(self.name, RunStatus.SUCCEEDED, token=lock.token)

    @staticmethod
    def ensure_lease_left(lock: Lock) -> None:
        """Refuse to start the job if setting up the run outlasted the lease.

        Writing the run row may have waited on a slow or reconnecting database; by then
        another server may hold the lock, so the job must not start.
        """
        if not lock.held:
            raise LockLost(lock.name, lock.token, "the lease ran out before the job started")

    def record(self, result: RunResult, exc: BaseException) -> None:
        """Set the status a job's exception means."""
        if isinstance(exc, Interrupted):
            result.status, result.signum = RunStatus.INTERRUPTED, exc.signum
        elif isinstance(exc, LockLost):
            result.status = RunStatus.LOST
        elif isinstance(exc, Exception):
            result.status = RunStatus.FAILED
            logger.error("job %s failed", self.name, exc_info=exc)
        else:  # KeyboardInterrupt, CancelledError, SystemExit
            result.status = RunStatus.INTERRUPTED
        result.exception = exc

    def finish(self, result: RunResult, *, ended: float | None = None) -> RunResult:
        """Stop keep-alive, release (min_hold honoured), record, say and signal the end.

        ``ended``: when the job ended (monotonic), if known better than "now".
        """
        lock = self.lock
        assert lock is not None
        result.duration = (ended or time.monotonic()) - self._started
        lock.stop_keepalive()
        signals.lock_lost.disconnect(self._lost_receiver, sender=Lock)
        try:
            lock.release()
        except JobLockError as exc:
            logger.error(
                "could not release %s token=%s (its lease ends by itself within %s): %s",
                self.name,
                lock.token,
                lock.ttl,
                exc,
            )
        # Checked after release(): that is where a lock force-released mid-run is found.
        if lock.lost and result.status != RunStatus.INTERRUPTED:
            result.status = RunStatus.LOST
        if isinstance(result.value, ChildExit):
            result.returncode = result.value.returncode
            if result.returncode != 0 and result.status == RunStatus.SUCCEEDED:
                result.status = RunStatus.FAILED
        if isinstance(result.value, Enqueued):
            result.enqueued = result.value
        if result.enqueued is not None and result.status == RunStatus.SUCCEEDED:
            result.status = RunStatus.ENQUEUED
        if self.run_id is not None:
            self.unwritten_end = history.record_end(
                lock,
                self.run_id,
                status=result.status,
                duration=result.duration,
                exception=result.exception,
                returncode=result.returncode,
                enqueued=result.enqueued,
            )
        self._say_finished(lock, result)
        return result

    def on_signal(self, signum: int) -> None:
        """SIGTERM/SIGINT: stop the job if it is running, else finish the lock work first.

        Raising inside a lock statement could leave the lock held until its lease ends,
        so outside the job body the signal is only remembered.
        """
        if self.in_job:
            self.in_job = False  # a second signal must not cut the release short
            self.pending_signal = signum
            raise Interrupted(signum)
        self.pending_signal = signum

    def _claim(self, lock: Lock) -> RunResult | None:
        """Write this run's history row; a SKIPPED result if its slot already has a run.

        A stop asked for while the lock was being taken ends here, before the slot is
        used up: the result is INTERRUPTED and nothing is written.
        """
        if self.pending_signal is not None:
            return RunResult(self.name, RunStatus.INTERRUPTED, signum=self.pending_signal)
        if not lock.held:  # taking it took longer than its lease: claim nothing
            return self._skipped("the lease ran out while the lock was being taken", "", None)
        if not self._on_time(lock):
            self.early = True
            return RunResult(self.name, RunStatus.SKIPPED)
        claim = history.claim(
            lock,
            self.name,
            not_before=self.not_before,
            schedule=self.schedule,
            catch_up=self.catch_up,
            retry_failed=self.retry_failed,
            request=self.request,
            requested_by=self.requested_by,
        )
        self.slot, self.more_due = claim.slot, claim.more
        self._say_missed(lock, claim.missed)
        if claim.run is None:
            return self._skipped(claim.why, lock.holder, None)
        if history.is_ours(claim.run, lock):
            self.run_id = claim.run.pk
            return None
        slot = self.slot.isoformat() if self.slot else "?"
        run = claim.run
        return self._skipped(
            f"slot {slot} already run by {run.holder} ({run.status})", run.holder, None
        )

    def _on_time(self, lock: Lock) -> bool:
        """Wait until ``not_before`` if the lock came a little early on the database's
        clock; False (claim nothing) if it came so early that the clock estimate is off."""
        if self.not_before is None or lock.acquired_at is None:
            return True
        early = (self.not_before - lock.acquired_at).total_seconds()
        if early > EARLY_WAIT_LIMIT:
            return False
        if early > 0:
            time.sleep(early)
        return True

    def _say_missed(self, lock: Lock, missed: list[dt.datetime]) -> None:
        """One line for the slots this start found missed, and a signal for each."""
        if not missed:
            return
        first, last = missed[0].isoformat(), missed[-1].isoformat()
        span = first if len(missed) == 1 else f"{first} .. {last}"
        self._say(
            f"missed {self.name}: {len(missed)} slot(s) no server ran, {span}; recorded",
            normal=False,
        )
        for slot in missed:
            # Robust: the rows are written; a receiver that raises must not undo the run.
            answers = signals.slot_missed.send_robust(
                sender=self.name, name=self.name, slot=slot, noticed_by=lock.holder
            )
            for receiver, answer in answers:
                if isinstance(answer, Exception):
                    logger.error("slot_missed receiver %r raised", receiver, exc_info=answer)

    def _skipped(self, why: str, holder: str, until: dt.datetime | None) -> RunResult:
        self._say(f"skipped {self.name}: {why}")
        extra = {"slot": self.slot} if self.slot is not None else {}
        signals.job_skipped.send(
            sender=self.name, name=self.name, holder=holder, expires_at=until, **extra
        )
        return RunResult(self.name, RunStatus.SKIPPED, holder=holder, held_until=until)

    def _say(self, line: str, *, normal: bool = True) -> None:
        """One line per decision: to the log, and to ``report`` (the command's output)."""
        logger.log(logging.INFO if normal else logging.WARNING, line)
        if self.report is not None:
            self.report(line, normal)

    def _say_finished(self, lock: Lock, result: RunResult) -> None:
        detail = ""
        if result.returncode not in (None, 0):
            detail = f" exit={result.returncode}"
        if result.enqueued is not None:
            detail += f" task={result.enqueued.result_id} backend={result.enqueued.backend}"
        if result.exception is not None:
            exc = result.exception
            message = getattr(exc, "message", None) or exc
            detail += f" error={history.error_type(exc)}: {message}"
        self._say(
            f"finished {self.name} status={result.status.value} "
            f"duration={result.duration:.3f}s token={lock.token}{detail}",
            normal=result.status in (RunStatus.SUCCEEDED, RunStatus.ENQUEUED),
        )
        signals.job_finished.send(
            sender=self.name,
            name=self.name,
            lock=lock,
            status=result.status.value,
            duration=result.duration,
            exception=result.exception,
        )

    def _lost_receiver(self, sender: Any, lock: Lock, reason: str, **kwargs: Any) -> None:
        if lock is self.lock and self.on_lost is not None:
            self.on_lost(lock)

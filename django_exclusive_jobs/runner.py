"""The run layer: take a job's lock, run it with keep-alive, report one line per decision.

Used by ``@exclusive_job`` and ``manage.py run_exclusive``. The lock engine decides who
holds a lock; this module decides what a run looks like: signals, log lines, outcomes,
shutdown on SIGTERM/SIGINT, and exit codes.
"""

from __future__ import annotations

import datetime as dt
import enum
import logging
import os
import signal
import subprocess
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError
from django.db.models import F

from . import signals
from .dbtime import DatabaseNow
from .durations import DurationLike
from .exceptions import JobLockError, LockHeld, LockLost
from .locks import Lock, acquire_or_raise, identity, run_statement
from .schedules import Schedule

logger = logging.getLogger("django_exclusive_jobs")


class Outcome(str, enum.Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    LOST = "lost"
    INTERRUPTED = "interrupted"


# Exit codes of ``manage.py run_exclusive`` (documented in the README and --help).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_DATABASE = 3
EXIT_LOST = 4


class Interrupted(BaseException):
    """Raised in the main thread when SIGTERM or SIGINT arrives during an in-process job.

    A BaseException, like KeyboardInterrupt, so ``except Exception`` in a job does not
    swallow it and its ``finally`` blocks still run.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


@dataclass
class RunResult:
    name: str
    outcome: Outcome
    value: Any = None
    exception: BaseException | None = None
    duration: float = 0.0
    token: int | None = None
    holder: str = ""
    held_until: Any = None
    returncode: int | None = None  # a child program's own exit code
    signum: int | None = None

    @property
    def exit_code(self) -> int:
        if self.outcome in (Outcome.SUCCEEDED, Outcome.SKIPPED):
            return EXIT_OK
        if self.outcome == Outcome.INTERRUPTED and self.signum:
            return 128 + self.signum
        if self.outcome == Outcome.LOST:
            return EXIT_LOST
        if self.returncode:
            return self.returncode if self.returncode > 0 else 128 - self.returncode
        return EXIT_FAILED


@dataclass
class JobRunner:
    """Runs one job under its lock. One instance per run; not shared between threads."""

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
    retry_failed: bool = False
    lock: Lock | None = field(default=None, init=False)
    run_id: int | None = field(default=None, init=False)
    in_job: bool = field(default=False, init=False)
    pending_signal: int | None = field(default=None, init=False)
    slot: dt.datetime | None = field(default=None, init=False)
    _started: float = field(default=0.0, init=False)

    def say(self, message: str) -> None:
        logger.info(message)
        if self.report is not None:
            self.report(message, True)

    def start(self) -> Lock | RunResult:
        """Take the lock and start keep-alive; a SKIPPED result if another holds it."""
        try:
            lock = acquire_or_raise(
                self.name, ttl=self.ttl, min_hold=self.min_hold, wait=self.wait, using=self.using
            )
        except LockHeld as held:
            until = held.expires_at.isoformat(timespec="seconds") if held.expires_at else "?"
            self.say(f"skipped {self.name}: held by {held.owner or '?'} until {until}")
            signals.job_skipped.send(
                sender=self.name, name=self.name, holder=held.owner, expires_at=held.expires_at
            )
            return RunResult(
                self.name, Outcome.SKIPPED, holder=held.owner, held_until=held.expires_at
            )
        try:
            claimed = self._claim_run(lock)
        except BaseException:
            lock.release()  # never leave the lock held because history failed
            raise
        if claimed is not None:
            lock.release()
            return claimed
        self.lock = lock
        slot = f" slot={self.slot.isoformat()}" if self.slot else ""
        self.say(f"acquired {self.name} token={lock.token} owner={lock.owner}{slot}")
        signals.lock_lost.connect(self._lost_receiver, sender=Lock)
        if self.keepalive:
            lock.start_keepalive()
        self._started = time.monotonic()
        signals.job_started.send(sender=self.name, name=self.name, lock=lock)
        return lock

    def record(self, result: RunResult, exc: BaseException) -> None:
        """Set the outcome a job's exception means."""
        if isinstance(exc, Interrupted):
            result.outcome, result.signum = Outcome.INTERRUPTED, exc.signum
        elif isinstance(exc, LockLost):
            result.outcome = Outcome.LOST
        elif isinstance(exc, Exception):
            result.outcome = Outcome.FAILED
            logger.error("job %s failed", self.name, exc_info=exc)
        else:  # KeyboardInterrupt, CancelledError, SystemExit
            result.outcome = Outcome.INTERRUPTED
        result.exception = exc

    def finish(self, result: RunResult) -> RunResult:
        """Stop keep-alive, release (min_hold honoured), log and signal the outcome."""
        lock = self.lock
        assert lock is not None
        result.duration = time.monotonic() - self._started
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
        # Checked after release(): that is where a lock cleared mid-run is found out.
        if lock.lost and result.outcome != Outcome.INTERRUPTED:
            result.outcome = Outcome.LOST
        if isinstance(result.value, ChildExit):
            result.returncode = result.value.returncode
            if result.returncode != 0 and result.outcome == Outcome.SUCCEEDED:
                result.outcome = Outcome.FAILED
        self._record_run(lock, result)
        self._finish(lock, result)
        return result

    def run(self, target: Callable[[Lock], Any]) -> RunResult:
        """Acquire, run ``target(lock)``, release. The job's errors become the outcome."""
        started = self.start()
        if isinstance(started, RunResult):
            return started
        result = RunResult(self.name, Outcome.SUCCEEDED, token=started.token)
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
        if self.pending_signal is not None and result.outcome != Outcome.INTERRUPTED:
            # The signal came while the lock was being released: the job had ended,
            # but the process was still asked to stop.
            result.outcome, result.signum = Outcome.INTERRUPTED, self.pending_signal
        return result

    @staticmethod
    def ensure_lease_left(lock: Lock) -> None:
        """Refuse to start the job if setting up the run outlasted the lease.

        Writing the run row may have waited on a slow or reconnecting database; by then
        another server may hold the lock, so the job must not start.
        """
        if not lock.held:
            raise LockLost(lock.name, lock.token, "the lease ran out before the job started")

    def on_signal(self, signum: int) -> None:
        """SIGTERM/SIGINT: stop the job if it is running, else finish the lock work first.

        Raising inside a lock statement could leave the lock held until its lease ends,
        so outside the job body the signal is only remembered.
        """
        if self.in_job:
            raise Interrupted(signum)
        self.pending_signal = signum

    def _claim_run(self, lock: Lock) -> RunResult | None:
        """Write this run's history row; a SKIPPED result if its slot already has a run.

        The unique (name, slot) row is what makes a slot run once: a server whose cron
        fired late finds the lock free but the slot taken.
        """
        from .models import JobRun, RunStatus

        runs = JobRun.objects.using(lock.using)
        self._close_abandoned_runs(lock)
        if self.schedule is not None:
            if lock.acquired_at is None:
                # Read from the row on MariaDB/MySQL: gone means another holder has it.
                lock.ensure_held()
                raise LockLost(lock.name, lock.token, "the acquisition time is unknown")
            self.slot = self.schedule.slot_at(lock.acquired_at)
        holder = {
            "status": RunStatus.RUNNING,
            "host": identity.host,
            "pid": identity.pid,
            "instance": identity.instance,
            "token": lock.token,
            "started_at": DatabaseNow(),
        }
        try:
            row = run_statement(
                lock.using, lambda: runs.create(name=self.name, slot=self.slot, **holder)
            )
            self.run_id = row.pk
            return None
        except IntegrityError:
            pass
        existing = runs.filter(name=self.name, slot=self.slot).first()
        if existing is not None and self._is_mine(existing, lock):
            self.run_id = existing.pk  # a retried insert whose first try committed
            return None
        retryable = RunStatus.unsuccessful()
        if existing is not None and self.retry_failed and existing.status in retryable:
            retried = run_statement(
                lock.using,
                lambda: runs.filter(pk=existing.pk, status__in=retryable).update(
                    attempts=F("attempts") + 1,
                    finished_at=None,
                    duration=None,
                    error_type="",
                    error="",
                    returncode=None,
                    **holder,
                ),
            )
            if retried:
                self.run_id = existing.pk
                return None
            existing.refresh_from_db()
            if self._is_mine(existing, lock):  # a retried update whose first try committed
                self.run_id = existing.pk
                return None
        slot_text = self.slot.isoformat() if self.slot else "?"
        owner = existing.owner if existing is not None else "?"
        status = existing.status if existing is not None else "?"
        self.say(f"skipped {self.name}: slot {slot_text} already run by {owner} ({status})")
        signals.job_skipped.send(
            sender=self.name, name=self.name, holder=owner, expires_at=None, slot=self.slot
        )
        return RunResult(self.name, Outcome.SKIPPED, holder=owner)

    @staticmethod
    def _is_mine(run: Any, lock: Lock) -> bool:
        """A running row with our token: only our own run can have it."""
        from .models import RunStatus

        return bool(
            run.token == lock.token
            and run.instance == identity.instance
            and run.status == RunStatus.RUNNING
        )

    def _close_abandoned_runs(self, lock: Lock) -> None:
        """Mark this job's runs still 'running' under an older token as lost.

        Holding token N means every holder before it lost the lock: its server crashed,
        or it was paused or cut off and will find out itself. Without this a crashed
        run would stay 'running' for ever, and its slot could never be retried.
        """
        from .models import JobRun, RunStatus

        reason = (
            f"The lock was taken over by token {lock.token} after this run's lease ran "
            "out or it was released by hand: its server crashed, or lost the lock."
        )
        closed = run_statement(
            lock.using,
            lambda: (
                JobRun.objects.using(lock.using)
                .filter(name=self.name, status=RunStatus.RUNNING, token__lt=lock.token)
                .update(
                    status=RunStatus.LOST,
                    finished_at=DatabaseNow(),
                    error_type="LockLost",
                    error=reason,
                )
            ),
        )
        if closed:
            logger.warning(
                "%s: %s earlier run(s) still marked running lost the lock; marked lost",
                self.name,
                closed,
            )

    def _record_run(self, lock: Lock, result: RunResult) -> None:
        from .models import JobRun

        run_id = self.run_id
        if run_id is None:
            return
        error_type = error = ""
        if result.exception is not None:
            error_type = type(result.exception).__qualname__[:255]
            error = _bounded_traceback(result.exception)
        values = {
            "status": result.outcome.value,
            "finished_at": DatabaseNow(),
            "duration": result.duration,
            "error_type": error_type,
            "error": error,
            "returncode": result.returncode,
        }
        try:
            run_statement(
                lock.using,
                lambda: (
                    JobRun.objects.using(lock.using)
                    .filter(pk=run_id, token=lock.token)
                    .update(**values)
                ),
            )
        except JobLockError:
            logger.exception("could not record the end of run %s of %s", self.run_id, self.name)

    def _finish(self, lock: Lock, result: RunResult) -> None:
        detail = ""
        if result.returncode not in (None, 0):
            detail = f" exit={result.returncode}"
        if result.exception is not None:
            detail += f" error={type(result.exception).__name__}: {result.exception}"
        line = (
            f"finished {self.name} outcome={result.outcome.value} "
            f"duration={result.duration:.3f}s token={lock.token}{detail}"
        )
        if result.outcome == Outcome.SUCCEEDED:
            self.say(line)
        else:
            logger.warning(line)
            if self.report is not None:
                self.report(line, False)
        signals.job_finished.send(
            sender=self.name,
            name=self.name,
            lock=lock,
            outcome=result.outcome.value,
            duration=result.duration,
            exception=result.exception,
        )

    def _lost_receiver(self, sender: Any, lock: Lock, reason: str, **kwargs: Any) -> None:
        if lock is self.lock and self.on_lost is not None:
            self.on_lost(lock)


TRACEBACK_LIMIT = 16_000


def _bounded_traceback(exc: BaseException) -> str:
    """The exception and its traceback, cut in the middle if longer than the limit."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if len(text) <= TRACEBACK_LIMIT:
        return text
    head = TRACEBACK_LIMIT // 4
    cut = len(text) - TRACEBACK_LIMIT
    return f"{text[:head]}\n[... {cut} characters cut ...]\n{text[cut + head :]}"


@dataclass
class ChildExit:
    """What a child program run under the lock returned."""

    returncode: int


@contextmanager
def stop_on_signals(on_signal: Callable[[int], None] | None = None) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT call ``on_signal(signum)``, or raise Interrupted.

    Only the main thread can install handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if on_signal is None:
            raise Interrupted(signum)
        on_signal(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class ChildProgram:
    """Runs an external program under the lock and supervises it.

    SIGTERM/SIGINT sent to us is passed on to the child; a lost lock terminates it.
    A child that has not exited ``grace`` seconds after SIGTERM gets SIGKILL.
    """

    def __init__(self, argv: list[str], *, grace: float = 10.0) -> None:
        self.argv = argv
        self.grace = grace
        self.process: subprocess.Popen[bytes] | None = None
        self.signum: int | None = None
        self._stop_sent_at: float | None = None
        self._mutex = threading.Lock()

    def __call__(self, lock: Lock) -> ChildExit:
        if self.signum is not None:  # asked to stop before the program even started
            raise Interrupted(self.signum)
        # Its own process group, so a stop reaches the program's own children too.
        self.process = subprocess.Popen(self.argv, start_new_session=True)
        while True:
            try:
                returncode = self.process.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                with self._mutex:
                    sent = self._stop_sent_at
                if sent is not None and time.monotonic() - sent > self.grace:
                    logger.warning(
                        "child of %s ignored SIGTERM for %ss: killing it", lock.name, self.grace
                    )
                    self._signal_group(signal.SIGKILL)
        if self.signum is not None:
            raise Interrupted(self.signum)
        return ChildExit(returncode)

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Send ``signum`` to the child (from a signal handler or the keep-alive thread)."""
        with self._mutex:
            if self._stop_sent_at is None:
                self._stop_sent_at = time.monotonic()
        self._signal_group(signum)

    def _signal_group(self, signum: int) -> None:
        process = self.process
        if process is None:
            return
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signum)

    def on_signal(self, signum: int) -> None:
        self.signum = signum
        self.stop(signum)

    def on_lost(self, lock: Lock) -> None:
        logger.warning("lock %s lost: stopping its child process", lock.name)
        self.stop(signal.SIGTERM)

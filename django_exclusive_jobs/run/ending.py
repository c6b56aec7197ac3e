"""How a run ends, decided over values: its status, its result, its exit code.

Pure: no I/O, no clock. The runner gathers what it knows of a run's end (what the job
raised, whether the lock was lost, what a child program or a job's process reported)
and asks :func:`status_of`; it writes, says and signals what comes back.
"""

from __future__ import annotations

import datetime as dt
import signal
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from ..lock.errors import LockLost
from .process import JobFailed, JobProcess, Outcome
from .shutdown import Interrupted, TimedOut
from .status import RunStatus
from .tasks import Enqueued
from .thread import JobThread

# Exit codes of ``manage.py run_exclusive`` (documented in the README and --help).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_DATABASE = 3
EXIT_LOST = 4
EXIT_TIMED_OUT = 124  # as timeout(1)

LEASE_ENDED = (
    "no renewal reached the job's process before its lease could end (the scheduler was "
    "frozen or could not reach the database, or the job held the GIL in one long call "
    "into C): the job was stopped before the lease's end"
)


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
    attempt: int = 1  # of the slot it served (retries=N)
    # Ended: when the slot's next attempt may start (None: this attempt was its last).
    # Skipped: when the slot's pending retry is due, if that is why.
    retry_at: dt.datetime | None = None
    # Skipped: another member of its concurrency group runs (why); it waits its turn.
    waiting: str = ""

    @property
    def final(self) -> bool:
        """No further attempt of its slot will be made: how it ended is the slot's end."""
        return self.retry_at is None

    @property
    def exit_code(self) -> int:
        done = (RunStatus.SUCCEEDED, RunStatus.SKIPPED, RunStatus.ENQUEUED, RunStatus.CANCELLED)
        if self.status in done:
            return EXIT_OK
        if self.status == RunStatus.INTERRUPTED and self.signum:
            return 128 + self.signum
        if self.status == RunStatus.LOST:
            return EXIT_LOST
        if self.status == RunStatus.TIMED_OUT:
            return EXIT_TIMED_OUT
        if self.returncode:
            return self.returncode if self.returncode > 0 else 128 - self.returncode
        return EXIT_FAILED


def status_of_error(exc: BaseException) -> tuple[RunStatus, int | None]:
    """The status (and the signal, for a stop by one) a job's exception means."""
    if isinstance(exc, Interrupted):
        return RunStatus.INTERRUPTED, exc.signum
    if isinstance(exc, TimedOut):
        return RunStatus.TIMED_OUT, None
    if isinstance(exc, LockLost):
        return RunStatus.LOST, None
    if isinstance(exc, Exception):
        return RunStatus.FAILED, None
    return RunStatus.INTERRUPTED, None  # KeyboardInterrupt, CancelledError, SystemExit


@dataclass(frozen=True)
class Ending:
    """What the runner knows of a run's end, once its lock is released.

    ``status``: what the job's execution made of it (SUCCEEDED if it returned; else what
    its exception means, see :func:`status_of_error`). ``lost``: the lock was found lost
    (mid-run, or by the release). ``returncode``: a child program's exit code, if the job
    was one. ``enqueued``: a django.tasks job enqueued its task. ``cancelled``: a newer
    slot's start asked this run to stop (``overlap="cancel_other"``).
    """

    status: RunStatus = RunStatus.SUCCEEDED
    lost: bool = False
    returncode: int | None = None
    enqueued: bool = False
    cancelled: bool = False


def status_of(ending: Ending) -> RunStatus:
    """How the run ended, the rules in order: a lost lock makes any end but a stop
    LOST; a program that exited non-zero after its job "succeeded" FAILED; an enqueued
    task's success ENQUEUED; a stop that a newer slot asked for CANCELLED."""
    status = ending.status
    if ending.lost and status != RunStatus.INTERRUPTED:
        status = RunStatus.LOST
    if ending.returncode not in (None, 0) and status == RunStatus.SUCCEEDED:
        status = RunStatus.FAILED
    if ending.enqueued and status == RunStatus.SUCCEEDED:
        status = RunStatus.ENQUEUED
    if ending.cancelled and status == RunStatus.INTERRUPTED:
        status = RunStatus.CANCELLED
    return status


@dataclass(frozen=True)
class ChildEnd:
    """What the end of a job's process (or thread) means, before the run's own end:
    ``error`` to record as the job's (as if it had raised it), or ``interrupted`` by the
    signal ``signum``; neither: the job's run is what it did."""

    error: BaseException | None = None
    interrupted: bool = False
    signum: int | None = None


def child_end(
    outcome: Outcome,
    *,
    stopped: bool,
    stopped_by: int | None,
    lost: bool,
    lock: tuple[str, int | None],
    time_limit: float | None,
) -> ChildEnd:
    """The rules in order, for a run whose job ran in a process (or thread) of its own:
    the guard stopped it for want of a renewal (unless it had returned before), its
    timeout stopped it, it raised, it was stopped by a signal (``stopped``: by the
    scheduler, while it ran), its process died before it returned. ``lock``: the lock's
    name and token (what a lost lease is reported with). A lock found ``lost`` is the
    run's end, whatever the job's process did after (see :func:`status_of`)."""
    returned_in_time = outcome.finished and (outcome.ended or 0) < (outcome.lease_ended or 0)
    if outcome.lease_ended is not None and not returned_in_time:
        return ChildEnd(error=LockLost(lock[0], lock[1], LEASE_ENDED))
    if outcome.timed_out is not None and not outcome.finished:
        return ChildEnd(error=TimedOut(time_limit or 0.0))
    if outcome.error is not None:
        return ChildEnd(error=outcome.error)
    if not lost and (outcome.interrupted_by or stopped):
        return ChildEnd(interrupted=True, signum=outcome.interrupted_by or stopped_by)
    if not outcome.finished and not lost and outcome.returncode is not None:
        return ChildEnd(error=JobFailed("ProcessDied", describe_exit(outcome.returncode)))
    return ChildEnd()


def stopped_while_running(child: JobProcess | JobThread, outcome: Outcome) -> bool:
    """The scheduler stopped the run before its job ended (a stop that comes after the
    job returned, a shutdown racing its end, interrupted nothing)."""
    stopped_at = getattr(child, "stopped_at", None)
    if child.stopped_by is None or stopped_at is None:
        return False
    return not outcome.finished or outcome.ended is None or outcome.ended > stopped_at


def describe_exit(returncode: int) -> str:
    """Why a job's process ended before its function returned."""
    if returncode < 0:
        with suppress(ValueError):
            return f"The job's process was killed by {signal.Signals(-returncode).name}."
        return f"The job's process was killed by signal {-returncode}."
    return f"The job's process exited with code {returncode} before the job returned."

"""How a run ends: its lock released, its status decided (see ``ending.py``), its end
written to the history, said and signalled; ``pause_after=N`` judged."""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any

from .. import logs, signals
from ..lock.errors import JobLockError
from ..lock.lock import Lock
from ..logs import line
from . import end_rows, groups, pausing
from .child import ChildExit
from .ending import Ending, RunResult, status_of, status_of_error
from .saying import Saying
from .shutdown import Cancelled
from .status import RunStatus
from .tasks import Enqueued

logger = logging.getLogger("django_exclusive_jobs")


class Finishing(Saying):
    """The run's end (the floor above :class:`Saying`)."""

    def begin(self, lock: Lock) -> RunResult:
        """The result the job's run fills in."""
        return RunResult(self.name, RunStatus.SUCCEEDED, token=lock.token)

    def record(self, result: RunResult, exc: BaseException) -> None:
        """Set the status a job's exception means (see :func:`status_of_error`)."""
        result.status, signum = status_of_error(exc)
        if signum is not None:
            result.signum = signum
        if result.status == RunStatus.FAILED:
            logger.error(
                "job %s failed",
                self.name,
                exc_info=exc,
                extra=logs.extra("finished", job_name=self.name, status="failed"),
            )
        result.exception = exc

    def finish(self, result: RunResult, *, ended: float | None = None) -> RunResult:
        """Stop keep-alive, release (min_hold honoured), record, say and signal the end.

        ``ended``: when the job ended (monotonic), if known better than "now". Once per
        run: a second call (a job that returned while its timeout ended the process)
        returns the first result.
        """
        with self._finishing:
            if self._finished is None:
                self._finished = self._finish(result, ended)
            return self._finished

    def _finish(self, result: RunResult, ended: float | None) -> RunResult:
        lock = self.lock
        assert lock is not None
        result.duration = (ended or time.monotonic()) - self._started
        if self._long is not None:
            self._long.stop()
        lock.stop_keepalive()
        signals.lock_lost.disconnect(self._lost_receiver, sender=Lock)
        try:
            groups.release(self.group_locks)  # its groups first: its own lock outlasts them
            lock.release()
        except JobLockError as exc:
            logger.error(
                "could not release %s token=%s (its lease ends by itself within %s): %s",
                self.name,
                lock.token,
                lock.ttl,
                exc,
                extra=logs.extra("unrecorded", job_name=self.name, token=lock.token),
            )
        if isinstance(result.value, ChildExit):
            result.returncode = result.value.returncode
        if isinstance(result.value, Enqueued):
            result.enqueued = result.value
        ending = Ending(
            result.status,
            lost=lock.lost,  # after release(): where a lock force-released mid-run is found
            returncode=result.returncode,
            enqueued=result.enqueued is not None,
            cancelled=bool(self.cancelled_by),
        )
        result.status = status_of(ending)
        if result.status == RunStatus.CANCELLED:
            result.signum, result.exception = None, Cancelled(self.cancelled_by)
        result.attempt = self.attempt
        if self.run_id is not None and result.status in RunStatus.unsuccessful():
            result.retry_at = self.retry_at = self._retry_at(lock, ended)
        if self.run_id is not None:
            self.unwritten_end = end_rows.record_end(
                lock,
                self.run_id,
                status=result.status,
                duration=result.duration,
                exception=result.exception,
                returncode=result.returncode,
                enqueued=result.enqueued,
                retry_at=result.retry_at,
            )
        self._say_finished(lock, result)
        self._pause_if_failing(lock, result)
        return result

    def _pause_if_failing(self, lock: Lock, result: RunResult) -> None:
        """``pause_after=N``: a slot's last attempt failed; pause the job if the N runs
        before it did too. A failure to look is one line: the run's end stands."""
        failures = self.job.pause_after
        if not failures or result.status not in RunStatus.failures() or result.retry_at:
            return
        try:
            if pausing.pause_after_failures(self.name, failures, using=lock.using):
                said = f"paused {self.name}: its last {failures} runs failed (pause_after)"
                self._say(line("paused", said, job_name=self.name), normal=False)
        except JobLockError as exc:
            logger.warning("%s: could not judge pause_after: %s", self.name, exc)

    def _retry_at(self, lock: Lock, ended: float | None) -> dt.datetime | None:
        """When this unsuccessful attempt's slot may be tried again (None: no more).

        Its end on the database's clock, followed from the acquisition on this machine's
        monotonic clock as the scheduler follows it: no query on the way out."""
        if lock.acquired_at is None:
            return None
        elapsed = (ended or time.monotonic()) - self._acquired
        end = lock.acquired_at + dt.timedelta(seconds=max(0.0, elapsed))
        return self.job.retry.retry_at(self.slot, self.attempt, end)

    def _lost_receiver(self, sender: Any, lock: Lock, reason: str, **kwargs: Any) -> None:
        """Its lock, or one of its groups', was lost: the run is stopped as its own
        lock's loss stops it."""
        ours = lock is self.lock or any(lock is group for group in self.group_locks)
        if ours and self.lock is not None and self.on_lost is not None:
            self.on_lost(self.lock)

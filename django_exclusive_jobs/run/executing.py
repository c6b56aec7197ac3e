"""Around a job that executes in the run's own thread: what it raises is recorded; it
may not start once a stop came or the lease ran out; it is stopped at its timeout (and
the process ended if it will not stop), and when a newer slot asks (cancel_other)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from django.db import connections

from .. import logs
from ..lock.errors import JobLockError, LockLost
from ..lock.lock import Lock
from ..logs import line
from . import run_requests
from .ending import EXIT_TIMED_OUT, RunResult
from .shutdown import Interrupted, TimedOut, time_limit
from .starting import Starting


class Executing(Starting):
    """The job's execution (the floor above :class:`Starting`)."""

    @contextmanager
    def _executing(self, result: RunResult) -> Iterator[None]:
        """Around the job's execution: whatever it raises is recorded in ``result``
        (never raised from here)."""
        self.in_job = self.job_running = True
        try:
            yield
        except BaseException as exc:
            self.record(result, exc)
        finally:
            self.in_job = self.job_running = False

    @contextmanager
    def _time_limit(self) -> Iterator[None]:
        """Around the job's execution in :meth:`call`: stop it at its timeout."""
        limit = self.job.time_limit if self.supervised else None
        main = threading.current_thread() is threading.main_thread()
        if limit is None or not main:  # only the main thread can be interrupted
            yield
            return
        last_resort = None
        if self.job.is_async:
            # The coroutine runs in another thread that nothing can interrupt: at the
            # timeout, the run is recorded and the process ended at once.
            last_resort = threading.Timer(limit, self._abandon, (limit,))
        elif self.on_timeout is None:  # in this thread: a job that ignores TimedOut
            last_resort = threading.Timer(limit + self.grace, self._abandon, (limit,))
        try:
            if last_resort is not None:
                last_resort.daemon = True
                last_resort.start()
            if self.job.is_async:
                yield
            else:
                with time_limit(limit, lambda: self._timed_out(limit)):
                    yield
        finally:
            if last_resort is not None:
                last_resort.cancel()

    @contextmanager
    def _stoppable(self, lock: Lock) -> Iterator[None]:
        """Around a command's job of ``overlap="cancel_other"``: look every few seconds
        for a stop asked by a newer slot's start (elsewhere: a scheduler's poll does)."""
        if not self.supervised or not self.job.overlap.stops_older_run:
            yield
            return
        done = threading.Event()
        watcher = threading.Thread(
            target=self._watch_for_stop, args=(lock, done), name=f"exclusive-jobs-stop:{self.name}"
        )
        watcher.daemon = True
        watcher.start()
        try:
            yield
        finally:
            done.set()
            watcher.join()

    def _watch_for_stop(self, lock: Lock, done: threading.Event) -> None:
        try:
            while not done.wait(run_requests.STOP_POLL):
                with suppress(JobLockError):
                    asked = run_requests.find_stop(self.name, token=lock.token, using=lock.using)
                    if asked and run_requests.take(asked, by=lock.holder, using=lock.using):
                        self.cancelled_by = asked.requested_by
                        by = asked.requested_by
                        said = f"stopping {self.name}: {by} runs a newer slot"
                        self._say(line("stopping", said, job_name=self.name, token=lock.token))
                        os.kill(os.getpid(), signal.SIGTERM)  # stops it as a SIGTERM does
                        return
        finally:
            connections.close_all()  # this thread's own

    def _timed_out(self, limit: float) -> None:
        """The run passed its timeout (SIGALRM, in the main thread): stop the job."""
        if not self.job_running or self.returned:
            return
        if self.on_timeout is not None:
            self.on_timeout(limit)
        else:
            raise TimedOut(limit)

    def _abandon(self, limit: float) -> None:
        """The job did not return within the grace after TimedOut (it caught it, or is
        stuck in C code): record the run timed out, release the lock, end the process, as
        SIGKILL ends a job's process elsewhere. Runs in a timer thread. (An async job,
        which runs in a thread of its own, comes here at the timeout itself.)"""
        if not self.job_running or self.returned or self.lock is None:
            return
        try:
            if self.job.is_async:
                text = f"{self.name} passed its timeout: ending the process"
            else:
                text = f"{self.name} did not stop within {self.grace:g}s of its timeout"
                text += ": ending the process"
            self._say(
                logs.line("stopping", text, job_name=self.name, status="timed_out"), normal=False
            )
            result = self.begin(self.lock)
            self.record(result, TimedOut(limit))
            self.finish(result)
        finally:
            logging.shutdown()
            os._exit(EXIT_TIMED_OUT)

    def _may_start(self, lock: Lock) -> None:
        """Raise if the job must not start: a stop asked for while the lock was being
        taken, or a lease that ran out while the run was set up (writing the run row
        waited on a slow database): another server may hold the lock by now."""
        if self.pending_signal is not None:
            raise Interrupted(self.pending_signal)
        if not lock.held:
            raise LockLost(lock.name, lock.token, "the lease ran out before the job started")

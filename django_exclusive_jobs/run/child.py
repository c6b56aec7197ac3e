"""A program run under the lock as a child process, and supervised while it runs.

``run_exclusive NAME -- PROGRAM ARGS...`` runs it; the lock's keep-alive and the signals
sent to ``run_exclusive`` reach it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from contextlib import suppress
from dataclasses import dataclass

from ..lock.lock import Lock
from ..logs import extra
from .run_info import current_run
from .shutdown import Interrupted, TimedOut

logger = logging.getLogger("django_exclusive_jobs")


@dataclass
class ChildExit:
    """What a child program run under the lock returned."""

    returncode: int


class ChildProgram:
    """Runs an external program under the lock and supervises it.

    SIGTERM/SIGINT sent to us is passed on to the child; a lost lock or the job's
    timeout terminates it. A child that has not exited ``grace`` seconds after SIGTERM
    gets SIGKILL.
    """

    def __init__(self, argv: list[str], *, grace: float = 10.0) -> None:
        self.argv = argv
        self.grace = grace
        self.process: subprocess.Popen[bytes] | None = None
        self.signum: int | None = None
        self.timed_out: float | None = None  # the timeout it passed, in seconds
        self._stop_sent_at: float | None = None
        self._mutex = threading.RLock()  # signal handlers take it too

    def __call__(self, lock: Lock) -> ChildExit:
        if self.signum is not None:  # asked to stop before the program even started
            raise Interrupted(self.signum)
        # Its own process group, so a stop reaches the program's own children too; the
        # run's facts in its environment (run_info.ENVIRONMENT).
        run = current_run()
        env = {**os.environ, **run.environment()} if run is not None else None
        self.process = subprocess.Popen(self.argv, start_new_session=True, env=env)
        while True:
            try:
                returncode = self.process.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                with self._mutex:
                    sent = self._stop_sent_at
                if sent is not None and time.monotonic() - sent > self.grace:
                    logger.warning(
                        "child of %s ignored SIGTERM for %ss: killing it",
                        lock.name,
                        self.grace,
                        extra=extra("stopping", lock=lock.name, token=lock.token),
                    )
                    self._signal_group(signal.SIGKILL)
        if self.timed_out is not None:
            raise TimedOut(self.timed_out)
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

    def on_timeout(self, seconds: float) -> None:
        """The run passed its timeout of ``seconds``: stop the program."""
        self.timed_out = seconds
        self.stop(signal.SIGTERM)

    def on_lost(self, lock: Lock) -> None:
        logger.warning(
            "lock %s lost: stopping its child process",
            lock.name,
            extra=extra("stopping", lock=lock.name, token=lock.token, status="lost"),
        )
        self.stop(signal.SIGTERM)

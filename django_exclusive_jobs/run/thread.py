"""A light job run in a thread of the scheduler's own process: ``in_process=True``.

By default the scheduler runs each job in a child process (``process.py``), which is
what makes a hung job stoppable and a crashing one harmless. Forking that process and its
guard is most of what a run costs the server (see the docs' performance page); a job
that does little (clears expired sessions, enqueues a task, sends one request) can
opt out of it and run here, as ``run_exclusive`` runs every job: in its own process.

What it gives up, and why it is opt-in:

* Nothing can stop a thread. An in-process job has no timeout (the decorator refuses
  ``timeout=``; one from the ``TIMEOUT`` setting or an operator's override, or
  ``overlap="cancel_other"``, runs it in a child process after all:
  :attr:`Job.runs_in_thread`). A run whose lock is lost goes on until it returns, as a
  job run by ``run_exclusive`` does; its fencing token refuses its late writes.
* A crash of the interpreter (a fault in a C extension, ``os._exit``) ends the
  scheduler with it: as after any crash, its runs' slots are taken over when their
  leases end.
* A job that holds the GIL for long (a C call that does not release it) starves the
  keep-alive that renews its lease, in the same process: the lease can end while it
  still runs. (The guard of a job run in a process is a process for this reason.)
* At a stop, a run still going once the grace is over is left to its lease:
  ``exclusive_scheduler`` ends its process at once, without releasing the lock (nothing
  waits for the thread), and the server that takes the lock over records the run as a
  crashed server's.

The scheduler drives a :class:`JobThread` as it drives a :class:`JobProcess`: it waits
on :meth:`waitables`, and :meth:`poll` gives the run's :class:`Outcome` once it ended.
"""

from __future__ import annotations

import os
import threading
from contextlib import suppress
from typing import Any

from django.db import connections

from .process import Outcome, execute
from .run_info import RunInfo


class JobThread:
    """One run of a job in a thread of this process (the scheduler's)."""

    stoppable = False  # a stop (SIGTERM, a lost lock) cannot reach a thread
    stopped_by = None  # so no run of it is ever recorded as stopped by a signal

    def __init__(
        self,
        name: str,
        slot: Any,
        *,
        kwargs: dict[str, Any] | None = None,
        trace: dict[str, str] | None = None,
        token: int | None = None,
        info: RunInfo | None = None,
    ) -> None:
        # The thread writes one byte here when the job has ended: the scheduler's wait
        # wakes on it as on a child process's exit.
        self._ended_read, self._ended_write = os.pipe()
        self._report: dict[str, Any] = {}
        self._ended = False  # all the thread has left to do is wake the scheduler
        self._thread = threading.Thread(
            target=self._run,
            args=(name, slot, kwargs or {}, token, trace or {}, info),
            name=f"exclusive-jobs-run:{name}",
            daemon=True,
        )
        try:
            self._thread.start()
        except BaseException:  # no thread could start: the start fails, nothing is left open
            self._close()
            raise

    def _run(
        self,
        name: str,
        slot: Any,
        kwargs: dict[str, Any],
        token: int | None,
        trace: Any,
        info: RunInfo | None,
    ) -> None:
        try:
            self._report = execute(name, slot, kwargs, token, trace, info=info)
            with suppress(Exception):
                connections.close_all()  # this thread's
        finally:
            self._ended = True
            os.write(self._ended_write, b"x")

    def waitables(self) -> list[Any]:
        return [self._ended_read] if self._ended_read >= 0 else []

    def poll(self) -> Outcome | None:
        """The run's outcome once its thread has ended, else None."""
        if self._ended_read < 0 or not self._ended:
            return None  # reaped already, or still running
        self._thread.join()  # it only had the byte to write
        self._close()
        report = self._report or {
            "error_type": "ThreadDied",
            "traceback": "The job's thread ended without reporting how the job went.",
        }
        return Outcome.of(None, report)

    def _close(self) -> None:
        os.close(self._ended_read)
        os.close(self._ended_write)
        self._ended_read = self._ended_write = -1

    def stop(self, signum: int = 0, *, kill_after: float | None = None) -> None:
        """Nothing: a thread cannot be stopped (see the module's docstring)."""

    def extend(self, deadline: float) -> None:
        """Nothing: there is no guard; the scheduler's keep-alive renews the lease."""

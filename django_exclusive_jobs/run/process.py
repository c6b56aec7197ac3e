"""A job run in a process of its own, for the scheduler.

The scheduler holds the lock, keeps its lease alive and writes the history; the job's
function runs in a child process. Whatever the job does (raises, hangs, leaks memory,
crashes the interpreter, calls ``os._exit``), the scheduler and its other jobs go on,
and a hung job can be stopped, which a thread cannot be.

Children come from a fork server that imported Django once (``forkserver``, where the
platform has it; else ``spawn``): a child starts in milliseconds, not the second a fresh
interpreter and ``django.setup()`` take, and never inherits the scheduler's threads or
database connections. A child and its own processes are killed when the scheduler dies
(its end of their connection closes), so a ``kill -9`` of the scheduler leaves no job
running without its lock.
"""

from __future__ import annotations

import multiprocessing
import os
import select
import signal
import sys
import threading
import time
from contextlib import suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from .tasks import Enqueued

_context: Any = None


def context() -> Any:
    """The multiprocessing context children are started from."""
    global _context
    if _context is None:
        if "forkserver" in multiprocessing.get_all_start_methods():
            _context = multiprocessing.get_context("forkserver")
            _context.set_forkserver_preload(["django_exclusive_jobs.run._warm"])
        else:
            _context = multiprocessing.get_context("spawn")
    return _context


def warm_up() -> None:
    """Start the fork server now, so the first slot does not wait for Django's set-up."""
    if context().get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


class JobFailed(Exception):
    """A job raised in its child process; the history shows the child's traceback."""

    def __init__(self, error_type: str, traceback_text: str) -> None:
        super().__init__(traceback_text.rstrip())
        self.error_type = error_type
        self.traceback_text = traceback_text
        last = (traceback_text.strip().splitlines() or [""])[-1]
        self.message = last.removeprefix(f"{error_type}:").strip()


@dataclass
class Outcome:
    """How a child ended: its exit code and what it reported before exiting."""

    returncode: int
    error: JobFailed | None = None
    interrupted_by: int | None = None  # the signal that stopped the job in the child
    finished: bool = False  # the job's function returned
    enqueued: Enqueued | None = None  # what a django.tasks job enqueued


class JobProcess:
    """One job run in a child process. The scheduler's main thread drives it.

    :meth:`stop` may be called from another thread (keep-alive, when the lock is lost);
    a child that has not exited ``grace`` seconds after it was stopped is killed.
    """

    def __init__(self, name: str, slot: Any, *, grace: float) -> None:
        self.name = name
        self.grace = grace
        self._killer: threading.Timer | None = None
        self._kill_at = float("inf")
        ctx = context()
        # One connection each way: the child reports on it, and its end of file tells the
        # child the scheduler is gone.
        self.reader, writer = ctx.Pipe(duplex=True)
        self.process = ctx.Process(
            target=main,
            args=(name, slot, writer),
            name=f"exclusive-job:{name}",
            daemon=False,
        )
        self.process.start()
        writer.close()
        self.stopped_at: float | None = None
        self.stopped_by: int | None = None
        self._report: dict[str, Any] = {}
        self._reported = False  # the report pipe reached its end
        self._mutex = threading.Lock()

    def waitables(self) -> list[Any]:
        """What the scheduler waits on for this child: its report pipe and its exit."""
        # Once the report pipe is at its end, only the exit is worth waiting for (a pipe
        # at its end is always "ready" and would make the loop spin).
        return [self.process.sentinel] if self._reported else [self.reader, self.process.sentinel]

    def poll(self) -> Outcome | None:
        """Read what the child reported; its outcome once it has exited, else None."""
        try:
            while not self._reported and self.reader.poll():
                self._report.update(self.reader.recv())
        except (EOFError, OSError):
            self._reported = True
        if self.process.exitcode is None:
            self.process.join(0)
        if self.process.exitcode is None:
            return None
        with self._mutex:
            if self._killer is not None:
                self._killer.cancel()
        self._signal_group(signal.SIGKILL)  # what the job started and left behind
        self.reader.close()
        report = self._report
        error = None
        if "error_type" in report:
            error = JobFailed(report["error_type"], report["traceback"])
        return Outcome(
            self.process.exitcode,
            error=error,
            interrupted_by=report.get("interrupted_by"),
            finished=bool(report.get("finished")),
            enqueued=report.get("enqueued"),
        )

    def stop(self, signum: int = signal.SIGTERM, *, kill_after: float | None = None) -> None:
        """Ask the job to stop (SIGTERM to its process group); SIGKILL it ``kill_after``
        seconds later (default: the grace) if it is still there. The SIGKILL comes from a
        timer, so a scheduler busy with a slow database does not delay it."""
        delay = self.grace if kill_after is None else kill_after
        with self._mutex:
            if self.stopped_at is None:
                self.stopped_at, self.stopped_by = time.monotonic(), signum
            kill_at = time.monotonic() + delay
            if kill_at < self._kill_at:
                if self._killer is not None:
                    self._killer.cancel()
                self._kill_at = kill_at
                self._killer = threading.Timer(delay, self._signal_group, (signal.SIGKILL,))
                self._killer.daemon = True
                self._killer.start()
        self._signal_group(signum)

    def _signal_group(self, signum: int) -> None:
        pid = self.process.pid
        if pid is None:
            return
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signum)


# --- in the child -----------------------------------------------------------------------


def main(name: str, slot: Any, report: Connection) -> None:
    """The child: run job ``name`` for ``slot`` and report how it went."""
    os.setsid()  # its own process group: a stop reaches the job's own children too
    guard, job_alive = _die_with_scheduler(report)
    from django.db import connections

    from .registry import get_job
    from .shutdown import Interrupted, stop_on_signals

    code = 0
    try:
        _setup_django()
        job = get_job(name)
        if job is None:
            raise LookupError(f"no job named {name!r} is registered in this process")
        with stop_on_signals():
            value = job.call(slot)
        enqueued = value if isinstance(value, Enqueued) else None
        report.send({"finished": True, "enqueued": enqueued})
    except Interrupted as exc:
        report.send({"interrupted_by": exc.signum})
        code = 128 + exc.signum
    except BaseException as exc:  # everything a job raises is reported
        from .history import bounded_traceback

        report.send({"error_type": type(exc).__qualname__, "traceback": bounded_traceback(exc)})
        code = 1
    finally:
        with suppress(Exception):
            connections.close_all()
    sys.stdout.flush()
    sys.stderr.flush()
    os.close(job_alive)  # the guard sees the job end, and exits
    with suppress(ChildProcessError):
        os.waitpid(guard, 0)
    os._exit(code)  # no atexit handlers or multiprocessing clean-up of the fork server's


def _setup_django() -> None:
    from django.apps import apps

    from . import _warm

    if _warm.failure:
        raise RuntimeError(
            "Django could not be set up in the scheduler's fork server; restart the "
            f"scheduler once it is fixed. The error was:\n{_warm.failure}"
        )
    if not apps.ready:
        import django

        django.setup()


def _die_with_scheduler(connection: Connection) -> tuple[int, int]:
    """Kill this process group when the scheduler is gone, even by ``kill -9``.

    A guard process (not a thread: a job holding the GIL would starve it) waits for
    either end: the scheduler's end of the connection closing (it never writes, so the
    connection only becomes readable at its end of file), or the job's end (the pipe
    this process holds closing). Returns the guard's pid and this process's pipe end.
    """
    job_alive_read, job_alive_write = os.pipe()
    guard = os.fork()
    if guard == 0:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a stop is for the job
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            os.close(job_alive_write)
            ready, _, _ = select.select([connection.fileno(), job_alive_read], [], [])
            if job_alive_read not in ready:  # the scheduler is gone, the job is not
                os.killpg(os.getpgrp(), signal.SIGKILL)
        finally:
            os._exit(0)
    os.close(job_alive_read)
    return guard, job_alive_write

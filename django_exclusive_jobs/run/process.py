"""A job run in a process of its own, for the scheduler.

The scheduler holds the lock, keeps its lease alive and writes the history; the job's
function runs in a child process. Whatever the job does (raises, hangs, leaks memory,
crashes the interpreter, calls ``os._exit``), the scheduler and its other jobs go on,
and a hung job can be stopped, which a thread cannot be.

Children come from a fork server that set Django up once (``forkserver.py``): a child
starts in milliseconds, not the second a fresh interpreter and ``django.setup()`` take,
and never inherits the scheduler's threads or database connections. One process per
run: the job's guard (``guard.py``), which stops it when it may no longer run (the
scheduler gone, its lease ending without a renewal, its timeout), is a thread of it
backed by the kernel's timer.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext, suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from django.db import connections

from . import forkserver
from .forkserver import ForkServer
from .guard import STOPS, Guard, Limits, timeout_at
from .registry import all_jobs, function_of, parameters_of
from .run_info import RunInfo, running
from .shutdown import Interrupted, stop_on_signals
from .tasks import Enqueued
from .tracebacks import TRACEBACK_LIMIT, bounded_traceback
from .tracing import continued

_server = ForkServer()


def warm_up() -> None:
    """Start the fork server now, so the first slot does not wait for Django's set-up."""
    _server.ensure_running()


def shut_down() -> None:
    """Stop the fork server (the scheduler stops; running jobs stop through their guard)."""
    _server.close()


def serve_forks(fd: int) -> None:
    """The fork server's entry (``ForkServer`` starts it): its loop, forking :func:`main`
    for each request."""
    forkserver.serve(fd, main, set_up=_read_once)


def _read_once() -> None:
    """Once Django is set up, what each child would otherwise read again: every job's
    parameters (a child inherits them; reading them cost each run about 0.1 ms of CPU)."""
    for job in all_jobs():
        parameters_of(job.func)


class JobFailed(Exception):
    """A job raised in its child process; the history shows the child's traceback."""

    def __init__(self, error_type: str, traceback_text: str, message: str | None = None) -> None:
        super().__init__(traceback_text.rstrip())
        self.error_type = error_type
        self.traceback_text = traceback_text
        if message is None:  # a report without it: the traceback's last line
            last = (traceback_text.strip().splitlines() or [""])[-1]
            message = last.removeprefix(f"{error_type}:").strip()
        self.message = message


@dataclass
class Outcome:
    """How a child ended: its exit code and what it reported before exiting."""

    returncode: int | None  # None: an in-process run (a thread, see thread.py)
    error: JobFailed | None = None
    interrupted_by: int | None = None  # the signal that stopped the job in the child
    finished: bool = False  # the job's function returned
    enqueued: Enqueued | None = None  # what a django.tasks job enqueued
    ended: float | None = None  # when the job ended, monotonic (None: killed from outside)
    lease_ended: float | None = None  # when the guard stopped it for want of a renewal
    timed_out: float | None = None  # when the guard stopped it at its timeout

    @classmethod
    def of(cls, returncode: int | None, report: dict[str, Any]) -> Outcome:
        """The outcome a run's report (see :func:`execute`, and the guard's) tells."""
        error = None
        if "error_type" in report:
            error = JobFailed(report["error_type"], report["traceback"], report.get("message"))
        return cls(
            returncode,
            error=error,
            interrupted_by=report.get("interrupted_by"),
            finished=bool(report.get("finished")),
            enqueued=report.get("enqueued"),
            ended=report.get("ended"),
            lease_ended=report.get("lease_ended"),
            timed_out=report.get("timed_out"),
        )


class JobProcess:
    """One job run in a child process. The scheduler's main thread drives it.

    :meth:`stop` may be called from another thread (keep-alive, when the lock is lost);
    a child that has not exited ``grace`` seconds after it was stopped is killed.
    :meth:`extend` (from the keep-alive thread) tells the child's guard the lease's new
    deadline.
    """

    stoppable = True  # by signals to its process group (an in-process run is not)

    def __init__(
        self,
        name: str,
        slot: Any,
        *,
        grace: float,
        deadline: float,
        margin: float,
        timeout: float | None = None,
        kwargs: dict[str, Any] | None = None,
        trace: dict[str, str] | None = None,
        token: int | None = None,
        info: RunInfo | None = None,
    ) -> None:
        self.name = name
        self.grace = grace
        self._killer: threading.Timer | None = None
        self._kill_at = float("inf")
        # One connection each way: the child reports on it, the scheduler sends the lease's
        # deadlines, and its end of file tells the guard the scheduler is gone.
        ours, theirs = socket.socketpair()
        self.reader = Connection(ours.detach())
        try:
            self.child = _server.start(
                (name, slot, deadline, margin, timeout, kwargs or {}, trace or {}, token, info),
                theirs.fileno(),
            )
        except BaseException:
            self.reader.close()
            raise
        finally:
            theirs.close()
        self.stopped_at: float | None = None
        self.stopped_by: int | None = None
        # What the guard's timer kills it at, to tell why when it did (see poll).
        self._limits = Limits(deadline, margin, timeout_at(timeout))
        self._report: dict[str, Any] = {}
        self._reported = False  # the report pipe reached its end
        self._mutex = threading.Lock()

    def waitables(self) -> list[Any]:
        """What the scheduler waits on for this child: its report pipe and its exit."""
        # Once the report pipe is at its end, only the exit is worth waiting for (a pipe
        # at its end is always "ready" and would make the loop spin).
        exit_pipe = [self.child.sentinel] if self.child.sentinel is not None else []
        return exit_pipe if self._reported else [self.reader, *exit_pipe]

    def extend(self, deadline: float) -> None:
        """Tell the guard the lease now lasts until ``deadline`` (monotonic seconds)."""
        with self._mutex, suppress(OSError):
            self._limits.deadline = max(self._limits.deadline, deadline)
            if not self.reader.closed:
                self.reader.send({"lease_until": deadline})

    def poll(self) -> Outcome | None:
        """Read what the child reported; its outcome once it has exited, else None."""
        try:
            while not self._reported and self.reader.poll():
                self._report.update(self.reader.recv())
        except Exception:  # its end (EOFError), or a report cut short by a kill
            self._reported = True
        exitcode = self.child.poll()
        if self.child.orphaned and self._reported:
            # The fork server died first: the job's end is its report connection's end.
            exitcode = self.child.exitcode = 0 if self._report.get("finished") else 1
        if exitcode is None:
            return None
        if exitcode == -signal.SIGALRM and not {"lease_ended", "timed_out"} & set(self._report):
            self._report.update(self._limits.passed())  # the guard's timer, not its thread
        with self._mutex:
            if self._killer is not None:
                self._killer.cancel()
            self.reader.close()
        self._signal_group(signal.SIGKILL)  # what the job started and left behind
        return Outcome.of(exitcode, self._report)

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
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.child.pid, signum)


# --- in the child -----------------------------------------------------------------------


def main(
    name: str,
    slot: Any,
    deadline: float,
    margin: float,
    timeout: float | None,
    kwargs: dict[str, Any],
    trace: dict[str, str],
    token: int | None = None,
    info: RunInfo | None = None,
    *,
    report: Connection,
    setup_failure: str = "",
) -> None:
    """The child: run job ``name`` for ``slot`` with the run's ``kwargs`` (those its
    history row records: a request's over the declared ones) and its fencing ``token``,
    and report how it went."""
    os.setsid()  # its own process group: a stop reaches the job's own children too
    guard = Guard(report, Limits(deadline, margin, timeout_at(timeout)))
    guard.start()
    # SIGTERM, SIGINT: Interrupted raised in the job while it runs; once it has ended
    # they are held until the process exits (the guard's SIGKILL still ends it).
    said = execute(
        name,
        slot,
        kwargs,
        token,
        trace,
        info=info,
        setup_failure=setup_failure,
        around=stop_on_signals,
        flush=True,  # what it traced: this process ends with os._exit
        after_job=_hold_stops,
    )
    _hold_stops()  # the job raised or was interrupted: its report goes out all the same
    guard.send(said)
    guard.end()
    with suppress(Exception):
        connections.close_all()
    code = 1  # it raised
    if said.get("finished"):
        code = 0
    elif "interrupted_by" in said:
        code = 128 + said["interrupted_by"]
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no atexit handlers of the fork server's


def execute(
    name: str,
    slot: Any,
    kwargs: dict[str, Any],
    token: int | None,
    trace: dict[str, str],
    *,
    info: RunInfo | None = None,
    setup_failure: str = "",
    around: Callable[[], AbstractContextManager[Any]] = nullcontext,
    flush: bool = False,
    after_job: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run job ``name`` for ``slot`` with the run's ``kwargs`` (those its history row
    records: a request's over the declared ones) and its fencing ``token``, in this
    thread, inside ``around()`` (``flush``: export what it traced at the end;
    ``after_job``: called as soon as the job has returned, still inside); what the
    run's report says: it returned (and what it enqueued), was interrupted, or raised
    (its traceback). A child process and an in-process run (``thread.py``) both run a
    job this way; each closes its thread's database connections after the report."""
    try:
        if setup_failure:
            raise RuntimeError(
                "Django could not be set up in the scheduler's fork server; restart the "
                f"scheduler once it is fixed. The error was:\n{setup_failure}"
            )
        job = function_of(name)
        if job is None:
            raise LookupError(f"no job named {name!r} is registered in this process")
        with around(), _traced(trace, flush=flush), running(info):
            value = job.with_arguments(kwargs).call(slot, token, info)
            ended = time.monotonic()  # before its spans are exported
            if after_job is not None:
                after_job()
        enqueued = value if isinstance(value, Enqueued) else None
        return {"finished": True, "enqueued": enqueued, "ended": ended}
    except Interrupted as exc:
        return {"interrupted_by": exc.signum, "ended": time.monotonic()}
    except BaseException as exc:  # everything a job raises is reported
        ended = time.monotonic()
        error = {
            "error_type": type(exc).__qualname__,
            "traceback": bounded_traceback(exc),
            # All of a message on many lines (the traceback's last line is only its last
            # line), bounded as the traceback is.
            "message": _message(exc)[:TRACEBACK_LIMIT],
        }
        return {**error, "ended": ended}


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # its __str__ raised: the traceback says so
        return f"<{type(exc).__qualname__}: its message could not be read>"


def _hold_stops() -> None:
    """The job has ended: SIGTERM and SIGINT are held until this process exits. A stop
    could now only turn what the job did into a kill (its spans' export, its report)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)


def _traced(trace: dict[str, str], *, flush: bool) -> AbstractContextManager[None]:
    """The run's trace continued while the job runs (OpenTelemetry on: ``trace`` is the
    run span's context), else nothing; ``flush``: export its spans at the end (a child
    process, which ends with ``os._exit``)."""
    if not trace:
        return nullcontext()
    return continued(trace, flush=flush)

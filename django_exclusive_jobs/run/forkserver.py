"""The fork server: one process that set Django up once and forks each job's process.

The scheduler starts it as ``python -c "...serve(FD)"`` with the scheduler's own module
search path (as ``PYTHONPATH``), environment, settings module and working directory, so
it imports the same project however the scheduler was started: from another folder
(a systemd unit without ``WorkingDirectory``), by ``django-admin`` with
``DJANGO_SETTINGS_MODULE``, by a script calling ``call_command``, or from a ``manage.py``
without a ``__main__`` guard. It never runs the user's main script: multiprocessing's
own fork server re-imports ``__main__`` in every child and ignores ``sys.path``.

One request per job run, on one Unix socket: the scheduler sends the job's name, slot,
arguments and lease deadline with two file descriptors, the child's end of its report connection and
the write end of its exit pipe. The server forks the child, answers with its pid, and
when the child exits writes its exit code (negative: killed by that signal) to the exit
pipe. When the scheduler is gone (its end of the socket closes), the server exits; the
jobs still running stop through their guard (``process.py``).
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import traceback
from collections.abc import Callable
from contextlib import suppress
from multiprocessing.connection import Connection
from typing import Any

import django
from django.conf import settings

HEADER = struct.Struct("!I")
ANSWER_WITHIN = 60.0  # seconds the fork server has to answer a request
EXIT = struct.Struct("!i")


class ForkServerGone(RuntimeError):
    """The fork server is not answering; the scheduler starts a new one next time."""


class Child:
    """A job's process, as the scheduler sees it: its pid and how it exited."""

    def __init__(self, pid: int, exit_pipe: int) -> None:
        self.pid = pid
        self.sentinel: int | None = exit_pipe  # readable once the child has exited
        self.exitcode: int | None = None
        # The fork server died before the child: its exit code will never come (the job
        # itself goes on; its report connection tells when it ends).
        self.orphaned = False

    def poll(self) -> int | None:
        """The exit code once the child has exited (without blocking), else None."""
        sentinel = self.sentinel
        if sentinel is not None and select.select([sentinel], [], [], 0)[0]:
            data = os.read(sentinel, EXIT.size)
            os.close(sentinel)
            self.sentinel = None
            if len(data) == EXIT.size:
                self.exitcode = EXIT.unpack(data)[0]
            else:
                self.orphaned = True
        return self.exitcode


class ForkServer:
    """The scheduler's end: starts the server on first use and asks it for children."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = None

    def ensure_running(self) -> None:
        """Start the server (Django is set up there once) unless it is running."""
        if self._process is not None and self._process.poll() is None:
            return
        self.close()
        ours, theirs = socket.socketpair()
        # The server's entry is process.serve_forks (its loop is serve, below, forking
        # process.main): process.py imports this module, never the other way round.
        entry = "from django_exclusive_jobs.run.process import serve_forks"
        code = f"{entry}; serve_forks({theirs.fileno()})"
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-c", code],
                pass_fds=[theirs.fileno()],
                env=child_environment(),
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        # A fork server stuck in Django's set-up must not hang the scheduler for ever.
        ours.settimeout(ANSWER_WITHIN)
        self._socket = ours

    def start(self, request: Any, report_fd: int) -> Child:
        """Fork a child that runs ``process.main(*request, report)``."""
        self.ensure_running()
        assert self._socket is not None
        payload = pickle.dumps(request)
        message = HEADER.pack(len(payload)) + payload
        exit_read, exit_write = os.pipe()
        try:
            socket.send_fds(self._socket, [message], [report_fd, exit_write])
            answer = _receive_exactly(self._socket, 4)
        except OSError as exc:  # a timeout too
            os.close(exit_read)
            self.close()
            raise ForkServerGone(f"the fork server did not answer: {exc}") from exc
        finally:
            os.close(exit_write)
        pid = HEADER.unpack(answer)[0] if answer is not None else 0
        if not pid:
            os.close(exit_read)
            if answer is None:
                self.close()
            raise ForkServerGone("the fork server could not start the job's process")
        return Child(pid, exit_read)

    def close(self) -> None:
        """Stop the server: it exits when its end of the socket closes (or is killed)."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        if self._process is not None:
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None


def child_environment() -> dict[str, str]:
    """This process's environment, with what a new interpreter needs to import the same
    project: its module search path (made absolute) and its settings module."""
    env = dict(os.environ)
    search = [os.path.abspath(entry or os.curdir) for entry in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(search))
    module = getattr(settings, "SETTINGS_MODULE", None)
    if module:
        env["DJANGO_SETTINGS_MODULE"] = module
    return env


def settings_reproducible() -> bool:
    """False when settings came from ``settings.configure()``: a new interpreter (the
    fork server) cannot load them."""
    return bool(getattr(settings, "SETTINGS_MODULE", None))


def _receive_exactly(sock: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


# --- in the fork server ---------------------------------------------------------------


def serve(fd: int, child: Callable[..., None], set_up: Callable[[], None] | None = None) -> None:
    """The server's loop: fork a child per request, which runs ``child(*request,
    report=..., setup_failure=...)`` (``process.main``), and report each child's exit;
    ``set_up()`` once Django is set up (what the children then inherit)."""
    # A SIGTERM sent to the whole process group (kill -- -PGID, tini -g, supervisord's
    # stopasgroup) must not take the server down with its running jobs.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    requests = socket.socket(fileno=fd)
    failure = _set_up_django()
    if not failure and set_up is not None:
        with suppress(Exception):  # only a saving: a child reads it again if need be
            set_up()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    exits: dict[int, int] = {}  # pid -> the write end of its exit pipe
    while True:
        ready, _, _ = select.select([requests.fileno(), wake_read], [], [])
        if wake_read in ready:
            with suppress(BlockingIOError):
                os.read(wake_read, 512)
        _reap(exits)
        if requests.fileno() in ready and not _serve_one(
            requests, exits, failure, (wake_read, wake_write), child
        ):
            break
    for exit_write in exits.values():
        os.close(exit_write)  # the scheduler is gone: nobody reads them
    os._exit(0)


def _serve_one(
    requests: socket.socket,
    exits: dict[int, int],
    failure: str,
    wake: tuple[int, int],
    child: Callable[..., None],
) -> bool:
    """Fork the child one request asks for; False when the scheduler is gone. A child
    that cannot be forked (a process limit, no file descriptors) is answered with pid 0:
    that start fails, and the server and the running jobs go on."""
    try:
        data, fds, _flags, _address = socket.recv_fds(requests, 65536, 2)
    except OSError:
        return False
    if not data or len(fds) != 2:
        for fd in fds:
            os.close(fd)
        return False
    report_fd, exit_write = fds
    try:
        size = HEADER.unpack(data[: HEADER.size])[0]
        payload = data[HEADER.size :]
        if len(payload) < size:
            payload += _receive_exactly(requests, size - len(payload)) or b""
        pid = os.fork()
    except OSError:
        os.close(report_fd)
        os.close(exit_write)
        requests.sendall(HEADER.pack(0))
        return True
    if pid == 0:  # the child: never returns
        try:
            signal.set_wakeup_fd(-1)
            for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, signal.SIG_DFL)
            requests.close()
            for other in (*exits.values(), exit_write, *wake):
                os.close(other)
            _run_child(child, pickle.loads(payload), report_fd, failure)
        finally:
            os._exit(70)
    os.close(report_fd)
    exits[pid] = exit_write
    requests.sendall(HEADER.pack(pid))
    return True


def _run_child(child: Callable[..., None], request: Any, report_fd: int, failure: str) -> None:
    code = 70  # EX_SOFTWARE: main() itself failed
    try:
        child(*request, report=Connection(report_fd), setup_failure=failure)
    finally:
        os._exit(code)


def _reap(exits: dict[int, int]) -> None:
    while exits:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        # What the job started and left behind (its process group): a job ended by its
        # guard's timer (see guard.py) could not stop them itself.
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        exit_write = exits.pop(pid, None)
        if exit_write is not None:
            with suppress(OSError):
                os.write(exit_write, EXIT.pack(os.waitstatus_to_exitcode(status)))
            os.close(exit_write)


def _set_up_django() -> str:
    """Set Django up before any child forks; the error text if it failed (each child then
    reports it: a half-set-up Django cannot be set up again in the same process). What
    each child runs (``process.py``, and multiprocessing.connection, which it imports) is
    imported already: it is the server's entry (imported in each child, it cost some
    4.5 ms of CPU per run)."""
    try:
        django.setup()
    except Exception:
        return traceback.format_exc()
    return ""

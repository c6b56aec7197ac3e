"""Test helpers: another server as a real OS process, started commands reaped, and direct
row access."""

from __future__ import annotations

import atexit
import datetime as dt
import glob
import multiprocessing
import os
import signal
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from django_exclusive_jobs.lock.clock import now_plus
from django_exclusive_jobs.models import JobLock

SPAWN = multiprocessing.get_context("spawn")


@contextmanager
def reaped() -> Iterator[list[subprocess.Popen[str]]]:
    """A list for the commands a test starts; on the way out each one still running is
    resumed (a test may have stopped it) and killed, and all are reaped."""
    started: list[subprocess.Popen[str]] = []
    try:
        yield started
    finally:
        for process in started:
            if process.poll() is None:
                with suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGCONT)
                process.kill()
            try:
                process.communicate(timeout=30)
            except subprocess.TimeoutExpired:  # a child program still holds its pipes
                process.wait(10)


def row(alias: str, name: str) -> JobLock:
    return JobLock.objects.using(alias).get(name=name)


def postgres_log() -> Path | None:
    """The PostgreSQL server's log file on this machine (Debian's layout), if readable."""
    found = sorted(glob.glob("/var/log/postgresql/postgresql-*-main.log"), key=os.path.getmtime)
    return Path(found[-1]) if found and os.access(found[-1], os.R_OK) else None


def log_lines_since(path: Path, offset: int, database: str) -> list[str]:
    """The server log's lines about ``database`` written after ``offset``."""
    with path.open(errors="replace") as log:
        log.seek(offset)
        return [line for line in log.read().splitlines() if f"@{database} " in line]


def expire_now(alias: str, name: str) -> None:
    """Make the lease of ``name`` run out now, as if its time had passed."""
    JobLock.objects.using(alias).filter(name=name).update(
        expires_at=now_plus(-dt.timedelta(seconds=1))
    )


class OtherServer:
    """A separate OS process with its own identity that takes and releases locks on demand."""

    def __init__(self) -> None:
        from . import _workers

        self._conn, child = SPAWN.Pipe()
        self._process = SPAWN.Process(target=_workers.serve_commands, args=(child,), daemon=True)
        self._process.start()
        child.close()
        self._mutex = threading.Lock()
        self.alias = "default"
        self.holder = self.call("holder")

    def call(self, *command: Any) -> Any:
        with self._mutex:
            self._conn.send(command)
            if not self._conn.poll(60):
                raise TimeoutError(f"other server did not answer {command!r}")
            ok, value = self._conn.recv()
        if not ok:
            raise RuntimeError(f"other server failed on {command!r}: {value}")
        return value

    def try_acquire(self, name: str, **kwargs: Any) -> int | None:
        return self.call("acquire", self.alias, name, kwargs)

    def release(self, name: str | None = None) -> bool:
        return self.call("release", name)

    def close(self) -> None:
        try:
            self.call("stop")
        except (OSError, EOFError, TimeoutError):
            pass  # already gone: multiprocessing ends daemon children at exit too
        finally:
            self._process.join(10)
            if self._process.is_alive():
                self._process.kill()


_server: OtherServer | None = None


def _shutdown() -> None:
    if _server is not None:
        _server.close()


atexit.register(_shutdown)


@contextmanager
def other_holder(alias: str) -> Iterator[OtherServer]:
    """The other server, pointed at ``alias``; whatever it holds is dropped afterwards."""
    global _server
    if _server is None or not _server._process.is_alive():
        _server = OtherServer()
    _server.alias = alias
    try:
        yield _server
    finally:
        _server.call("forget")


def race_slots(
    alias: str,
    name: str,
    *,
    processes: int,
    every: float,
    triggers: int,
    shifts: Sequence[float] = (),
) -> tuple[Counter[int], float]:
    """``processes`` real processes call an ``every=`` job around each of ``triggers``
    slots (see ``_workers.slot_racer``); how often each trigger ran, and the first slot."""
    import math
    import time

    from . import _workers

    ready = SPAWN.Barrier(processes + 1)
    go = SPAWN.Barrier(processes + 1)
    start_at = SPAWN.Value("d", 0.0)
    results = SPAWN.Queue()
    workers = [
        SPAWN.Process(
            target=_workers.slot_racer,
            args=(alias, name, every, triggers, ready, go, start_at, results, n)
            + ((shifts[n],) if shifts else ()),
        )
        for n in range(processes)
    ]
    ran: Counter[int] = Counter()
    with started_workers(workers):
        ready.wait(180)
        first = math.ceil((time.time() + 1.5) / every) * every
        start_at.value = first
        go.wait(60)
        for _ in workers:
            _worker, triggered, error = results.get(timeout=triggers * every + 120)
            assert error is None, error
            ran.update(triggered)
    return ran, first


@contextmanager
def started_workers(workers: Sequence[Any]) -> Iterator[None]:
    """Start these worker processes; on the way out join each, killing one still there
    30 s later."""
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        for worker in workers:
            worker.join(30)
            if worker.is_alive():
                worker.kill()

"""Stopping a run without leaving its lock held: on SIGTERM or SIGINT, or at its timeout."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

KILL_AFTER = 5.0  # seconds a job sent SIGTERM (a stop, its timeout) gets before SIGKILL


class Interrupted(BaseException):
    """Raised in the main thread when SIGTERM or SIGINT arrives during an in-process job.

    A BaseException, like KeyboardInterrupt, so ``except Exception`` in a job does not
    swallow it and its ``finally`` blocks still run.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


class TimedOut(BaseException):
    """A run that lasted longer than its job's ``timeout``: raised in the main thread of
    an in-process run (a BaseException, as :class:`Interrupted`), or the reason recorded
    for a process that was stopped."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        super().__init__(f"the run passed its timeout of {seconds:g}s and was stopped")


class Cancelled(BaseException):
    """Why a run of a job with ``overlap="cancel_other"`` was stopped: a newer slot's
    start asked for it."""

    def __init__(self, by: str) -> None:
        self.by = by
        super().__init__(f"stopped so that a newer slot could run (asked by {by})")


@contextmanager
def time_limit(seconds: float, on_timeout: Callable[[], None]) -> Iterator[None]:
    """While inside, ``on_timeout()`` is called once ``seconds`` have passed (from a
    SIGALRM handler, in the main thread: it may raise there, as a SIGTERM handler does).

    Only the main thread can handle signals; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: on_timeout())
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


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

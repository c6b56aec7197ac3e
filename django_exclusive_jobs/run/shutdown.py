"""Stopping a run on SIGTERM or SIGINT without leaving its lock held."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class Interrupted(BaseException):
    """Raised in the main thread when SIGTERM or SIGINT arrives during an in-process job.

    A BaseException, like KeyboardInterrupt, so ``except Exception`` in a job does not
    swallow it and its ``finally`` blocks still run.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


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

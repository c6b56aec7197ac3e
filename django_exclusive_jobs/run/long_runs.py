"""``warn_after=``: a run that lasts that long is running long. It goes on; the process
that holds its lock says so once (a line, ``job_running_long``), and the jobs page, the
health view, ``--check`` and the metric show it (``models.running_long``)."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable

from .. import logs, signals
from ..lock.keepalive import wake_at
from ..lock.lock import Lock
from ..logs import line


class LongRunWatch:
    """One run's ``warn_after``: at that moment (monotonic), unless the run has ended,
    one line and ``job_running_long``, from a thread of their own (a slow receiver holds
    up no keep-alive). Costs no thread for a run that ends sooner."""

    def __init__(
        self,
        name: str,
        lock: Lock,
        slot: dt.datetime | None,
        after: float,
        say: Callable[[logs.Line], None],
    ) -> None:
        self.name, self.lock, self.slot, self.after = name, lock, slot, after
        self._say = say
        self._started = time.monotonic()
        self._ended = threading.Event()

    def start(self) -> None:
        wake_at(self._started + self.after, self)

    @property
    def stopped(self) -> bool:
        return self._ended.is_set()

    def stop(self) -> None:
        """The run has ended: nothing is said if it was not yet."""
        self._ended.set()

    def begin(self) -> None:
        if not self.stopped:
            name = f"exclusive-jobs-running-long:{self.name}"
            threading.Thread(target=self._tell, name=name, daemon=True).start()

    def _tell(self) -> None:
        running_for = time.monotonic() - self._started
        said = (
            f"running long {self.name}: running for {running_for:.0f}s, past its "
            f"warn_after of {self.after:g}s; it goes on"
        )
        fields = {"token": self.lock.token, "holder": self.lock.holder, "slot": self.slot}
        self._say(line("running_long", said, job_name=self.name, duration=running_for, **fields))
        logs.send_robustly(
            signals.job_running_long,
            "job_running_long",
            logs.extra("running_long", job_name=self.name),
            sender=self.name,
            name=self.name,
            lock=self.lock,
            slot=self.slot,
            running_for=running_for,
            warn_after=self.after,
        )

"""A database outage as the scheduler lives it: one line when the database stops
answering, one when it answers again, and how long to wait between two probes."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..logs import Line, line

PROBE_EVERY = 1.0  # seconds between two tries while the database is down


class Outage:
    """One line when the database stops answering and one when it answers again.

    While it lasts, nothing is started: the loop only probes (clock and heartbeat) every
    second, so the database's return is noticed within about a second, and the slots due
    meanwhile start then, each under its job's catch-up policy. Nothing is retried at
    "now + backoff": a start is always at a slot's time (or a failed slot's ``retry_at``).
    """

    def __init__(self, say: Callable[[Line, bool], None]) -> None:
        self.say = say
        self.since: float | None = None
        self.failures = 0

    def failed(self, exc: BaseException) -> float:
        """Note a failure; how long to wait before the next try."""
        if self.since is None:
            self.since = time.monotonic()
            said = f"database unreachable, retrying with backoff: {exc}"
            self.say(line("database", said, status="down", error=type(exc).__name__), False)
        self.failures += 1
        return float(min(PROBE_EVERY, 0.25 * 2 ** min(self.failures - 1, 10)))

    @property
    def ongoing(self) -> bool:
        return self.since is not None

    def ended(self) -> None:
        if self.since is not None:
            down = time.monotonic() - self.since
            said = f"database reachable again after {down:.1f}s"
            self.say(line("database", said, status="up", duration=down), False)
        self.since, self.failures = None, 0

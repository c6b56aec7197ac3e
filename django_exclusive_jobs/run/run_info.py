"""The run, given to the job: a job function that takes ``run`` gets a :class:`RunInfo`
(``slot=`` and ``token=`` are spellings of ``run.slot`` and ``run.token``); a program
under ``run_exclusive NAME -- PROGRAM`` and a management command run under the lock get
the same facts as environment variables (:data:`ENVIRONMENT`); code anywhere in the job
reads :func:`current_run`."""

from __future__ import annotations

import contextvars
import datetime as dt
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

# Each fact's environment variable (a time in ISO 8601, UTC; a missing one is unset).
ENVIRONMENT = {
    "name": "EXCLUSIVE_JOBS_NAME",
    "slot": "EXCLUSIVE_JOBS_SLOT",
    "attempt": "EXCLUSIVE_JOBS_ATTEMPT",
    "token": "EXCLUSIVE_JOBS_TOKEN",
    "why": "EXCLUSIVE_JOBS_WHY",
    "requested_by": "EXCLUSIVE_JOBS_REQUESTED_BY",
    "lease_until": "EXCLUSIVE_JOBS_LEASE_UNTIL",
    "deadline": "EXCLUSIVE_JOBS_DEADLINE",
}


@dataclass(frozen=True)
class RunInfo:
    """One run, as its job sees it. Times are on the database's clock (UTC).

    ``why``: ``"scheduled"`` (its slot, from a scheduler or a cron line), ``"catch_up"``
    (a slot older than the latest, run late), ``"retry"`` (``attempt`` > 1),
    ``"run_now"`` and ``"backfill"`` (``requested_by`` says who asked), or ``"call"``
    (a direct call of the function). ``lease_until``: when the lease ends as the run
    starts (keep-alive renews it while the job runs); ``deadline``: when its timeout
    stops it (None: no timeout)."""

    name: str
    slot: dt.datetime | None
    attempt: int
    token: int
    why: str
    requested_by: str | None
    lease_until: dt.datetime | None
    deadline: dt.datetime | None

    def environment(self) -> dict[str, str]:
        """The facts as environment variables (:data:`ENVIRONMENT`); None ones left out."""
        found: dict[str, str] = {}
        for field, variable in ENVIRONMENT.items():
            value = getattr(self, field)
            if value is not None:
                found[variable] = (
                    value.isoformat() if isinstance(value, dt.datetime) else str(value)
                )
        return found


_current: contextvars.ContextVar[RunInfo | None] = contextvars.ContextVar(
    "exclusive_jobs_run", default=None
)


def current_run() -> RunInfo | None:
    """The run whose job executes in this thread (or task), if any."""
    return _current.get()


@contextmanager
def running(info: RunInfo | None) -> Iterator[None]:
    """While the job executes: :func:`current_run` is ``info``."""
    token = _current.set(info)
    try:
        yield
    finally:
        _current.reset(token)


@contextmanager
def in_environment(info: RunInfo | None) -> Iterator[None]:
    """The facts in this process's environment while a management command runs under
    the lock (it runs in this process), and the environment as it was after."""
    if info is None:
        yield
        return
    given = info.environment()
    before = {variable: os.environ.get(variable) for variable in ENVIRONMENT.values()}
    for variable in ENVIRONMENT.values():
        os.environ.pop(variable, None)
    os.environ.update(given)
    try:
        yield
    finally:
        for variable, value in before.items():
            if value is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = value

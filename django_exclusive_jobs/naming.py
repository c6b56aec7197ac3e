"""How a holder, a slot's lock and a run's arguments are written, the same everywhere.

Plain functions of plain values (no models, no settings): the tables (``models.py``), the
lock engine (``lock/``) and the run (``run/``) all use them, so they sit below all three.
"""

from __future__ import annotations

import datetime as dt
import json
from contextlib import suppress
from typing import Any


def holder_name(host: str, pid: int | None, instance: str) -> str:
    """How a holder is shown everywhere (logs, admin, CLI): ``host:pid:instance``."""
    return f"{host}:{pid}:{instance[:8]}" if instance else ""


# A slot's own lock (``overlap="allow_all"``, see ``run/slot_locks.py``): ``NAME@SLOT``.
SEPARATOR = "@"
FORMAT = "%Y-%m-%dT%H:%M:%SZ"
# How many characters a slot adds to the job's name (a job's name must leave room).
LENGTH = len(SEPARATOR) + len(dt.datetime(2026, 1, 1).strftime(FORMAT))


def lock_name(name: str, slot: dt.datetime) -> str:
    """The lock of ``slot`` of the job ``name``."""
    return f"{name}{SEPARATOR}{slot.astimezone(dt.UTC).strftime(FORMAT)}"


def job_of(lock: str) -> str:
    """The job whose lock ``lock`` is: the name before a slot's suffix, if it has one."""
    job, separator, slot = lock.rpartition(SEPARATOR)
    if separator and len(separator + slot) == LENGTH:
        with suppress(ValueError):
            dt.datetime.strptime(slot, FORMAT)
            return job
    return lock


def describe_arguments(kwargs: dict[str, Any]) -> str:
    """A run's arguments in one short line, as JSON ("" for none)."""
    return json.dumps(kwargs, sort_keys=True, ensure_ascii=False) if kwargs else ""

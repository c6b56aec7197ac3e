"""Counts the statements a scheduler process sends through Django's cursor.

Installed by the app in the scheduler process when ``$BENCH_STATEMENTS`` names a
directory: every connection the process opens (the scheduler's own, and those of
keep-alive threads) gets an execute wrapper that counts each statement by thread (the
main thread, keep-alive, other) and kind (first word and table). At exit the counts are
written to ``<dir>/statements-<pid>.json``: totals, and per second of the wall clock
unless ``$BENCH_TIMELINE`` is ``0`` (a run of many minutes whose memory is measured
keeps totals only, so the counter itself cannot grow).
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

TABLES = (
    ("joblock", "lock"),
    ("jobrun", "run"),
    ("jobstate", "state"),
    ("runrequest", "request"),
    ("_scheduler", "scheduler"),
)

_totals: Counter[str] = Counter()
_timeline: defaultdict[int, Counter[str]] | None = None
_mutex = threading.Lock()


def kind_of(sql: str) -> str:
    """E.g. ``UPDATE lock``, ``INSERT run``, ``SELECT clock``; the scheduler's look for
    requests and overrides (models/beats.py) is ``SELECT look``, or ``INSERT beat+look``
    when its beat carries it."""
    verb = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else "?"
    lowered = sql.lower()
    if "runrequest" in lowered and "jobstate" in lowered and "_scheduler" in lowered:
        return f"{verb} beat+look" if verb == "INSERT" else f"{verb} look"
    for needle, table in TABLES:
        if needle in lowered:
            return f"{verb} {table}"
    return f"{verb} clock" if verb == "SELECT" and "from" not in lowered else verb


def thread_of() -> str:
    current = threading.current_thread()
    if current is threading.main_thread():
        return "main"
    if current.name.startswith("exclusive-jobs-keepalive"):
        return "keepalive"
    return "other"


def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
    key = f"{thread_of()}: {kind_of(sql)}"
    with _mutex:
        _totals[key] += 1
        if _timeline is not None:
            _timeline[int(time.time())][key] += 1
    return execute(sql, params, many, context)


def on_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    if count not in connection.execute_wrappers:
        connection.execute_wrappers.append(count)


def install(directory: str) -> None:
    global _timeline
    from django.db.backends.signals import connection_created

    if os.environ.get("BENCH_TIMELINE", "1") != "0":
        _timeline = defaultdict(Counter)
    connection_created.connect(on_connection, weak=False)
    pid = os.getpid()

    def dump() -> None:
        if os.getpid() != pid:
            return
        with _mutex:
            data = {
                "pid": pid,
                "totals": dict(_totals),
                "timeline": {str(k): dict(v) for k, v in (_timeline or {}).items()},
            }
        Path(directory, f"statements-{pid}.json").write_text(json.dumps(data))

    atexit.register(dump)

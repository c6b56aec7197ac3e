"""The campaign's jobs and the events each run appends to ``$CAMPAIGN_HISTORY``.

Each run, in the job's own process (the scheduler's child, or ``run_exclusive`` itself):

1. is given its slot and its fencing token (a ``token`` parameter), and finds its run
   row, ``JobRun`` of (job, slot, the process holding the lock), for its attempt;
2. reads the database's clock and the job's ``JobLock`` row in one statement, and
   appends ``start``;
3. works for a while (a duration drawn from the seed, the job and the slot);
4. writes with the token it was given through the fenced resource, the table
   ``campaign_fenced`` (job, token, seq),
   as docs/how-it-works.md says: ``UPDATE ... SET token = mine WHERE job = %s AND token
   <= mine``, and reads back the resource's count of accepted writes in the same
   transaction; appends ``fenced_write`` (accepted or refused);
5. reads clock and lock row again, and appends ``end``.

Each event is one line of JSON written by one ``write`` call on a file opened with
``O_APPEND``, so the lines of concurrent processes never mix.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

from django.db import connections, transaction

from django_exclusive_jobs import exclusive_job
from django_exclusive_jobs.lock.clock import now_sql, to_datetime
from django_exclusive_jobs.models import JobLock, JobRun

TTL = os.environ.get("CAMPAIGN_TTL", "4s")
FENCED = "campaign_fenced"
# name: (every, the longest usual run, chance of a long run, chance of a failure)
JOBS: dict[str, dict[str, Any]] = {
    "camp_a": {"every": 1.0, "work": (0.05, 0.6), "long": 0.0, "fail": 0.0, "retries": 0},
    "camp_b": {"every": 2.0, "work": (0.2, 1.2), "long": 0.1, "fail": 0.0, "retries": 0},
    "camp_c": {"every": 2.0, "work": (0.1, 0.8), "long": 0.0, "fail": 0.15, "retries": 1},
}


def emit(kind: str, **fields: Any) -> None:
    """Append one event to the history (one write, O_APPEND)."""
    path = os.environ.get("CAMPAIGN_HISTORY")
    if not path:
        return
    event = {"kind": kind, "wall": time.time(), "proc": os.environ.get("CAMPAIGN_PROC"), **fields}
    data = (json.dumps(event, default=str) + "\n").encode()
    handle = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(handle, data)
    finally:
        os.close(handle)


def draw(*parts: Any) -> float:
    """A number in [0, 1) fixed by the campaign's seed and ``parts``."""
    text = "/".join(str(part) for part in (os.environ.get("CAMPAIGN_SEED", "0"), *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


def observe(name: str) -> dict[str, Any]:
    """The database's clock and the job's lock row, read by one statement."""
    connection = connections["default"]
    table = connection.ops.quote_name(JobLock._meta.db_table)
    sql = (
        f"SELECT {now_sql(connection.vendor)}, token, acquired_at, expires_at, released_at "
        f"FROM {table} WHERE name = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [name])
        found = cursor.fetchone()
    if found is None:
        return {"db_now": None, "lock": None}
    now, token, acquired, expires, released = found
    return {
        "db_now": _iso(to_datetime(connection, now)),
        "lock": {
            "token": token,
            "acquired_at": _iso(to_datetime(connection, acquired)),
            "expires_at": _iso(to_datetime(connection, expires)),
            "released_at": _iso(to_datetime(connection, released)),
        },
    }


def _iso(value: dt.datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.isoformat()


def fenced_write(name: str, token: int) -> dict[str, Any]:
    """The write through the fenced resource: accepted unless a higher token wrote."""
    connection = connections["default"]
    with transaction.atomic(using="default"), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {FENCED} SET token = %s, seq = seq + 1 WHERE job = %s AND token <= %s",
            [token, name, token],
        )
        accepted = cursor.rowcount == 1
        cursor.execute(
            f"SELECT {now_sql(connection.vendor)}, token, seq FROM {FENCED} WHERE job = %s",
            [name],
        )
        now, current, seq = cursor.fetchone()
    return {
        "accepted": accepted,
        "seq": seq if accepted else None,
        "current_token": current,
        "db_now": _iso(to_datetime(connection, now)),
    }


def work(name: str, slot: dt.datetime | None, token: int) -> None:
    """One run, with a marker file ``$CAMPAIGN_RUNNING/<holder pid>-<pid>`` while it
    lasts: the nemesis prefers to freeze or kill a process that is inside its job."""
    holder = os.environ.get("CAMPAIGN_HOLDER_PID") or str(os.getpid())
    marker = os.path.join(os.environ.get("CAMPAIGN_RUNNING", "."), f"{holder}-{os.getpid()}")
    if os.environ.get("CAMPAIGN_RUNNING"):
        with open(marker, "w"):
            pass
    try:
        _work(name, slot, token)
    finally:
        if os.environ.get("CAMPAIGN_RUNNING"):
            with contextlib.suppress(OSError):
                os.unlink(marker)


def _work(name: str, slot: dt.datetime | None, token: int) -> None:
    settings = JOBS[name]
    holder = int(os.environ.get("CAMPAIGN_HOLDER_PID") or os.getpid())
    base: dict[str, Any] = {
        "job": name,
        "slot": _iso(slot),
        "pid": os.getpid(),
        "holder_pid": holder,
        "given_token": token,
    }
    try:
        rows = JobRun.objects.using("default").filter(name=name, slot=slot, pid=holder)
        rows = rows.exclude(status__in=("missed", "skipped", "paused"))
        run = rows.order_by("-attempt").values("id", "attempt", "token", "status").first()
        seen = observe(name)
    except Exception as exc:
        emit("job_error", where="start", error=f"{type(exc).__name__}: {exc}", **base)
        raise
    if run is not None:
        base.update(run_id=run["id"], attempt=run["attempt"], token=run["token"])
    emit("start", run_status=run and run["status"], **base, **seen)
    low, high = settings["work"]
    attempt = base.get("attempt", 0)
    seconds = low + (high - low) * draw(name, slot, attempt, "work")
    if draw(name, slot, attempt, "long") < settings["long"]:
        seconds = settings["every"] * 1.3
    time.sleep(seconds)
    if run is None or run["token"] is None:
        return  # the checker flags a start without its run row
    if run["token"] != token:
        emit("job_error", where="token", error=f"given {token}, run row {run['token']}", **base)
    try:
        wrote = fenced_write(name, token)
    except Exception as exc:
        emit("job_error", where="fenced_write", error=f"{type(exc).__name__}: {exc}", **base)
        raise
    emit("fenced_write", **base, **wrote)
    try:
        seen = observe(name)
    except Exception as exc:
        emit("job_error", where="end", error=f"{type(exc).__name__}: {exc}", **base)
        raise
    emit("end", **base, **seen)
    if draw(name, slot, attempt, "fail") < settings["fail"]:
        raise RuntimeError("the campaign's job fails on purpose (retries)")


def make_job(name: str) -> Callable[[dt.datetime, int], None]:
    settings = JOBS[name]

    def job(slot: dt.datetime, token: int) -> None:
        work(name, slot, token)

    job.__name__ = job.__qualname__ = name
    options: dict[str, Any] = {"every": f"{settings['every']:g}s", "ttl": TTL}
    if settings["retries"]:
        options.update(retries=settings["retries"], retry_backoff="1s")
    return exclusive_job(name, **options)(job)


for _name in JOBS:
    make_job(_name)

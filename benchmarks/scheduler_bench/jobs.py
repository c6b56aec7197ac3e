"""``$BENCH_JOBS`` jobs, ``bench_000`` ..., each due every ``$BENCH_EVERY``; run in the
scheduler's own process (``in_process=True``) if ``$BENCH_IN_PROCESS`` is ``1``.

A run appends ``name slot pid time`` to ``$BENCH_RUNS_FILE``: ``time`` is this
machine's clock (``time.time()``) at the job's first line, so the benchmark counts real
executions and sees when each child started. Lines are short single ``write`` calls in
append mode, so runs in many processes do not mix them.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Callable

from django_exclusive_jobs import exclusive_job

JOBS = int(os.environ.get("BENCH_JOBS", "50"))
EVERY = os.environ.get("BENCH_EVERY", "10s")
IN_PROCESS = os.environ.get("BENCH_IN_PROCESS") == "1"


def make_job(name: str) -> Callable[[dt.datetime], None]:
    def job(slot: dt.datetime) -> None:
        first = time.time()
        path = os.environ.get("BENCH_RUNS_FILE")
        if path:
            with open(path, "a") as handle:
                handle.write(f"{name} {slot.isoformat()} {os.getpid()} {first:.6f}\n")

    job.__name__ = job.__qualname__ = name
    return exclusive_job(name, every=EVERY, in_process=IN_PROCESS)(job)


for number in range(JOBS):
    make_job(f"bench_{number:03d}")

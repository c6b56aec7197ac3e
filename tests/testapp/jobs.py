"""Jobs the command tests run in real `manage.py run_exclusive` processes.

Each job appends a line to the file named by $MARKER (if set), so a test can count
how many processes really ran it.
"""

from __future__ import annotations

import asyncio
import os
import time

from django_exclusive_jobs import exclusive_job


def mark(text: str) -> None:
    path = os.environ.get("MARKER")
    if path:
        with open(path, "a") as handle:
            handle.write(f"{text} {os.getpid()}\n")


@exclusive_job("quick")
def quick() -> None:
    mark("quick")


@exclusive_job("slow", ttl=2)
def slow() -> None:
    mark("slow-start")
    time.sleep(float(os.environ.get("JOB_SECONDS", "30")))
    mark("slow-end")


@exclusive_job("broken")
def broken() -> None:
    mark("broken")
    raise RuntimeError("the report server said no")


@exclusive_job("async_quick")
async def async_quick() -> None:
    await asyncio.sleep(0)
    mark("async_quick")


@exclusive_job("keepalive_probe")
def keepalive_probe() -> None:
    import threading

    running = any(t.name.startswith("exclusive-jobs-keepalive:") for t in threading.enumerate())
    mark(f"keepalive={running}")

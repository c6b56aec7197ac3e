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


# --- jobs the scheduler tests serve (`exclusive_scheduler --jobs ...`) ---------------------


@exclusive_job("tick", every=os.environ.get("TICK_EVERY", "2s"), ttl=3)
def tick(slot: object) -> None:
    mark(f"tick {slot.isoformat()}")  # type: ignore[attr-defined]
    time.sleep(float(os.environ.get("JOB_SECONDS", "0")))


@exclusive_job("tick_all", every=os.environ.get("TICK_EVERY", "2s"), ttl=3, catch_up="all")
def tick_all(slot: object) -> None:
    mark(f"tick_all {slot.isoformat()}")  # type: ignore[attr-defined]


@exclusive_job("tick_skip", every=os.environ.get("TICK_EVERY", "2s"), ttl=3, catch_up="skip")
def tick_skip(slot: object) -> None:
    mark(f"tick_skip {slot.isoformat()}")  # type: ignore[attr-defined]


@exclusive_job("tick_retry", every=os.environ.get("TICK_EVERY", "2s"), ttl=3, retry_failed=True)
def tick_retry(slot: object) -> None:
    mark(f"tick_retry-start {slot.isoformat()}")  # type: ignore[attr-defined]
    time.sleep(float(os.environ.get("JOB_SECONDS", "0")))
    mark(f"tick_retry {slot.isoformat()}")  # type: ignore[attr-defined]


@exclusive_job("crash", every=os.environ.get("TICK_EVERY", "2s"))
def crash() -> None:
    how = os.environ.get("CRASH", "raise")
    mark(f"crash-{how}")
    if how == "exit":
        os._exit(3)
    if how == "segfault":
        import ctypes

        ctypes.string_at(0)
    raise RuntimeError("the job fell over")


# --- django.tasks Tasks scheduled with @exclusive_job (tests/test_tasks.py) ------------

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django_tasks backport
    from django_tasks import task


@exclusive_job("enqueue_tick", every=os.environ.get("TICK_EVERY", "2s"), retry_failed=True)
@task()
def enqueue_tick(slot: str) -> None:
    mark(f"enqueue_tick {slot}")


@exclusive_job("enqueue_now", every="1h")
@task(backend="immediate")
def enqueue_now(slot: str) -> None:
    mark(f"enqueue_now {slot}")


@exclusive_job("spin", every=os.environ.get("TICK_EVERY", "2s"), ttl=3)
def spin(slot: object) -> None:
    mark(f"spin {slot.isoformat()}")  # type: ignore[attr-defined]
    while True:  # holds the GIL: only another process can stop it
        pass


if os.environ.get("RAISING_RECEIVERS"):
    from django_exclusive_jobs import signals

    def _raise(**kwargs: object) -> None:
        raise RuntimeError("a receiver that raises")

    for _signal in (signals.job_finished, signals.slot_missed):
        _signal.connect(_raise, weak=False, dispatch_uid=f"raise-{id(_signal)}")


@exclusive_job("long_tick", every=os.environ.get("TICK_EVERY", "2s"), ttl=3)
def long_tick(slot: object) -> None:
    """Beats (the wall-clock time) every 50 ms for JOB_SECONDS: a test sees when it stops."""
    mark(f"long_tick-start {slot.isoformat()}")  # type: ignore[attr-defined]
    end = time.monotonic() + float(os.environ.get("JOB_SECONDS", "12"))
    while time.monotonic() < end:
        mark(f"long_tick-beat {time.time():.3f}")
        time.sleep(0.05)
    mark(f"long_tick-end {slot.isoformat()}")  # type: ignore[attr-defined]


@exclusive_job("steady", every=os.environ.get("TICK_EVERY", "2s"), ttl=30)
def steady(slot: object) -> None:
    """A long lease: a short database outage during the run does not end it."""
    mark(f"steady-start {slot.isoformat()}")  # type: ignore[attr-defined]
    time.sleep(float(os.environ.get("JOB_SECONDS", "0")))
    mark(f"steady-end {slot.isoformat()}")  # type: ignore[attr-defined]


# --- jitter and several schedules with arguments (tests/test_jitter.py, test_arguments.py)


@exclusive_job("jittery", every="4s", jitter="2s", ttl=5, catch_up="skip")
def jittery(slot: object) -> None:
    mark(f"jittery {slot.isoformat()}")  # type: ignore[attr-defined]


@exclusive_job(
    "summary",
    schedules={
        "daily": {"cron": "0 6 * * *", "kwargs": {"period": "day"}},
        "weekly": {"cron": "0 7 * * 1", "timezone": "Europe/Paris", "kwargs": {"period": "week"}},
    },
)
def summary(period: str, slot: object = None) -> None:
    mark(f"summary {period}")


@exclusive_job("digest", every="1h", kwargs={"recipients": ["ops@example.com"], "limit": 5})
def digest(recipients: list[str], limit: int) -> None:
    mark(f"digest {','.join(recipients)} {limit}")

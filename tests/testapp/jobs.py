"""Jobs the command tests run in real `manage.py run_exclusive` processes.

Each job appends a line to the file named by $MARKER (if set), so a test can count
how many processes really ran it.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from django_exclusive_jobs import celery_beat_job, exclusive_job, schedule_celery_task


def mark(text: str) -> None:
    path = os.environ.get("MARKER")
    if path:
        with open(path, "a") as handle:
            handle.write(f"{text} {os.getpid()}\n")


def failure(usual: str) -> RuntimeError:
    """What a failing job raises: ``usual``, or the JSON string in the file named by
    $ERROR_FILE (a message holding any character, NUL and lone surrogates too, of any
    length: tests/test_forged_output.py)."""
    path = os.environ.get("ERROR_FILE")
    return RuntimeError(json.loads(Path(path).read_text()) if path else usual)


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
    raise failure("the report server said no")


@exclusive_job("async_quick")
async def async_quick() -> None:
    await asyncio.sleep(0)
    mark("async_quick")


@exclusive_job("keepalive_probe")
def keepalive_probe() -> None:
    """Whether the lock this run holds has its keep-alive (its threads start only when the
    first renewal is due)."""
    from django_exclusive_jobs.lock.lock import held_here

    running = any(lock._keepalive is not None for lock in held_here().values())
    mark(f"keepalive={running}")


# --- jobs the scheduler tests serve (`exclusive_scheduler --jobs ...`) ---------------------

# The tick jobs' lease: 3 s (renewed every second), so that a test of a lost lease or a
# takeover does not wait long; TICK_TTL gives a test whose subject is not the lease
# room for a loaded machine's slow renewal.
TICK_TTL = float(os.environ.get("TICK_TTL", "3"))


@exclusive_job("tick", every=os.environ.get("TICK_EVERY", "2s"), ttl=TICK_TTL)
def tick(slot: object) -> None:
    mark(f"tick {slot.isoformat()}")  # type: ignore[attr-defined]
    time.sleep(float(os.environ.get("JOB_SECONDS", "0")))


@exclusive_job("tick_all", every=os.environ.get("TICK_EVERY", "2s"), ttl=TICK_TTL, catch_up="all")
def tick_all(slot: object) -> None:
    mark(f"tick_all {slot.isoformat()}")  # type: ignore[attr-defined]


@exclusive_job("tick_skip", every=os.environ.get("TICK_EVERY", "2s"), ttl=TICK_TTL, catch_up="skip")
def tick_skip(slot: object) -> None:
    mark(f"tick_skip {slot.isoformat()}")  # type: ignore[attr-defined]


@exclusive_job(
    "tick_retry",
    every=os.environ.get("TICK_EVERY", "2s"),
    ttl=3,
    retries=1,
    retry_backoff=os.environ.get("RETRY_BACKOFF", "0"),
)
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
    raise failure("the job fell over")


# --- django.tasks Tasks scheduled with @exclusive_job (tests/test_tasks.py) ------------

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django_tasks backport
    from django_tasks import task


@exclusive_job(
    "enqueue_tick",
    every=os.environ.get("TICK_EVERY", "2s"),
    retries=1,
    retry_backoff=os.environ.get("RETRY_BACKOFF", "0"),
)
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


@exclusive_job("gil_hog", every=os.environ.get("TICK_EVERY", "2s"), ttl=3)
def gil_hog(slot: object) -> None:
    """One call into C that holds the GIL for minutes: no other thread of its process
    runs until it returns (its guard's thread included)."""
    mark(f"gil_hog {slot.isoformat()}")  # type: ignore[attr-defined]
    sum(range(10**12))


@exclusive_job("long_tick", every=os.environ.get("TICK_EVERY", "2s"), ttl=3)
def long_tick(slot: object) -> None:
    """Beats (the wall-clock time) every 50 ms for JOB_SECONDS: a test sees when it stops."""
    mark(f"long_tick-start {slot.isoformat()}")  # type: ignore[attr-defined]
    end = time.monotonic() + float(os.environ.get("JOB_SECONDS", "12"))
    while time.monotonic() < end:
        mark(f"long_tick-beat {time.time():.3f}")
        time.sleep(0.05)
    mark(f"long_tick-end {slot.isoformat()}")  # type: ignore[attr-defined]


@exclusive_job("light_tick", every=os.environ.get("TICK_EVERY", "2s"), ttl=3, in_process=True)
def light_tick(slot: object) -> None:
    """In the scheduler's own process: the pid it marks is the scheduler's."""
    mark(f"light_tick {slot.isoformat()}")  # type: ignore[attr-defined]
    time.sleep(float(os.environ.get("JOB_SECONDS", "0")))


@exclusive_job("light_async", every=os.environ.get("TICK_EVERY", "2s"), ttl=3, in_process=True)
async def light_async(slot: object) -> None:
    """An async light job: it runs on an event loop of asgiref's, in a thread that the
    interpreter waits for at exit."""
    mark(f"light_async {slot.isoformat()}")  # type: ignore[attr-defined]
    await asyncio.sleep(float(os.environ.get("JOB_SECONDS", "0")))


@exclusive_job("light_broken", every=os.environ.get("TICK_EVERY", "2s"), in_process=True)
def light_broken() -> None:
    mark("light_broken")
    raise failure("the light job fell over")


@exclusive_job("steady", every=os.environ.get("TICK_EVERY", "2s"), ttl=30)
def steady(slot: object) -> None:
    """A long lease: a short database outage during the run does not end it."""
    mark(f"steady-start {slot.isoformat()}")  # type: ignore[attr-defined]
    time.sleep(float(os.environ.get("JOB_SECONDS", "0")))
    mark(f"steady-end {slot.isoformat()}")  # type: ignore[attr-defined]


@exclusive_job(
    "flaky_retry",
    every=os.environ.get("TICK_EVERY", "2s"),
    retries=2,
    retry_backoff=os.environ.get("RETRY_BACKOFF", "0"),
)
def flaky_retry(slot: object) -> None:
    """Fails on the first attempt at each slot, succeeds on the next (its memory: MARKER)."""
    line = f"flaky_retry {slot.isoformat()}"  # type: ignore[attr-defined]
    marker = Path(os.environ.get("MARKER", "/nonexistent"))
    first = not marker.exists() or line not in marker.read_text()
    mark(line)
    if first:
        raise RuntimeError("the first attempt fails")


# --- timeouts (tests/test_timeout.py) ---------------------------------------------------


@exclusive_job(
    "overrun",
    every=os.environ.get("TICK_EVERY", "2s"),
    ttl=3,
    timeout=os.environ.get("JOB_TIMEOUT", "1s"),
)
def overrun() -> None:
    """Runs JOB_SECONDS (30) past its timeout; with STUBBORN set it ignores SIGTERM and
    catches what is raised to stop it, so only SIGKILL (or the end of its process) can."""
    import signal

    stubborn = bool(os.environ.get("STUBBORN"))
    if stubborn:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    mark("overrun-start")
    end = time.monotonic() + float(os.environ.get("JOB_SECONDS", "30"))
    while time.monotonic() < end:
        try:
            time.sleep(0.05)
        except BaseException:
            if not stubborn:
                raise
            mark("overrun-ignored")
    mark("overrun-end")


# --- overlap policies (tests/test_overlap.py) -------------------------------------------


@exclusive_job(
    "overlong",
    every=os.environ.get("TICK_EVERY", "2s"),
    ttl=float(os.environ.get("OVERLONG_TTL", "3")),
    overlap=os.environ.get("OVERLAP", "skip"),
)
def overlong(slot: object) -> None:
    """Its first run lasts LONG_SECONDS (5), past the next slots; later runs are quick.
    Its lease lasts OVERLONG_TTL (3) seconds."""
    first = os.environ.get("MARKER", "") + ".first"
    mark(f"overlong-start {slot.isoformat()}")  # type: ignore[attr-defined]
    if os.environ.get("MARKER") and not os.path.exists(first):
        open(first, "w").close()
        time.sleep(float(os.environ.get("LONG_SECONDS", "5")))
    mark(f"overlong {slot.isoformat()}")  # type: ignore[attr-defined]


@exclusive_job(
    "superseded", every=os.environ.get("TICK_EVERY", "2s"), ttl=3, overlap="cancel_other"
)
def superseded(slot: object) -> None:
    """Its first run would last LONG_SECONDS (60): the next slot's start cancels it."""
    first = os.environ.get("MARKER", "") + ".first"
    mark(f"superseded-start {slot.isoformat()}")  # type: ignore[attr-defined]
    if os.environ.get("MARKER") and not os.path.exists(first):
        open(first, "w").close()
        time.sleep(float(os.environ.get("LONG_SECONDS", "60")))
    mark(f"superseded {slot.isoformat()}")  # type: ignore[attr-defined]


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


# --- backfills (tests/test_backfill.py) -------------------------------------------------


@exclusive_job("backfill_hourly", every="1h", ttl=5)
def backfill_hourly(slot: object) -> None:
    """Marks the slot it serves; fails for the slots in FAIL_SLOTS (ISO, comma-separated),
    and lasts JOB_SECONDS (0)."""
    when = slot.isoformat()  # type: ignore[attr-defined]
    mark(f"backfill_hourly {when}")
    time.sleep(float(os.environ.get("JOB_SECONDS", "0")))
    if when in os.environ.get("FAIL_SLOTS", "").split(","):
        raise RuntimeError(f"slot {when} fails")


@exclusive_job("backfill_slotless", every="1h")
def backfill_slotless() -> None:
    """Takes no slot: each backfilled run does what a run now does."""
    mark("backfill_slotless")


# --- observed runs (tests/test_observe_*.py): only in the processes those tests start ----

if os.environ.get("OBSERVED"):

    @exclusive_job("observed", cron="*/5 * * * *", timeout="10m")
    def observed(slot: object) -> None:
        from opentelemetry import trace

        with trace.get_tracer("tests").start_as_current_span("inside the job"):
            mark(f"observed {slot.isoformat()}")  # type: ignore[attr-defined]
        if os.environ.get("OBSERVED_FAILS"):
            raise RuntimeError("the observed job fell over")

    @exclusive_job("observed_tick", every="2s")
    def observed_tick(slot: object) -> None:
        """observed's twin for a scheduler: its span is made in the scheduler's child."""
        from opentelemetry import trace

        with trace.get_tracer("tests").start_as_current_span("inside the scheduled job"):
            mark(f"observed_tick {slot.isoformat()}")  # type: ignore[attr-defined]

    @exclusive_job("modules_probe")
    def modules_probe() -> None:
        """What a run imported: none of the monitoring integrations when they are off."""
        import sys

        prefixes = ("django_exclusive_jobs.integrations", "opentelemetry", "sentry_sdk")
        mark(" ".join(sorted(m for m in sys.modules if m.startswith(prefixes))) or "none")


# --- the fencing token (tests/test_arguments.py) ----------------------------------------


@exclusive_job("fenced", every="1h")
def fenced(slot: object, token: int) -> None:
    """Marks the fencing token it was given, for a write that must refuse a stale holder."""
    mark(f"fenced {token}")


# --- a test-only knob: how often a scheduler of the tests polls ------------------------------

# EXCLUSIVE_JOBS_TEST_REQUEST_POLL (seconds): a scheduler started by a test looks for
# runs asked for now and reads the operators' rows that often, instead of every
# REQUEST_POLL (5 s), so a test waits for a poll's effect, not for the wall clock.
if os.environ.get("EXCLUSIVE_JOBS_TEST_REQUEST_POLL"):
    from django_exclusive_jobs.run import scheduler as _scheduler

    assert hasattr(_scheduler, "REQUEST_POLL"), "the scheduler's poll has moved: follow it here"
    _scheduler.REQUEST_POLL = float(os.environ["EXCLUSIVE_JOBS_TEST_REQUEST_POLL"])


def facts_line(facts: dict[str, object]) -> None:
    """One line ``facts {JSON}`` in $MARKER (tests/test_run_info.py)."""
    path = os.environ.get("MARKER")
    if path:
        with open(path, "a") as handle:
            handle.write(f"facts {json.dumps(facts, sort_keys=True)}\n")


@exclusive_job("run_facts", every="1h", timeout="10m")
def run_facts(run: Any, slot: object, token: int) -> None:
    """What it is told of its run, with ``slot=`` and ``token=`` beside it."""
    from dataclasses import asdict

    from django_exclusive_jobs import current_run

    facts = {
        key: value.isoformat() if hasattr(value, "isoformat") else value
        for key, value in asdict(run).items()
    }
    facts.update(slot_given=str(slot), token_given=token, current=current_run() == run)
    facts["pid"] = os.getpid()
    facts_line(facts)


# --- concurrency groups (tests/test_groups.py) -----------------------------------------


def group_member(name: str, slot: object) -> None:
    """Marks its start and end with the wall clock's time (one machine: the test compares
    them), and runs JOB_SECONDS between."""
    mark(f"{name}-start {time.time():.6f} {slot}")
    time.sleep(float(os.environ.get("JOB_SECONDS", "0")))
    mark(f"{name}-end {time.time():.6f} {slot}")


@exclusive_job("group_skip", every=os.environ.get("GROUP_EVERY", "1h"), ttl=3, group="maintenance")
def group_skip(slot: object) -> None:
    group_member("group_skip", slot)


@exclusive_job(
    "group_wait",
    every=os.environ.get("GROUP_EVERY", "1h"),
    ttl=3,
    overlap="buffer_one",
    group=["maintenance", "nightly"],
)
def group_wait(slot: object) -> None:
    group_member("group_wait", slot)


# --- a Celery task sent once per slot (tests/test_celery.py) ----------------------------

schedule_celery_task(
    "celery_tick",
    "tests.record",
    app="tests.celery_app.app",
    args=["tick"],
    kwargs={"size": 3},
    queue=os.environ.get("CELERY_QUEUE") or None,
    every=os.environ.get("TICK_EVERY", "2s"),
    ttl=3,
)

# The job django-celery-beat's periodic tasks are imported into (tests/test_celery_beat.py).
celery_beat_job(app="tests.celery_app.app", ttl=3)


# --- schedules added at run time (tests/test_runtime_schedules.py) ----------------------


@exclusive_job("customer_report", ttl=5)
def customer_report(run: Any, customer: str = "nobody", lines: int = 10) -> None:
    """A report with no schedule of its own: staff add one per customer at run time.
    Marks ``customer_report NAME SLOT CUSTOMER LINES``."""
    mark(f"customer_report {run.name} {run.slot.isoformat()} {customer} {lines}")

"""Code that runs inside the worker processes of the fault and load tests (spawned).

Each worker reports through a multiprocessing queue; none of them raises: a failure is
reported as a traceback so the test can show it.
"""

from __future__ import annotations

import logging
import os
import random
import time
import traceback
from typing import Any

from ._workers import setup_django


def setup_django_behind_proxy(alias: str, port: int) -> None:
    """Set Django up with ``alias`` reached through the test's TCP proxy on ``port``."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    from tests import settings as test_settings

    test_settings.DATABASES[alias] = {
        **test_settings.DATABASES[alias],
        "HOST": "127.0.0.1",
        "PORT": port,
    }
    setup_django()


# --- load -----------------------------------------------------------------------------

START_JITTER = 0.050


def race_for_one_name(
    alias: str, name: str, triggers: int, barrier: Any, results: Any, worker: int
) -> None:
    """Race for ``name`` once per trigger; report the triggers this process won.

    Every process meets at the barrier, calls ``try_acquire`` at once, meets again once
    all have decided; then the winner releases and all meet a third time. Without that
    third meeting the winner would reach the next start last, and the last process to
    reach a barrier goes on first: it would win again far more often than 1 in N.

    After the first meeting each process waits a random 0-50 ms, as servers' crons fire
    a little apart: otherwise the order in which the OS wakes twenty processes on two
    cores, not anything the lock does, would pick the winner.
    """
    setup_django()
    from django.db import connections

    from django_exclusive_jobs import try_acquire

    won: list[int] = []
    tokens: list[int] = []
    jitter = random.Random()  # seeded from the OS: independent in every process
    try:
        for trigger in range(triggers):
            barrier.wait(120)
            time.sleep(jitter.uniform(0, START_JITTER))
            lock = try_acquire(name, using=alias, ttl=60)
            barrier.wait(120)  # everyone has decided before the winner lets go
            if lock is not None:
                won.append(trigger)
                tokens.append(lock.token)
                if not lock.release():
                    raise AssertionError(f"trigger {trigger}: the winner could not release")
            barrier.wait(120)  # released before anyone races again
        results.put((worker, won, tokens, None))
    except BaseException:
        barrier.abort()
        results.put((worker, won, tokens, traceback.format_exc()))
    finally:
        connections.close_all()


# --- SQLite contention ----------------------------------------------------------------


def hammer_sqlite(
    alias: str, iterations: int, barrier: Any, results: Any, worker: int, guard_dir: str
) -> None:
    """Take and release one lock, and call one decorated job, ``iterations`` times each.

    While holding either, create an O_EXCL file named after it in ``guard_dir``: a second
    simultaneous holder of the same name would find it there. Counts wins, skips, runs,
    skip signals and overlaps; reports any exception.
    """
    setup_django()
    from django.db import connections

    from django_exclusive_jobs import exclusive_job, signals, try_acquire

    counts = {"wins": 0, "skips": 0, "runs": 0, "job_skips": 0, "returned_none": 0, "overlaps": 0}

    def hold_exclusively(name: str) -> None:
        guard = os.path.join(guard_dir, name)
        try:
            handle = os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            counts["overlaps"] += 1
            return
        os.close(handle)
        time.sleep(0.001)
        os.unlink(guard)

    @exclusive_job("hammer-job", using=alias, ttl=60)
    def job() -> str:
        counts["runs"] += 1
        hold_exclusively("hammer-job")
        return "ran"

    def on_skip(sender: Any, name: str, **kwargs: Any) -> None:
        if name == "hammer-job":
            counts["job_skips"] += 1

    signals.job_skipped.connect(on_skip, weak=False)
    try:
        barrier.wait(120)
        for number in range(iterations):
            lock = try_acquire("hammer", using=alias, ttl=60)
            if lock is None:
                counts["skips"] += 1
            else:
                counts["wins"] += 1
                hold_exclusively("hammer")
                if not lock.release():
                    raise AssertionError(f"iteration {number}: the holder could not release")
            value = job()
            if value is None:
                counts["returned_none"] += 1
            elif value != "ran":
                raise AssertionError(f"the job returned {value!r}")
        results.put((worker, counts, None))
    except BaseException:
        results.put((worker, counts, traceback.format_exc()))
    finally:
        connections.close_all()


# --- database outage through the proxy ------------------------------------------------


class _RetryCounter(logging.Handler):
    """Counts the lock engine's retries: the keep-alive's "renewal ... failed, retrying"
    and a statement's "connection ... dropped, reconnecting" log lines."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.retries = 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "failed, retrying" in message or "dropped, reconnecting" in message:
            self.retries += 1


def _watch(lock: Any, seconds: float) -> dict[str, Any]:
    """Sit in the job for ``seconds`` watching the lock without touching the database.

    Returns the last local lease deadline seen while held, and when the lease end moved
    (renewals that got through), both on time.monotonic: one system-wide clock on
    Linux, so the test can compare them with its own readings.
    """
    deadline = None
    expires = lock.expires_at
    moved_at = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        now = time.monotonic()
        left = lock.seconds_left  # read after `now`: now + left never overstates
        if lock.held:
            deadline = now + left
        if lock.expires_at != expires:
            expires = lock.expires_at
            moved_at.append(now)
        time.sleep(0.01)
    return {"last_deadline": deadline, "lease_moved_at": moved_at}


def hold_through_outage(
    alias: str,
    port: int,
    name: str,
    ttl: float,
    job_seconds: float,
    events: Any,
    *,
    through_runner: bool,
) -> None:
    """Hold ``name`` with keep-alive through a database behind the test's proxy.

    With ``through_runner`` the job runs as a ``Run`` runs it (history, release).
    Without, the worker takes the lock with ``try_acquire`` + keep-alive and releases it
    on the connection the outage broke.
    Sends ("acquired", token, monotonic) once holding, then ("finished", {...}).
    """
    setup_django_behind_proxy(alias, port)
    from django.db import connections

    from django_exclusive_jobs import signals, try_acquire
    from django_exclusive_jobs.run.registry import Job
    from django_exclusive_jobs.run.runner import Run

    logger = logging.getLogger("django_exclusive_jobs")
    counter = _RetryCounter()
    logger.addHandler(counter)
    logger.setLevel(logging.INFO)
    lost: dict[str, Any] = {}

    def on_lost(sender: Any, lock: Any, reason: str, **kwargs: Any) -> None:
        lost.setdefault("at", time.monotonic())
        lost.setdefault("reason", reason)

    signals.lock_lost.connect(on_lost, weak=False)
    report: dict[str, Any] = {}
    try:
        if through_runner:

            def target(lock: Any) -> None:
                events.put(("acquired", lock.token, time.monotonic()))
                report.update(_watch(lock, job_seconds))

            runner = Run(Job(name, target, ttl=ttl, using=alias))
            result = runner.call(target)
            assert runner.lock is not None
            report.update(
                status=result.status.value,
                token=result.token,
                expires_at=runner.lock.expires_at,
                run_id=runner.run_id,
            )
        else:
            lock = try_acquire(name, using=alias, ttl=ttl)
            if lock is None:
                raise AssertionError(f"{name} was held when the worker started")
            lock.start_keepalive()
            events.put(("acquired", lock.token, time.monotonic()))
            report.update(_watch(lock, job_seconds))
            report.update(
                held=lock.held, lost=lock.lost, token=lock.token, expires_at=lock.expires_at
            )
            lock.stop_keepalive()
            # The outage broke this thread's connection too: release() must reconnect.
            report["released"] = lock.release()
        report.update(lost_at=lost.get("at"), lost_reason=lost.get("reason"))
        report["retries"] = counter.retries
        events.put(("finished", report))
    except BaseException:
        report["retries"] = counter.retries
        report.update(lost_at=lost.get("at"), lost_reason=lost.get("reason"))
        events.put(("error", report, traceback.format_exc()))
    finally:
        connections.close_all()

"""Code that runs inside worker processes started by the tests (spawned, not forked)."""

from __future__ import annotations

import os
import traceback
from multiprocessing.connection import Connection
from typing import Any


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()


def serve_commands(conn: Connection) -> None:
    """Answer commands from the test process, one at a time, until told to stop."""
    setup_django()
    from django.db import connections

    from django_exclusive_jobs import try_acquire
    from django_exclusive_jobs.lock.lock import Lock, process
    from django_exclusive_jobs.lock.lock import forget as forget_lock

    held: dict[str, Lock] = {}
    while True:
        command = conn.recv()
        verb, args = command[0], command[1:]
        try:
            result: Any = None
            if verb == "stop":
                conn.send((True, None))
                return
            if verb == "holder":
                result = process.holder()
            elif verb == "acquire":
                alias, name, kwargs = args
                lock = try_acquire(name, using=alias, **kwargs)
                if lock is not None:
                    held[name] = lock
                result = None if lock is None else lock.token
            elif verb == "release":
                (name,) = args
                names = [name] if name else list(held)
                result = all(held.pop(n).release() for n in names if n in held)
            elif verb == "run_job":  # a decorated job, as this server runs it
                alias, name, kwargs = args
                from django_exclusive_jobs import exclusive_job

                exclusive_job(name, using=alias, **kwargs)(lambda: None)()
            elif verb == "forget":
                # As if this server had vanished: its rows stay as they are, and it keeps
                # no memory of them. Left in this thread's held locks, a lock would make
                # its next acquisition of the name (a later test, the tables emptied, the
                # tokens starting at 1 again) a re-entry that renews the new holder's row
                # of the same token: twice on SQLite with three workers (2026-12-06).
                for lock in held.values():
                    lock.stop_keepalive()
                    forget_lock(lock)
                held.clear()
                connections.close_all()
            else:
                raise ValueError(f"unknown command {verb!r}")
            conn.send((True, result))
        except Exception:
            conn.send((False, traceback.format_exc()))


def race(
    alias: str,
    prefix: str,
    rounds: int,
    barrier: Any,
    results: Any,
    worker: int,
    clock_shift: float = 0.0,
) -> None:
    """Race for one name per round; report the rounds this process won.

    Even rounds race for a name nobody has used (the get_or_create path), odd rounds
    for the one just released (the conditional UPDATE path).
    """
    setup_django()
    if clock_shift:
        shift_python_clock(clock_shift)
    from django.db import connections

    from django_exclusive_jobs import try_acquire

    won: list[int] = []
    try:
        for number in range(rounds):
            barrier.wait(60)
            lock = try_acquire(f"{prefix}-{number // 2}", using=alias, ttl=60)
            barrier.wait(60)  # every process has decided before the winner lets go
            if lock is not None:
                won.append(number)
                lock.release()
            barrier.wait(60)
        results.put((worker, won, None))
    except Exception:
        barrier.abort()
        results.put((worker, won, traceback.format_exc()))
    finally:
        connections.close_all()


def shift_python_clock(seconds: float) -> None:
    """Make this process's wall clock read ``seconds`` off, as on a badly set server."""
    import datetime as dt
    import time

    from django.utils import timezone

    real_time = time.time
    time.time = lambda: real_time() + seconds  # type: ignore[assignment]
    real_now = timezone.now
    timezone.now = lambda: real_now() + dt.timedelta(seconds=seconds)


def hold_then_report(
    alias: str, name: str, ttl: float, hold: float, clock_shift: float, results: Any
) -> None:
    """Take ``name`` with a skewed clock, hold it for ``hold`` seconds, report the token."""
    setup_django()
    shift_python_clock(clock_shift)
    import time

    from django.db import connections

    from django_exclusive_jobs import try_acquire

    try:
        lock = try_acquire(name, using=alias, ttl=ttl)
        results.put(("acquired", None if lock is None else lock.token))
        if lock is not None:
            time.sleep(hold)
            results.put(("released", lock.release()))
    finally:
        connections.close_all()


def slot_racer(
    alias: str,
    name: str,
    every: float,
    triggers: int,
    ready: Any,
    go: Any,
    start_at: Any,
    results: Any,
    worker: int,
    clock_shift: float = 0.0,
) -> None:
    """Call an ``every=`` job once per trigger, starting at a random point around it.

    Starts are spread over [trigger - 0.5 s, trigger + 1.0 s], as cron on servers with
    slightly different clocks and start-up times would spread them.
    """
    import random
    import time

    setup_django()
    real_time = time.time
    if clock_shift:
        shift_python_clock(clock_shift)
    from django.db import connections

    from django_exclusive_jobs import exclusive_job

    ran: list[int] = []
    rng = random.Random(worker)

    @exclusive_job(name, every=every, using=alias, ttl=30)
    def job(trigger: int) -> None:
        time.sleep(0.01)
        ran.append(trigger)

    try:
        ready.wait(120)
        go.wait(120)
        first = start_at.value
        for trigger in range(triggers):
            moment = first + trigger * every + rng.uniform(-0.5, 1.0)
            delay = moment - real_time()
            if delay > 0:
                time.sleep(delay)
            job(trigger)
        results.put((worker, ran, None))
    except Exception:
        results.put((worker, ran, traceback.format_exc()))
    finally:
        connections.close_all()

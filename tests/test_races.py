"""Real OS processes racing for one lock, on every backend."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from django_exclusive_jobs import try_acquire

from . import _workers
from .helpers import SPAWN

PROCESSES = 10
ROUNDS = 200


def run_race(alias: str, prefix: str, shifts: list[float]) -> dict[int, int]:
    """Start one racer per clock shift; return round -> number of winners."""
    barrier = SPAWN.Barrier(len(shifts))
    results = SPAWN.Queue()
    processes = [
        SPAWN.Process(
            target=_workers.race,
            args=(alias, prefix, ROUNDS, barrier, results, worker, shift),
        )
        for worker, shift in enumerate(shifts)
    ]
    for process in processes:
        process.start()
    try:
        winners: Counter[int] = Counter()
        errors = []
        for _ in processes:
            _worker, won, error = results.get(timeout=300)
            winners.update(won)
            if error:
                errors.append(error)
        assert not errors, errors[0]
        return dict(winners)
    finally:
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.kill()


@pytest.mark.slow
def test_ten_processes_exactly_one_winner_per_round(alias: str) -> None:
    winners = run_race(alias, "race", [0.0] * PROCESSES)
    assert set(winners) == set(range(ROUNDS)), "a round with no winner"
    doubled = {number: count for number, count in winners.items() if count != 1}
    assert doubled == {}, f"rounds with more than one winner: {doubled}"


@pytest.mark.slow
def test_app_server_clock_skew_changes_no_outcome(alias: str) -> None:
    """Servers an hour ahead and an hour behind still agree on every round."""
    shifts = [3600.0, -3600.0, 0.0, 3600.0, -3600.0]
    winners = run_race(alias, "skew", shifts)
    assert set(winners) == set(range(ROUNDS))
    assert all(count == 1 for count in winners.values())


def test_lease_of_a_server_an_hour_behind_is_respected(alias: str) -> None:
    """A lease written by a server whose clock is an hour slow still blocks others.

    Had the lease been computed from the app server's clock, it would already have
    expired in everyone else's eyes.
    """
    results = SPAWN.Queue()
    holder = SPAWN.Process(
        target=_workers.hold_then_report,
        args=(alias, "skewed", 30, 1.5, -3600.0, results),
    )
    holder.start()
    try:
        assert results.get(timeout=60) == ("acquired", 1)
        assert try_acquire("skewed", using=alias, ttl=30) is None
        assert results.get(timeout=60) == ("released", True)
        lock = try_acquire("skewed", using=alias, ttl=30)
        assert lock is not None
        assert lock.token == 2
        lock.release()
    finally:
        holder.join(10)
        if holder.is_alive():
            holder.kill()


def test_lease_of_a_server_an_hour_ahead_expires_on_time(alias: str) -> None:
    results = SPAWN.Queue()
    holder = SPAWN.Process(
        target=_workers.hold_then_report,
        args=(alias, "ahead", 1, 0, 3600.0, results),
    )
    holder.start()
    try:
        assert results.get(timeout=60) == ("acquired", 1)
        results.get(timeout=60)
        deadline = time.monotonic() + 10
        lock = None
        while lock is None and time.monotonic() < deadline:
            lock = try_acquire("ahead", using=alias, ttl=30)
            time.sleep(0.05)
        assert lock is not None, "lock written by a fast clock never became free"
        lock.release()
    finally:
        holder.join(10)
        if holder.is_alive():
            holder.kill()

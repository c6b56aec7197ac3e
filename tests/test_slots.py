"""Once per scheduled slot, with real processes racing around each trigger."""

from __future__ import annotations

import datetime as dt
import math
import time
from collections import Counter

import pytest

from django_exclusive_jobs.models import JobRun, RunStatus

from . import _workers
from .helpers import SPAWN

PROCESSES = 10
EVERY = 3.0
TRIGGERS = 20
# Three servers an hour fast, three an hour slow: their clocks must change nothing.
SHIFTS = [3600.0] * 3 + [-3600.0] * 3 + [0.0] * (PROCESSES - 6)


@pytest.mark.slow
def test_one_run_per_slot_with_spread_starts_and_skewed_clocks(alias: str) -> None:
    ready = SPAWN.Barrier(PROCESSES + 1)
    go = SPAWN.Barrier(PROCESSES + 1)
    start_at = SPAWN.Value("d", 0.0)
    results = SPAWN.Queue()
    processes = [
        SPAWN.Process(
            target=_workers.slot_racer,
            args=(alias, "every3", EVERY, TRIGGERS, ready, go, start_at, results, n, SHIFTS[n]),
        )
        for n in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    try:
        ready.wait(180)
        first = math.ceil((time.time() + 1.5) / EVERY) * EVERY
        start_at.value = first
        go.wait(60)
        ran: Counter[int] = Counter()
        for _ in processes:
            _worker, triggers, error = results.get(timeout=TRIGGERS * EVERY + 120)
            assert error is None, error
            ran.update(triggers)
    finally:
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()

    assert ran == Counter(range(TRIGGERS)), "a trigger ran twice or not at all"
    runs = JobRun.objects.using(alias).filter(name="every3")
    expected = {
        dt.datetime.fromtimestamp(first + n * EVERY, tz=dt.timezone.utc) for n in range(TRIGGERS)
    }
    assert set(runs.values_list("slot", flat=True)) == expected
    assert set(runs.values_list("status", flat=True)) == {RunStatus.SUCCEEDED}

"""Once per scheduled slot, with real processes racing around each trigger."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import pytest

from django_exclusive_jobs.models import JobRun, RunStatus

from .helpers import race_slots

PROCESSES = 10
EVERY = 3.0
TRIGGERS = 12
# Three servers an hour fast, three an hour slow: their clocks must change nothing.
SHIFTS = [3600.0] * 3 + [-3600.0] * 3 + [0.0] * (PROCESSES - 6)


@pytest.mark.slow
def test_one_run_per_slot_with_spread_starts_and_skewed_clocks(alias: str) -> None:
    ran, first = race_slots(
        alias, "every3", processes=PROCESSES, every=EVERY, triggers=TRIGGERS, shifts=SHIFTS
    )
    assert ran == Counter(range(TRIGGERS)), "a trigger ran twice or not at all"
    runs = JobRun.objects.using(alias).filter(name="every3")
    expected = {dt.datetime.fromtimestamp(first + n * EVERY, tz=dt.UTC) for n in range(TRIGGERS)}
    assert set(runs.values_list("slot", flat=True)) == expected
    assert set(runs.values_list("status", flat=True)) == {RunStatus.SUCCEEDED}

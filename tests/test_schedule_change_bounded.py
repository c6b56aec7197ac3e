"""The work after a schedule change is bounded, as a backfill's is (issue 41, item 5).

A job moved off an ``every=1s`` override (back to its code) a month after its last run
had a month of the replaced schedule's slots to account for: its first start walked
each of them (2.6 million; 3.6 s, half a minute for a year), and its skip line blamed
a slot that "started too late". Now a start walks at most ``catchup.MAX_RECORDED`` of
them: those, the newest, are recorded missed one by one, the older ones as one
missed-range record that says how many, from when to when, and that the schedule
changed; and the skip line gives the right reason.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_exclusive_jobs import exclusive_job
from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.models import JobRun, JobState
from django_exclusive_jobs.run import overrides
from django_exclusive_jobs.run.catchup import MAX_RECORDED
from django_exclusive_jobs.run.registry import _jobs, get_job
from django_exclusive_jobs.run.schedules import Every
from django_exclusive_jobs.run.status import RunStatus

MONTH = dt.timedelta(days=30)


@pytest.fixture
def moved(alias: str) -> Iterator[Callable[[], Any]]:
    """An hourly job whose last run, a month ago, ran under an ``every=1s`` override,
    moved back to its code just now."""

    @exclusive_job("moved_off_1s", every="1h", using=alias)
    def moved_off_1s() -> None:
        pass

    try:
        job = get_job("moved_off_1s")
        assert job is not None
        overrides.override(job, {"schedule": {"every": "1s"}}, reason="fast", by="ops", using=alias)
        last = database_now(alias).replace(microsecond=0) - MONTH
        JobRun.objects.using(alias).create(
            name="moved_off_1s", slot=last, status=RunStatus.SUCCEEDED, started_at=last
        )
        assert overrides.back_to_code(job, reason="enough", by="ops", using=alias)
        yield moved_off_1s
    finally:
        _jobs.pop("moved_off_1s", None)


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many steps every= schedules take (each slot walked is one)."""
    taken = [0]
    step = Every.latest_at_or_before

    def counted(self: Every, moment: dt.datetime) -> tuple[dt.datetime, dt.timedelta]:
        taken[0] += 1
        return step(self, moment)

    monkeypatch.setattr(Every, "latest_at_or_before", counted)
    return taken


def said(caplog: pytest.LogCaptureFixture, event: str) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if getattr(record, "event", None) == event and record.name == "django_exclusive_jobs"
    ]


def test_the_first_start_after_a_schedule_change_walks_a_bounded_number_of_slots(
    alias: str, moved: Callable[[], Any], steps: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    name = "moved_off_1s"
    state = JobState.objects.using(alias).get(name=name)
    changed = state.schedule_since
    assert changed is not None and state.schedule_before == {"every": 1.0}
    last = JobRun.objects.using(alias).get(name=name).slot
    assert last is not None
    caplog.set_level(logging.INFO, logger="django_exclusive_jobs")

    moved()

    assert steps[0] < 3 * MAX_RECORDED, f"{steps[0]} schedule steps for {MAX_RECORDED} slots"
    missed = JobRun.objects.using(alias).filter(name=name, status=RunStatus.MISSED)
    assert missed.count() == MAX_RECORDED + 1  # the newest one by one, and one range
    # Every second after the last run and before the change was a slot of every=1s.
    every_one = int((changed.replace(microsecond=0) - last).total_seconds())
    if changed.microsecond == 0:
        every_one -= 1  # the change's own second is the new schedule's
    ranged = missed.order_by("slot").first()
    assert ranged is not None
    assert ranged.slot == last + dt.timedelta(seconds=1)
    older = every_one - MAX_RECORDED
    assert ranged.error.startswith(
        f"{older} slots of the replaced schedule (every 1s) were missed, from "
        f"{ranged.slot.isoformat()} to "
    ), ranged.error
    assert "its schedule changed at" in ranged.error
    singles = list(missed.order_by("slot").values_list("slot", flat=True))[1:]
    newest = changed.replace(microsecond=0) - dt.timedelta(seconds=0 if changed.microsecond else 1)
    assert singles[-1] == newest
    assert singles[0] == newest - dt.timedelta(seconds=MAX_RECORDED - 1)

    lines = said(caplog, "missed")
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"missed {name}: {every_one} slot(s) of its replaced schedule (every 1s) no server "
        f"ran, {ranged.slot.isoformat()} .. {newest.isoformat()}, before its schedule "
        "changed at "
    ), lines[0]
    # The code's hourly slot of now came before the change: not run, and said so.
    skipped = said(caplog, "skipped")
    assert len(skipped) == 1, skipped
    assert "its slot came before its schedule was put in force at" in skipped[0], skipped[0]
    assert "started too late" not in skipped[0]


def test_a_few_slots_of_a_replaced_schedule_are_recorded_one_by_one(
    alias: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Under the cap, as before: each missed slot of the replaced schedule is a row."""

    @exclusive_job("moved_a_little", every="1m", using=alias)
    def moved_a_little() -> None:
        pass

    try:
        job = get_job("moved_a_little")
        assert job is not None
        overrides.override(job, {"schedule": {"every": "1s"}}, reason="fast", by="ops", using=alias)
        # before the code's slot of now (each minute): a run it finds
        last = database_now(alias).replace(second=0, microsecond=0) - dt.timedelta(seconds=20)
        JobRun.objects.using(alias).create(
            name="moved_a_little", slot=last, status=RunStatus.SUCCEEDED, started_at=last
        )
        assert overrides.back_to_code(job, reason="enough", by="ops", using=alias)
        changed = JobState.objects.using(alias).get(name="moved_a_little").schedule_since
        assert changed is not None
        caplog.set_level(logging.INFO, logger="django_exclusive_jobs")
        moved_a_little()
        missed: Any = JobRun.objects.using(alias).filter(
            name="moved_a_little", status=RunStatus.MISSED
        )
        slots = sorted(missed.values_list("slot", flat=True))
        assert slots[0] == last + dt.timedelta(seconds=1)
        assert slots == [slots[0] + dt.timedelta(seconds=n) for n in range(len(slots))]
        assert slots[-1] < changed
        assert 19 <= len(slots) <= 90
        assert all("schedule" in run.error for run in missed)
        lines = said(caplog, "missed")
        assert len(lines) == 1 and "of its replaced schedule (every 1s)" in lines[0], lines
    finally:
        _jobs.pop("moved_a_little", None)

"""One run object: its settings fixed when built, a manual run's slot, and the scheduler
driven in-process to completion (as a test or a one-off would)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from django_exclusive_jobs import LockConfigurationError
from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.models import JobRun
from django_exclusive_jobs.run import control
from django_exclusive_jobs.run.registry import get_job
from django_exclusive_jobs.run.scheduler import Scheduler

from .test_command import marker

__all__ = ["marker"]  # a fixture


def test_a_job_with_changed_settings_is_a_new_checked_value() -> None:
    job = get_job("tick")
    assert job is not None
    changed = job.but(ttl="90s", using=None)
    assert (changed.ttl, job.ttl) == ("90s", 3)  # the declared job is left as it was
    assert changed.but() is changed
    with pytest.raises(LockConfigurationError):
        job.but(ttl="-1s")


def test_a_manual_run_gives_a_scheduled_job_the_slot_its_schedule_serves_now(
    alias: str, marker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tick`` takes ``slot``: run by hand, it gets the slot a scheduled start would
    serve now (it used to get None), while its history row has no slot (a manual run)."""
    monkeypatch.setenv("MARKER", str(marker))
    job = get_job("tick")
    assert job is not None and job.schedule is not None
    before = job.schedule.slot_at(database_now(alias))
    result = control.run_now("tick", by="operator", using=alias)
    after = job.schedule.slot_at(database_now(alias))
    assert result.status == "succeeded", result.exception
    [line] = marker.read_text().splitlines()
    given = dt.datetime.fromisoformat(line.split()[1])
    assert before <= given <= after
    [run] = JobRun.objects.using(alias).filter(name="tick")
    assert (run.slot, run.requested_by) == (None, "operator")


def test_the_scheduler_runs_in_process_until_a_number_of_runs_ended(
    alias: str, marker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Scheduler(max_runs=2)`` returns after two runs, as django-tasks-db's worker does
    with a number of tasks: a test drives it to completion without a subprocess."""
    monkeypatch.setenv("MARKER", str(marker))
    job = get_job("tick")
    assert job is not None
    # A lease of 10 s: the subject is the count of runs (a 3-s lease was once lost on a
    # loaded machine, the job's process 4.8 s long).
    tick = job.but(using=alias, ttl=10)
    scheduler = Scheduler([tick], using=alias, max_runs=2, run_for=60)
    assert scheduler.run() == 0
    assert scheduler.ended_runs == 2
    runs = JobRun.objects.using(alias).filter(name="tick", status="succeeded")
    assert runs.count() == 2
    assert len(marker.read_text().splitlines()) == 2


def test_the_scheduler_runs_in_process_until_its_time_is_up(alias: str) -> None:
    job = get_job("quick")
    assert job is not None
    scheduler = Scheduler([], on_request=[job.but(using=alias)], using=alias, run_for=1.5)
    assert scheduler.run() == 0
    assert scheduler.ended_runs == 0

"""Schedules added at run time (``add_schedule`` and the admin): one door for their
values, audited changes, and real schedulers on every backend that take them up while
they run, each slot once, each schedule with its own slots, arguments and window.

The test app's ``customer_report`` has no schedule of its own; it marks
``customer_report NAME SLOT CUSTOMER LINES`` each time it really runs.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from django_exclusive_jobs import (
    add_schedule,
    change_schedule,
    delete_schedule,
    list_schedules,
    pause_schedule,
    resume_schedule,
)
from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.lock.errors import LockConfigurationError
from django_exclusive_jobs.models import JobChange, JobRun, JobState, RunTimeSchedule, Scheduler
from django_exclusive_jobs.run import control, overrides, runtime_schedules
from django_exclusive_jobs.run.registry import get_job
from django_exclusive_jobs.run.schedules import Cron, Every

from .helpers import reaped
from .process_output import Output
from .test_command import ROOT, marker, wait_for
from .test_scheduler import scheduler_env

__all__ = ["marker"]  # fixtures

JOB = "customer_report"


def report() -> Any:
    job = get_job(JOB)
    assert job is not None
    return job


# --- the door ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({}, "A run-time schedule needs cron= or every=."),
        ({"cron": "0 8 * * 1", "every": "1h"}, "Give either every= or cron=, not both."),
        ({"cron": "nope"}, "must have 5 fields"),
        ({"cron": "0 8 * * 1", "timezone": "Mars/Olympus"}, "Mars/Olympus"),
        ({"every": "999999999d"}, "every must be at most"),
        ({"every": "0s"}, "every must be at least 1s"),
        ({"every": "1h", "kwargs": {"nope": 1}}, "unknown argument 'nope'"),
        ({"every": "1h", "kwargs": [1]}, "must be a dict"),
        ({"every": "1h", "kwargs": {"run": 1}}, "run"),
        ({"every": "1h", "starts_at": "0001-01-01T00:00"}, "starts_at must be between"),
        (
            {"every": "1h", "starts_at": "2027-01-02", "ends_at": "2027-01-01"},
            "ends_at must be after starts_at.",
        ),
        ({"every": "1h", "enabled": "yes"}, "enabled must be True or False"),
        ({"every": "1h", "group": "x"}, "A run-time schedule has no group."),
    ],
)
def test_the_door_refuses_each_bad_value_in_one_line(given: dict[str, Any], message: str) -> None:
    with pytest.raises(LockConfigurationError) as refused:
        runtime_schedules.check(report(), given)
    said = str(refused.value)
    assert message in said and "\n" not in said


def test_the_door_normalizes_what_it_stores() -> None:
    checked = runtime_schedules.check(
        report(),
        {"cron": "@weekly", "timezone": "Europe/Paris", "kwargs": {"customer": "acme"},
         "starts_at": "2027-01-01T08:00"},
    )  # fmt: skip
    assert checked == {
        "cron": "0 0 * * 0",
        "timezone": "Europe/Paris",
        "every": None,
        "kwargs": {"customer": "acme"},
        # A time without a zone is on the job's clock: its schedule's zone.
        "starts_at": dt.datetime.fromisoformat("2027-01-01T08:00+01:00"),
        "ends_at": None,
        "enabled": True,
    }
    assert runtime_schedules.check(report(), {"every": "2h"})["every"] == 7200.0


@pytest.mark.parametrize(
    ("job", "key", "message"),
    [
        ("nope", "acme", "No job named 'nope' is declared."),
        (JOB, "a:b", "must not contain ':'"),
        (JOB, "", "Schedule key must not be empty."),
        (JOB, "x\ny", "control character"),
        ("summary", "daily", "No job named 'summary' is declared."),
    ],
)
@pytest.mark.django_db
def test_names_are_checked_before_anything_is_written(job: str, key: str, message: str) -> None:
    with pytest.raises(LockConfigurationError) as refused:
        add_schedule(job, key, every="1h", by="ops")
    assert message in str(refused.value)
    assert not RunTimeSchedule.objects.exists() and not JobChange.objects.exists()


def test_a_schedule_cannot_take_the_name_of_a_declared_one() -> None:
    assert get_job("summary:daily") is not None  # declared with schedules=
    with pytest.raises(LockConfigurationError, match="summary:daily is declared in the code"):
        runtime_schedules.name_of("summary", "daily")


# --- the job it runs as -------------------------------------------------------------------


def row(**settings: Any) -> RunTimeSchedule:
    base = {"cron": "", "timezone": "", "every": None, "kwargs": {}, "enabled": True}
    return RunTimeSchedule(name=f"{JOB}:acme", job=JOB, key="acme", **{**base, **settings})


def test_a_schedule_runs_as_a_job_of_its_own_with_the_declared_settings() -> None:
    ends = dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
    job = runtime_schedules.job_of(
        row(cron="0 8 * * 1", timezone="Europe/Paris", kwargs={"lines": 3}, ends_at=ends),
        report(),
    )
    assert (job.name, job.added, job.ends_at, job.func) == (
        f"{JOB}:acme",
        True,
        ends,
        report().func,
    )
    assert isinstance(job.schedule, Cron) and job.schedule.timezone == "Europe/Paris"
    assert job.kwargs == {"lines": 3} and job.ttl == report().ttl
    every = runtime_schedules.job_of(row(every=7200.0), report())
    assert isinstance(every.schedule, Every) and every.schedule.period == dt.timedelta(hours=2)


@pytest.mark.parametrize(
    "settings",
    [
        {"every": 3600.0, "kwargs": {"renamed": 1}},  # the function no longer takes it
        {"cron": "61 * * * *"},  # written by SQL, past the door
        {"every": -5.0},
        {"every": 3600.0, "kwargs": "text"},
    ],
)
def test_a_row_it_cannot_use_is_that_schedule_s_problem(settings: dict[str, Any]) -> None:
    with pytest.raises(overrides.Misconfigured) as bad:
        runtime_schedules.job_of(row(**settings), report())
    assert bad.value.name == f"{JOB}:acme" and "its run-time schedule" in bad.value.reason


def test_in_force_leaves_out_what_is_switched_off_or_ended() -> None:
    now = dt.datetime(2026, 12, 6, tzinfo=dt.UTC)
    rows = [
        row(every=60.0),
        row(every=60.0, enabled=False),
        row(every=60.0, ends_at=now),
        row(every=60.0, ends_at=now + dt.timedelta(seconds=1)),
    ]
    assert runtime_schedules.in_force(rows, now) == [rows[0], rows[3]]


# --- the API: written, audited ----------------------------------------------------------


def actions(alias: str, name: str) -> list[str]:
    changes = JobChange.objects.using(alias).filter(name=name).order_by("at", "id")
    return [change.action for change in changes]


def test_add_change_pause_resume_delete_each_audited(alias: str) -> None:
    name = f"{JOB}:acme"
    made = add_schedule(
        JOB, "acme", every="1h", kwargs={"customer": "acme"}, reason="new customer",
        by="ops", using=alias,
    )  # fmt: skip
    assert (made.name, made.every, made.kwargs, made.created_by) == (
        name, 3600.0, {"customer": "acme"}, "ops",
    )  # fmt: skip
    with pytest.raises(LockConfigurationError, match="exists already"):
        add_schedule(JOB, "acme", every="2h", by="ops", using=alias)
    assert len(list_schedules(JOB, using=alias)) == 1
    changed = change_schedule(name, cron="0 8 * * 1", by="lead", reason="mondays", using=alias)
    assert (changed.cron, changed.every, changed.changed_by) == ("0 8 * * 1", None, "lead")
    with pytest.raises(LockConfigurationError, match="unknown argument"):
        change_schedule(name, kwargs={"nope": 1}, by="lead", using=alias)
    assert not pause_schedule(name, by="lead", using=alias).enabled
    assert resume_schedule(name, by="lead", using=alias).enabled
    assert delete_schedule(name, by="lead", reason="churned", using=alias)
    assert not delete_schedule(name, by="lead", using=alias)
    assert actions(alias, name) == [
        "schedule_added", "schedule_edited", "schedule_edited", "schedule_edited",
        "schedule_gone",
    ]  # fmt: skip
    edits = JobChange.objects.using(alias).filter(name=name, action="schedule_edited")
    edited = edits.order_by("at", "id").first()
    assert edited is not None
    assert (edited.before, edited.after) == (
        {"cron": "", "timezone": "", "every": 3600.0},
        {"cron": "0 8 * * 1", "timezone": "UTC", "every": None},
    )


def test_its_slots_count_from_its_start_not_before(alias: str) -> None:
    """Added with a start in the future: the slots before it are quiet (neither run nor
    missed), through the one rule the claim already follows (``schedule_since``)."""
    starts = database_now(alias) + dt.timedelta(days=2)
    add_schedule(JOB, "later", every="1h", starts_at=starts, by="ops", using=alias)
    state = JobState.objects.using(alias).get(name=f"{JOB}:later")
    assert state.schedule_since == starts and state.schedule_before == {}


# --- real schedulers ------------------------------------------------------------------------


def marked(marker: Path) -> list[list[str]]:
    """``[NAME, SLOT, CUSTOMER, LINES]`` for each run that really ran."""
    if not marker.exists():
        return []
    lines = [line.split() for line in marker.read_text().splitlines()]
    return [fields[1:5] for fields in lines if fields[0] == JOB]


def ran(marker: Path, name: str) -> list[dt.datetime]:
    return [dt.datetime.fromisoformat(slot) for n, slot, *_ in marked(marker) if n == name]


def scheduler(started: list[Any], alias: str, marker: Path) -> Output:
    command = [sys.executable, "-m", "django", "exclusive_scheduler", "--database", alias]
    env = {**scheduler_env(marker), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [*command, "--jobs", JOB], cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    started.append(process)
    return Output(process)


@pytest.mark.slow
def test_schedulers_take_up_schedules_added_while_they_run_each_slot_once(
    alias: str, marker: Path
) -> None:
    """Two schedulers serve ``customer_report``, which has no schedule in the code. Staff
    add two schedules while they run, each with its own arguments; one with a window;
    and a row written past the door. Each slot runs once, with its schedule's
    arguments; the bad row is that schedule's problem; a paused schedule and a deleted
    one run no more; a run asked for now of one runs on a scheduler."""
    with reaped() as started:
        servers = [scheduler(started, alias, marker) for _ in range(2)]
        wait_for(lambda: Scheduler.objects.using(alias).alive().count() == 2, timeout=90)
        now = database_now(alias)
        window = (now + dt.timedelta(seconds=5), now + dt.timedelta(seconds=11))
        add_schedule(JOB, "acme", every="2s", kwargs={"customer": "acme"}, by="ops", using=alias)
        add_schedule(
            JOB, "globex", every="3s", kwargs={"customer": "globex", "lines": 3}, by="ops",
            using=alias,
        )  # fmt: skip
        add_schedule(
            JOB, "initech", every="2s", kwargs={"customer": "initech"}, starts_at=window[0],
            ends_at=window[1], by="ops", using=alias,
        )  # fmt: skip
        RunTimeSchedule.objects.using(alias).create(  # past the door: SQL, an old version
            name=f"{JOB}:bad", job=JOB, key="bad", every=2.0, kwargs={"renamed": 1},
            created_at=now, created_by="sql", changed_at=now, changed_by="sql",
        )  # fmt: skip
        wait_for(lambda: len(ran(marker, f"{JOB}:acme")) >= 4, timeout=120)
        wait_for(lambda: database_now(alias) > window[1] + dt.timedelta(seconds=2), timeout=60)
        control.request_run(f"{JOB}:globex", by="ops", using=alias, kwargs={"lines": 7})
        wait_for(lambda: ["globex", "7"] in [m[2:] for m in marked(marker)], timeout=60)
        pause_schedule(f"{JOB}:acme", by="ops", using=alias)
        delete_schedule(f"{JOB}:globex", by="ops", using=alias)
        for server in servers:
            for name in ("acme", "globex"):
                gone = f"{JOB}:{name}: no longer scheduled"
                wait_for(lambda s=server, g=gone: s.count(g) == 1, timeout=60)  # type: ignore[misc]
        wait_for(lambda: not JobRun.objects.using(alias).filter(status="running").exists(), 30)
        settled = len(marked(marker))
        # Long enough for two slots of each: none runs.
        until = database_now(alias) + dt.timedelta(seconds=6.5)
        wait_for(lambda: database_now(alias) > until, timeout=30)
        assert len(marked(marker)) == settled
        said = "\n".join(server.stop() for server in servers)
    for name, customer, lines in (("acme", "acme", "10"), ("globex", "globex", "3")):
        # The run asked for now (7 lines) is told the slot it came in; the others, theirs.
        scheduled = [m for m in marked(marker) if m[0] == f"{JOB}:{name}" and m[3] != "7"]
        slots = [m[1] for m in scheduled]
        assert slots and len(slots) == len(set(slots)), (name, slots)
        assert {(m[2], m[3]) for m in scheduled} == {(customer, lines)}
    initech = ran(marker, f"{JOB}:initech")
    assert initech and len(initech) == len(set(initech))
    assert all(window[0] <= slot < window[1] for slot in initech), (window, initech)
    assert not ran(marker, f"{JOB}:bad")
    assert f"misconfigured {JOB}:bad: its run-time schedule:" in said
    rows = JobRun.objects.using(alias).filter(name__startswith=f"{JOB}:")
    counted = Counter((run.name, run.slot, run.attempt) for run in rows)
    assert max(counted.values()) == 1


# --- the health view, --check and the jobs page ------------------------------------------


def test_health_judges_each_run_time_schedule_as_a_job_of_its_own(alias: str) -> None:
    """A failing schedule is a problem (--check, the health view, metrics); one switched
    off shows paused; one its scheduler cannot use, misconfigured; none is undeclared."""
    from django_exclusive_jobs.health import overview

    now = database_now(alias)
    add_schedule(JOB, "acme", every="1h", kwargs={"customer": "acme"}, by="ops", using=alias)
    add_schedule(JOB, "off", every="1h", enabled=False, by="ops", using=alias)
    RunTimeSchedule.objects.using(alias).create(  # past the door: SQL, an old version
        name=f"{JOB}:bad", job=JOB, key="bad", every=3600.0, kwargs={"renamed": 1},
        created_at=now, created_by="sql", changed_at=now, changed_by="sql",
    )  # fmt: skip
    slot = now.replace(minute=0, second=0, microsecond=0)
    JobRun.objects.using(alias).create(
        name=f"{JOB}:acme", slot=slot, status="failed", started_at=now, finished_at=now
    )
    seen = overview(alias)
    jobs = {job.name: job for job in seen.jobs}
    assert not [job.name for job in seen.undeclared if job.name.startswith(JOB)]
    acme, off, bad = (jobs[f"{JOB}:{key}"] for key in ("acme", "off", "bad"))
    assert acme.added and acme.as_dict()["run_time"] and not jobs[JOB].added
    assert acme.schedule == "Every hour" and acme.arguments == '{"customer": "acme"}'
    assert any("failing" in problem for problem in acme.problems), acme.problems
    assert (off.badge, off.pause_reason, off.problems) == ("paused", "switched off", [])
    assert "its run-time schedule" in bad.misconfigured

"""Moving from django-celery-beat: ``exclusive_jobs import-celery-beat``.

The plan is a decision over rows (pure: what is carried, what is not, and why); then a
real django-celery-beat database (its own models and migrations, on PostgreSQL)
imported by the real command, and two real schedulers sending what was imported to a
real Celery worker on the machine's RabbitMQ (tests/celery_app.py): each slot once,
with its slot in the headers.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.conf import settings
from django.db import connections

from django_exclusive_jobs.models import JobChange, JobRun, RunTimeSchedule
from django_exclusive_jobs.run import celery_beat
from django_exclusive_jobs.run.registry import get_job

from .test_celery import sent
from .test_command import ROOT, command_env, launch, marker, processes, wait_for
from .test_scheduler import schedulers, start_scheduler, stop

__all__ = ["marker", "processes", "schedulers"]  # fixtures

NOW = dt.datetime(2026, 12, 6, 20, 0, 30, tzinfo=dt.UTC)


def task(name: str, **given: Any) -> Any:
    """A periodic task as django-celery-beat's row has it (its schedule read with it)."""
    fields = {
        "name": name, "task": "tests.record", "args": "[]", "kwargs": "{}", "queue": None,
        "enabled": True, "one_off": False, "start_time": None, "description": "",
        "crontab_id": None, "interval_id": None, "solar_id": None, "clocked_id": None,
        "expires": None, "expire_seconds": None, "exchange": None, "routing_key": None,
        "priority": None, "headers": "{}",
    }  # fmt: skip
    fields.update(given)
    for kind in ("crontab", "interval", "solar", "clocked"):
        if kind in given:
            fields[f"{kind}_id"] = 1
    return SimpleNamespace(**fields)


class Solar:
    def __str__(self) -> str:
        return "sunset"


def crontab(**fields: str) -> Any:
    cron = {"minute": "0", "hour": "8", "day_of_month": "*", "month_of_year": "*",
            "day_of_week": "1", "timezone": "Europe/Paris"}  # fmt: skip
    return SimpleNamespace(**{**cron, **fields})


def planned(*tasks: Any, existing: frozenset[str] = frozenset()) -> celery_beat.Plan:
    job = get_job("celery_beat")
    assert job is not None
    return celery_beat.plan(list(tasks), job, NOW, set(existing), celery_beat._first_slot)


def test_each_kind_of_schedule_is_carried_or_said_why_not() -> None:
    decided = planned(
        task("weekly report", crontab=crontab(), args='["weekly"]', kwargs='{"size": 2}',
             queue="reports", description="Mondays at 8"),
        task("every 90 s", interval=SimpleNamespace(every=90, period="seconds")),
        task("hourly: off", interval=SimpleNamespace(every=1, period="hours"), enabled=False),
        task("at sunset", solar=Solar()),
        task("too often", interval=SimpleNamespace(every=500, period="microseconds")),
        task("bad args", interval=SimpleNamespace(every=1, period="days"), args="{"),
        task("no schedule"),
    )  # fmt: skip
    carried = {c.task: c for c in decided.carried}
    assert sorted(carried) == ["every 90 s", "hourly: off", "weekly report"]
    weekly = carried["weekly report"]
    assert (weekly.key, weekly.reason) == (
        "weekly report", "imported from django-celery-beat: Mondays at 8",
    )  # fmt: skip
    assert weekly.settings == {
        "cron": "0 8 * * 1", "timezone": "Europe/Paris", "enabled": True,
        "kwargs": {"task": "tests.record", "args": ["weekly"], "kwargs": {"size": 2},
                   "queue": "reports"},
    }  # fmt: skip
    assert carried["every 90 s"].settings["every"] == 90
    assert (
        carried["hourly: off"].key == "hourly- off"
        and not carried["hourly: off"].settings["enabled"]
    )
    why = {n.task: n.why for n in decided.not_carried}
    assert set(why) == {"at sunset", "too often", "bad args", "no schedule"}
    assert "a solar schedule (sunset) is not carried" in why["at sunset"]
    assert "every must be at least 1s" in why["too often"]
    assert "its arguments are not JSON" in why["bad args"]
    assert why["no schedule"] == "it has no schedule"


def test_a_one_off_runs_its_first_slot_from_its_start_only() -> None:
    start = NOW + dt.timedelta(hours=3)
    clock = SimpleNamespace(clocked_time=dt.datetime(2026, 12, 24, 18, 30, tzinfo=dt.UTC))
    decided = planned(
        task("once", interval=SimpleNamespace(every=1, period="hours"), one_off=True,
             start_time=start),
        task("christmas eve", clocked=clock),
        task("odd second", clocked=SimpleNamespace(
            clocked_time=dt.datetime(2026, 12, 24, 18, 30, 5, tzinfo=dt.UTC))),
    )  # fmt: skip
    carried = {c.task: c.settings for c in decided.carried}
    first = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)  # the first hourly slot from 23:00:30
    assert (carried["once"]["starts_at"], carried["once"]["ends_at"]) == (
        start, first + dt.timedelta(seconds=1),
    )  # fmt: skip
    eve = carried["christmas eve"]
    assert (eve["cron"], eve["timezone"]) == ("30 18 24 12 *", "UTC")
    assert eve["ends_at"] == clock.clocked_time + dt.timedelta(seconds=1)
    assert [n.task for n in decided.not_carried] == ["odd second"]


def test_what_a_schedule_cannot_carry_is_listed_and_one_imported_is_left() -> None:
    decided = planned(
        task("expiring", interval=SimpleNamespace(every=1, period="hours"), expire_seconds=30,
             priority=5),
        task("done before", interval=SimpleNamespace(every=1, period="hours")),
        existing=frozenset({"celery_beat:done before"}),
    )  # fmt: skip
    [expiring] = decided.carried
    assert expiring.left_out == ("expire_seconds=30", "priority=5")
    assert decided.existing == ["done before"]


# --- a real django-celery-beat database, the real command, real schedulers ---------------


SEED = """
from django_celery_beat.models import (
    CrontabSchedule, IntervalSchedule, PeriodicTask, SolarSchedule,
)
every = IntervalSchedule.objects.using("{alias}").create(every=2, period="seconds")
nightly = CrontabSchedule.objects.using("{alias}").create(
    minute="15", hour="3", timezone="Europe/Paris",
)
sun = SolarSchedule.objects.using("{alias}").create(
    event="sunset", latitude=48.85, longitude=2.35,
)
rows = PeriodicTask.objects.using("{alias}")
rows.create(name="beat-tick", task="tests.record", interval=every, args='["beat"]',
            kwargs='{{"size": 1}}', queue="{queue}")
rows.create(name="nightly", task="tests.record", crontab=nightly, args='["night"]')
rows.create(name="sunset", task="tests.record", solar=sun, args='["sun"]')
"""


def beat(alias: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``manage.py ARGS`` in a process that has django-celery-beat (tests/settings.py)."""
    with_beat = {**env, "EXCLUSIVE_JOBS_TEST_CELERY_BEAT": "1"}
    command = [sys.executable, "-m", "django", *args]
    return subprocess.run(
        command, cwd=ROOT, env=with_beat, capture_output=True, text=True, timeout=120
    )


def exclusive_jobs(alias: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    given = ["exclusive_jobs", *args, "--database", alias, "--beat-database", alias]
    return beat(alias, *given, env=env)


@pytest.mark.slow
def test_periodic_tasks_are_imported_then_sent_once_per_slot_to_a_real_worker(
    alias: str,
    marker: Path,
    processes: list[subprocess.Popen[str]],
    schedulers: list[subprocess.Popen[str]],
) -> None:
    # On PostgreSQL only: what it tests is the import and a real worker; each slot once
    # on every backend is tests/test_celery.py's and tests/test_runtime_schedules.py's
    # (a Celery worker costs seconds of CPU to start, on a loaded two-core machine).
    if connections[alias].vendor != "postgresql":
        pytest.skip("the import's end-to-end test runs on PostgreSQL")
    pytest.importorskip("django_celery_beat")  # the dev extra
    queue = f"exclusive_jobs_{uuid.uuid4().hex[:12]}"
    env = command_env(marker, CELERY_QUEUE=queue)
    # Its tables and rows, made by its own models and migrations in commands that have
    # it (tests/settings.py), as a project that runs celery beat has them.
    # (On "default" too: its signals write its change marker there, whatever the row's.)
    for database in {alias, "default"}:
        made = beat(alias, "migrate", "django_celery_beat", "--database", database, env=env)
        assert made.returncode == 0, made
    seeded = beat(alias, "shell", "-c", SEED.format(alias=alias, queue=queue), env=env)
    assert seeded.returncode == 0, seeded
    try:
        dry = exclusive_jobs(alias, "import-celery-beat", "--dry-run", env=env)
        assert dry.returncode == 1, dry  # the solar one cannot be carried
        assert "would import beat-tick as celery_beat:beat-tick: every 2s" in dry.stdout
        assert "would import nightly as celery_beat:nightly: cron 15 3 * * * (Europe/Paris)" in (
            dry.stdout
        )
        assert "not carried: sunset: a solar schedule" in dry.stdout
        assert not RunTimeSchedule.objects.using(alias).exists()
        done = exclusive_jobs(alias, "import-celery-beat", "--by", "migration", env=env)
        assert done.returncode == 1 and "2 imported, 0 already imported, 1 not carried" in (
            done.stdout
        )
        again = exclusive_jobs(alias, "import-celery-beat", env=env)
        assert "0 imported, 2 already imported, 1 not carried" in again.stdout
        added = {row.name: row for row in RunTimeSchedule.objects.using(alias)}
        assert sorted(added) == ["celery_beat:beat-tick", "celery_beat:nightly"]
        audit = JobChange.objects.using(alias).filter(action="schedule_added")
        assert {change.by for change in audit} == {"migration"}
        worker = [sys.executable, "-m", "celery", "-A", "tests.celery_app", "worker"]
        quiet = ["--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "warning"]
        launch(processes, [*worker, "--pool=solo", "-Q", queue, "-n", f"{queue}@%h", *quiet], env)
        for _ in range(2):
            start_scheduler(schedulers, alias, "--jobs", "celery_beat", env=env)
        wait_for(lambda: len(sent(marker)) >= 3, timeout=90)
        for scheduler in schedulers:
            stop(scheduler)
    finally:
        for database in {alias, "default"}:
            beat(alias, "migrate", "django_celery_beat", "zero", "--database", database, env=env)
    enqueued = JobRun.objects.using(alias).filter(name="celery_beat:beat-tick", status="enqueued")
    wait_for(lambda: len(sent(marker)) >= enqueued.count(), timeout=60)  # the last ones sent
    received = sent(marker)
    slots = [slot for _, slot, *_ in received]
    assert len(slots) == len(set(slots)) == enqueued.count(), received
    by_id = {row.task_result_id: row for row in enqueued}
    for label, slot, task_id, name, kwargs in received:
        row = by_id[task_id]
        assert (label, name, kwargs) == ("beat", "celery_beat:beat-tick", "[('size', 1)]")
        assert row.slot is not None and slot == row.slot.isoformat()


def test_an_unknown_beat_database_is_one_line_and_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "django", "exclusive_jobs", "import-celery-beat",
         "--beat-database", "nowhere"],
        cwd=ROOT, env=command_env(None), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert done.stderr.strip() == (
        "CommandError: Unknown database alias 'nowhere' for --beat-database; known aliases: "
        + ", ".join(sorted(settings.DATABASES))
        + "."
    )

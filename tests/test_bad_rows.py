"""Rows already in the database that no door would let in today (written by an older
version, or by SQL) never stop the cluster: a scheduler makes such a job a problem of its
own (one line, once) and goes on serving the others; the jobs page, the job's page, health
and metrics show it as a problem; Resume and Back to the code put it right (issue 41,
item 2).

The bad rows are written as an older version or a raw UPDATE would: with the ORM or SQL,
past every validator."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client
from django.test.utils import override_settings
from django.urls import reverse

from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.lock.retry import run_statement
from django_exclusive_jobs.models import JobLock, JobRun, JobState
from django_exclusive_jobs.run import overrides
from django_exclusive_jobs.run.registry import Job, get_job
from django_exclusive_jobs.run.scheduler import Scheduler
from django_exclusive_jobs.run.schedules import Every

from .process_output import Output
from .test_command import manage, marker, wait_for
from .test_operate import exclusive_jobs
from .test_scheduler import scheduler_env, schedulers, start_scheduler, stop

# Run in the README suite on every database; the Django 6.x stages of CI leave them out
# (the doors themselves are checked there by tests/test_doors.py).
pytestmark = pytest.mark.slow

__all__ = ["marker", "schedulers"]  # fixtures

TOKEN = "bad-rows-s3cret"
ACT = "admin:django_exclusive_jobs_jobstate_act"
JOBS = "admin:django_exclusive_jobs_jobstate_changelist"
JOB = "admin:django_exclusive_jobs_jobstate_job"
BAD = "tick_skip"  # every 2 s (TICK_EVERY): the job given a bad row
GOOD = "tick"  # every 2 s: the job that must go on being served
DAY = 86400.0

BAD_OVERRIDES = {
    "every 999999999 days": {"every": 999999999 * DAY},
    "every 750000 days": {"every": 750000 * DAY},
    "an unknown zone": {"cron": "* * * * *", "timezone": "Nope/Nowhere"},
    "a cron with no slot": {"cron": "0 0 31 2 *", "timezone": "UTC"},
    "not a schedule": {"every": "often"},
}


def write_override(alias: str, schedule: object) -> None:
    """As an older version saved it: no check."""
    job = get_job(BAD)
    assert job is not None
    code = {"schedule": overrides.code_of(job)["schedule"]}
    defaults = {"override": {"schedule": schedule}, "code": code, "overridden_by": "old"}
    states = JobState.objects.using(alias)
    # With the app's retry, as runs_of reads.
    run_statement(alias, lambda: states.update_or_create(name=BAD, defaults=defaults))


def serving(server: subprocess.Popen[str], reached: Any, timeout: float = 90) -> None:
    """Wait until ``reached()``; the scheduler must not die meanwhile (it did, before)."""
    wait_for(lambda: server.poll() is not None or reached(), timeout=timeout)
    assert server.poll() is None, f"the scheduler died (exit {server.returncode})"


def runs_of(alias: str, name: str) -> int:
    """With the app's retry: SQLite can answer "database is locked" to the test's read
    while the scheduler writes (seen in fresh-clone CI), as to any statement."""
    runs = JobRun.objects.using(alias).filter(name=name)
    count: int = run_statement(alias, runs.count)
    return count


@pytest.fixture
def operator(alias: str) -> Iterator[Client]:
    """A superuser of the admin (its row on the default database), the app on ``alias``."""
    user, _ = User.objects.get_or_create(username="bad-rows-op", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(user)
    with override_settings(EXCLUSIVE_JOBS={"HEALTH_TOKEN": TOKEN, "DATABASE": alias}):
        yield client
    User.objects.filter(pk=user.pk).delete()


def pages_show_the_problem(operator: Client, word: str) -> tuple[dict[str, Any], str]:
    """The jobs page and the job's page answer 200 and name the problem; the health
    view answers its problem status, 503, listing it; the scrape answers 200. Returns
    health's JSON and the scrape."""
    jobs = operator.get(reverse(JOBS))
    assert jobs.status_code == 200, jobs.content[-2000:]
    assert word in jobs.content.decode()
    page = operator.get(reverse(JOB), {"job": BAD})
    assert page.status_code == 200, page.content[-2000:]
    assert word in page.content.decode()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    health = Client().get("/jobs/health", headers=auth)
    scrape = Client().get("/jobs/metrics", headers=auth)
    assert scrape.status_code == 200, scrape.content
    return {"status": health.status_code, **health.json()}, scrape.content.decode()


def misconfigured_sample(scrape: str) -> str:
    found = re.findall(
        rf'exclusive_jobs_problem\{{job_name="{BAD}",problem="misconfigured"\}} (\S+)', scrape
    )
    assert len(found) == 1, scrape
    return str(found[0])


# --- a schedule in an override that cannot be used --------------------------------------------


def started_in_process(alias: str, said: list[str], *names: str) -> Scheduler:
    """The real scheduler's start-up in this process (it reads the rows and plans each
    job's first slot, as a ``exclusive_scheduler`` does), stopped at once: a test then
    drives its polls itself (``poll``), in milliseconds."""
    scheduler = Scheduler(
        [declared(name, alias) for name in names],
        using=alias,
        run_for=0,
        report=lambda line, normal: said.append(str(line)),
    )
    assert scheduler.run() == 0
    return scheduler


def poll(scheduler: Scheduler) -> None:
    """One of the scheduler's polls for its jobs' rows (every REQUEST_POLL seconds)."""
    scheduler._read_overrides()


def misconfigured_lines(said: list[str]) -> list[str]:
    return [line for line in said if line.startswith(f"misconfigured {BAD}:")]


@pytest.mark.parametrize("schedule", list(BAD_OVERRIDES.values()), ids=list(BAD_OVERRIDES))
def test_a_bad_override_is_its_jobs_problem_and_back_to_the_code_serves_it_again(
    alias: str, operator: Client, schedule: object
) -> None:
    """A scheduler started with the row (it crashed at start-up before) plans the other
    job, says once that the job is misconfigured (its later polls say nothing more), and
    plans it again once Back to the code (the admin's) has put it right; meanwhile every
    page shows it. (A real scheduler process serving beside such a row:
    test_a_scheduler_serves_on_beside_bad_overrides_and_the_way_back_serves_the_job.)"""
    write_override(alias, schedule)
    # How the row is read and judged: the job as it would run is refused.
    state = overrides.read([BAD], using=alias)[BAD]
    with pytest.raises(overrides.Misconfigured) as refused:
        overrides.tried(overrides.in_force(declared(BAD, alias), state), database_now(alias))
    said: list[str] = []
    scheduler = started_in_process(alias, said, GOOD, BAD)
    assert set(scheduler.served.misconfigured) == {BAD}, said
    assert GOOD in scheduler.due and BAD not in scheduler.due
    poll(scheduler)
    poll(scheduler)
    lines = misconfigured_lines(said)
    assert len(lines) == 1, said
    assert refused.value.reason in lines[0]
    assert lines[0].endswith("its runs are not started until it is fixed")
    assert runs_of(alias, BAD) == 0
    health, scrape = pages_show_the_problem(operator, "misconfigured")
    assert health["status"] == 503
    problems = [p for p in health["problems"] if p.startswith(f"{BAD}: misconfigured: ")]
    assert len(problems) == 1, health["problems"]
    assert misconfigured_sample(scrape) == "1.0"
    # The way back, from the admin: the next poll reads it.
    back = operator.post(reverse(ACT, args=["back"]), {"job": BAD, "confirm": "yes"})
    assert back.status_code == 302
    poll(scheduler)
    assert not scheduler.served.misconfigured and BAD in scheduler.due, said
    _, scrape = pages_show_the_problem(operator, BAD)
    assert misconfigured_sample(scrape) == "0.0"
    assert len(misconfigured_lines(said)) == 1, said
    assert any(f"{BAD}: back to its code" in line for line in said), said
    assert any(f"{BAD}: fixed, served again" in line for line in said), said
    assert not any("Traceback" in line for line in said), said


POLL = "0.3"  # seconds between a test scheduler's polls (EXCLUSIVE_JOBS_TEST_REQUEST_POLL)


def test_a_scheduler_serves_on_beside_bad_overrides_and_the_way_back_serves_the_job(
    alias: str, marker: Path, schedulers: list[Any], operator: Client
) -> None:
    """A real scheduler started with a bad row (it crashed at start-up before) and one
    under which a bad row is written (every scheduler serving the job died within its
    poll before): it lives, serves the other job, says once per bad row that the job is
    misconfigured, and serves the job again once Back to the code has put it right."""
    misconfigured = f"misconfigured {BAD}:"
    write_override(alias, BAD_OVERRIDES["every 999999999 days"])
    env = scheduler_env(marker, PYTHONUNBUFFERED="1", EXCLUSIVE_JOBS_TEST_REQUEST_POLL=POLL)
    server = start_scheduler(schedulers, alias, "--jobs", GOOD, BAD, env=env)
    output = Output(server)
    serving(server, lambda: output.count(misconfigured) == 1)  # its start-up
    # Two slots of the healthy job (2 s each) after the line: many polls (0.3 s) of the
    # same row, and the job runs on.
    before = runs_of(alias, GOOD)
    serving(server, lambda: runs_of(alias, GOOD) >= before + 2)
    assert runs_of(alias, BAD) == 0
    _, scrape = pages_show_the_problem(operator, "misconfigured")
    assert misconfigured_sample(scrape) == "1.0"
    back = operator.post(reverse(ACT, args=["back"]), {"job": BAD, "confirm": "yes"})
    assert back.status_code == 302
    serving(server, lambda: runs_of(alias, BAD) >= 1)
    # Now written under the running scheduler (another kind of bad row).
    write_override(alias, BAD_OVERRIDES["an unknown zone"])
    serving(server, lambda: output.count(misconfigured) == 2)
    settled, before = runs_of(alias, BAD), runs_of(alias, GOOD)
    serving(server, lambda: runs_of(alias, GOOD) >= before + 2)
    assert runs_of(alias, BAD) == settled  # not started until it is fixed
    health, _ = pages_show_the_problem(operator, "misconfigured")
    assert any(p.startswith(f"{BAD}: misconfigured: ") for p in health["problems"])
    # Resume does not put an override right, but it answers (nothing to resume).
    resume = operator.post(reverse(ACT, args=["resume"]), {"job": BAD, "confirm": "yes"})
    assert resume.status_code == 302
    back = operator.post(reverse(ACT, args=["back"]), {"job": BAD, "confirm": "yes"})
    assert back.status_code == 302
    serving(server, lambda: runs_of(alias, BAD) > settled)
    said = output.stop()
    lines = output.starting(misconfigured)
    assert len(lines) == 2, said  # once per bad row, whatever the polls in between
    assert all(line.endswith("its runs are not started until it is fixed") for line in lines)
    assert "Traceback" not in said
    assert output.count(f"{BAD}: back to its code") == 2, said
    assert output.count(f"{BAD}: fixed, served again") == 2, said


def test_run_exclusive_refuses_a_misconfigured_job_in_one_line_and_leaves_no_lock(
    alias: str, marker: Path
) -> None:
    write_override(alias, BAD_OVERRIDES["every 999999999 days"])
    result = manage(alias, BAD)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "misconfigured" in result.stderr and "Traceback" not in result.stderr
    assert runs_of(alias, BAD) == 0
    assert not JobLock.objects.using(alias).filter(name=BAD).held().exists()
    listed = exclusive_jobs(alias, "list")
    assert listed.returncode == 0, listed.stderr
    checked = exclusive_jobs(alias, "--check")
    assert checked.returncode == 1 and f"{BAD}: misconfigured" in checked.stdout + checked.stderr
    coming = exclusive_jobs(alias, "next", BAD)
    assert coming.returncode == 2 and len(coming.stderr.strip().splitlines()) == 1, coming
    assert "misconfigured" in coming.stderr and "Traceback" not in coming.stderr


@dataclass(frozen=True)
class Unreachable(Every):
    """A schedule whose slots cannot be computed (as one whose next slot is past year
    9999): whatever the checks on a row foresaw, computing it may still fail."""

    def latest_at_or_before(self, moment: dt.datetime) -> tuple[dt.datetime, dt.timedelta]:
        raise OverflowError("date value out of range")


def declared(name: str, alias: str) -> Job:
    job = get_job(name)
    assert job is not None
    return job.but(using=alias)


def test_a_schedule_that_cannot_be_computed_stops_only_its_job(
    alias: str, marker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the scheduler computes a job's slots, a failure is that job's: one line,
    once, and the other job is served (in process: the scheduler runs to completion)."""
    monkeypatch.setenv("MARKER", str(marker))
    bad = replace(declared(BAD, alias), schedule=Unreachable(period=dt.timedelta(seconds=2)))
    said: list[str] = []
    scheduler = Scheduler(
        [declared(GOOD, alias), bad],
        using=alias,
        max_runs=3,
        run_for=60,
        report=lambda line, normal: said.append(str(line)),
    )
    assert scheduler.run() == 0
    assert scheduler.ended_runs == 3 and runs_of(alias, GOOD) == 3 and runs_of(alias, BAD) == 0
    lines = [line for line in said if line.startswith(f"misconfigured {BAD}:")]
    assert len(lines) == 1 and "OverflowError: date value out of range" in lines[0], said


# --- a pause end that Python (or the driver) cannot read ---------------------------------------

BAD_ENDS = {
    "postgres": ["0001-12-31 23:00:00+00 BC", "10000-01-01 00:00:00+00"],
    "mysql": ["0000-00-00 00:00:00", "0001-01-01 00:00:00"],
    "default": ["0000-01-01 00:00:00", "not a time"],
}


def write_pause_end(alias: str, end: str) -> None:
    """A pause whose end is out of range, as a raw UPDATE writes it; retried as the app
    retries a statement (under a running scheduler SQLite may answer "database is locked")."""
    run_statement(alias, lambda: _write_pause_end(alias, end))


def _write_pause_end(alias: str, end: str) -> None:
    JobState.objects.using(alias).update_or_create(
        name=BAD, defaults={"paused": True, "paused_by": "old", "pause_reason": "old"}
    )
    table = connections[alias].ops.quote_name(JobState._meta.db_table)
    with connections[alias].cursor() as cursor:
        if alias == "mysql":
            cursor.execute("SET SESSION sql_mode = ''")  # as an older server let it in
        cursor.execute(f"UPDATE {table} SET paused_until = %s WHERE name = %s", [end, BAD])
        if alias == "mysql":
            cursor.execute("SET SESSION sql_mode = DEFAULT")


@pytest.mark.parametrize("which", [0, 1], ids=["too early", "too late"])
def test_a_pause_end_out_of_range_is_read_as_until_resumed_and_resume_works(
    alias: str, marker: Path, operator: Client, which: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: every read of the row failed (PostgreSQL: "timestamp too small"): the
    pages 500, health and metrics 503, the commands exit 3, and the scheduler said
    "database unreachable" every 5 s. Now the end is read as none (paused until
    resumed: the pause is kept), and Resume ends it: the job is served again. (A real
    scheduler process serving beside such a row:
    test_a_pause_end_out_of_range_under_a_running_scheduler_is_no_outage.)"""
    monkeypatch.setenv("MARKER", str(marker))
    write_pause_end(alias, BAD_ENDS[alias][which])
    state = JobState.objects.using(alias).get(name=BAD)
    assert state.paused and state.paused_until is None and state.paused_now(database_now(alias))
    # The scheduler's start-up and its polls read the row: no outage, the job planned
    # (each run decides that it is paused: the cron line below).
    said: list[str] = []
    scheduler = started_in_process(alias, said, GOOD, BAD)
    poll(scheduler)
    assert not scheduler.served.misconfigured and {GOOD, BAD} <= set(scheduler.due), said
    assert not any("database unreachable" in line or "Traceback" in line for line in said)
    health, scrape = pages_show_the_problem(operator, "paused")
    assert health["status"] in (200, 503), health
    assert "database" not in " ".join(health["problems"])
    assert re.search(rf'exclusive_jobs_paused\{{job_name="{BAD}"\}} 1\.0', scrape), scrape
    listed = exclusive_jobs(alias, "list")
    assert listed.returncode == 0, listed.stderr
    cron_line = manage(alias, BAD)
    assert (
        cron_line.returncode == 0
        and runs_of(alias, BAD)
        == JobRun.objects.using(alias).filter(name=BAD, status="paused").count()
        >= 1
    ), (cron_line.stdout, cron_line.stderr)
    if which == 0:  # the command's Resume ("was not paused" before)
        resumed = exclusive_jobs(alias, "resume", BAD, "--reason", "over")
        assert resumed.returncode == 0 and "was not paused" not in resumed.stdout + resumed.stderr
    else:  # the admin's (500 before)
        done = operator.post(reverse(ACT, args=["resume"]), {"job": BAD, "confirm": "yes"})
        assert done.status_code == 302
    assert not JobState.objects.using(alias).get(name=BAD).paused
    # Served again: the real scheduler, in this process, until its first run has ended.
    served = Scheduler([declared(BAD, alias)], using=alias, max_runs=1, run_for=60)
    assert served.run() == 0 and served.ended_runs == 1
    assert JobRun.objects.using(alias).filter(name=BAD, status="succeeded").exists()


def test_the_migration_keeps_a_pause_with_an_end_out_of_range_until_resumed(alias: str) -> None:
    """The data migration compares in SQL (nothing out of range is ever fetched)."""
    import importlib

    migration = importlib.import_module("django_exclusive_jobs.migrations.0012_pause_end_in_range")
    write_pause_end(alias, BAD_ENDS[alias][0])
    JobState.objects.using(alias).create(
        name=GOOD, paused=True, paused_until=dt.datetime(2099, 1, 1, tzinfo=dt.UTC)
    )

    class Editor:
        connection = connections[alias]

    from django.apps import apps

    migration.pause_ends_in_range(apps, Editor())
    table = connections[alias].ops.quote_name(JobState._meta.db_table)
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT name, paused, paused_until IS NULL FROM {table} ORDER BY name")
        rows = [(name, bool(paused), bool(empty)) for name, paused, empty in cursor.fetchall()]
    assert rows == [(GOOD, True, False), (BAD, True, True)]


def test_a_pause_end_out_of_range_under_a_running_scheduler_is_no_outage(
    alias: str, marker: Path, schedulers: list[Any], operator: Client
) -> None:
    """A real scheduler under which such a pause end is written: it lives, serves the
    other job, runs the paused one not at all (its slots are recorded paused), says no
    outage, and serves it again once Resume (the admin's) has ended the pause."""
    env = scheduler_env(marker, EXCLUSIVE_JOBS_TEST_REQUEST_POLL=POLL)
    server = start_scheduler(schedulers, alias, "--jobs", GOOD, BAD, env=env)
    wait_for(lambda: runs_of(alias, BAD) >= 1 and runs_of(alias, GOOD) >= 1, timeout=60)
    write_pause_end(alias, BAD_ENDS[alias][0])
    runs = JobRun.objects.using(alias).filter(name=BAD)
    ran, succeeded = runs.exclude(status="paused"), runs.filter(status="succeeded")
    settled, before = run_statement(alias, ran.count), runs_of(alias, GOOD)
    # Two slots (2 s each): the scheduler has read the row at many polls (0.3 s); the
    # paused job's slots are not run (at most recorded paused).
    serving(server, lambda: runs_of(alias, GOOD) >= before + 2)
    assert run_statement(alias, ran.count) == settled
    settled = run_statement(alias, succeeded.count)
    health, scrape = pages_show_the_problem(operator, "paused")
    assert "database" not in " ".join(health["problems"])
    assert re.search(rf'exclusive_jobs_paused\{{job_name="{BAD}"\}} 1\.0', scrape), scrape
    done = operator.post(reverse(ACT, args=["resume"]), {"job": BAD, "confirm": "yes"})
    assert done.status_code == 302
    serving(server, lambda: run_statement(alias, succeeded.count) > settled)
    _out, err = stop(server)
    assert "database unreachable" not in err and "Traceback" not in err, err

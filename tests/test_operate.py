"""Operating jobs: pause and resume, run now, the health check, the health view and the
jobs page, through real commands and Django's test client, on every backend."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client
from django.test.utils import override_settings
from django.urls import reverse

from django_exclusive_jobs import exclusive_job
from django_exclusive_jobs.health import overview
from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.models import JobLock, JobRun, JobState, RunRequest, Scheduler
from django_exclusive_jobs.run import control
from django_exclusive_jobs.run.catchup import CatchUp
from django_exclusive_jobs.run.registry import Job, _jobs
from django_exclusive_jobs.run.runner import Run
from django_exclusive_jobs.run.schedules import Every
from django_exclusive_jobs.run.start import Start

from .helpers import expire_now, other_holder
from .test_admin import client_for, make_user
from .test_command import ROOT, command_env, manage, marker, runs

__all__ = ["marker"]  # a fixture

JOBS = reverse("admin:django_exclusive_jobs_jobstate_changelist")
HOUR = dt.timedelta(hours=1)


def exclusive_jobs(
    alias: str, *args: str, marker: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", "exclusive_jobs", *args, "--database", alias],
        cwd=ROOT,
        env=command_env(marker),
        capture_output=True,
        text=True,
        timeout=120,
    )


# --- pause and resume ------------------------------------------------------------------


def test_a_paused_job_skips_with_one_line_until_resumed(alias: str, marker: Path) -> None:
    paused = exclusive_jobs(alias, "pause", "quick", "--by", "alice")
    assert paused.returncode == 0, paused.stderr
    result = manage(alias, "quick", env=command_env(marker))
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()
    assert line.startswith("skipped quick: paused by alice since ")
    assert runs(marker, "quick") == 0
    assert not JobRun.objects.using(alias).filter(name="quick").exists()
    assert exclusive_jobs(alias, "resume", "quick").returncode == 0
    assert manage(alias, "quick", env=command_env(marker)).returncode == 0
    assert runs(marker, "quick") == 1


def test_slots_that_pass_while_paused_are_not_missed(alias: str) -> None:
    now = database_now(alias)
    current = Every(period=HOUR).slot_at(now)
    JobRun.objects.using(alias).create(
        name="hourly_paused", slot=current - 4 * HOUR, status="succeeded", started_at=now
    )
    JobState.objects.using(alias).create(
        name="hourly_paused",
        paused=False,
        paused_at=current - 2 * HOUR - dt.timedelta(minutes=30),
        resumed_at=now,
    )
    job = Job(
        "hourly_paused",
        noop,
        using=alias,
        schedule=Every(period=HOUR),
        catch_up=CatchUp("latest"),
        keepalive=False,
    )
    ran = Run(job).call()
    assert ran.status == "skipped"  # the current slot began while it was paused
    rows = dict(
        JobRun.objects.using(alias).filter(name="hourly_paused").values_list("slot", "status")
    )
    assert rows == {current - 4 * HOUR: "succeeded", current - 3 * HOUR: "missed"}


def test_pause_and_resume_of_an_unknown_job_is_exit_2(alias: str) -> None:
    result = exclusive_jobs(alias, "pause", "nope")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "CommandError: Unknown job 'nope': 'manage.py exclusive_jobs' lists the jobs."
    )
    assert not JobState.objects.using(alias).exists()


# --- run now ---------------------------------------------------------------------------


def test_run_now_runs_once_here_as_a_manual_run_even_when_paused(alias: str, marker: Path) -> None:
    control.pause("quick", by="alice", using=alias)
    result = exclusive_jobs(alias, "run", "quick", "--by", "bob", marker=marker)
    assert result.returncode == 0, result.stderr
    assert runs(marker, "quick") == 1
    run = JobRun.objects.using(alias).get(name="quick")
    assert (run.slot, run.status, run.requested_by) == (None, "succeeded", "bob")
    assert not RunRequest.objects.using(alias).exists()  # nothing a scheduler could take


def test_run_now_while_the_lock_is_held_runs_nothing_and_leaves_no_request(
    alias: str, marker: Path
) -> None:
    with other_holder(alias) as other:
        other.try_acquire("quick", ttl=600)
        result = exclusive_jobs(alias, "run", "quick", marker=marker)
    assert result.returncode == 1
    assert "skipped quick: held by" in result.stdout
    assert runs(marker, "quick") == 0
    assert not RunRequest.objects.using(alias).exists()


def test_a_request_is_taken_by_one_run_only(alias: str) -> None:
    request = control.request_run("quick", by="carol", using=alias)
    calls: list[int] = []
    for _ in range(2):  # two servers' schedulers see the same request
        job = Job("quick", noop, using=alias, keepalive=False)
        taken = RunRequest.objects.using(alias).get(pk=request.pk)
        Run(job, start=Start.run_now(request=taken)).call(lambda lock: calls.append(1))
    assert calls == [1]
    assert JobRun.objects.using(alias).filter(name="quick").count() == 1


# --- health ----------------------------------------------------------------------------


def problems(alias: str) -> list[str]:
    return overview(alias).problems


@pytest.fixture
def hourly() -> Iterator[str]:
    @exclusive_job("health_hourly", every="1h")
    def job() -> None:
        pass

    yield "health_hourly"
    _jobs.pop("health_hourly", None)


def test_check_is_quiet_and_exit_0_when_all_is_well(alias: str) -> None:
    result = exclusive_jobs(alias, "--check")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ok: ")


def test_check_names_each_problem_on_one_line_and_exits_1(alias: str, marker: Path) -> None:
    manage(alias, "broken", env=command_env(marker))  # its last run failed
    with other_holder(alias) as other:
        other.try_acquire("slow", ttl=600)
        expire_now(alias, "slow")  # a stale lock
        result = exclusive_jobs(alias, "--check")
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert any(line.startswith("broken: failing: its last run failed at ") for line in lines)
    assert "slow: stale lock: its holder's lease ran out and it was never released" in lines


def test_a_slot_with_no_run_is_missed_even_before_anyone_notices(alias: str, hourly: str) -> None:
    now = database_now(alias)
    current = Every(period=HOUR).slot_at(now - dt.timedelta(minutes=10))
    JobLock.objects.using(alias).create(name=hourly, token=1)
    JobRun.objects.using(alias).create(
        name=hourly, slot=current - 2 * HOUR, status="succeeded", started_at=now
    )
    [line] = [line for line in problems(alias) if line.startswith(hourly)]
    assert line.startswith(f"{hourly}: missed: no run for the slot of ")
    control.pause(hourly, by="ops", using=alias)  # a paused job's slots are not missed
    assert not [line for line in problems(alias) if line.startswith(hourly)]


def test_a_job_whose_schedulers_are_gone_is_unserved_and_the_crash_a_problem(alias: str) -> None:
    now = database_now(alias)
    Scheduler.objects.using(alias).create(
        instance="gone",
        host="web-1",
        pid=1,
        jobs=["tick"],
        started_at=now - HOUR,
        last_beat_at=now - dt.timedelta(minutes=5),
    )
    overview(alias)  # the first look makes the lock rows; "tick" was declared an hour ago
    JobLock.objects.using(alias).filter(name="tick").update(created_at=now - HOUR)
    found = problems(alias)
    assert any(
        line.startswith("tick: unserved: no live scheduler serves it, and no run for the slot of ")
        for line in found
    )
    assert any(line.startswith("scheduler web-1:1: gone: no beat since ") for line in found)
    table = exclusive_jobs(alias).stdout.splitlines()[-1]
    assert table.startswith("no scheduler alive since ")
    Scheduler.objects.using(alias).filter(instance="gone").update(last_beat_at=database_now(alias))
    found = problems(alias)
    assert not [line for line in found if line.startswith(("tick: unserved", "scheduler "))]
    assert [line for line in found if line.startswith("tick: ")] == [
        line for line in found if line.startswith("tick: never ran: ")
    ]


def test_list_as_json_has_every_declared_job_and_the_undeclared_ones(alias: str) -> None:
    JobLock.objects.using(alias).create(name="retired_job", token=3)
    result = exclusive_jobs(alias, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    names = {job["name"] for job in data["jobs"]}
    assert {"quick", "tick", "crash"} <= names
    assert [job["name"] for job in data["undeclared"]] == ["retired_job"]
    tick = next(job for job in data["jobs"] if job["name"] == "tick")
    assert tick["schedule"] == "Every 2 seconds" and tick["next_slot"]


def test_cron_schedules_are_shown_in_words() -> None:
    from django_exclusive_jobs.health import schedule_in_words
    from django_exclusive_jobs.run.schedules import make_schedule

    schedule = make_schedule(cron="30 2 * * 1-5", timezone="Europe/Paris")
    assert schedule is not None
    assert schedule_in_words(schedule) == ("At 02:30, Monday through Friday", "Europe/Paris")


def insert_runs(alias: str, names: list[str], total: int) -> None:
    """``total`` finished runs spread over ``names``, one per hour back in time, in SQL."""
    table = JobRun._meta.db_table
    vendor = connections[alias].vendor
    jobs = len(names)
    with connections[alias].cursor() as cursor:
        if vendor == "postgresql":
            numbers = "SELECT n FROM generate_series(0, %s) AS n"
            name = f"'bulk_' || LPAD((n %% {jobs})::text, 4, '0')"
            when = "NOW() - (n / %s) * INTERVAL '1 hour'"
        elif vendor == "mysql":
            numbers = "SELECT seq AS n FROM seq_0_to_%s"
            name = f"CONCAT('bulk_', LPAD(n %% {jobs}, 4, '0'))"
            when = "UTC_TIMESTAMP() - INTERVAL (n DIV %s) HOUR"
        else:
            numbers = (
                "WITH RECURSIVE c(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM c WHERE n < %s) "
                "SELECT n FROM c"
            )
            name = f"'bulk_' || SUBSTR('000' || (n %% {jobs}), -4)"
            when = "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '-' || (n / %s) || ' hours')"
        cursor.execute(
            f"INSERT INTO {table} (name, slot, status, host, instance, attempt, started_at, "
            f"finished_at, duration, error_type, error, requested_by, task_result_id, "
            f"task_backend, backfill, kwargs) "
            f"SELECT {name}, {when}, 'succeeded', 'h', 'i', 1, {when}, {when}, 1.5, '', '', '', "
            f"'', '', FALSE, '{{}}' "
            f"FROM ({numbers}) AS numbers",
            [jobs, jobs, jobs, total - 1],
        )


# --- the health view -------------------------------------------------------------------


@pytest.fixture
def unscheduled_only() -> Iterator[None]:
    """Only the declared jobs without a schedule (one that never ran is no problem)."""
    before = dict(_jobs)
    _jobs.clear()
    _jobs.update({name: job for name, job in before.items() if job.schedule is None})
    try:
        yield
    finally:
        _jobs.clear()
        _jobs.update(before)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("unscheduled_only")
def test_health_view_is_closed_to_anonymous_and_open_to_the_token() -> None:
    client = Client()
    assert client.get("/jobs/health").status_code == 403
    with override_settings(EXCLUSIVE_JOBS={"HEALTH_TOKEN": "s3cret"}):
        assert client.get("/jobs/health", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
        answer = client.get("/jobs/health", HTTP_AUTHORIZATION="Bearer s3cret")
    assert answer.status_code == 200 and answer.json()["ok"] is True
    JobRun.objects.create(name="broken", status="failed", started_at=database_now("default"))
    # A declared job: the flush before this test may have remade its row (post_migrate).
    JobLock.objects.update_or_create(name="broken", defaults={"token": 1})
    with override_settings(EXCLUSIVE_JOBS={"HEALTH_TOKEN": "s3cret"}):
        answer = client.get("/jobs/health", HTTP_AUTHORIZATION="Bearer s3cret")
    assert answer.status_code == 503
    assert answer.json()["problems"][0].startswith("broken: failing: ")


# --- the jobs page ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_jobs_page_lists_every_job_and_viewers_get_no_buttons() -> None:
    viewer = client_for(make_user("viewer", perms=("view_jobstate",)))
    page = viewer.get(JOBS)
    assert page.status_code == 200
    html = page.content.decode()
    for name in ("quick", "tick", "crash", "tick_all"):
        assert f'data-job="{name}"' in html
    assert "Every 2 seconds" in html and "never ran" in html
    assert "Run now" not in html and "Pause" not in html
    act = reverse("admin:django_exclusive_jobs_jobstate_act", args=["pause"])
    forged = viewer.post(act, {"job": "quick", "confirm": "yes"})
    assert forged.status_code == 403
    assert not JobState.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_pause_asks_first_then_pauses_on_post() -> None:
    operator = client_for(make_user("operator", perms=("view_jobstate", "change_jobstate")))
    act = reverse("admin:django_exclusive_jobs_jobstate_act", args=["pause"])
    asked = operator.get(act, {"job": "quick"})
    assert asked.status_code == 200
    assert "will skip it" in asked.content.decode()
    assert not JobState.objects.exists()
    unsaid = operator.post(act, {"job": "quick", "confirm": "yes"})
    assert unsaid.status_code == 200 and "This field is required" in unsaid.content.decode()
    assert not JobState.objects.exists()  # a pause says why
    done = operator.post(act, {"job": "quick", "confirm": "yes", "reason": "vendor down"})
    assert done.status_code == 302
    state = JobState.objects.get(name="quick")
    assert state.paused and state.paused_by == "operator (admin)"
    assert state.pause_reason == "vendor down"
    run = reverse("admin:django_exclusive_jobs_jobstate_act", args=["run"])
    operator.post(run, {"job": "quick", "confirm": "yes"})
    operator.post(run, {"job": "quick", "confirm": "yes"})
    assert RunRequest.objects.filter(name="quick", requested_by="operator (admin)").count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_waiting_run_is_shown_warned_about_and_cancelled_with_a_record() -> None:
    from django.contrib.admin.models import LogEntry

    operator = client_for(make_user("operator", perms=("view_jobstate", "change_jobstate")))
    run = reverse("admin:django_exclusive_jobs_jobstate_act", args=["run"])
    asked = operator.post(run, {"job": "quick", "confirm": "yes"}, follow=True)
    assert "No live scheduler serves quick: the request waits for one." in (asked.content.decode())
    waiting = RunRequest.objects.get(name="quick")
    html = operator.get(JOBS).content.decode()
    at = waiting.requested_at.strftime("%Y-%m-%d %H:%M:%S")
    assert f"run now requested by operator (admin) at {at}, waiting" in html
    assert "no live scheduler serves it" in html
    cancel = reverse("admin:django_exclusive_jobs_jobstate_act", args=["cancel"])
    page = operator.get(cancel, {"job": "quick", "request": waiting.pk}).content.decode()
    assert "will not start" in page and f'name="request" value="{waiting.pk}"' in page
    assert RunRequest.objects.get().cancelled_at is None  # asked first
    done = operator.post(
        cancel, {"job": "quick", "request": waiting.pk, "confirm": "yes"}, follow=True
    )
    assert "Cancelled the run of quick." in done.content.decode()
    waiting.refresh_from_db()
    assert waiting.cancelled_by == "operator (admin)" and waiting.taken_at is not None
    assert "waiting" not in operator.get(JOBS).content.decode()
    entries = LogEntry.objects.filter(object_id=str(waiting.pk)).order_by("id")
    assert [entry.get_change_message() for entry in entries] == [
        "Run now of quick",  # asked for, then cancelled: the request's history
        f"Cancelled run request {waiting.pk} of quick",
    ]
    again = operator.post(
        cancel, {"job": "quick", "request": waiting.pk, "confirm": "yes"}, follow=True
    )
    assert "That run request no longer waits." in again.content.decode()


@pytest.mark.django_db(transaction=True)
def test_a_viewer_sees_a_waiting_run_but_cannot_cancel_it() -> None:
    waiting = control.request_run("quick", by="carol", using="default")
    viewer = client_for(make_user("viewer", perms=("view_jobstate",)))
    html = viewer.get(JOBS).content.decode()
    assert "run now requested by carol at " in html and "Cancel" not in html
    cancel = reverse("admin:django_exclusive_jobs_jobstate_act", args=["cancel"])
    forged = viewer.post(cancel, {"job": "quick", "request": waiting.pk, "confirm": "yes"})
    assert forged.status_code == 403
    assert RunRequest.objects.get().cancelled_at is None


@pytest.mark.django_db(transaction=True)
def test_actions_need_csrf() -> None:
    user = make_user("csrf", perms=("view_jobstate", "change_jobstate"))
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    act = reverse("admin:django_exclusive_jobs_jobstate_act", args=["pause"])
    assert client.post(act, {"job": "quick", "confirm": "yes"}).status_code == 403
    assert not JobState.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_job_names_are_escaped_on_the_jobs_page() -> None:
    # get_or_create: test_admin declares a job of that name, whose row a flush remakes.
    JobLock.objects.get_or_create(name="<script>alert(1)</script>", defaults={"token": 1})
    root = User.objects.create_superuser("root", password="pw")
    html = client_for(root).get(JOBS).content.decode()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


@pytest.mark.django_db(transaction=True)
def test_all_jobs_comes_first_under_the_app_on_the_admin_index() -> None:
    root = User.objects.create_superuser("root", password="pw")
    html = client_for(root).get(reverse("admin:index")).content.decode()
    assert html.index("All jobs") < html.index("Job locks") < html.index("Job runs")


def noop() -> None:
    return None

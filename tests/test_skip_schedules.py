"""The environment switch: ``SKIP_SCHEDULES`` (and ``exclusive_scheduler
--skip-schedules``) keeps every scheduled slot from starting while runs asked for now
still run; and it is seen everywhere: --check, the health view, a metric, every page.
Real schedulers and cron lines on every backend."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from io import StringIO
from pathlib import Path

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.test import Client
from django.test.utils import override_settings
from django.urls import reverse

from django_exclusive_jobs.health import SKIPPED_HERE, overview
from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.models import JobLock, JobRun, Scheduler
from django_exclusive_jobs.run import control

from .test_admin import client_for, make_user
from .test_command import argv, command_env, marker, wait_for
from .test_metrics import TOKEN
from .test_scheduler import scheduler_env, schedulers, start_scheduler, stop

__all__ = ["marker", "schedulers"]  # fixtures

SKIP = json.dumps({"SKIP_SCHEDULES": True})
HOUR = dt.timedelta(hours=1)


def test_skip_schedules_is_true_or_false() -> None:
    with override_settings(EXCLUSIVE_JOBS={"SKIP_SCHEDULES": "yes"}):
        found = [message.id for message in run_checks()]
    assert "django_exclusive_jobs.E019" in found


def test_a_cron_line_runs_nothing_and_says_so_while_schedules_are_skipped(
    alias: str, marker: Path
) -> None:
    env = command_env(marker, EXCLUSIVE_JOBS_TEST_SETTINGS=SKIP)
    done = subprocess.run(argv(alias, "quick"), env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "skipped quick: schedules are skipped here (SKIP_SCHEDULES); "
        "'manage.py exclusive_jobs run quick' runs it now"
    ]
    coded = subprocess.run(
        argv(alias, "quick", "--skipped-exit-code", "3"), env=env, capture_output=True, text=True
    )
    assert coded.returncode == 3
    assert not JobRun.objects.using(alias).exists()
    assert not JobLock.objects.using(alias).filter(token__gt=0).exists()  # no lock taken
    assert not marker.exists()  # nothing ran


def test_a_scheduler_that_skips_schedules_runs_only_what_is_asked_for_now(
    alias: str, marker: Path, schedulers: list[subprocess.Popen[str]]
) -> None:
    """``tick`` is due every 2 s: none of its slots starts; Run now of ``quick`` runs."""
    env = scheduler_env(marker, JOB_SECONDS="0")
    started = start_scheduler(schedulers, alias, "--skip-schedules", env=env)
    rows = Scheduler.objects.using(alias)
    wait_for(lambda: rows.filter(pid=started.pid).exists(), 60)
    row = rows.get(pid=started.pid)
    assert row.skips_schedules and row.jobs == []  # no other scheduler hands it a slot
    begun = database_now(alias)
    control.request_run("quick", by="alice", using=alias)
    done = JobRun.objects.using(alias).filter(name="quick", status="succeeded")
    wait_for(done.exists, 60)
    # Three of tick's slots come and go on the database's clock: none is started.
    wait_for(lambda: database_now(alias) >= begun + dt.timedelta(seconds=6.5), 30)
    out, _ = stop(started)
    assert "schedules skipped (SKIP_SCHEDULES or --skip-schedules)" in out.splitlines()[0]
    assert not JobRun.objects.using(alias).filter(slot__isnull=False).exists()
    [run] = done
    assert run.requested_by == "alice" and run.pid != 0


def test_the_switch_is_one_problem_in_check_health_and_the_metric(alias: str) -> None:
    now = database_now(alias)
    JobLock.objects.using(alias).update_or_create(name="tick", defaults={"created_at": now - HOUR})
    with override_settings(EXCLUSIVE_JOBS={"DATABASE": alias}):
        before = overview(alias).problems
    assert any(line.startswith("tick: ") for line in before)  # never ran, every 2 s
    settings = {"DATABASE": alias, "SKIP_SCHEDULES": True, "HEALTH_TOKEN": TOKEN}
    with override_settings(EXCLUSIVE_JOBS=settings):
        seen = overview(alias)
        out = StringIO()
        with pytest.raises(SystemExit) as exited:
            call_command("exclusive_jobs", "--check", "--database", alias, stdout=out)
        answer = Client().get("/jobs/health", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
        metrics = Client().get("/jobs/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert seen.problems[0] == SKIPPED_HERE
    assert not [line for line in seen.problems if line.startswith("tick: ")]  # on purpose
    assert exited.value.code == 1 and out.getvalue().splitlines()[0] == SKIPPED_HERE
    assert answer.status_code == 503 and answer.json()["problems"][0] == SKIPPED_HERE
    assert answer.json()["schedules_skipped_here"] is True
    assert "exclusive_jobs_schedules_skipped 1.0" in metrics.content.decode().splitlines()


def test_a_live_scheduler_that_skips_schedules_is_a_problem_where_the_setting_is_off(
    alias: str,
) -> None:
    now = database_now(alias)
    values = {"host": "web-9", "pid": 99, "started_at": now, "last_beat_at": now}
    Scheduler.objects.using(alias).create(instance="skipper", skips_schedules=True, **values)
    with override_settings(EXCLUSIVE_JOBS={"DATABASE": alias, "HEALTH_TOKEN": TOKEN}):
        problems = overview(alias).problems
        metrics = Client().get("/jobs/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert problems[0] == (
        "scheduler web-9:99: skips schedules: it starts no slot, only runs asked for now "
        "(SKIP_SCHEDULES or --skip-schedules)"
    )
    assert "exclusive_jobs_schedules_skipped 1.0" in metrics.content.decode().splitlines()
    Scheduler.objects.using(alias).update(skips_schedules=False)
    with override_settings(EXCLUSIVE_JOBS={"DATABASE": alias, "HEALTH_TOKEN": TOKEN}):
        metrics = Client().get("/jobs/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert "exclusive_jobs_schedules_skipped 0.0" in metrics.content.decode().splitlines()


@pytest.mark.django_db(transaction=True)
def test_every_page_says_schedules_are_skipped() -> None:
    staff = client_for(make_user("viewer", perms=("view_jobstate", "view_joblock", "view_jobrun")))
    pages = [
        reverse("admin:django_exclusive_jobs_jobstate_changelist"),
        reverse("admin:django_exclusive_jobs_joblock_changelist"),
        reverse("admin:django_exclusive_jobs_jobrun_changelist"),
    ]
    for page in pages:
        assert SKIPPED_HERE not in staff.get(page).content.decode()
    with override_settings(EXCLUSIVE_JOBS={"SKIP_SCHEDULES": True}):
        for page in pages:
            html = staff.get(page).content.decode()
            assert f'<li class="warning">{SKIPPED_HERE}</li>' in html, page

"""Operators change a job without a deploy: overrides of its schedule, arguments, timeout
and overlap, checked before they are saved, honoured by a running scheduler within one
poll and by cron lines, shown as drift from the code, undone by "back to the code";
pauses with a reason and an end, and pause_after=N; every change in the audit."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse

from django_exclusive_jobs import LockConfigurationError, exclusive_job
from django_exclusive_jobs.health import Health, overview
from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.models import JobChange, JobRun, JobState
from django_exclusive_jobs.run import control, overrides
from django_exclusive_jobs.run.registry import _jobs, get_job
from django_exclusive_jobs.run.scheduler import REQUEST_POLL
from django_exclusive_jobs.run.status import RunStatus
from django_exclusive_jobs.signals import job_paused

from .helpers import other_holder
from .test_admin import client_for, make_user
from .test_command import ROOT, command_env, marker, wait_for
from .test_operate import exclusive_jobs
from .test_run_now_arguments import said
from .test_scheduler import scheduler_env, schedulers, start_scheduler, stop

__all__ = ["marker", "schedulers"]  # fixtures

ACT = "admin:django_exclusive_jobs_jobstate_act"
JOBS = reverse("admin:django_exclusive_jobs_jobstate_changelist")
JOB = reverse("admin:django_exclusive_jobs_jobstate_job")


def digest() -> Any:
    job = get_job("digest")
    assert job is not None
    return job


def changes(alias: str, name: str) -> list[tuple[str, str]]:
    rows = JobChange.objects.using(alias).filter(name=name).order_by("id")
    return [(row.action, row.by) for row in rows]


# --- checked before anything is saved ------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "refused"),
    [
        ({"schedule": {"cron": "61 * * * *"}}, "not valid"),
        ({"schedule": {"cron": "0 * * *"}}, "5 fields"),
        ({"schedule": {"every": "0s"}}, "at least 1s"),
        ({"schedule": {"cron": "0 * * * *", "timezone": "Mars/Olympus"}}, "Unknown time zone"),
        ({"kwargs": {"recipients": ["a"], "limt": 1}}, "unknown argument 'limt'"),
        ({"kwargs": {"recipients": ["a"]}}, "missing a required argument"),
        ({"timeout": "-5m"}, "is not a duration"),
        ({"timeout": 0}, "must be positive"),
        ({"overlap": "allow_all"}, "in the code, not here"),
        ({"overlap": "sometimes"}, "overlap must be one of"),
        ({"ttl": "5m"}, "can be overridden"),
    ],
)
def test_a_bad_override_is_refused_in_one_line_and_nothing_is_saved(
    alias: str, given: dict[str, Any], refused: str
) -> None:
    with pytest.raises(LockConfigurationError, match=refused) as caught:
        overrides.override(digest(), given, reason="test", by="ops", using=alias)
    assert "\n" not in str(caught.value)
    assert not JobState.objects.using(alias).filter(name="digest").exists()
    assert not JobChange.objects.using(alias).exists()


def test_an_override_equal_to_the_code_is_no_override(alias: str) -> None:
    job = digest()
    after = overrides.override(
        job, {"schedule": {"every": "1h"}, "kwargs": job.kwargs}, reason="x", by="ops", using=alias
    )
    assert after == {}
    every_2h = overrides.override(
        job, {"schedule": {"every": "2h"}}, reason="halve", by="ops", using=alias
    )
    assert every_2h == {"schedule": {"every": 7200.0}}
    state = JobState.objects.using(alias).get(name="digest")
    assert state.code == {"schedule": {"every": 3600.0}}
    assert state.schedule_since is not None and state.override_reason == "halve"
    # Given the code's value again, that setting is no longer overridden.
    again = overrides.override(
        job, {"schedule": {"every": "1h"}}, reason="y", by="ops", using=alias
    )
    assert again == {}


def test_an_override_outlives_no_change_of_the_code_unseen(alias: str) -> None:
    """The code moved after the override (a deploy changed the declaration): the drift
    says so, with what the code says now."""
    from dataclasses import replace

    from django_exclusive_jobs.run.schedules import make_schedule

    job = digest()
    overrides.override(job, {"schedule": {"every": "2h"}}, reason="x", by="ops", using=alias)
    state = JobState.objects.using(alias).get(name="digest")
    [same] = overrides.drift(job, state)
    assert (same["value"], same["code"], same["changed"]) == ("every 2h", "every 1h", "")
    deployed = replace(job, schedule=make_schedule(every="30m"))
    [moved] = overrides.drift(deployed, state)
    assert (moved["value"], moved["code"], moved["changed"]) == ("every 2h", "every 30m", "yes")
    # Still in force over the new code, until an operator goes back to it.
    in_force = overrides.in_force(deployed, state).schedule
    assert in_force is not None and in_force.describe() == "every 2:00:00"


# --- what runs: the override in force ----------------------------------------------------------


def test_a_cron_line_runs_with_the_overridden_arguments_and_back_to_the_code(
    alias: str, marker: Path
) -> None:
    changed = {"kwargs": {"recipients": ["night@example.com"], "limit": 1}}
    overrides.override(digest(), changed, reason="night shift", by="ops", using=alias)
    done = exclusive_jobs(alias, "run", "digest", marker=marker)
    assert done.returncode == 0, done.stderr
    assert said(marker) == ["digest night@example.com 1"]
    run = JobRun.objects.using(alias).get(name="digest")
    assert run.kwargs == changed["kwargs"]
    # Arguments given to a run now still win over the override.
    listed = exclusive_jobs(alias)
    assert "digest: kwargs" in listed.stdout and "overridden by ops: night shift" in listed.stdout
    done = exclusive_jobs(alias, "run", "digest", "--kwargs", '{"limit": 9}', marker=marker)
    assert done.returncode == 0, done.stderr
    assert said(marker)[-1] == "digest night@example.com 9"
    assert overrides.back_to_code(digest(), reason="day again", by="ops", using=alias)
    assert not overrides.back_to_code(digest(), reason="twice", by="ops", using=alias)
    done = exclusive_jobs(alias, "run", "digest", marker=marker)
    assert said(marker)[-1] == "digest ops@example.com 5"
    actions = [action for action, _ in changes(alias, "digest")]
    assert actions == ["override", "run_now", "run_now", "back_to_code", "run_now"]


def test_a_running_scheduler_follows_an_override_and_back_to_the_code(
    alias: str, marker: Path, schedulers: list[Any]
) -> None:
    """digest runs every hour in the code; overridden to every 2 s with other arguments,
    a scheduler already running picks it up within one poll, without a restart."""
    # Not across the top of an hour: the code's own slot would then run, rightly, in the
    # window where the test expects none.
    now = database_now(alias)
    to_the_hour = 3600 - (now.minute * 60 + now.second)
    if to_the_hour < 90:
        time.sleep(to_the_hour + 1)
    server = start_scheduler(schedulers, alias, "--jobs", "digest", env=scheduler_env(marker))
    wait_for(lambda: JobState.objects.using(alias).count() == 0 and _beats(alias), timeout=60)
    changed = {"schedule": {"every": "2s"}, "kwargs": {"recipients": ["x@y.z"], "limit": 2}}
    overrides.override(digest(), changed, reason="load test", by="ops", using=alias)
    wait_for(lambda: said(marker).count("digest x@y.z 2") >= 2, timeout=60)
    slots = list(JobRun.objects.using(alias).filter(name="digest").values_list("slot", flat=True))
    assert len(slots) == len(set(slots)) and all(slot.second % 2 == 0 for slot in slots)
    overrides.back_to_code(digest(), reason="done", by="ops", using=alias)
    # Within a poll (REQUEST_POLL) it wakes only at the code's hourly slots again.
    time.sleep(REQUEST_POLL + 2)
    settled = len(said(marker))
    time.sleep(6)  # three of the override's slots: none runs
    assert len(said(marker)) == settled
    out, err = stop(server)
    assert "digest: overridden (every 2s" in out + err
    assert "digest: back to its code" in out + err


def _beats(alias: str) -> bool:
    from django_exclusive_jobs.models import Scheduler

    return Scheduler.objects.using(alias).alive().exists()


def test_missed_slots_follow_the_schedule_in_force_at_each_slot(alias: str) -> None:
    """A job that last ran five hours ago (hourly) is moved to every 30 minutes now: the
    first start after that records missed the hourly slots no server ran before the
    change, and none of the new schedule's half-hour slots before it."""

    @exclusive_job("moved_job", every="1h", using=alias, catch_up="skip")
    def moved_job() -> None:
        pass

    now = database_now(alias)
    last = now.replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=5)
    JobRun.objects.using(alias).create(
        name="moved_job", slot=last, status=RunStatus.SUCCEEDED, started_at=last
    )
    try:
        job = get_job("moved_job")
        assert job is not None
        overrides.override(job, {"schedule": {"every": "30m"}}, reason="x", by="ops", using=alias)
        changed = JobState.objects.using(alias).get(name="moved_job").schedule_since
        assert changed is not None
        moved_job()
        missed = sorted(
            JobRun.objects.using(alias)
            .filter(name="moved_job", status=RunStatus.MISSED)
            .values_list("slot", flat=True)
        )
        hourly = [last + dt.timedelta(hours=n) for n in range(1, 6)]
        assert missed == [slot for slot in hourly if slot < changed]
        assert all(slot.minute == 0 for slot in missed)
    finally:
        _jobs.pop("moved_job", None)


# --- pauses -------------------------------------------------------------------------------------


def test_a_paused_slot_is_recorded_paused_and_a_pause_with_an_end_ends_by_itself(
    alias: str,
) -> None:
    ran: list[str] = []

    @exclusive_job("paused_hourly", every="1h", using=alias)
    def paused_hourly() -> None:
        ran.append("ran")

    try:
        control.pause("paused_hourly", by="ops", using=alias, reason="disk full")
        assert paused_hourly() is None and ran == []
        [row] = JobRun.objects.using(alias).filter(name="paused_hourly")
        assert row.status == RunStatus.PAUSED and "disk full" in row.error
        seen = next(job for job in overview(alias).jobs if job.name == "paused_hourly")
        assert seen.paused and seen.pause_reason == "disk full" and not seen.problems
        # A pause whose end has passed already is refused: it would pause nothing.
        JobRun.objects.using(alias).filter(name="paused_hourly").delete()
        ended = database_now(alias) - dt.timedelta(seconds=1)
        with pytest.raises(LockConfigurationError, match="is past"):
            control.pause("paused_hourly", by="ops", using=alias, reason="short", until=ended)
        # A pause whose end passes is over, with no write: its next slot runs.
        soon = database_now(alias) + dt.timedelta(seconds=1)
        control.pause("paused_hourly", by="ops", using=alias, reason="short", until=soon)

        def over() -> bool:
            seen = next(job for job in overview(alias).jobs if job.name == "paused_hourly")
            return not seen.paused

        wait_for(over)
        assert not control.resume("paused_hourly", by="ops", using=alias)  # over: no write
        paused_hourly()
        assert ran == ["ran"]
        assert [a for a, _ in changes(alias, "paused_hourly")] == ["pause", "pause"]
    finally:
        _jobs.pop("paused_hourly", None)


def test_pause_after_n_failures_pauses_the_job_signals_and_is_a_health_problem(
    alias: str,
) -> None:
    sent: list[dict[str, Any]] = []

    def receiver(sender: str, **kwargs: Any) -> None:
        sent.append(kwargs)

    @exclusive_job("fails_often", using=alias, pause_after=2)
    def fails_often() -> None:
        raise RuntimeError("down")

    job_paused.connect(receiver)
    try:
        with pytest.raises(RuntimeError):
            fails_often()
        assert not JobState.objects.using(alias).filter(name="fails_often", paused=True).exists()
        with pytest.raises(RuntimeError):
            fails_often()
        state = JobState.objects.using(alias).get(name="fails_often")
        assert state.paused and state.paused_by == control.AUTO_PAUSER
        assert "last 2 runs failed" in state.pause_reason
        assert [kwargs["name"] for kwargs in sent] == ["fails_often"]
        assert fails_often() is None  # paused: skipped, not failed
        seen = next(job for job in overview(alias).jobs if job.name == "fails_often")
        assert Health.PAUSED_AFTER_FAILURES in seen.kinds
        control.resume("fails_often", by="ops", using=alias, reason="fixed")
        assert [a for a, _ in changes(alias, "fails_often")] == ["pause", "resume"]
    finally:
        job_paused.disconnect(receiver)
        _jobs.pop("fails_often", None)


def test_pause_after_must_be_a_whole_number() -> None:
    with pytest.raises(LockConfigurationError, match="pause_after"):
        exclusive_job("bad_pause_after", pause_after=0)


def test_the_commands_pause_with_a_reason_and_an_end_and_record_who(
    alias: str, marker: Path
) -> None:
    done = exclusive_jobs(
        alias, "pause", "digest", "--reason", "vendor down", "--until", "2099-01-01T06:00",
        "--by", "alice",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "until 2099-01-01T06:00:00+00:00" in done.stdout
    state = JobState.objects.using(alias).get(name="digest")
    assert state.pause_reason == "vendor down" and state.paused_until is not None
    for action in ("run", "list", "next", "backfill"):
        done = exclusive_jobs(
            alias, action, *(["digest"] if action != "list" else []), "--reason", "x"
        )
        assert done.returncode == 2 and "--reason goes with pause" in done.stderr, action
    done = exclusive_jobs(alias, "resume", "digest", "--by", "bob")
    assert done.returncode == 0 and "resumed digest" in done.stdout
    assert changes(alias, "digest") == [("pause", "alice"), ("resume", "bob")]


def test_a_forced_release_is_in_the_audit(alias: str) -> None:
    with other_holder(alias) as other:
        other.try_acquire("digest", ttl=600)
        done = subprocess_locks(alias, "force-release", "digest", "--live")
        assert done.returncode == 0, done.stderr
    [change] = JobChange.objects.using(alias).filter(name="digest")
    assert change.action == "force_release" and change.before["token"] >= 1


def subprocess_locks(alias: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", "exclusive_locks", *args, "--database", alias],
        cwd=ROOT,
        env=command_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


# --- the admin --------------------------------------------------------------------------------


@pytest.fixture
def operator(db: None) -> Client:
    return client_for(make_user("operator", perms=("view_jobstate", "change_jobstate")))


@pytest.mark.django_db(transaction=True)
def test_the_override_form_refuses_a_bad_cron_previews_the_next_slots_then_saves(
    operator: Client,
) -> None:
    url = reverse(ACT, args=["override"])
    page = operator.get(url, {"job": "digest"})
    assert page.status_code == 200 and 'value="1h"' in page.content.decode()
    form = {
        "job": "digest",
        "cron": "61 */2 * * *",
        "timezone": "UTC",
        "every": "",
        "arguments": '{"recipients": ["ops@example.com"], "limit": 5}',
        "timeout": "",
        "overlap": "skip",
        "reason": "halve the load",
    }
    refused = operator.post(url, form)
    assert refused.status_code == 200 and "is not valid" in refused.content.decode()
    assert not JobState.objects.filter(name="digest").exists()
    checked = operator.post(url, {**form, "cron": "0 */2 * * *"})
    text = checked.content.decode()
    slots = re.findall(r'data-slot="([^"]+)"', text)
    assert len(slots) == 5 and all(dt.datetime.fromisoformat(s).hour % 2 == 0 for s in slots)
    assert not JobState.objects.filter(name="digest").exists()  # not saved before confirm
    saved = operator.post(url, {**form, "cron": "0 */2 * * *", "confirm": "yes"})
    assert saved.status_code == 302
    state = JobState.objects.get(name="digest")
    assert state.override == {"schedule": {"cron": "0 */2 * * *", "timezone": "UTC"}}
    jobs = operator.get(JOBS).content.decode()
    assert "schedule cron 0 */2 * * * (UTC) by operator (admin) on" in jobs
    assert "“halve the load”; code says every 1h" in jobs
    assert LogEntry.objects.filter(change_message__startswith="Overrode digest").exists()
    page = operator.get(JOB, {"job": "digest"}).content.decode()
    assert 'data-action="override"' in page and "halve the load" in page
    back = operator.post(
        reverse(ACT, args=["back"]), {"job": "digest", "confirm": "yes", "reason": "over"}
    )
    assert back.status_code == 302
    assert JobState.objects.get(name="digest").override == {}
    assert "exclusive-jobs-drift" not in operator.get(JOBS).content.decode()


@pytest.mark.django_db(transaction=True)
def test_the_pause_form_takes_a_reason_and_an_end_on_the_jobs_clock(operator: Client) -> None:
    url = reverse(ACT, args=["pause"])
    done = operator.post(
        url,
        {"job": "digest", "reason": "maintenance", "until": "2099-03-01T06:00", "confirm": "yes"},
    )
    assert done.status_code == 302
    state = JobState.objects.get(name="digest")
    assert state.paused and state.pause_reason == "maintenance"
    assert state.paused_until == dt.datetime(2099, 3, 1, 6, tzinfo=dt.UTC)
    assert "“maintenance”" in operator.get(JOBS).content.decode()
    missing = operator.post(url, {"job": "digest", "confirm": "yes", "reason": ""})
    assert missing.status_code == 200  # a pause needs a reason: the form comes back


@pytest.mark.django_db(transaction=True)
def test_without_change_permission_no_override_form_and_a_forged_post_is_403() -> None:
    viewer = client_for(make_user("viewer", perms=("view_jobstate",)))
    page = viewer.get(JOB, {"job": "digest"}).content.decode()
    assert "override-link" not in page
    for action in ("override", "back", "pause"):
        forged = viewer.post(reverse(ACT, args=[action]), {"job": "digest", "confirm": "yes"})
        assert forged.status_code == 403
    assert not JobState.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_an_override_without_a_csrf_token_is_refused() -> None:
    user = make_user("csrf_operator", perms=("view_jobstate", "change_jobstate"))
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    form = {"job": "digest", "every": "2h", "overlap": "skip", "reason": "x", "confirm": "yes"}
    refused = client.post(reverse(ACT, args=["override"]), form)
    assert refused.status_code == 403
    assert not JobState.objects.exists()

"""Run now with arguments: ``exclusive_jobs run NAME --kwargs JSON`` and the admin's Run
now form. The given arguments update the job's declared kwargs (the given ones win),
are checked against its function before anything is asked for, locked or run, and are
recorded: on the request, on the run's row with who asked, in the admin's log."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from django_exclusive_jobs import LockConfigurationError
from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.models import JobLock, JobRun, RunRequest
from django_exclusive_jobs.run import control
from django_exclusive_jobs.run.registry import Job, get_job
from django_exclusive_jobs.run.runner import Run
from django_exclusive_jobs.run.scheduler import Scheduler
from django_exclusive_jobs.run.start import Start

from .test_admin import client_for, make_user
from .test_command import marker
from .test_operate import exclusive_jobs

__all__ = ["marker"]  # a fixture

DIGEST = {"recipients": ["ops@example.com"], "limit": 5}  # digest's declared kwargs
RUN = reverse("admin:django_exclusive_jobs_jobstate_act", args=["run"])
JOBS = reverse("admin:django_exclusive_jobs_jobstate_changelist")


def said(marker: Path) -> list[str]:
    """What the job's runs marked, without their process ids."""
    lines = marker.read_text().splitlines() if marker.exists() else []
    return [line.rsplit(" ", 1)[0] for line in lines]


def lock_rows(alias: str, name: str) -> list[dict[str, Any]]:
    return list(JobLock.objects.using(alias).filter(name=name).values())


# --- the merge and the check, written once ------------------------------------------------


def test_given_arguments_update_the_declared_ones_and_win() -> None:
    job = get_job("digest")
    assert job is not None
    assert job.with_arguments({"limit": 2}).kwargs == {**DIGEST, "limit": 2}
    assert job.with_arguments({}).kwargs == DIGEST
    assert job.kwargs == DIGEST  # the declared job is unchanged
    weekly = get_job("summary:weekly")
    assert weekly is not None  # a schedule's own kwargs are its base
    assert weekly.with_arguments({"period": "month"}).kwargs == {"period": "month"}


@pytest.mark.parametrize(
    ("given", "error"),
    [
        ({"limt": 2}, "The run's arguments (its declared kwargs updated by those given) {"),
        ({"limt": 2}, "do not fit digest(recipients, limit): unknown argument 'limt'."),
        ([1], "The arguments must be a dict of argument names to values, not [1]."),
        ({"limit": float("nan")}, "are not JSON"),
    ],
)
def test_arguments_that_do_not_fit_are_one_clear_error(given: object, error: str) -> None:
    job = get_job("digest")
    assert job is not None
    with pytest.raises(LockConfigurationError) as raised:
        job.check_arguments(given)
    assert error in str(raised.value) and "\n" not in str(raised.value)


def test_a_slot_is_never_given() -> None:
    job = get_job("summary:daily")
    assert job is not None
    with pytest.raises(LockConfigurationError, match="must not give 'slot'"):
        job.check_arguments({"slot": "2026-11-24"})


# --- exclusive_jobs run NAME --kwargs -----------------------------------------------------


def test_run_with_kwargs_runs_here_with_them_and_records_them_with_who_asked(
    alias: str, marker: Path
) -> None:
    result = exclusive_jobs(
        alias, "run", "digest", "--kwargs", '{"limit": 2}', "--by", "bob", marker=marker
    )
    assert result.returncode == 0, result.stderr
    assert said(marker) == ["digest ops@example.com 2"]
    [run] = JobRun.objects.using(alias).filter(name="digest")
    assert (run.status, run.requested_by, run.kwargs) == (
        "succeeded",
        "bob",
        {**DIGEST, "limit": 2},
    )
    assert not RunRequest.objects.using(alias).exists()


def test_run_with_kwargs_of_a_schedule_updates_that_schedules_arguments(alias: str) -> None:
    done = control.run_now("summary:weekly", by="bob", using=alias, kwargs={"period": "month"})
    assert done.status == "succeeded", done.exception
    done = control.run_now("summary:weekly", by="bob", using=alias, kwargs={})
    assert done.status == "succeeded", done.exception
    recorded = JobRun.objects.using(alias).filter(name="summary:weekly").order_by("id")
    assert [run.kwargs for run in recorded] == [{"period": "month"}, {"period": "week"}]


@pytest.mark.parametrize(
    ("given", "error"),
    [
        ('{"limit": ', "argument --kwargs: The arguments are not JSON (Expecting value"),
        ('{"limt": 2}', "do not fit digest(recipients, limit): unknown argument 'limt'."),
        ("[]", "The arguments must be a dict of argument names to values, not []."),
    ],
)
def test_bad_kwargs_are_one_line_and_exit_2_with_nothing_run_recorded_or_locked(
    alias: str, marker: Path, given: str, error: str
) -> None:
    before = lock_rows(alias, "digest")
    result = exclusive_jobs(alias, "run", "digest", "--kwargs", given, marker=marker)
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = result.stderr.splitlines()
    assert error in line
    assert result.stdout == "" and said(marker) == []
    assert not JobRun.objects.using(alias).exists()
    assert lock_rows(alias, "digest") == before


def test_kwargs_go_with_run_only(alias: str) -> None:
    with pytest.raises(CommandError, match=r"^--kwargs goes with run\.$") as raised:
        call_command("exclusive_jobs", "pause", "digest", "--kwargs", "{}", "--database", alias)
    assert raised.value.returncode == 2
    assert not JobRun.objects.using(alias).exists()


# --- a request with arguments, served by a scheduler ------------------------------------


@pytest.mark.parametrize(
    ("name", "given", "marked", "recorded"),
    [
        ("digest", {"limit": 2}, "digest ops@example.com 2", {**DIGEST, "limit": 2}),
        ("summary:weekly", {"period": "month"}, "summary month", {"period": "month"}),
    ],
)
def test_a_request_with_arguments_runs_in_the_scheduler_with_them(
    alias: str,
    marker: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    given: dict[str, Any],
    marked: str,
    recorded: dict[str, Any],
) -> None:
    monkeypatch.setenv("MARKER", str(marker))
    job = get_job(name)
    assert job is not None
    asked = control.request_run(name, by="alice (admin)", using=alias, kwargs=given)
    assert RunRequest.objects.using(alias).get(pk=asked.pk).kwargs == given
    scheduler = Scheduler(
        [], on_request=[job.but(using=alias)], using=alias, max_runs=1, run_for=60
    )
    assert scheduler.run() == 0
    assert said(marker) == [marked]  # in the job's own process
    [run] = JobRun.objects.using(alias).filter(name=name)
    assert (run.status, run.requested_by, run.kwargs) == ("succeeded", "alice (admin)", recorded)
    assert RunRequest.objects.using(alias).get(pk=asked.pk).run_id == run.pk


def test_a_request_with_arguments_that_do_not_fit_is_refused_and_nothing_is_asked(
    alias: str,
) -> None:
    with pytest.raises(LockConfigurationError, match="unknown argument 'limt'"):
        control.request_run("digest", by="alice", using=alias, kwargs={"limt": 2})
    assert not RunRequest.objects.using(alias).exists()


def test_a_request_whose_arguments_no_longer_fit_runs_fails_and_is_used_up(alias: str) -> None:
    # Asked for before a deploy changed the function: the run says why, once.
    stale = RunRequest.objects.using(alias).create(
        name="changed", requested_by="alice", requested_at=database_now(alias), kwargs={"gone": 1}
    )
    job = Job("changed", takes_nothing, using=alias, keepalive=False)
    result = Run(job, start=Start.run_now(request=stale)).call()
    assert result.status == "failed"
    [run] = JobRun.objects.using(alias).filter(name="changed")
    assert (run.error_type, run.kwargs, run.requested_by) == ("TypeError", {"gone": 1}, "alice")
    assert not RunRequest.objects.using(alias).pending().exists()


def takes_nothing() -> None:
    return None


# --- the admin's Run now form --------------------------------------------------------------


def operator() -> Client:
    return client_for(make_user("operator", perms=("view_jobstate", "change_jobstate")))


@pytest.mark.django_db(transaction=True)
def test_the_run_now_page_is_prefilled_with_the_declared_arguments() -> None:
    client = operator()
    page = client.get(RUN, {"job": "summary:weekly"}).content.decode()
    textarea = re.search(r'<textarea name="arguments"[^>]*>(.*?)</textarea>', page, re.S)
    assert textarea is not None
    assert html.unescape(textarea.group(1)).strip() == '{"period": "week"}'
    assert not RunRequest.objects.exists()  # asked first


@pytest.mark.django_db(transaction=True)
def test_run_now_with_arguments_is_asked_for_recorded_and_logged() -> None:
    client = operator()
    done = client.post(
        RUN, {"job": "digest", "confirm": "yes", "arguments": '{"limit": 2}'}, follow=True
    )
    shown = html.unescape(done.content.decode())
    assert 'Asked for a run of digest with arguments {"limit": 2}: a scheduler' in shown
    [asked] = RunRequest.objects.all()
    assert (asked.name, asked.kwargs, asked.requested_by) == (
        "digest",
        {"limit": 2},
        "operator (admin)",
    )
    [entry] = LogEntry.objects.filter(object_id=str(asked.pk))
    assert entry.user.get_username() == "operator"
    assert entry.get_change_message() == 'Run now of digest with arguments {"limit": 2}'
    jobs = html.unescape(client.get(JOBS).content.decode())
    assert re.search(
        r"run now requested by operator \(admin\) at [^<]*, waiting <span "
        r'class="exclusive-jobs-arguments"[^>]*>\{"limit": 2\}</span>',
        jobs,
    )


@pytest.mark.django_db(transaction=True)
def test_run_now_without_arguments_is_logged_too() -> None:
    operator().post(RUN, {"job": "quick", "confirm": "yes"})
    [asked] = RunRequest.objects.all()
    assert asked.kwargs == {}
    [entry] = LogEntry.objects.filter(object_id=str(asked.pk))
    assert entry.get_change_message() == "Run now of quick"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("given", "error"),
    [
        ('{"limit": ', "The arguments are not JSON (Expecting value"),
        ('{"limt": 2}', "unknown argument 'limt'."),
        ("[1]", "The arguments must be a dict of argument names to values, not [1]."),
        ('{"limit": NaN}', "are not JSON"),
    ],
)
def test_bad_arguments_are_refused_on_the_form_and_nothing_is_asked(given: str, error: str) -> None:
    page = operator().post(RUN, {"job": "digest", "confirm": "yes", "arguments": given})
    assert page.status_code == 200
    shown = html.unescape(page.content.decode())
    errors = re.search(r'<ul class="errorlist[^"]*"[^>]*><li>(.*?)</li>', shown, re.S)
    assert errors is not None and error in errors.group(1)
    textarea = re.search(r'<textarea name="arguments"[^>]*>(.*?)</textarea>', shown, re.S)
    assert textarea is not None and textarea.group(1).strip() == given.strip()  # kept, to fix
    assert not RunRequest.objects.exists()
    assert not LogEntry.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_viewer_gets_no_form_and_a_forged_post_is_refused() -> None:
    viewer = client_for(make_user("viewer", perms=("view_jobstate",)))
    assert "Run now" not in viewer.get(JOBS).content.decode()
    assert viewer.get(RUN, {"job": "digest"}).status_code == 403
    forged = viewer.post(RUN, {"job": "digest", "confirm": "yes", "arguments": '{"limit": 2}'})
    assert forged.status_code == 403
    assert not RunRequest.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_run_now_with_arguments_needs_csrf() -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("csrf", perms=("view_jobstate", "change_jobstate")))
    asked = {"job": "digest", "confirm": "yes", "arguments": '{"limit": 2}'}
    assert client.post(RUN, asked).status_code == 403
    assert not RunRequest.objects.exists()
    page = client.get(RUN, {"job": "digest"}).content.decode()  # the form's own token
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token is not None
    done = client.post(RUN, {**asked, "csrfmiddlewaretoken": token.group(1)})
    assert done.status_code == 302
    assert RunRequest.objects.get().kwargs == {"limit": 2}

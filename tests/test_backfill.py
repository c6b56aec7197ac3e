"""Backfill: the slots it picks, `exclusive_jobs backfill` in real processes, and backfill
requests served as runs of their slot, on every backend."""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client

from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.lock.errors import LockConfigurationError
from django_exclusive_jobs.models import JobRun, RunRequest
from django_exclusive_jobs.run import backfill, control
from django_exclusive_jobs.run.registry import Job, get_job
from django_exclusive_jobs.run.runner import Run
from django_exclusive_jobs.run.schedules import Every, make_schedule
from django_exclusive_jobs.run.start import Start

from .conftest import clean_tables
from .helpers import other_holder, reaped
from .test_admin import JOBS, client_for, make_user
from .test_command import ROOT, command_env, launch, marker, wait_for
from .test_operate import exclusive_jobs

__all__ = ["marker"]  # a fixture

HOUR = dt.timedelta(hours=1)
NAME = "backfill_hourly"


def hours_ago(alias: str, hours: int) -> dt.datetime:
    """The hourly slot ``hours`` before the latest one at or before the database's now
    (UTC): the one a backfill ends at by default. Not ``slot_at``, which in the last
    SLOT_TOLERANCE before the hour already names the coming slot, one in the future."""
    latest, _ = Every(period=HOUR).latest_at_or_before(database_now(alias))
    return latest - hours * HOUR


def record(alias: str, slot: dt.datetime, status: str, attempt: int = 1, name: str = NAME) -> None:
    now = database_now(alias)
    JobRun.objects.using(alias).create(
        name=name, slot=slot, status=status, attempt=attempt, started_at=now, finished_at=now
    )


def rows(alias: str, name: str = NAME) -> list[tuple[dt.datetime | None, int, str, bool, str]]:
    runs = JobRun.objects.using(alias).filter(name=name).order_by("slot", "attempt")
    return list(runs.values_list("slot", "attempt", "status", "backfill", "requested_by"))


def job(name: str = NAME) -> Job:
    found = get_job(name)
    assert found is not None
    return found


def marked(marker: Path, word: str) -> list[str]:
    """What the job wrote after its name, in order: the slots it served."""
    if not marker.exists():
        return []
    lines = [line.split() for line in marker.read_text().splitlines()]
    return [fields[1] for fields in lines if fields[0] == word]


# --- which slots -------------------------------------------------------------------------


def test_the_slots_are_those_of_the_range_without_a_successful_run_oldest_first(
    alias: str,
) -> None:
    slot = {n: hours_ago(alias, n) for n in range(3, 11)}
    record(alias, slot[10], "succeeded")
    record(alias, slot[9], "missed")
    record(alias, slot[8], "failed")
    record(alias, slot[8], "failed", attempt=2)
    record(alias, slot[7], "skipped")
    record(alias, slot[6], "enqueued")
    record(alias, slot[5], "timed_out")
    record(alias, slot[5], "succeeded", attempt=2)  # its retry succeeded
    record(alias, slot[3], "missed")  # outside the range
    plan = backfill.plan(job(), slot[10], slot[4], using=alias)
    assert plan.slots == [slot[9], slot[8], slot[7], slot[4]]
    assert plan.done == {slot[10]: "succeeded", slot[6]: "enqueued", slot[5]: "succeeded"}
    assert plan.describe() == (
        f"backfill {NAME}: 4 slot(s) to run, {slot[9].isoformat()} .. {slot[4].isoformat()} "
        "(3 already succeeded)"
    )


def test_the_range_includes_both_ends_and_defaults_to_now(alias: str) -> None:
    current = hours_ago(alias, 0)
    assert backfill.plan(job(), current - 2 * HOUR, using=alias).slots == [
        current - 2 * HOUR,
        current - HOUR,
        current,
    ]
    just_after = current - 2 * HOUR + dt.timedelta(seconds=1)
    assert backfill.plan(job(), just_after, current - HOUR, using=alias).slots == [current - HOUR]


@pytest.mark.parametrize("alias", ["sqlite"], indirect=True)
def test_a_time_without_a_zone_is_in_the_schedules_time_zone(alias: str) -> None:
    schedule = make_schedule(cron="0 2 * * *", timezone="Europe/Paris")
    paris = Job("paris_nightly", lambda slot: None, schedule=schedule)
    naive = dt.datetime(2026, 1, 10, 2, 0)  # 02:00 in Paris is 01:00 UTC in winter
    plan = backfill.plan(paris, naive, naive, using=alias)
    assert plan.slots == [dt.datetime(2026, 1, 10, 1, 0, tzinfo=dt.UTC)]
    utc = dt.datetime(2026, 1, 10, 2, 0, tzinfo=dt.UTC)  # a zone given: used as given
    assert backfill.plan(paris, utc, utc, using=alias).slots == []
    # every= has no zone of its own: TIME_ZONE (UTC in the tests).
    hourly = backfill.plan(
        job(), dt.datetime(2026, 1, 10, 2), dt.datetime(2026, 1, 10, 2), using=alias
    )
    assert hourly.slots == [utc]


@pytest.mark.parametrize("alias", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("name", "start", "end", "said"),
    [
        (
            "quick",
            -3,
            None,
            "quick has no schedule (every= or cron=): it has no slots to backfill.",
        ),
        (NAME, -1, -3, "is after --to"),
        (NAME, -3, +2, "is in the future"),
        (NAME, -1001, -1, f"has more than 1000 slots of {NAME}: backfill a shorter range"),
    ],
)
def test_a_bad_range_is_refused_with_one_line(
    alias: str, name: str, start: int, end: int | None, said: str
) -> None:
    current = hours_ago(alias, 0)
    with pytest.raises(LockConfigurationError, match=said.replace("(", r"\(").replace(")", r"\)")):
        backfill.plan(
            job(name),
            current + start * HOUR,
            None if end is None else current + end * HOUR,
            using=alias,
        )


@pytest.mark.parametrize("alias", ["sqlite"], indirect=True)
def test_a_thousand_slots_are_allowed(alias: str) -> None:
    current = hours_ago(alias, 0)
    assert len(backfill.plan(job(), current - 999 * HOUR, current, using=alias).slots) == 1000


# --- the command -------------------------------------------------------------------------


def test_dry_run_lists_the_slots_and_changes_nothing(alias: str, marker: Path) -> None:
    three, two, one = (hours_ago(alias, n) for n in (3, 2, 1))
    record(alias, three, "succeeded")
    record(alias, two, "missed")
    before = rows(alias)
    result = exclusive_jobs(
        alias,
        "backfill",
        NAME,
        "--from",
        three.isoformat(),
        "--to",
        one.isoformat(),
        "--dry-run",
        marker=marker,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"backfill {NAME}: 2 slot(s) to run, {two.isoformat()} .. {one.isoformat()} "
        "(1 already succeeded)",
        f"would skip {NAME} slot={three.isoformat()}: already succeeded",
        f"would run {NAME} slot={two.isoformat()}",
        f"would run {NAME} slot={one.isoformat()}",
    ]
    assert rows(alias) == before
    assert marked(marker, NAME) == []
    assert not RunRequest.objects.using(alias).exists()


def test_backfill_runs_exactly_the_slots_without_success_oldest_first_once_each(
    alias: str, marker: Path
) -> None:
    slot = {n: hours_ago(alias, n) for n in range(1, 7)}
    record(alias, slot[6], "succeeded")
    record(alias, slot[5], "missed")
    record(alias, slot[4], "failed")
    record(alias, slot[3], "skipped")
    # slot[2]: no row at all (nobody noticed it); slot[1]: fails when backfilled
    env = command_env(marker, FAIL_SLOTS=slot[2].isoformat())
    result = subprocess.run(
        [
            *argv(alias),
            "backfill",
            NAME,
            "--from",
            slot[6].isoformat(),
            "--to",
            slot[1].isoformat(),
            "--by",
            "alice",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr  # one slot failed: the others still ran
    assert marked(marker, NAME) == [slot[n].isoformat() for n in (5, 4, 3, 2, 1)]
    lines = result.stdout.splitlines()
    assert lines[0] == (
        f"backfill {NAME}: 5 slot(s) to run, {slot[5].isoformat()} .. {slot[1].isoformat()} "
        "(1 already succeeded)"
    )
    assert f"acquired {NAME} token=" in lines[1] and lines[1].endswith(
        f"slot={slot[5].isoformat()}"
    )
    assert result.stderr.splitlines()[-1] == f"backfilled {NAME} 5 slot(s): 4 succeeded, 1 failed"
    assert rows(alias) == [
        (slot[6], 1, "succeeded", False, ""),
        (slot[5], 1, "missed", False, ""),
        (slot[5], 2, "succeeded", True, "alice"),
        (slot[4], 1, "failed", False, ""),
        (slot[4], 2, "succeeded", True, "alice"),
        (slot[3], 1, "skipped", False, ""),
        (slot[3], 2, "succeeded", True, "alice"),
        (slot[2], 1, "failed", True, "alice"),
        (slot[1], 1, "succeeded", True, "alice"),
    ]
    # Run again: nothing left but the failed slot, its third attempt... its second here.
    again = exclusive_jobs(
        alias,
        "backfill",
        NAME,
        "--from",
        slot[6].isoformat(),
        "--to",
        slot[1].isoformat(),
        marker=marker,
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1] == f"backfilled {NAME} 1 slot(s): 1 succeeded"
    assert rows(alias)[-2:] == [
        (slot[2], 2, "succeeded", True, again_by()),
        (slot[1], 1, "succeeded", True, "alice"),
    ]


def again_by() -> str:
    import getpass
    import socket

    return f"{getpass.getuser()}@{socket.gethostname()}"


def argv(alias: str) -> list[str]:
    import sys

    return [sys.executable, "-m", "django", "exclusive_jobs", "--database", alias]


def test_two_backfills_started_together_run_each_slot_once(alias: str, marker: Path) -> None:
    slots = [hours_ago(alias, n) for n in (4, 3, 2, 1)]
    env = command_env(marker, JOB_SECONDS="0.3")
    args = ["backfill", NAME, "--from", slots[0].isoformat(), "--to", slots[-1].isoformat()]
    with reaped() as started:
        both = [launch(started, [*argv(alias), *args], env) for _ in range(2)]
        outputs = [process.communicate(timeout=120) for process in both]
    for process, (out, err) in zip(both, outputs, strict=True):
        assert process.returncode == 0, out + err
    assert marked(marker, NAME) == [slot.isoformat() for slot in slots]
    assert [(slot, attempt, status) for slot, attempt, status, *_ in rows(alias)] == [
        (slot, 1, "succeeded") for slot in slots
    ]
    summaries = [out.splitlines()[-1] for out, _err in outputs]
    assert all(line.startswith(f"backfilled {NAME} ") for line in summaries)


def test_a_job_that_takes_no_slot_warns_and_needs_yes(alias: str, marker: Path) -> None:
    two, one = hours_ago(alias, 2), hours_ago(alias, 1)
    args = ("backfill", "backfill_slotless", "--from", two.isoformat(), "--to", one.isoformat())
    warning = (
        "warning: backfill_slotless does not take a slot argument: each backfilled run does "
        "the same work as a run now, whatever its slot"
    )
    refused = exclusive_jobs(alias, *args, marker=marker)
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        warning,
        "CommandError: Not backfilled: backfill_slotless takes no slot argument; give --yes "
        "to run it once per slot anyway.",
    ]
    assert marked(marker, "backfill_slotless") == []
    assert not JobRun.objects.using(alias).exists()
    dry = exclusive_jobs(alias, *args, "--dry-run", marker=marker)
    assert dry.returncode == 0 and dry.stderr.splitlines() == [warning]
    done = exclusive_jobs(alias, *args, "--yes", marker=marker)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == warning
    assert len(rows(alias, "backfill_slotless")) == 2


@pytest.mark.parametrize("alias", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["backfill", NAME], "CommandError: backfill needs --from: the oldest slot to run."),
        (
            ["backfill", NAME, "--from", "last night"],
            "error: argument --from: --from must be an ISO 8601 time",
        ),
        (["backfill", NAME, "--from", "2026-01-02", "--to", "2026-01-01"], "is after --to"),
        (["backfill", NAME, "--from", "2000-01-01"], "has more than 1000 slots"),
        (["backfill", NAME, "--from", "2000-01-01", "--to", "2999-01-01"], "is in the future"),
        (["backfill", "quick", "--from", "2026-01-01"], "quick has no schedule"),
        (["backfill", "nope", "--from", "2026-01-01"], "Unknown job 'nope'"),
        (["run", "quick", "--dry-run"], "go with backfill"),
        (["backfill", NAME, "--from", "2026-01-01", "--wait", "soon"], "error: argument --wait"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_and_nothing_runs(
    alias: str, marker: Path, args: list[str], said: str
) -> None:
    result = exclusive_jobs(alias, *args, marker=marker)
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = result.stderr.splitlines()
    assert said in line
    assert result.stdout == ""
    assert not JobRun.objects.using(alias).exists()
    assert not marker.exists()


def test_a_held_lock_is_waited_for_then_the_backfill_stops_naming_the_slots_not_run(
    alias: str, marker: Path
) -> None:
    two, one = hours_ago(alias, 2), hours_ago(alias, 1)
    with other_holder(alias) as other:
        other.try_acquire(NAME, ttl=600)
        result = exclusive_jobs(
            alias,
            "backfill",
            NAME,
            "--from",
            two.isoformat(),
            "--to",
            one.isoformat(),
            "--wait",
            "1s",
            marker=marker,
        )
        holder = other.holder
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"backfill of {NAME} stopped: its lock stayed held by {holder} for over 1s (--wait); "
        f"run it again with --from {two.isoformat()}",
        f"backfilled {NAME} 0 slot(s): none (2 not run: {two.isoformat()} .. {one.isoformat()})",
    ]
    assert marked(marker, NAME) == []
    assert not JobRun.objects.using(alias).exists()


def test_sigterm_stops_the_running_slot_and_the_rest(alias: str, marker: Path) -> None:
    three, two, one = (hours_ago(alias, n) for n in (3, 2, 1))
    env = command_env(marker, JOB_SECONDS="30")
    args = ["backfill", NAME, "--from", three.isoformat(), "--to", one.isoformat()]
    with reaped() as started:
        process = launch(started, [*argv(alias), *args], env)
        wait_for(lambda: marked(marker, NAME))
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert rows(alias) == [(three, 1, "interrupted", True, again_by())]
    assert err.splitlines()[-2:] == [
        f"backfill of {NAME} stopped by signal {int(signal.SIGTERM)}; "
        f"run it again with --from {two.isoformat()}",
        f"backfilled {NAME} 1 slot(s): 1 interrupted (2 not run: {two.isoformat()} .. "
        f"{one.isoformat()})",
    ]


# --- backfill requests (the admin's), as a scheduler serves them ---------------------------


def test_a_request_with_a_slot_runs_as_the_slots_next_attempt(alias: str) -> None:
    two = hours_ago(alias, 2)
    record(alias, two, "missed")
    request = control.request_run(NAME, by="carol (admin)", using=alias, slot=two)
    served: list[object] = []
    this = job().but(using=alias, keepalive=False)
    run = Run(this, start=Start.run_now(request=RunRequest.objects.using(alias).get(pk=request.pk)))
    result = run.call(lambda lock: served.append(run.job_slot))
    assert result.status == "succeeded"
    assert served == [two]
    assert rows(alias) == [
        (two, 1, "missed", False, ""),
        (two, 2, "succeeded", True, "carol (admin)"),
    ]
    taken = RunRequest.objects.using(alias).get(pk=request.pk)
    assert (
        taken.taken_at is not None and taken.run_id == JobRun.objects.using(alias).get(attempt=2).pk
    )


def test_a_request_for_a_slot_that_succeeded_meanwhile_is_used_up_without_a_run(
    alias: str,
) -> None:
    two = hours_ago(alias, 2)
    request = control.request_run(NAME, by="carol (admin)", using=alias, slot=two)
    record(alias, two, "succeeded")  # a late catch-up, or another backfill, ran it
    lines: list[str] = []
    this = job().but(using=alias, keepalive=False)
    run = Run(
        this, start=Start.run_now(request=request), report=lambda line, normal: lines.append(line)
    )
    result = run.call(lambda lock: pytest.fail("the slot ran twice"))
    assert result.status == "skipped"
    [line] = lines
    assert line.startswith(f"skipped {NAME}: slot {two.isoformat()} already run by ")
    assert line.endswith(" (succeeded)")
    assert rows(alias) == [(two, 1, "succeeded", False, "")]
    assert not RunRequest.objects.using(alias).pending().exists()


def test_a_jobs_backfill_requests_are_served_oldest_slot_first(alias: str) -> None:
    three, two, one = (hours_ago(alias, n) for n in (3, 2, 1))
    first = control.request_run(NAME, by="a", using=alias, slot=two)
    now = control.request_run(NAME, by="b", using=alias)
    later = [control.request_run(NAME, by="c", using=alias, slot=s) for s in (one, three)]
    other = control.request_run("quick", by="d", using=alias)
    waiting = control.pending([NAME, "quick"], using=alias)
    assert [r.pk for r in waiting] == [later[1].pk, now.pk, first.pk, later[0].pk, other.pk]


# --- the admin's Backfill… -----------------------------------------------------------------

ACT = "/admin/django_exclusive_jobs/jobstate/act/backfill/"


@pytest.fixture
def admin_db(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    """The admin's database (``default``), clean, with its users."""
    from django.contrib.auth.models import User

    with django_db_blocker.unblock():
        clean_tables("default")
        try:
            yield "default"
        finally:
            clean_tables("default")
            User.objects.all().delete()
            LogEntry.objects.all().delete()


def superuser() -> Client:
    from django.contrib.auth.models import User

    return client_for(User.objects.create_superuser("root", password="pw"))


def test_the_backfill_page_previews_the_slots_then_asks_for_one_request_per_slot(
    admin_db: str,
) -> None:
    three, two, one = (hours_ago(admin_db, n) for n in (3, 2, 1))
    record(admin_db, two, "succeeded")
    client = superuser()
    form = client.get(ACT, {"job": NAME})
    assert form.status_code == 200
    assert 'id="backfill-slots"' not in form.content.decode()
    assert 'id="backfill-unserved"' in form.content.decode()  # no live scheduler
    assert 'id="backfill-warning"' not in form.content.decode()
    rng = {"job": NAME, "start": three.isoformat(), "end": one.isoformat()}
    preview = client.get(ACT, rng).content.decode()
    assert preview.count("<li>") == 3
    assert f"<li>{three:%Y-%m-%d %H:%M:%S} UTC</li>" in preview
    assert f"<li>{two:%Y-%m-%d %H:%M:%S} UTC (succeeded)</li>" in preview
    assert not RunRequest.objects.using(admin_db).exists()  # a preview asks for nothing
    done = client.post(ACT, {**rng, "confirm": "yes"})
    assert done.status_code == 302
    waiting = list(RunRequest.objects.using(admin_db).pending().order_by("id"))
    assert [(r.name, r.slot, r.requested_by) for r in waiting] == [
        (NAME, three, "root (admin)"),
        (NAME, one, "root (admin)"),
    ]
    [entry] = LogEntry.objects.all()
    assert entry.object_id == str(waiting[0].pk)
    assert entry.get_change_message() == (
        f"Backfill of {NAME}: 2 slot(s), {three.isoformat()} .. {one.isoformat()}"
    )
    page = client.get(JOBS).content.decode()
    assert f"backfill of slot {three:%Y-%m-%d %H:%M:%S} requested by root (admin) at " in page
    cancel = client.post(
        "/admin/django_exclusive_jobs/jobstate/act/cancel/",
        {"job": NAME, "request": waiting[0].pk, "confirm": "yes"},
    )
    assert cancel.status_code == 302
    assert [r.slot for r in RunRequest.objects.using(admin_db).pending()] == [one]


def test_the_backfill_page_warns_when_the_job_takes_no_slot(admin_db: str) -> None:
    one = hours_ago(admin_db, 1)
    rng = {"job": "backfill_slotless", "start": one.isoformat(), "end": one.isoformat()}
    page = superuser().get(ACT, rng).content.decode()
    assert 'id="backfill-warning"' in page
    assert "backfill_slotless does not take a slot argument" in page


def test_a_bad_range_is_shown_on_the_page_and_asks_for_nothing(admin_db: str) -> None:
    client = superuser()
    rng = {"job": NAME, "start": "2000-01-01", "end": "", "confirm": "yes"}
    page = client.post(ACT, rng)
    assert page.status_code == 200
    assert "has more than 1000 slots of" in page.content.decode()
    nonsense = client.get(ACT, {"job": NAME, "start": "last night"}).content.decode()
    assert "From must be an ISO 8601 time such as" in nonsense
    assert not RunRequest.objects.using(admin_db).exists()


def test_backfill_needs_the_change_permission_and_the_csrf_token(admin_db: str) -> None:
    one = hours_ago(admin_db, 1)
    rng = {"job": NAME, "start": one.isoformat(), "end": one.isoformat(), "confirm": "yes"}
    viewer = client_for(make_user("viewer", perms=("view_jobstate",)))
    assert viewer.get(ACT, {"job": NAME}).status_code == 403
    assert viewer.post(ACT, rng).status_code == 403
    assert "act/backfill/" not in viewer.get(JOBS).content.decode()
    from django.contrib.auth.models import User

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.create_superuser("root", password="pw"))
    assert strict.post(ACT, rng).status_code == 403
    assert not RunRequest.objects.using(admin_db).exists()
    assert strict.post(ACT, rng, headers={"X-CSRFToken": csrf(strict)}).status_code == 302
    assert RunRequest.objects.using(admin_db).count() == 1


def csrf(client: Client) -> str:
    client.get(JOBS)
    return client.cookies["csrftoken"].value


@pytest.mark.slow
def test_a_scheduler_serves_the_backfill_requests_oldest_slot_first(
    admin_db: str, marker: Path
) -> None:
    from .test_scheduler import start_scheduler, stop

    slots = [hours_ago(admin_db, n) for n in (4, 3, 2)]
    client = superuser()
    rng = {"job": NAME, "start": slots[0].isoformat(), "end": slots[-1].isoformat()}
    assert client.post(ACT, {**rng, "confirm": "yes"}).status_code == 302
    # A later backfill that reaches further back: its slot is served first.
    older = hours_ago(admin_db, 5)
    control.request_run(NAME, by="bob", using=admin_db, slot=older)
    with reaped() as started:
        scheduler = start_scheduler(
            started, admin_db, "--jobs", NAME, env=command_env(marker, JOB_SECONDS="0.2")
        )
        wait_for(lambda: JobRun.objects.using(admin_db).finished().count() == 4, timeout=120)
        stop(scheduler)
    runs = list(JobRun.objects.using(admin_db).order_by("started_at"))
    assert [run.slot for run in runs] == [older, *slots]
    assert {(run.status, run.backfill, run.attempt) for run in runs} == {("succeeded", True, 1)}
    assert marked(marker, NAME) == [slot.isoformat() for slot in (older, *slots)]
    assert not RunRequest.objects.using(admin_db).pending().exists()

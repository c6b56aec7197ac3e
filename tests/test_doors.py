"""Each door refuses the hostile values of issue 41, on every database: a command with one
line on stderr and exit 2, an admin form with its error and status 200; no traceback, no
row written, no lock left. And what the doors must now accept or refuse besides."""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.checks import Warning as CheckWarning
from django.test import Client
from django.test.utils import override_settings
from django.urls import reverse

from django_exclusive_jobs import exclusive_job
from django_exclusive_jobs.checks import check_settings
from django_exclusive_jobs.models import JobChange, JobLock, JobRun, JobState, RunRequest
from django_exclusive_jobs.run.registry import _jobs

from .test_admin import client_for, make_user
from .test_command import command_env, manage, marker, runs
from .test_operate import exclusive_jobs

pytestmark = pytest.mark.no_deadline  # CPU only, no deadline: nice 10 (tests/cpu_report.py)

__all__ = ["marker"]  # a fixture

ACT = "admin:django_exclusive_jobs_jobstate_act"
EVERY_TOO_LONG = ["999999999d", "750000d", "P999999999D"]


def nothing_written(alias: str) -> None:
    """No row of any kind: nothing was paused, overridden, asked for, run or locked."""
    for model in (JobState, JobChange, RunRequest, JobRun, JobLock):
        assert not model.objects.using(alias).exists(), model.__name__


def one_line(result: subprocess.CompletedProcess[str], *parts: str) -> str:
    """The one line a refused command printed: exit 2, no traceback, nothing on stdout."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stdout == ""
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


# --- the commands -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "until"),
    [
        pytest.param("summary:weekly", "0001-01-01T00:00", id="year-1-in-paris"),
        pytest.param("summary:weekly", "9999-12-31T23:59", id="year-9999-in-paris"),
        pytest.param("digest", "9999-12-31T23:59-05:00", id="year-9999-west-of-utc"),
        pytest.param("digest", "0001-01-01T00:00+14:00", id="year-1-east-of-utc"),
    ],
)
def test_a_pause_end_out_of_bounds_is_refused_and_never_stored(
    alias: str, name: str, until: str
) -> None:
    done = exclusive_jobs(alias, "pause", name, "--until", until, "--reason", "x")
    one_line(done, "--until must be between 1970-01-01 and 9000-01-01 (UTC)", until)
    nothing_written(alias)


def test_a_pause_end_already_past_is_refused(alias: str) -> None:
    done = exclusive_jobs(alias, "pause", "digest", "--until", "2001-01-01T00:00")
    one_line(done, "The pause's end 2001-01-01T00:00:00+00:00 is past (database time ")
    nothing_written(alias)


@pytest.mark.parametrize(
    ("option", "text"),
    [
        pytest.param("--reason", "ok\nfinished X status=succeeded token=999", id="reason-newline"),
        pytest.param("--reason", "\x1b]0;owned\x07\x1b[2J", id="reason-escape"),
        pytest.param("--reason", "evil\u202etxt.exe", id="reason-bidi"),
        pytest.param("--reason", "x" * 501, id="reason-too-long"),
        pytest.param("--by", "alice\rok: 9 job(s), no problem", id="by-carriage-return"),
        pytest.param("--by", "b" * 256, id="by-too-long"),
    ],
)
def test_a_reason_or_by_that_could_forge_a_line_is_refused(
    alias: str, option: str, text: str
) -> None:
    done = exclusive_jobs(alias, "pause", "digest", option, text)
    line = one_line(done, f"argument {option}: {option} ")
    assert "\x1b" not in line and "\u202e" not in line
    nothing_written(alias)


def test_pause_with_check_is_a_usage_error_not_a_pause(alias: str) -> None:
    one_line(exclusive_jobs(alias, "pause", "digest", "--check"), "--check goes with list.")
    one_line(exclusive_jobs(alias, "resume", "digest", "--json"), "--json goes with list")
    nothing_written(alias)


def test_a_backfill_range_out_of_bounds_is_refused(alias: str) -> None:
    done = exclusive_jobs(alias, "backfill", "digest", "--from", "0001-01-01T00:00", "--yes")
    one_line(done, "--from must be between 1970-01-01 and 9000-01-01 (UTC)")
    done = exclusive_jobs(
        alias, "backfill", "digest", "--from", "2026-01-01T00:00", "--to", "9999-12-31T23:59"
    )
    one_line(done, "--to must be between 1970-01-01 and 9000-01-01 (UTC)")
    nothing_written(alias)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        pytest.param(
            '{"recipients": ' + "[" * 30 + "]" * 30 + ', "limit": 1}',
            "The arguments are nested more than 20 levels deep.",
            id="deep",
        ),
        pytest.param('{"recipients": ["a\\u0000"], "limit": 1}', "hold a NUL character", id="nul"),
        pytest.param(
            json.dumps({"recipients": ["x" * 70000], "limit": 1}),
            "the limit is 65536",
            id="large",
        ),
    ],
)
def test_run_now_arguments_out_of_bounds_are_refused(alias: str, kwargs: str, says: str) -> None:
    one_line(exclusive_jobs(alias, "run", "digest", "--kwargs", kwargs), says)
    nothing_written(alias)


@pytest.mark.parametrize("every", EVERY_TOO_LONG)
def test_run_exclusive_refuses_an_every_too_long_with_the_decorator_s_line(
    alias: str, every: str
) -> None:
    done = manage(alias, "quick", "--every", every)
    one_line(done, f"argument --every: every must be at most 3653d, got '{every}'.")
    nothing_written(alias)


def test_run_exclusive_takes_a_slot_tolerance_for_a_job_that_declares_every(
    alias: str, marker: Path
) -> None:
    done = manage(alias, "digest", "--slot-tolerance", "5s", env=command_env(marker))
    assert done.returncode == 0, done.stderr
    assert runs(marker, "digest") == 1
    assert JobRun.objects.using(alias).filter(name="digest").count() == 1
    # A job without a schedule has no slot to be early for.
    refused = manage(alias, "quick", "--slot-tolerance", "5s")
    one_line(refused, "A slot tolerance only applies with every= or cron=.")


# --- the admin ----------------------------------------------------------------------------


@pytest.fixture
def operator(alias: str) -> Iterator[Client]:
    """An operator with the change permission, the admin on ``alias``'s lock tables."""
    client = client_for(make_user("door_operator", perms=("view_jobstate", "change_jobstate")))
    with override_settings(EXCLUSIVE_JOBS={"DATABASE": alias}):
        yield client
    User.objects.filter(username="door_operator").delete()


@pytest.fixture
def west() -> Iterator[str]:
    """A job on a zone west of UTC."""

    @exclusive_job("door_west", cron="0 6 * * *", timezone="America/Los_Angeles")
    def door_west() -> None:
        return None

    yield "door_west"
    _jobs.pop("door_west", None)


def refused_form(answer: Any, *parts: str) -> str:
    """The page of a refused form: status 200, its error shown."""
    assert answer.status_code == 200, answer.status_code
    page = answer.content.decode()
    assert "errorlist" in page, page[-2000:]
    for part in parts:
        assert part in page, part
    return page


OVERRIDE = {"cron": "", "timezone": "", "arguments": '{"recipients": ["a"], "limit": 1}'}


def override_form(every: str, **more: str) -> dict[str, str]:
    return {
        "job": "digest",
        **OVERRIDE,
        "every": every,
        "timeout": "",
        "overlap": "skip",
        "reason": "load",
        "confirm": "yes",
        **more,
    }


@pytest.mark.django_db(transaction=True, databases="__all__")
@pytest.mark.parametrize("every", EVERY_TOO_LONG)
def test_an_override_every_too_long_is_a_form_error(
    alias: str, operator: Client, every: str
) -> None:
    answer = operator.post(reverse(ACT, args=["override"]), override_form(every))
    refused_form(answer, "every must be at most 3653d, got")
    nothing_written(alias)


@pytest.mark.django_db(transaction=True, databases="__all__")
@pytest.mark.parametrize(
    ("job", "until", "says"),
    [
        pytest.param("door_west", "9999-12-31T23:59", "Until must be between", id="9999-west"),
        pytest.param("summary:weekly", "0001-01-01T00:00", "Until must be between", id="1-paris"),
        pytest.param("digest", "2001-01-01T00:00", "is past (database time", id="past"),
        pytest.param("digest", "soon", "Until must be an ISO 8601 time", id="not-a-time"),
    ],
)
def test_a_pause_end_out_of_bounds_or_past_is_a_form_error(
    alias: str, operator: Client, west: str, job: str, until: str, says: str
) -> None:
    form = {"job": job, "reason": "maintenance", "until": until, "confirm": "yes"}
    refused_form(operator.post(reverse(ACT, args=["pause"]), form), says)
    nothing_written(alias)


@pytest.mark.django_db(transaction=True, databases="__all__")
@pytest.mark.parametrize(
    "reason",
    ["ok\nfinished X status=succeeded", "\x1b[2J", "evil\u202etxt", "x" * 501],
    ids=["newline", "escape", "bidi", "too-long"],
)
def test_a_reason_that_could_forge_a_line_is_a_form_error(
    alias: str, operator: Client, reason: str
) -> None:
    pause = {"job": "digest", "reason": reason, "until": "", "confirm": "yes"}
    refused_form(operator.post(reverse(ACT, args=["pause"]), pause), "The reason ")
    answer = operator.post(reverse(ACT, args=["override"]), override_form("2h", reason=reason))
    refused_form(answer, "The reason ")
    nothing_written(alias)


@pytest.mark.django_db(transaction=True, databases="__all__")
def test_run_now_and_backfill_out_of_bounds_are_form_errors(alias: str, operator: Client) -> None:
    deep = '{"recipients": ' + "[" * 30 + "]" * 30 + ', "limit": 1}'
    run = {"job": "digest", "arguments": deep, "confirm": "yes"}
    refused_form(operator.post(reverse(ACT, args=["run"]), run), "nested more than 20 levels")
    backfill = {"job": "digest", "start": "0001-01-01T00:00", "end": "", "confirm": "yes"}
    answer = operator.post(reverse(ACT, args=["backfill"]), backfill)
    refused_form(answer, "From must be between 1970-01-01 and 9000-01-01 (UTC)")
    nothing_written(alias)


def version_in(page: str) -> str:
    found = re.search(r'name="version" value="([^"]*)"', page)
    assert found is not None, "the form carries the version it was opened on"
    return found.group(1)


@pytest.mark.django_db(transaction=True, databases="__all__")
def test_a_stale_override_form_is_refused_naming_who_changed_what_when(
    alias: str, operator: Client
) -> None:
    url = reverse(ACT, args=["override"])
    other = client_for(make_user("door_other", perms=("view_jobstate", "change_jobstate")))
    try:
        # Both open the form on the same state (the code's).
        mine = version_in(operator.get(url, {"job": "digest"}).content.decode())
        theirs = version_in(other.get(url, {"job": "digest"}).content.decode())
        assert mine == theirs
        first = other.post(url, override_form("2h", version=theirs, reason="halve the load"))
        assert first.status_code == 302
        saved = JobState.objects.using(alias).get(name="digest")
        assert saved.override["schedule"] == {"every": 7200.0}
        second = operator.post(url, override_form("30m", version=mine))
        refused_form(
            second,
            "Not saved: since this form was opened, door_other (admin) overrode it (every 2h",
            "UTC: halve the load",
        )
        after = JobState.objects.using(alias).get(name="digest")
        assert (after.override, after.overridden_by, after.overridden_at) == (
            saved.override,
            saved.overridden_by,
            saved.overridden_at,
        )
        assert JobChange.objects.using(alias).filter(action="override").count() == 1
        # Opened again, on the state in force now, the same change saves.
        fresh = version_in(operator.get(url, {"job": "digest"}).content.decode())
        assert fresh != mine
        assert operator.post(url, override_form("30m", version=fresh)).status_code == 302
        now = JobState.objects.using(alias).get(name="digest").override["schedule"]
        assert now == {"every": 1800.0}
    finally:
        User.objects.filter(username="door_other").delete()


@pytest.mark.django_db(transaction=True, databases="__all__")
def test_a_stale_back_to_the_code_is_refused(alias: str, operator: Client) -> None:
    url = reverse(ACT, args=["override"])
    version = version_in(operator.get(url, {"job": "digest"}).content.decode())
    assert operator.post(url, override_form("2h", version=version)).status_code == 302
    back = reverse(ACT, args=["back"])
    opened = version_in(operator.get(back, {"job": "digest"}).content.decode())
    newer = version_in(operator.get(url, {"job": "digest"}).content.decode())
    assert operator.post(url, override_form("3h", version=newer)).status_code == 302
    answer = operator.post(
        back, {"job": "digest", "reason": "over", "version": opened, "confirm": "yes"}
    )
    refused_form(answer, "Not saved: since this form was opened, door_operator (admin) overrode")
    state = JobState.objects.using(alias).get(name="digest")
    assert state.override["schedule"] == {"every": 10800.0}
    assert not JobChange.objects.using(alias).filter(action="back_to_code").exists()


@pytest.mark.django_db(transaction=True, databases="__all__")
def test_a_stale_pause_form_is_refused_naming_who_paused(alias: str, operator: Client) -> None:
    url = reverse(ACT, args=["pause"])
    first = version_in(operator.get(url, {"job": "digest"}).content.decode())
    second = version_in(operator.get(url, {"job": "digest"}).content.decode())
    pause = {"job": "digest", "until": "", "confirm": "yes"}
    done = operator.post(url, {**pause, "reason": "vendor down", "version": first})
    assert done.status_code == 302
    before = JobState.objects.using(alias).get(name="digest")
    answer = operator.post(url, {**pause, "reason": "disk full", "version": second})
    refused_form(
        answer, "Not saved: since this form was opened, door_operator (admin) paused it at "
    )
    assert "UTC: vendor down" in answer.content.decode()
    after = JobState.objects.using(alias).get(name="digest")
    assert (after.pause_reason, after.paused_at) == ("vendor down", before.paused_at)
    assert JobChange.objects.using(alias).filter(action="pause").count() == 1


# --- settings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "warned"),
    [("t", True), ("x" * 15, True), (12345, True), ("x" * 16, False), (None, False)],
)
def test_a_short_health_token_draws_a_warning(token: object, warned: bool) -> None:
    with override_settings(EXCLUSIVE_JOBS={"HEALTH_TOKEN": token}):
        found = [m for m in check_settings() if m.id == "django_exclusive_jobs.W006"]
    assert bool(found) == warned
    if found:
        assert isinstance(found[0], CheckWarning) and not found[0].is_serious()
        assert "HEALTH_TOKEN" in found[0].msg


def test_the_reference_states_the_bounds_the_code_keeps() -> None:
    from django_exclusive_jobs import values

    reference = (Path(__file__).parent.parent / "docs" / "reference" / "commands.md").read_text()
    bounds = reference.split("## Bounds", 1)[1].split("\n## ", 1)[0]
    assert f"{values.LONGEST.days:,} days" in bounds
    assert f"{values.EARLIEST:%Y-%m-%d} to {values.LATEST:%Y-%m-%d} (UTC)" in bounds
    assert f"{values.CRON_LENGTH:,} characters" in bounds
    assert f"1 to {values.NAME_LENGTH} characters" in bounds
    assert f"at most {values.REASON_LENGTH} characters" in bounds
    assert f"{values.JSON_SIZE // 1024} KiB and {values.JSON_DEPTH} levels" in bounds
    assert dt.timedelta(days=3653) == values.LONGEST

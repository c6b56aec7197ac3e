"""Text from people and jobs cannot forge a line of the commands' text output (issue 41).

A job's exception message, a pause's or an override's reason and who gave it are shown
escaped (``values.printable``) and cut to ``values.SHOWN_LENGTH`` characters in text
mode; JSON mode carries them as they are. Text the database refuses (NUL, a lone
surrogate) in a job's error is replaced when the run's end is written, so the failure
is recorded. Real processes, on every backend, with the settings `startproject` gives
(no LOGGING): the commands print their own lines.
"""

from __future__ import annotations

import json
import sys
import unicodedata
from pathlib import Path

from django_exclusive_jobs.models import JobRun, JobState
from django_exclusive_jobs.run import control, overrides
from django_exclusive_jobs.run.registry import get_job
from django_exclusive_jobs.run.tracebacks import TRACEBACK_LIMIT
from django_exclusive_jobs.values import REFUSED, SHOWN_LENGTH

from .helpers import reaped
from .test_command import command_env, django_admin, launch, manage, marker, wait_for

__all__ = ["marker"]  # fixtures

# A message that, printed raw, ends the finished line and forges a success after it,
# clears the screen and sets the terminal's title.
FORGED = (
    "the server said no\nfinished broken status=succeeded duration=0.001s token=999"
    "\r\nok: 9 job(s), no problem\x1b[2J\x1b]0;title\x07\u2028\u202eforged"
)
# What the database refuses: a NUL byte and a lone surrogate.
REFUSED_BY_THE_DATABASE = "bad\x00byte\ud800"


def plain_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The test settings without LOGGING (as `startproject` makes them): the commands
    print their lines themselves."""
    (tmp_path / "plain_settings.py").write_text(
        "from tests.settings import *  # noqa: F403\nLOGGING = {}\n"
    )
    env = command_env(**{"DJANGO_SETTINGS_MODULE": "plain_settings", **extra})
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    return env


def failing_with(tmp_path: Path, message: str, **extra: str) -> dict[str, str]:
    """The environment in which the test jobs that fail raise ``message``."""
    path = tmp_path / "error.json"
    path.write_text(json.dumps(message))
    return plain_env(tmp_path, ERROR_FILE=str(path), **extra)


def assert_unforged(output: str) -> list[str]:
    """Every line is one line: no control or format character but the newlines between
    lines, and no line forged (a success, a check's all clear). Its lines."""
    for char in output.replace("\n", ""):
        assert unicodedata.category(char) not in REFUSED, (repr(char), output[-2000:])
    lines = output.splitlines()
    assert not [line for line in lines if line.startswith("finished broken status=succeeded")]
    assert not [line for line in lines if line.startswith("ok: 9 job(s)")]
    return lines


def test_a_job_s_message_shows_escaped_on_its_finished_line(alias: str, tmp_path: Path) -> None:
    result = manage(alias, "broken", env=failing_with(tmp_path, FORGED))
    assert result.returncode == 1, result.stderr
    lines = assert_unforged(result.stdout + result.stderr)
    finished = [line for line in lines if line.startswith("finished ")]
    assert len(finished) == 1, lines
    assert finished[0].startswith("finished broken status=failed ")
    assert finished[0].endswith(
        "error=RuntimeError: the server said no\\nfinished broken status=succeeded "
        "duration=0.001s token=999\\r\\nok: 9 job(s), no problem\\e[2J\\e]0;title\\x07"
        "\\u2028\\u202eforged"
    )
    # The history keeps the message as it was.
    run = JobRun.objects.using(alias).get(name="broken")
    assert FORGED in run.error


def test_json_lines_carry_the_message_as_it_is(alias: str, tmp_path: Path) -> None:
    (tmp_path / "json_settings.py").write_text(
        "from plain_settings import *  # noqa: F403\n"
        'EXCLUSIVE_JOBS = {**globals().get("EXCLUSIVE_JOBS", {}), "LOG_FORMAT": "json"}\n'
    )
    env = failing_with(tmp_path, FORGED, DJANGO_SETTINGS_MODULE="json_settings")
    result = manage(alias, "broken", env=env)
    assert result.returncode == 1, result.stderr
    said = [json.loads(line) for line in result.stderr.splitlines()]
    # (the other "finished" record is "job broken failed", with its traceback)
    finished = [line for line in said if line["message"].startswith("finished broken ")]
    assert len(finished) == 1, said
    assert finished[0]["status"] == "failed"
    assert finished[0]["message"].endswith(f"error=RuntimeError: {FORGED}")


def test_a_scheduler_s_lines_show_a_job_s_message_escaped(alias: str, tmp_path: Path) -> None:
    """The job runs in a process of its own; its whole message reaches the line, escaped,
    and its error, with NUL and a lone surrogate, is recorded."""
    message = FORGED + REFUSED_BY_THE_DATABASE
    env = failing_with(tmp_path, message, TICK_EVERY="1s", CRASH="raise")
    command = [sys.executable, "-m", "django", "exclusive_scheduler", "--database", alias]
    with reaped() as started:
        scheduler = launch(started, [*command, "--jobs", "crash"], env)
        failed = JobRun.objects.using(alias).filter(name="crash", status="failed")
        wait_for(failed.exists, timeout=60)
        scheduler.terminate()
        out, err = scheduler.communicate(timeout=60)
    assert scheduler.returncode == 0, err
    lines = assert_unforged(out + err)
    finished = [line for line in lines if line.startswith("finished crash status=failed ")]
    assert finished, lines
    assert finished[0].endswith(
        "error=RuntimeError: the server said no\\nfinished broken status=succeeded "
        "duration=0.001s token=999\\r\\nok: 9 job(s), no problem\\e[2J\\e]0;title\\x07"
        "\\u2028\\u202eforgedbad\\x00byte\\ud800"
    )
    run = failed.first()
    assert run is not None
    assert run.error_type == "RuntimeError"
    assert "forgedbad\ufffdbyte\ufffd" in run.error


def test_reasons_and_names_in_rows_cannot_forge_lines(alias: str, tmp_path: Path) -> None:
    """A pause's and an override's reason and who gave them, as an older version or the
    admin could have stored them: exclusive_jobs list, --check, and a start's skip line."""
    quick = get_job("quick")
    assert quick is not None
    overrides.override(quick, {"timeout": 5.0}, reason="clean", by="ops", using=alias)
    control.pause("broken", by="ops", using=alias, reason="clean")
    states = JobState.objects.using(alias)
    states.filter(name="quick").update(overridden_by=FORGED[:255], override_reason=FORGED)
    # paused by the app (pause_after): --check shows its reason
    states.filter(name="broken").update(paused_by=control.AUTO_PAUSER, pause_reason=FORGED)
    env = plain_env(tmp_path)

    listed = django_admin("exclusive_jobs", "list", "--database", alias, env=env)
    assert listed.returncode == 0, listed.stderr
    lines = assert_unforged(listed.stdout + listed.stderr)
    drift = [line for line in lines if line.startswith("quick: timeout")]
    assert len(drift) == 1, lines
    assert "\\e[2J" in drift[0] and "\\nfinished broken" in drift[0]

    checked = django_admin("exclusive_jobs", "list", "--check", "--database", alias, env=env)
    assert checked.returncode == 1, checked.stderr
    lines = assert_unforged(checked.stdout + checked.stderr)
    paused = [line for line in lines if line.startswith("broken: ")]
    assert len(paused) == 1, lines
    assert "\\nok: 9 job(s), no problem\\e[2J" in paused[0]

    skipped = manage(alias, "broken", "-v", "2", env=env)
    assert skipped.returncode == 0, skipped.stderr
    lines = assert_unforged(skipped.stdout + skipped.stderr)
    said = [line for line in lines if line.startswith("skipped broken: paused by ")]
    assert len(said) == 1, lines
    assert "\\nfinished broken status=succeeded" in said[0]


def test_an_error_the_database_refuses_is_recorded(alias: str, tmp_path: Path) -> None:
    """NUL and a lone surrogate in a job's message: the run ends failed with its error
    (the replacement character in their place), --check reports it, and the text line
    says so."""
    env = failing_with(tmp_path, REFUSED_BY_THE_DATABASE)
    result = manage(alias, "broken", env=env)
    assert result.returncode == 1, result.stderr
    lines = assert_unforged(result.stdout + result.stderr)
    finished = [line for line in lines if line.startswith("finished broken status=failed ")]
    assert len(finished) == 1, lines
    assert finished[0].endswith("error=RuntimeError: bad\\x00byte\\ud800")
    run = JobRun.objects.using(alias).get(name="broken")
    assert (run.status, run.error_type) == ("failed", "RuntimeError")
    assert "RuntimeError: bad\ufffdbyte\ufffd" in run.error

    checked = django_admin("exclusive_jobs", "list", "--check", "--database", alias, env=env)
    assert checked.returncode == 1, checked.stderr
    assert [line for line in checked.stdout.splitlines() if line.startswith("broken: failing: ")]


def test_a_long_message_is_cut_on_its_line_and_bounded_in_the_history(
    alias: str, tmp_path: Path
) -> None:
    message = "x" * 1_000_000 + "END"
    result = manage(alias, "broken", env=failing_with(tmp_path, message))
    assert result.returncode == 1, result.stderr[-500:]
    lines = assert_unforged(result.stdout + result.stderr)
    finished = [line for line in lines if line.startswith("finished broken status=failed ")]
    assert len(finished) == 1
    assert finished[0].endswith(f"error=RuntimeError: {'x' * SHOWN_LENGTH}…")
    assert max(len(line) for line in lines) < SHOWN_LENGTH + 200
    run = JobRun.objects.using(alias).get(name="broken")
    assert run.status == "failed"
    assert len(run.error) <= TRACEBACK_LIMIT + 100
    assert run.error.rstrip().endswith("END")  # cut in the middle: its end is kept

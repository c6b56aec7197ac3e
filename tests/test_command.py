"""`manage.py run_exclusive` in real processes, on every backend."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from django_exclusive_jobs import force_release
from django_exclusive_jobs.models import JobLock, JobRun

from .helpers import other_holder

ROOT = Path(__file__).resolve().parent.parent


def command_env(marker: Path | None = None, **extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key in ("PATH", "HOME", "LANG", "CI", "EXCLUSIVE_JOBS_TEST_DB_NAMES")
    }
    env.update(PYTHONPATH=str(ROOT), DJANGO_SETTINGS_MODULE="tests.settings")
    if marker is not None:
        env["MARKER"] = str(marker)
    env.update(extra)
    return env


def argv(alias: str, *args: str) -> list[str]:
    cut = args.index("--") if "--" in args else len(args)
    return [
        sys.executable,
        "-m",
        "django",
        "run_exclusive",
        *args[:cut],
        "--database",
        alias,
        *args[cut:],
    ]


def manage(
    alias: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv(alias, *args),
        cwd=ROOT,
        env=env or command_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def django_admin(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m django ARGS`` with the test settings (or ``env``), as cron would run it."""
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=env or command_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "marker.txt"


def runs(marker: Path, word: str) -> int:
    if not marker.exists():
        return 0
    return sum(1 for line in marker.read_text().splitlines() if line.split()[0] == word)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


def launch(
    started: list[subprocess.Popen[str]], command: list[str], env: dict[str, str]
) -> subprocess.Popen[str]:
    """Start ``command`` in the project's root, its output piped as text; add it to
    ``started`` (a list that tests.helpers.reaped cleans up)."""
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    started.append(process)
    return process


def start(
    processes: list[subprocess.Popen[str]], alias: str, *args: str, env: dict[str, str]
) -> subprocess.Popen[str]:
    return launch(processes, argv(alias, *args), env)


def handles(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler of its own for ``signum`` (Linux's
    /proc/PID/status, SigCgt: the signals it catches)."""
    for field in Path(f"/proc/{pid}/status").read_text().splitlines():
        if field.startswith("SigCgt:"):
            return bool(int(field.split()[1], 16) >> (signum - 1) & 1)
    return False


def wait_for(predicate: object, timeout: float = 60) -> None:
    """Until ``predicate()`` holds (else AssertionError after ``timeout`` seconds): asked
    at once, then at intervals growing from 20 ms to 200 ms, so that a long wait (most
    are for slots and leases, seconds away) is not a query every 50 ms on a busy machine."""
    deadline = time.monotonic() + timeout
    pause = 0.02
    while time.monotonic() < deadline:
        if callable(predicate) and predicate():
            return
        time.sleep(pause)
        pause = min(pause * 1.5, 0.2)
    raise AssertionError("condition not reached in time")


# --- exit codes -----------------------------------------------------------------------


def test_job_runs_and_exits_0(alias: str, marker: Path) -> None:
    result = manage(alias, "quick", env=command_env(marker))
    assert result.returncode == 0, result.stderr
    assert runs(marker, "quick") == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("acquired quick token=1 holder=")
    assert lines[1].startswith("finished quick status=succeeded")
    assert JobLock.objects.using(alias).free().filter(name="quick").exists()


@pytest.mark.parametrize(
    ("flag", "expected"), [((), "keepalive=True"), (("--no-keepalive",), "keepalive=False")]
)
def test_keepalive_option_overrides_the_default(
    alias: str, marker: Path, flag: tuple[str, ...], expected: str
) -> None:
    result = manage(alias, "keepalive_probe", *flag, env=command_env(marker))
    assert result.returncode == 0, result.stderr
    assert marker.read_text().split()[0] == expected


def test_skip_exits_0_with_one_line_saying_who_holds_it(alias: str, marker: Path) -> None:
    with other_holder(alias) as other:
        other.try_acquire("quick", ttl=60)
        result = manage(alias, "quick", env=command_env(marker))
        quiet = manage(alias, "quick", "--verbosity", "0", env=command_env(marker))
        custom = manage(alias, "quick", "--skipped-exit-code", "75", env=command_env(marker))
    assert result.returncode == 0
    assert result.stdout.splitlines() == [
        line for line in result.stdout.splitlines() if line.startswith("skipped quick: held by")
    ]
    assert other.holder in result.stdout
    assert result.stderr == ""
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")
    assert custom.returncode == 75
    assert runs(marker, "quick") == 0


def test_failing_job_exits_1_and_releases(alias: str, marker: Path) -> None:
    result = manage(alias, "broken", env=command_env(marker))
    assert result.returncode == 1
    assert runs(marker, "broken") == 1
    assert "RuntimeError: the report server said no" in result.stderr
    assert "status=failed" in result.stderr
    assert JobLock.objects.using(alias).free().filter(name="broken").exists()


def test_async_job_runs(alias: str, marker: Path) -> None:
    result = manage(alias, "async_quick", env=command_env(marker))
    assert result.returncode == 0, result.stderr
    assert runs(marker, "async_quick") == 1


def test_management_command_target_with_its_arguments(alias: str, marker: Path) -> None:
    result = manage(alias, "touch_marker", "hello", env=command_env(marker))
    assert result.returncode == 0, result.stderr
    assert runs(marker, "hello") == 1
    assert JobLock.objects.using(alias).filter(name="touch_marker").exists()


def test_child_program_exit_code_is_passed_through(alias: str, marker: Path) -> None:
    ok = manage(alias, "backup", "--", "sh", "-c", f"echo child >> {marker}")
    failed = manage(alias, "backup", "--", "sh", "-c", "exit 7")
    assert ok.returncode == 0, ok.stderr
    assert runs(marker, "child") == 1
    assert failed.returncode == 7
    assert "exit=7" in failed.stderr
    assert JobLock.objects.using(alias).get(name="backup").token == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nope",), "Unknown job 'nope'"),
        (("quick", "--ttl", "soon"), "is not a duration"),
        (("quick", "--ttl", "0"), "ttl must be positive"),
        (("quick", "--ttl", "10", "--min-hold", "20"), "longer than ttl"),
        (("quick", "--bogus"), "Unknown option(s): --bogus"),
        (("backup", "--", "no-such-program-xyz"), "was not found"),
        (("backup", "--"), "Nothing after '--'"),
        ((), "Give the job's NAME"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    alias: str, marker: Path, args: tuple[str, ...], message: str
) -> None:
    result = manage(alias, *args, env=command_env(marker))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if "rror" in line]
    assert len(error_lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert not marker.exists()
    assert not JobLock.objects.using(alias).exists()


def test_unknown_database_alias_exits_2(marker: Path) -> None:
    result = django_admin("run_exclusive", "quick", "--database", "nope", env=command_env(marker))
    assert result.returncode == 2
    assert "Unknown database alias 'nope'" in result.stderr
    assert not marker.exists()


def test_unmigrated_database_exits_2_and_says_run_migrate(tmp_path: Path, marker: Path) -> None:
    env = command_env(marker)
    env.pop("EXCLUSIVE_JOBS_TEST_DB_NAMES", None)
    env["EXCLUSIVE_JOBS_TEST_DB_NAMES"] = f'{{"default": "{tmp_path / "empty.sqlite3"}"}}'
    result = manage("default", "quick", env=env)
    assert result.returncode == 2, result.stderr
    assert "run 'manage.py migrate" in result.stderr
    assert "Traceback" not in result.stderr
    assert not marker.exists()


def test_unreachable_database_exits_3_and_does_not_run(marker: Path) -> None:
    env = command_env(marker, CI="1", TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:9/none")
    env.pop("EXCLUSIVE_JOBS_TEST_DB_NAMES")
    result = manage("postgres", "quick", env=env)
    assert result.returncode == 3, result.stderr
    assert "Cannot reach database 'postgres'" in result.stderr
    assert "The job was not run." in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not marker.exists()


# --- races, signals, crashes ----------------------------------------------------------


@pytest.mark.slow
def test_ten_processes_started_together_one_runs(
    alias: str, marker: Path, processes: list[subprocess.Popen[str]]
) -> None:
    env = command_env(marker)
    for _ in range(10):
        start(processes, alias, "quick", "--min-hold", "60", "--ttl", "60", env=env)
    results = [process.communicate(timeout=120) for process in processes]
    assert [process.returncode for process in processes] == [0] * 10
    assert runs(marker, "quick") == 1
    skips = [out for out, _err in results if out.startswith("skipped quick: held by")]
    assert len(skips) == 9


def test_sigterm_stops_job_releases_lock_and_exits_143(
    alias: str, marker: Path, processes: list[subprocess.Popen[str]]
) -> None:
    env = command_env(marker, JOB_SECONDS="30")
    holder = start(processes, alias, "slow", "--ttl", "30", env=env)
    wait_for(lambda: runs(marker, "slow-start") == 1)
    holder.send_signal(signal.SIGTERM)
    _out, err = holder.communicate(timeout=60)
    assert holder.returncode == 128 + signal.SIGTERM
    assert "status=interrupted" in err
    assert runs(marker, "slow-end") == 0
    # released at once (no min_hold): the next run starts straight away
    again = manage(alias, "quick", env=env)
    follow = manage(alias, "slow", env=command_env(marker, JOB_SECONDS="0"))
    assert again.returncode == 0
    assert follow.returncode == 0, follow.stderr
    assert follow.stdout.startswith("acquired slow token=2")


def test_sigterm_while_waiting_for_the_lock_stops_at_once_and_uses_no_slot(
    alias: str, marker: Path, processes: list[subprocess.Popen[str]]
) -> None:
    with other_holder(alias) as other:
        assert other.try_acquire("quick", ttl=120) is not None
        waiting = start(
            processes, alias, "quick", "--wait", "60", "--every", "1h", env=command_env(marker)
        )
        # Django is up and the command is in its wait loop (a fixed 3 s was not always
        # enough on a loaded machine: the SIGTERM came before the command handled it)
        wait_for(lambda: handles(waiting.pid, signal.SIGTERM), timeout=60)
        time.sleep(1)
        began = time.monotonic()
        waiting.send_signal(signal.SIGTERM)
        waiting.communicate(timeout=30)
        assert time.monotonic() - began < 5  # not after the 60 s wait
    assert waiting.returncode == 128 + signal.SIGTERM
    assert runs(marker, "quick") == 0
    assert not JobRun.objects.using(alias).filter(name="quick").exists()  # the slot is free


def test_sigterm_is_passed_to_a_child_program(
    alias: str, tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    ready = tmp_path / "ready"
    script = f"trap 'echo got-term > {tmp_path}/term; exit 0' TERM; touch {ready}; sleep 30 & wait"
    holder = start(processes, alias, "child", "--", "sh", "-c", script, env=command_env())
    wait_for(ready.exists)
    holder.send_signal(signal.SIGTERM)
    holder.communicate(timeout=60)
    assert holder.returncode == 143
    assert (tmp_path / "term").read_text().strip() == "got-term"
    assert JobLock.objects.using(alias).free().filter(name="child").exists()


def test_kill_9_leaves_lock_until_lease_ends(
    alias: str, marker: Path, processes: list[subprocess.Popen[str]]
) -> None:
    env = command_env(marker, JOB_SECONDS="30")
    holder = start(processes, alias, "slow", "--ttl", "3", env=env)
    wait_for(lambda: runs(marker, "slow-start") == 1)
    holder.kill()
    holder.communicate(timeout=30)
    quick_env = command_env(marker, JOB_SECONDS="0")
    blocked = manage(alias, "slow", env=quick_env)
    assert blocked.returncode == 0
    assert blocked.stdout.startswith("skipped slow: held by")
    wait_for(lambda: JobLock.objects.using(alias).stale().filter(name="slow").exists(), 30)
    after = manage(alias, "slow", env=quick_env)
    assert after.returncode == 0
    assert after.stdout.startswith("acquired slow token=2")
    assert runs(marker, "slow-end") == 1


def test_wait_acquires_when_the_holder_finishes(
    alias: str, marker: Path, processes: list[subprocess.Popen[str]]
) -> None:
    holder = start(processes, alias, "slow", env=command_env(marker, JOB_SECONDS="2"))
    wait_for(lambda: runs(marker, "slow-start") == 1)
    waiter = manage(alias, "quick", env=command_env(marker))  # another job is not blocked
    assert runs(marker, "quick") == 1
    waited = manage(alias, "slow", "--wait", "20", env=command_env(marker, JOB_SECONDS="0"))
    holder.communicate(timeout=60)
    assert waiter.returncode == 0
    assert waited.returncode == 0, waited.stderr
    assert waited.stdout.startswith("acquired slow token=2")
    assert runs(marker, "slow-end") == 2


def test_lost_lock_kills_child_and_exits_4(
    alias: str, tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    ready = tmp_path / "ready"
    script = f"touch {ready}; sleep 60"
    holder = start(
        processes,
        alias,
        "guarded",
        "--ttl",
        "1.5",
        "--grace",
        "1",
        "--",
        "sh",
        "-c",
        script,
        env=command_env(),
    )
    wait_for(ready.exists)
    started = time.monotonic()
    assert force_release("guarded", using=alias)  # an operator clears it
    _out, err = holder.communicate(timeout=60)
    assert holder.returncode == 4, err
    assert "status=lost" in err
    assert time.monotonic() - started < 30


def test_list_shows_registered_jobs() -> None:
    result = django_admin("run_exclusive", "--list")
    assert result.returncode == 0
    names = [line.split()[0] for line in result.stdout.splitlines()]
    assert names == [
        "async_quick",
        "backfill_hourly",
        "backfill_slotless",
        "broken",
        "celery_beat",
        "celery_tick",
        "crash",
        "customer_report",
        "digest",
        "enqueue_now",
        "enqueue_tick",
        "fenced",
        "flaky_retry",
        "gil_hog",
        "group_skip",
        "group_wait",
        "jittery",
        "keepalive_probe",
        "light_async",
        "light_broken",
        "light_tick",
        "long_tick",
        "overlong",
        "overrun",
        "quick",
        "run_facts",
        "slow",
        "spin",
        "steady",
        "summary:daily",
        "summary:weekly",
        "superseded",
        "tick",
        "tick_all",
        "tick_retry",
        "tick_skip",
    ]


def test_help_documents_exit_codes() -> None:
    result = django_admin("help", "run_exclusive")
    for code in ("0 ", "1 ", "2 ", "3 ", "4 ", "124", "128+N"):
        assert f"\n  {code}" in result.stdout
    assert settings.ROOT_URLCONF  # the settings module really loaded


def test_every_option_runs_a_slot_once_across_separate_starts(alias: str, marker: Path) -> None:
    env = command_env(marker)
    first = manage(alias, "quick", "--every", "1h", env=env)
    late = manage(alias, "quick", "--every", "1h", env=env)
    assert first.returncode == 0, first.stderr
    assert " slot=" in first.stdout
    assert late.returncode == 0
    assert late.stdout.startswith("skipped quick: slot ")
    assert "already run by" in late.stdout
    assert runs(marker, "quick") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("quick", "--cron", "61 * * * *"), "is not valid"),
        (("quick", "--cron", "0 * * * *", "--every", "1h"), "not both"),
        (("quick", "--cron", "0 * * * *", "--timezone", "Nowhere/Land"), "Unknown time zone"),
        (("quick", "--every", "0.5"), "at least 1s"),
    ],
)
def test_bad_schedule_options_exit_2(
    alias: str, marker: Path, args: tuple[str, ...], message: str
) -> None:
    result = manage(alias, *args, env=command_env(marker))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not marker.exists()
    assert not JobLock.objects.using(alias).exists()


@pytest.mark.parametrize(
    ("logging_setting", "job", "stream", "line"),
    [
        ("LOGGING = {}", "broken", "stderr", "finished broken status=failed"),
        ("LOGGING = {}", "quick", "stdout", "finished quick status=succeeded"),
        ("from tests.settings import LOGGING", "broken", "stderr", "finished broken status=failed"),
    ],
    ids=["no-logging-failed", "no-logging-succeeded", "project-logging-failed"],
)
def test_each_decision_is_one_line_whatever_the_logging(
    alias: str, tmp_path: Path, logging_setting: str, job: str, stream: str, line: str
) -> None:
    """As with `startproject` settings (no LOGGING) or a project that logs our lines."""
    (tmp_path / "one_line_settings.py").write_text(
        f"from tests.settings import *  # noqa: F403\n{logging_setting}\n"
    )
    env = command_env(DJANGO_SETTINGS_MODULE="one_line_settings")
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    result = manage(alias, job, env=env)
    both = result.stdout + result.stderr
    assert both.count(line) == 1, both
    assert line in getattr(result, stream)
    if logging_setting == "LOGGING = {}":  # the project's own logging may add a traceback
        assert "Traceback" not in result.stderr

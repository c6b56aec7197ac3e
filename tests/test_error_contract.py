"""One error contract for every command: each condition an operator meets is one line on
standard error and the exit code of the table in docs/reference/commands.md.

Every command (each action of it) runs as a real process against each condition: the
database cannot be reached (PostgreSQL and MariaDB on a closed port), it is not migrated
(a new SQLite file), a ``jobs.py`` fails at start-up (tests.brokenjobs), an option has a
bad value. No condition needs a test database, so all the processes start at once, in
one fixture; each test reads its own.
"""

from __future__ import annotations

import json
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_exclusive_jobs.checks import check_jobs, configuration_error
from django_exclusive_jobs.run import registry

from .test_command import ROOT, command_env, django_admin

pytestmark = pytest.mark.no_deadline  # CPU only, no deadline: nice 10 (tests/cpu_report.py)

# Every command of the app, each action once: the name of the case and its arguments.
COMMANDS = {
    "run_exclusive": ("run_exclusive", "quick"),
    "scheduler": ("exclusive_scheduler",),
    "jobs-list": ("exclusive_jobs",),
    "jobs-json": ("exclusive_jobs", "--json"),
    "jobs-check": ("exclusive_jobs", "--check"),
    "jobs-pause": ("exclusive_jobs", "pause", "quick"),
    "jobs-resume": ("exclusive_jobs", "resume", "quick"),
    "jobs-run": ("exclusive_jobs", "run", "quick"),
    "locks-list": ("exclusive_locks", "list", "--json"),
    "locks-release": ("exclusive_locks", "force-release", "quick"),
    "locks-release-stale": ("exclusive_locks", "force-release", "--stale"),
    "prune": ("prune_job_runs",),
}
BROKEN_JOBS = ROOT / "tests" / "brokenjobs" / "jobs.py"
MIGRATE = "run 'manage.py migrate django_exclusive_jobs'."


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    code: int
    line: str  # the one line on stderr starts with this
    contains: str = ""  # ... and has this in it
    env: dict[str, str] = field(default_factory=dict)
    database: str | None = "default"  # --database
    waits: bool = False  # a scheduler waiting for the database: it is stopped


@dataclass(frozen=True)
class Outcome:
    code: int | None
    lines: list[str]  # stderr's lines (a waiting scheduler: those before it was stopped)
    stderr: str
    running: bool = False  # a waiting scheduler was still running when stopped


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def line_of(text: str) -> int:
    """The line of tests/brokenjobs/jobs.py that has ``text``."""
    lines = BROKEN_JOBS.read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if text in line)


def unreachable(alias: str, port: int) -> dict[str, Case]:
    # CI=1 keeps tests/settings.py from leaving out an alias it cannot reach.
    env = {
        "CI": "1",
        "TEST_POSTGRES_URL": f"postgres://postgres@127.0.0.1:{port}/unused",
        "TEST_MYSQL_URL": f"mysql://root@127.0.0.1:{port}/unused",
    }
    cases = {
        f"unreachable-{alias}-{name}": Case(
            args, 3, f"CommandError: Cannot reach database '{alias}': ", env=env, database=alias
        )
        for name, args in COMMANDS.items()
    }
    # The scheduler waits for the database (docs/scheduler.md): one line, not an exit.
    cases[f"unreachable-{alias}-scheduler"] = Case(
        COMMANDS["scheduler"],
        0,
        "database unreachable, retrying with backoff: ",
        env=env,
        database=alias,
        waits=True,
    )
    return cases


# A jobs.py that fails at start-up, each way: the line of tests/brokenjobs/jobs.py that
# fails (found by this text), the job it names, and what the line says.
STARTUP = {
    "import": ("raise ImportError", None, "ImportError: No module named 'reportlab'"),
    "cron": ('cron="61', "nightly_report", "Cron expression '61 * * * *' is not valid"),
    "every": ('every="often"', "ticker", "every 'often' is not a duration"),
    "ttl": ("ttl=-1", "report", "ttl must be positive, got -1s."),
    "duplicate": (
        '@exclusive_job("quick")',
        "quick",
        "Two jobs are named 'quick': tests.testapp.jobs.quick and tests.brokenjobs.jobs.quick.",
    ),
    "kwargs-unknown": (
        'kwargs={"perod"',
        "report",
        "kwargs {'perod': 'day'} do not fit report(period, slot=None): unknown argument 'perod'.",
    ),
    "kwargs-missing": (
        'schedules={"weekly"',
        "report",
        "Schedule 'weekly': kwargs {} do not fit report(period, slot=None): missing a "
        "required argument: 'period'.",
    ),
    "kwargs-json": (
        'kwargs={"period": ("day"',
        "report",
        "kwargs {'period': ('day', 'week')} are not JSON: the run history stores them",
    ),
}

# A bad option value or usage of each command: one line (argparse's, for what argparse
# checks), exit 2.
BAD_OPTIONS = {
    "run_exclusive-ttl": (("run_exclusive", "quick", "--ttl", "soon"), "argument --ttl: "),
    "run_exclusive-cron": (
        ("run_exclusive", "quick", "--cron", "61 * * * *"),
        "CommandError: Cron expression '61 * * * *' is not valid",
    ),
    "scheduler-max-concurrent": (
        ("exclusive_scheduler", "--max-concurrent", "0"),
        "argument --max-concurrent: ",
    ),
    "scheduler-grace": (("exclusive_scheduler", "--grace", "soon"), "argument --grace: "),
    "jobs-action": (("exclusive_jobs", "start", "quick"), "argument action: invalid choice"),
    "jobs-unknown-option": (("exclusive_jobs", "--check", "--quiet"), "unrecognized arguments"),
    "jobs-run-no-value": (("exclusive_jobs", "run", "quick", "--by"), "argument --by: "),
    "jobs-run-no-name": (("exclusive_jobs", "run"), "CommandError: run needs the job's NAME."),
    "locks-action": (("exclusive_locks", "release", "x"), "argument action: invalid choice"),
    "locks-both": (
        ("exclusive_locks", "force-release", "x", "--stale"),
        "CommandError: force-release takes a NAME or --stale",
    ),
    "prune-older-than": (("prune_job_runs", "--older-than", "soon"), "argument --older-than: "),
    "prune-negative": (("prune_job_runs", "--older-than=-1d"), "argument --older-than: "),
}


def all_cases() -> dict[str, Case]:
    """Each case by name. The alias ``default`` is a new SQLite file (see ``start``)."""
    port = closed_port()
    cases = {**unreachable("postgres", port), **unreachable("mysql", port)}
    for name, args in COMMANDS.items():
        cases[f"not-migrated-{name}"] = Case(
            args,
            2,
            "CommandError: The lock table does not exist on database 'default': ",
            contains=MIGRATE,
        )
    # An unknown database alias: each command once (the actions share the option).
    for name in ("run_exclusive", "scheduler", "jobs-run", "locks-list", "prune"):
        cases[f"unknown-alias-{name}"] = Case(
            COMMANDS[name],
            2,
            "CommandError: Unknown database alias 'nope' for the lock table",
            database="nope",
        )
    # A broken jobs.py: every command refuses; each other kind of fault, through one.
    for fault, (text, job, message) in STARTUP.items():
        where = f"tests/brokenjobs/jobs.py:{line_of(text)}"
        named = f"Job {job!r} ({where}): " if job else f"{where}: "
        env = {"DJANGO_SETTINGS_MODULE": "tests.settings_broken", "BROKEN_JOBS": fault}
        for name in COMMANDS if fault == "import" else ("scheduler",):
            cases[f"startup-{fault}-{name}"] = Case(
                COMMANDS[name],
                2,
                f"CommandError: {named}{message}",
                contains="(django_exclusive_jobs.E014)",
                env=env,
            )
    for name, (args, says) in BAD_OPTIONS.items():
        if not says.startswith("CommandError"):  # argparse's: "PROG COMMAND: error: ..."
            says = f" {args[0]}: error: {says}"
        cases[f"bad-option-{name}"] = Case(args, 2, "", says, database=None)
    return cases


CASES = all_cases()


def start(case: Case, tmp: Path) -> Outcome:
    """Run ``case``'s command with ``default`` on a new SQLite file in ``tmp``."""
    empty = json.dumps({"default": str(tmp / "empty.sqlite3")})
    env = command_env(EXCLUSIVE_JOBS_TEST_DB_NAMES=empty, **case.env)
    database = () if case.database is None else ("--database", case.database)
    process = subprocess.Popen(
        [sys.executable, "-m", "django", *case.args, *database],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        if not case.waits:
            _, err = process.communicate(timeout=60)
            return Outcome(process.returncode, err.splitlines(), err)
        # A waiting scheduler: its line, then still running a second later; then stopped.
        assert process.stderr is not None
        ready, _, _ = select.select([process.stderr], [], [], 60)
        first = [process.stderr.readline().rstrip("\n")] if ready else []
        more, _, _ = select.select([process.stderr], [], [], 1.0)
        running = process.poll() is None and not more
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
        return Outcome(process.returncode, first, "\n".join(first) + "\n" + err, running)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Outcome]]:
    tmp = tmp_path_factory.mktemp("contract")
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = {name: pool.submit(start, case, tmp) for name, case in CASES.items()}
        yield {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_each_condition_is_one_line_and_its_exit_code(
    outcomes: dict[str, Outcome], name: str
) -> None:
    case, outcome = CASES[name], outcomes[name]
    assert "Traceback" not in outcome.stderr, outcome.stderr
    assert outcome.code == case.code, outcome.stderr
    [line] = outcome.lines
    assert line.startswith(case.line), line
    assert case.contains in line, line
    if case.waits:
        assert outcome.running, outcome.stderr


# --- start-up problems: Django's own commands, the check, what registers -------------------


def broken(fault: str = "import", *args: str) -> subprocess.CompletedProcess[str]:
    env = command_env(DJANGO_SETTINGS_MODULE="tests.settings_broken", BROKEN_JOBS=fault)
    return django_admin(*args, env=env, timeout=60)


def test_manage_py_check_reports_a_broken_jobs_module_as_e014() -> None:
    result = broken("ttl", "check")
    assert result.returncode == 1, result.stderr
    where = f"tests/brokenjobs/jobs.py:{line_of('ttl=-1')}"
    assert (
        f"(django_exclusive_jobs.E014) Job 'report' ({where}): ttl must be positive"
        in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_a_broken_jobs_module_leaves_django_and_the_other_apps_jobs_working() -> None:
    """django.setup() does not fail (a command without checks runs); the other apps' jobs
    register, the broken module's own are taken out again."""
    code = (
        "from django_exclusive_jobs.run.registry import get_job;"
        "print(get_job('quick').target, get_job('broken_module_job'))"
    )
    result = broken("duplicate", "shell", "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "tests.testapp.jobs.quick None"


def test_check_jobs_and_the_commands_line_name_each_problem(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    problems = [
        registry.StartupProblem("report", "app/jobs.py", 7, "ttl must be positive, got -1s."),
        registry.StartupProblem(None, "other/jobs.py", 1, "ImportError: No module named 'x'"),
    ]
    monkeypatch.setattr(registry, "startup_problems", problems)
    messages = check_jobs()
    assert [message.id for message in messages] == ["django_exclusive_jobs.E014"] * 2
    assert messages[0].msg == "Job 'report' (app/jobs.py:7): ttl must be positive, got -1s."
    assert messages[1].msg == "other/jobs.py:1: ImportError: No module named 'x'"
    assert configuration_error() == (
        f"{messages[0].msg} (django_exclusive_jobs.E014) And 1 more: 'manage.py check' lists them."
    )
    with pytest.raises(CommandError, match=r"E014") as refused:
        call_command("exclusive_locks")
    assert refused.value.returncode == 2


def test_a_clean_start_has_no_problem() -> None:
    assert check_jobs() == []
    assert configuration_error() is None


# --- one failure, one line --------------------------------------------------------------


def test_a_manual_run_that_fails_prints_its_failure_once_without_logging(
    tmp_path: Path,
) -> None:
    """As in a `startproject` project (no LOGGING): the library's log records must not
    reach Python's last-resort handler beside the command's own line."""
    (tmp_path / "no_logging.py").write_text(
        "from tests.settings import *  # noqa: F403\nLOGGING = {}\n"
    )
    names = json.dumps({"default": str(tmp_path / "db.sqlite3")})
    env = command_env(DJANGO_SETTINGS_MODULE="no_logging", EXCLUSIVE_JOBS_TEST_DB_NAMES=names)
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return django_admin(*args, env=env)

    assert run("migrate", "-v", "0").returncode == 0
    for args in (("exclusive_jobs", "run", "broken"), ("run_exclusive", "broken")):
        result = run(*args)
        assert result.returncode == 1, result.stderr
        [line] = result.stderr.splitlines()
        assert line.startswith("finished broken status=failed "), line
        assert line.endswith(" error=RuntimeError: the report server said no"), line
        assert result.stdout.startswith("acquired broken ")
        assert "finished" not in result.stdout

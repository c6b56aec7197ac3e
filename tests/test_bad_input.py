"""The catalogue of bad input to `manage.py run_exclusive`, each in a real process.

Every case must exit with the documented code (2 for usage and configuration errors)
after one clear line on stderr and no traceback, having run nothing and written no lock
or run row. Errors argparse finds itself are its one line too (no usage block).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from django_exclusive_jobs.models import JobLock, JobRun

from .test_command import ROOT, command_env

pytestmark = pytest.mark.no_deadline  # CPU only, no deadline: nice 10 (tests/cpu_report.py)

Prepare = Callable[[Path, dict[str, str]], None]


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    message: str  # a part of the one line that must say what is wrong
    child: bool = False  # run a child program that leaves a trace (NAME is then the lock's)
    prepare: Prepare | None = None  # adjusts the environment (settings, database)
    database: str | None = None  # --database value; None: the backend under test


# A project with a hundred jobs: an unknown name must not list them all.
MANY_JOBS = (
    "from django_exclusive_jobs import exclusive_job\n"
    "for number in range(100):\n"
    "    exclusive_job(f'report_{number:02d}')(lambda: None)\n"
)


def writes_marker(marker: Path) -> list[str]:
    """A child program that leaves a trace if it ever runs."""
    return ["sh", "-c", f"echo ran >> {marker}"]


def empty_sqlite(tmp_path: Path, env: dict[str, str]) -> None:
    """Point the `default` alias at a SQLite file nobody migrated."""
    names = json.loads(env["EXCLUSIVE_JOBS_TEST_DB_NAMES"])
    names["default"] = str(tmp_path / "empty.sqlite3")
    env["EXCLUSIVE_JOBS_TEST_DB_NAMES"] = json.dumps(names)


def settings_with(body: str, *, jobs: str | None = None) -> Prepare:
    """A settings module in tmp_path: the test settings plus ``body``, and optionally an
    app ``extrajobs`` whose jobs.py is ``jobs``."""

    def prepare(tmp_path: Path, env: dict[str, str]) -> None:
        text = "from tests.settings import *  # noqa: F403\n" + body + "\n"
        if jobs is not None:
            app = tmp_path / "extrajobs"
            app.mkdir()
            (app / "__init__.py").write_text("")
            (app / "jobs.py").write_text(jobs)
            text += 'INSTALLED_APPS = [*INSTALLED_APPS, "extrajobs"]  # noqa: F405\n'
        (tmp_path / "bad_input_settings.py").write_text(text)
        env["PYTHONPATH"] = f"{ROOT}:{tmp_path}"
        env["DJANGO_SETTINGS_MODULE"] = "bad_input_settings"

    return prepare


def bug(reason: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, reason=f"BUG: {reason}")


CASES = [
    # names
    pytest.param(Case(("",), "Give the job's NAME"), id="name-empty"),
    pytest.param(Case(("x" * 256,), "the limit is 255", child=True), id="name-too-long"),
    pytest.param(
        Case(("bad\x07name",), "contains a control character", child=True), id="name-bell"
    ),
    pytest.param(
        Case(("two\nlines",), "contains a control character", child=True), id="name-newline"
    ),
    pytest.param(Case(("\tname",), "contains a control character", child=True), id="name-tab"),
    pytest.param(
        Case((" report",), "must not start or end with white", child=True), id="name-leading-space"
    ),
    pytest.param(
        Case(("report ",), "must not start or end with white", child=True), id="name-trailing-space"
    ),
    # durations
    pytest.param(Case(("quick", "--ttl", "soon"), "'soon' is not a duration"), id="ttl-word"),
    pytest.param(Case(("quick", "--ttl", "0"), "ttl must be positive"), id="ttl-zero"),
    pytest.param(Case(("quick", "--ttl", "-5"), "ttl must be positive"), id="ttl-negative"),
    pytest.param(Case(("quick", "--ttl", "inf"), "'inf' is not a duration"), id="ttl-inf"),
    pytest.param(Case(("quick", "--ttl", "nan"), "'nan' is not a duration"), id="ttl-nan"),
    pytest.param(
        Case(("quick", "--ttl", "9999999999d"), "too long"),
        id="ttl-overflow",
    ),
    pytest.param(
        Case(("quick", "--ttl", "1ms"), "ttl"),
        id="ttl-1ms",
    ),
    pytest.param(Case(("quick", "--min-hold", "-1"), "must not be negative"), id="hold-negative"),
    pytest.param(
        Case(("quick", "--ttl", "10", "--min-hold", "20"), "longer than ttl"), id="hold-over-ttl"
    ),
    pytest.param(Case(("quick", "--min-hold", "1x"), "is not a duration"), id="hold-word"),
    pytest.param(Case(("quick", "--wait", "-1"), "wait must not be negative"), id="wait-negative"),
    pytest.param(Case(("quick", "--wait", "later"), "is not a duration"), id="wait-word"),
    pytest.param(Case(("quick", "--grace", "soon"), "is not a duration"), id="grace-word"),
    pytest.param(
        Case(("backup", "--grace=-1"), "grace", child=True),
        id="grace-negative",
    ),
    pytest.param(Case(("quick", "--every", "0"), "at least 1s"), id="every-zero"),
    pytest.param(Case(("quick", "--every", "0.5"), "at least 1s"), id="every-subsecond"),
    pytest.param(Case(("quick", "--every=-1h"), "is not a duration"), id="every-negative"),
    pytest.param(Case(("quick", "--every", "hourly"), "is not a duration"), id="every-word"),
    pytest.param(
        Case(("quick", "--every", "1h", "--slot-tolerance=-5"), "must not be negative"),
        id="tolerance-negative",
    ),
    pytest.param(
        Case(("quick", "--every", "1h", "--slot-tolerance", "x"), "is not a duration"),
        id="tolerance-word",
    ),
    pytest.param(
        Case(("quick", "--skipped-exit-code", "abc"), "invalid int value"), id="skip-code-word"
    ),
    pytest.param(
        Case(("quick", "--skipped-exit-code", "256"), "skipped-exit-code"),
        id="skip-code-out-of-range",
    ),
    # cron
    pytest.param(Case(("quick", "--cron", "* * * *"), "must have 5 fields"), id="cron-4-fields"),
    pytest.param(
        Case(("quick", "--cron", "* * * * * *"), "must have 5 fields"), id="cron-6-fields"
    ),
    pytest.param(Case(("quick", "--cron", ""), "must have 5 fields"), id="cron-empty"),
    pytest.param(
        Case(("quick", "--cron", "@reboot"), "@reboot is not a schedule"), id="cron-reboot"
    ),
    pytest.param(Case(("quick", "--cron", "61 * * * *"), "is not valid"), id="cron-minute-61"),
    pytest.param(Case(("quick", "--cron", "0 25 * * *"), "is not valid"), id="cron-hour-25"),
    pytest.param(Case(("quick", "--cron", "0 0 32 * *"), "is not valid"), id="cron-day-32"),
    pytest.param(Case(("quick", "--cron", "0 0 * 13 *"), "is not valid"), id="cron-month-13"),
    pytest.param(
        Case(("quick", "--cron", "0 * * * *", "--timezone", "Nowhere/Land"), "Unknown time zone"),
        id="cron-bad-timezone",
    ),
    pytest.param(
        Case(("quick", "--cron", "0 * * * *", "--timezone", "../../etc/passwd"), "Unknown time"),
        id="cron-timezone-path",
    ),
    # option combinations
    pytest.param(
        Case(("quick", "--every", "1h", "--cron", "0 * * * *"), "not both"), id="every-and-cron"
    ),
    pytest.param(
        Case(("quick", "--timezone", "Europe/Paris"), "only applies to a cron"),
        id="timezone-without-cron",
    ),
    pytest.param(
        Case(("quick", "--slot-tolerance", "5s"), "only applies with every"),
        id="tolerance-without-schedule",
    ),
    pytest.param(
        Case(("quick", "--retries", "2"), "--retries only applies with --every or --cron"),
        id="retries-without-schedule",
    ),
    pytest.param(
        Case(("quick", "--every", "1h", "--retries", "-1"), "retries must be from 0 to 100"),
        id="negative-retries",
    ),
    pytest.param(
        Case(("quick", "--retry-failed"), "Unknown option(s): --retry-failed"),
        id="retry-failed-is-gone",
    ),
    pytest.param(Case(("quick", "--bogus"), "Unknown option(s): --bogus"), id="unknown-option"),
    pytest.param(Case(("quick", "surplus"), "Unknown option(s): surplus"), id="surplus-argument"),
    pytest.param(Case(("backup", "--", "no-such-program-xyz"), "was not found"), id="no-program"),
    pytest.param(Case(("backup", "--"), "Nothing after '--'"), id="nothing-after-dashes"),
    # jobs
    pytest.param(Case(("nope",), "Unknown job 'nope'"), id="unknown-job"),
    pytest.param(Case(("Quick",), "Unknown job 'Quick'"), id="unknown-job-case"),
    pytest.param(Case(("quik",), "Did you mean 'quick'?"), id="unknown-job-suggests"),
    pytest.param(Case(("quik",), "run_exclusive --list' shows all"), id="unknown-job-lists-how"),
    pytest.param(
        Case(("report_5x",), "shows all 1", prepare=settings_with("", jobs=MANY_JOBS)),
        id="unknown-job-among-many",
    ),
    pytest.param(Case(("run_exclusive",), "Unknown job 'run_exclusive'"), id="job-is-itself"),
    # databases and settings
    pytest.param(
        Case(("quick",), "Unknown database alias 'nope'", database="nope"), id="unknown-alias"
    ),
    pytest.param(
        Case(("quick",), "Unknown database alias ''", database=""),
        id="empty-alias",
    ),
    pytest.param(
        Case(("quick",), "run 'manage.py migrate", prepare=empty_sqlite, database="default"),
        id="unmigrated-database",
    ),
    pytest.param(
        Case(("quick",), "E003", prepare=settings_with("EXCLUSIVE_JOBS = {'TTL': 'soon'}")),
        id="setting-bad-ttl",
    ),
    pytest.param(
        Case(("quick",), "E002", prepare=settings_with("EXCLUSIVE_JOBS = {'TLL': '5m'}")),
        id="setting-unknown-key",
    ),
    pytest.param(
        Case(("quick",), "E006", prepare=settings_with("EXCLUSIVE_JOBS = {'DATABASE': 'x'}")),
        id="setting-unknown-database",
    ),
    pytest.param(
        Case(("quick",), "E001", prepare=settings_with("EXCLUSIVE_JOBS = ['TTL', '5m']")),
        id="setting-not-a-dict",
    ),
]

# Where discovery fails, Django still starts (see autodiscover()); the command refuses
# with the problem's one line (check E014), naming the job and where it is declared.
STARTUP_FAILURES = [
    pytest.param(
        settings_with("", jobs="raise ImportError('No module named reportlab')\n"),
        "CommandError: extrajobs/jobs.py:1: ImportError: No module named reportlab "
        "(django_exclusive_jobs.E014)",
        id="jobs-module-import-error",
    ),
    pytest.param(
        settings_with(
            "",
            jobs="from django_exclusive_jobs import exclusive_job\n\n"
            "@exclusive_job('report', ttl=-1)\ndef report():\n    pass\n",
        ),
        "CommandError: Job 'report' (extrajobs/jobs.py:3): ttl must be positive, got -1s. "
        "(django_exclusive_jobs.E014)",
        id="jobs-module-bad-decorator",
    ),
]


def run_command(
    alias: str, case: Case, tmp_path: Path, marker: Path
) -> subprocess.CompletedProcess[str]:
    env = command_env(marker)
    if case.prepare is not None:
        case.prepare(tmp_path, env)
    args = list(case.args)
    program: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, program = args[:cut], args[cut:]
    if case.child:
        program = ["--", *writes_marker(marker)]
    database = alias if case.database is None else case.database
    return subprocess.run(
        [sys.executable, "-m", "django", "run_exclusive", *args, "--database", database, *program],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def complaint(stderr: str) -> list[str]:
    """The lines of stderr, without argparse's usage block."""
    lines = []
    in_usage = False
    for line in stderr.splitlines():
        if line.startswith("usage:"):
            in_usage = True
            continue
        if in_usage and line.startswith(" "):
            continue
        in_usage = False
        if line.strip():
            lines.append(line)
    return lines


def assert_nothing_happened(alias: str, marker: Path) -> None:
    assert not marker.exists(), "the job ran"
    assert not JobLock.objects.using(alias).exists(), "a lock row was left"
    assert not JobRun.objects.using(alias).exists(), "a run row was left"


# A case refused before the lock is touched (its values, its job, its settings, another
# database than the one under test) goes through the same code on every backend: it runs
# once, on PostgreSQL (each is a real process: ~0.5 s of CPU). A name is refused where the
# lock would be written: those run on every backend.
EVERY_BACKEND = [param for param in CASES if param.values[0].child]
ONE_BACKEND = [param for param in CASES if not param.values[0].child]


@pytest.mark.parametrize("case", EVERY_BACKEND)
def test_bad_input_exits_2_with_one_line_and_runs_nothing(
    alias: str, tmp_path: Path, case: Case
) -> None:
    bad_input_exits_2_with_one_line_and_runs_nothing(alias, tmp_path, case)


@pytest.mark.parametrize("alias", ["postgresql"], indirect=True)
@pytest.mark.parametrize("case", ONE_BACKEND)
def test_bad_input_refused_before_the_lock(alias: str, tmp_path: Path, case: Case) -> None:
    bad_input_exits_2_with_one_line_and_runs_nothing(alias, tmp_path, case)


def bad_input_exits_2_with_one_line_and_runs_nothing(
    alias: str, tmp_path: Path, case: Case
) -> None:
    marker = tmp_path / "marker.txt"
    result = run_command(alias, case, tmp_path, marker)
    lines = complaint(result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    assert case.message in lines[0], lines[0]
    assert result.stdout == ""
    assert_nothing_happened(alias, marker)


@pytest.mark.parametrize("alias", ["postgresql"], indirect=True)  # refused at start-up
@pytest.mark.parametrize(("prepare", "line"), STARTUP_FAILURES)
def test_jobs_module_that_fails_at_startup_exits_2_with_one_line(
    alias: str, tmp_path: Path, prepare: Prepare, line: str
) -> None:
    marker = tmp_path / "marker.txt"
    result = run_command(alias, Case(("quick",), "", prepare=prepare), tmp_path, marker)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [line]
    assert_nothing_happened(alias, marker)


def without_drivers(tmp_path: Path, env: dict[str, str]) -> None:
    """Shadow the database drivers with modules that fail to import, as if not installed."""
    for module in ("psycopg", "psycopg2", "MySQLdb"):
        (tmp_path / f"{module}.py").write_text("raise ImportError('not installed')\n")


@pytest.mark.parametrize("alias", ["postgresql", "mysql"], indirect=True)  # SQLite's is Python's
@pytest.mark.parametrize("command", ["run_exclusive", "exclusive_locks", "prune_job_runs"])
def test_missing_driver_is_one_line_and_exit_2(alias: str, tmp_path: Path, command: str) -> None:
    env = command_env()
    without_drivers(tmp_path, env)
    args = ["quick"] if command == "run_exclusive" else []
    result = subprocess.run(
        [sys.executable, "-m", "django", command, *args, "--database", alias],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = complaint(result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    assert "cannot be used" in lines[0]
    assert "pip install 'django-exclusive-jobs[" in lines[0]

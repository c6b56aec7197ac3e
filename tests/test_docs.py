"""The documentation cannot rot: every sample in docs/ is run or checked here.

* Python samples live in docs/snippets/ (the pages include them with ``literalinclude``);
  each is imported and exercised against the test database (SQLite).
* Shell, crontab, systemd and Kubernetes samples that call ``manage.py`` (in the pages and
  the README) are parsed with the real command's parser, so an option that does not exist
  fails here.
* Reference pages list exactly the settings, system checks and signals the code has; the
  protocol page shows the SQL the lock sends and the files the package has; the output
  lines, admin actions and JSON fields are named as the code names them; and no page
  uses a name that was retired.

The Sphinx build itself (warnings are errors) runs in CI through scripts/docs.sh.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import logging
import re
import shlex
import sys
import threading
import types
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.core.management import call_command, get_commands, load_command_class
from django.core.management.base import CommandError
from django.db import connections
from django.test import override_settings

from django_exclusive_jobs import LockConfigurationError, conf, signals, try_acquire
from django_exclusive_jobs.checks import check_settings
from django_exclusive_jobs.lock.durations import parse_duration
from django_exclusive_jobs.models import JobLock, JobRun, RunStatus
from django_exclusive_jobs.run import registry
from django_exclusive_jobs.run.schedules import make_schedule

from .conftest import clean_tables
from .helpers import expire_now

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SNIPPETS = DOCS / "snippets"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)
README = ROOT / "README.md"
PACKAGE = ROOT / "django_exclusive_jobs"


# --- helpers ----------------------------------------------------------------------------


def load_snippet(stem: str) -> types.ModuleType:
    """Import docs/snippets/<stem>.py as a module of its own (registering its jobs)."""
    name = f"docs_snippet_{stem}"
    spec = importlib.util.spec_from_file_location(name, SNIPPETS / f"{stem}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def settings_from(stem: str) -> dict[str, Any]:
    """The names a settings snippet defines."""
    namespace: dict[str, Any] = {}
    exec(compile((SNIPPETS / f"{stem}.py").read_text(), stem, "exec"), namespace)
    return {key: value for key, value in namespace.items() if key.isupper()}


def runs_of(name: str) -> list[JobRun]:
    return list(JobRun.objects.using("default").filter(name=name).order_by("id"))


@pytest.fixture
def sqlite(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    """The SQLite test database in autocommit, with clean lock tables and job registry."""
    jobs = dict(registry._jobs)
    with django_db_blocker.unblock():
        clean_tables("default")
        try:
            yield "default"
        finally:
            clean_tables("default")
            registry._jobs.clear()
            registry._jobs.update(jobs)
            for stem in [key for key in sys.modules if key.startswith("docs_snippet_")]:
                del sys.modules[stem]
            connections.close_all()


# --- the pages --------------------------------------------------------------------------

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$", re.MULTILINE)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body) of every fenced block of a Markdown page."""
    blocks = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        fence, info = match["fence"], match["info"].strip()
        body = []
        index += 1
        while index < len(lines) and not lines[index].strip().startswith(fence):
            body.append(lines[index])
            index += 1
        blocks.append((info, "\n".join(body)))
        index += 1
    return blocks


def test_docs_have_pages() -> None:
    names = {page.relative_to(DOCS).as_posix() for page in PAGES}
    assert {"index.md", "quickstart.md", "how-it-works.md", "guarantees.md"} <= names
    assert len(PAGES) >= 10


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(DOCS).as_posix())
def test_no_inline_python_in_pages(page: Path) -> None:
    """Python samples are files under docs/snippets/, so that a test runs them."""
    for info, _body in fenced_blocks(page.read_text()):
        language = info.split()[0].lower() if info else ""
        assert language not in ("python", "py", "python3", "pycon", "ipython"), (
            f"{page.name}: put Python samples in docs/snippets/ and use literalinclude"
        )


def test_every_snippet_is_shown_and_exists() -> None:
    """Each literalinclude names a snippet that exists, and each snippet is shown."""
    included = set()
    for page in PAGES:
        for info, _body in fenced_blocks(page.read_text()):
            if info.startswith("{literalinclude}"):
                target = (page.parent / info.split(maxsplit=1)[1].strip()).resolve()
                assert target.is_file(), f"{page.name}: {target} does not exist"
                included.add(target)
    snippets = {path.resolve() for path in SNIPPETS.glob("*.py")}
    assert snippets - included == set(), "snippets no page shows"


# --- commands in shell, crontab, systemd and Kubernetes samples -------------------------

SHELL_STOP = {">", ">>", "2>&1", "|", "||", "&&", ";", "&", "2>", "1>"}


def manage_py_calls() -> list[tuple[str, list[str]]]:
    """(page, argv after manage.py) for every ``manage.py`` call in a non-Python block."""
    calls = []
    for page in [*PAGES, README]:
        for info, body in fenced_blocks(page.read_text()):
            if info.startswith("{"):
                continue  # directives: literalinclude, autodoc, toctree, ...
            text = body.replace("\\\n", " ")
            for line in text.splitlines():
                if "manage.py" not in line:
                    continue
                argv = _argv_after_manage_py(line)
                if argv is not None:
                    calls.append((page.name, argv))
    return calls


def _argv_after_manage_py(line: str) -> list[str] | None:
    flow = re.search(r"\[[^\[\]]*manage\.py[^\[\]]*\]", line)
    if flow:  # a YAML/JSON list: ["python", "manage.py", "run_exclusive", ...]
        words = json.loads(flow.group(0))
    else:
        line = line.split(" #", 1)[0]  # a trailing comment
        words = shlex.split(line.split("manage.py", 1)[1], posix=True)
        words = ["manage.py", *words]
    words = words[words.index("manage.py") + 1 :] if "manage.py" in words else []
    argv = []
    for word in words:
        if word in SHELL_STOP or word.startswith((">", "2>")):
            break
        argv.append(word)
    return argv or None


CALLS = manage_py_calls()


def test_samples_call_manage_py() -> None:
    commands = {argv[0] for _page, argv in CALLS}
    assert {"run_exclusive", "exclusive_locks", "prune_job_runs", "migrate"} <= commands


@pytest.mark.parametrize(
    ("page", "argv"), CALLS, ids=[f"{page}:{' '.join(argv)}" for page, argv in CALLS]
)
def test_sample_command_line_parses(page: str, argv: list[str]) -> None:
    """Every option a sample passes to a manage.py command exists in that command."""
    check_command_line(page, argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["run_exclusive", "hourly_report", "--bogus"],
        ["run_exclusive", "hourly_report", "--ttl", "soon"],
        ["run_exclusive", "hourly_report", "--cron", "61 * * * *"],
        ["exclusive_locks", "--release-all"],
        ["exclusive_locks", "--release", "hourly_report"],
        ["exclusive_locks", "force-release", "hourly_report", "--force"],
        ["exclusive_locks", "release", "hourly_report"],
        ["prune_job_runs", "--keep", "3"],
        ["exclusive_locks", "[--stale]", "[--purge]"],
        ["exclusive_locks", "[release]", "NAME", "[--live]"],
    ],
)
def test_command_line_check_catches_mistakes(argv: list[str]) -> None:
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        check_command_line("test", argv)


def check_command_line(page: str, argv: list[str]) -> None:
    name, *args = argv
    commands = get_commands()
    assert name in commands, f"{page}: no management command {name!r}"
    if any("[" in word for word in args):
        # A synopsis such as "exclusive_locks [list] [--stale] [--json]": each option must
        # exist, and each action word must be one the command accepts.
        parser = parser_of(name)
        words = [word.strip("[]") for word in args]
        flags = {word for word in words if word.startswith("--")}
        known = set(parser._option_string_actions)
        assert flags - {"--"} <= known, f"{page}: unknown option(s) {flags - known}"
        actions = {
            choice
            for action in parser._actions
            if not action.option_strings and action.choices
            for choice in action.choices
        }
        for word in words:
            if re.fullmatch(r"[a-z][a-z_-]*", word) and word != "options":
                assert word in actions, f"{page}: {name} has no action {word!r}"
        return
    if name == "run_exclusive" and "--" in args:
        program = args[args.index("--") + 1 :]
        assert program, f"{page}: nothing after '--'"
        args = args[: args.index("--")]
    try:
        options, extra = parser_of(name).parse_known_args(args)
        if extra:
            # run_exclusive passes what it does not know to the command it runs.
            assert name == "run_exclusive", f"{page}: unknown option(s) {extra}"
            assert options.name in commands, f"{page}: {options.name} is not a command"
            parser_of(options.name).parse_args(extra)
        if name == "run_exclusive":
            make_schedule(
                every=options.every,
                cron=options.cron,
                timezone=options.timezone,
                tolerance=options.slot_tolerance,
            )
    except (CommandError, SystemExit, LockConfigurationError) as exc:
        pytest.fail(f"{page}: manage.py {' '.join(argv)} does not parse: {exc}")


def parser_of(name: str) -> Any:
    """The command's parser, without abbreviations: ``--force`` must not pass for
    ``--force-color``."""
    command = load_command_class(get_commands()[name], name)
    return command.create_parser("manage.py", name, allow_abbrev=False)


def test_run_exclusive_exit_codes_match_the_docs() -> None:
    """The exit-code table of the reference matches run_exclusive's --help."""
    from django_exclusive_jobs.management.commands.run_exclusive import EPILOG

    documented = (DOCS / "reference" / "commands.md").read_text()
    for code in re.findall(r"^  (\d+(?:\+N)?) ", EPILOG, re.MULTILINE):
        assert f"| {code} |" in documented, f"exit code {code} is not documented"


# --- reference pages list what the code has ---------------------------------------------


def test_settings_reference_lists_every_key_and_default() -> None:
    page = (DOCS / "reference" / "settings.md").read_text()
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", page, re.MULTILINE))
    assert documented == set(conf.DEFAULTS)


def test_settings_snippet_spells_out_the_defaults() -> None:
    values = settings_from("settings_exclusive_jobs")["EXCLUSIVE_JOBS"]
    assert set(values) == set(conf.DEFAULTS)
    for key, default in conf.DEFAULTS.items():
        if isinstance(default, dt.timedelta):
            assert parse_duration(values[key]) == default, key
        else:
            assert values[key] == default, key
    with override_settings(EXCLUSIVE_JOBS=values):
        assert check_settings() == []


def test_checks_reference_lists_every_check() -> None:
    source = (PACKAGE / "checks.py").read_text()
    ids = {f"django_exclusive_jobs.{code}" for code in re.findall(r'"([EW]\d{3})"', source)}
    page = (DOCS / "reference" / "checks.md").read_text()
    documented = set(re.findall(r"^#+ `(django_exclusive_jobs\.[EW]\d{3})`", page, re.MULTILINE))
    assert len(ids) >= 14 and documented == ids


def test_gone_settings_are_documented() -> None:
    """Each setting that is gone or renamed (W002) is listed on the settings page."""
    page = (DOCS / "reference" / "settings.md").read_text()
    gone = page.split("## Settings that are gone", 1)[1]
    assert set(re.findall(r"^- `([A-Z_]+)`", gone, re.MULTILINE)) == set(conf.GONE)
    checks = (DOCS / "reference" / "checks.md").read_text()
    w002 = checks.split("django_exclusive_jobs.W002", 1)[1]
    for key in conf.GONE:
        assert f"`{key}`" in w002, key
    with override_settings(EXCLUSIVE_JOBS=dict.fromkeys(conf.GONE, True)):
        assert {message.id for message in check_settings()} == {"django_exclusive_jobs.W002"}


def test_signals_reference_lists_every_signal() -> None:
    from django.dispatch import Signal

    declared = {name for name, value in vars(signals).items() if isinstance(value, Signal)}
    page = (DOCS / "reference" / "signals.md").read_text()
    documented = set(re.findall(r"^## `(\w+)`", page, re.MULTILINE))
    assert declared and documented == declared


def test_installed_apps_snippet() -> None:
    apps = settings_from("settings_installed_apps")["INSTALLED_APPS"]
    assert "django_exclusive_jobs" in apps
    assert set(apps) - {"reports"} <= set(settings.INSTALLED_APPS)


def test_lock_database_snippet_passes_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    values = settings_from("settings_lock_database")
    databases = values["DATABASES"]
    assert databases["locks"]["NAME"] == databases["default"]["NAME"]
    # Not override_settings: that would reset the test run's database connections.
    monkeypatch.setattr(settings, "DATABASES", databases)
    with override_settings(EXCLUSIVE_JOBS=values["EXCLUSIVE_JOBS"]):
        assert check_settings() == []
    # The same settings pointing the locks at the ATOMIC_REQUESTS alias get W001.
    with override_settings(EXCLUSIVE_JOBS={"DATABASE": "default"}):
        assert [message.id for message in check_settings()] == ["django_exclusive_jobs.W001"]


# --- the Python snippets, run for real --------------------------------------------------


def test_quickstart_job_runs_once_per_slot(sqlite: str) -> None:
    jobs = load_snippet("quickstart_jobs")
    assert jobs.hourly_report() == 0  # ran: nobody joined in the last hour
    assert jobs.hourly_report() is None  # the same hourly slot: skipped
    [run] = runs_of("hourly_report")
    assert run.status == RunStatus.SUCCEEDED
    assert run.slot is not None and run.slot.minute == 0 and run.slot.second == 0


def test_quickstart_job_runs_from_the_command(sqlite: str, capsys: Any) -> None:
    load_snippet("quickstart_jobs")
    call_command("run_exclusive", "hourly_report")
    call_command("run_exclusive", "hourly_report")
    out = capsys.readouterr().out
    assert "acquired hourly_report" in out
    assert "skipped hourly_report: slot" in out
    assert len(runs_of("hourly_report")) == 1


def test_python_lock_snippet(sqlite: str, capsys: Any) -> None:
    snippet = load_snippet("python_lock")
    assert snippet.rebuild_search_index() is True
    assert "rebuilding with fencing token 1" in capsys.readouterr().out
    # Another server (a thread, on its own connection) holds the lock: skipped.
    held = hold_in_other_thread("rebuild_search_index")
    try:
        assert snippet.rebuild_search_index() is False
        assert "skipped: held by" in capsys.readouterr().out
    finally:
        held.release()
    assert snippet.rebuild_search_index() is True
    assert "fencing token 3" in capsys.readouterr().out


def hold_in_other_thread(name: str) -> Any:
    """Take ``name`` from another thread, as another server would, and return the Lock."""
    box: dict[str, Any] = {}

    def take() -> None:
        try:
            box["lock"] = try_acquire(name, ttl="1m")
        finally:
            connections.close_all()

    thread = threading.Thread(target=take)
    thread.start()
    thread.join(timeout=30)
    assert box.get("lock") is not None
    return box["lock"]


def test_manual_lock_snippet(sqlite: str) -> None:
    snippet = load_snippet("manual_lock")
    assert snippet.import_feed(["a", "b", "c"]) == 3
    lock = JobLock.objects.get(name="import_feed")
    assert lock.released_at is not None and lock.token == 1
    held = hold_in_other_thread("import_feed")
    try:
        assert snippet.import_feed(["a"]) is None
    finally:
        held.release()


def test_manual_lock_snippet_refuses_to_commit_after_a_release(sqlite: str) -> None:
    """An operator releasing the lock mid-run makes ensure_held() refuse to commit."""
    from django_exclusive_jobs import force_release

    snippet = load_snippet("manual_lock")

    class Items(list[str]):
        def __iter__(self) -> Iterator[str]:
            force_release("import_feed")  # cleared from the admin while we work
            return super().__iter__()

    assert snippet.import_feed(Items(["a"])) is None


def test_min_hold_vs_slots_snippet(sqlite: str) -> None:
    snippet = load_snippet("min_hold_vs_slots")
    assert snippet.refresh_rates() == "refreshed"
    assert snippet.refresh_rates() is None  # the same 15-minute slot
    assert JobLock.objects.get(name="refresh_rates").expires_at is not None
    assert snippet.send_digest() == "sent"
    assert snippet.send_digest() is None  # released, but closed for 60 s after start
    lock = JobLock.objects.with_state().get(name="send_digest")
    assert lock.state == "cooldown"  # type: ignore[attr-defined]
    assert lock.expires_at - lock.acquired_at >= dt.timedelta(seconds=60)


def test_management_command_job_snippet(sqlite: str) -> None:
    from django.contrib.sessions.models import Session
    from django.utils import timezone

    Session.objects.create(
        session_key="old", session_data="", expire_date=timezone.now() - dt.timedelta(days=1)
    )
    snippet = load_snippet("management_command_job")
    snippet.clear_sessions()
    assert not Session.objects.filter(session_key="old").exists()
    [run] = runs_of("clear_sessions")
    assert run.status == RunStatus.SUCCEEDED and run.slot is not None


def test_async_job_snippet(sqlite: str) -> None:
    snippet = load_snippet("async_job")
    assert async_to_sync(snippet.warm_caches)() == 3
    assert async_to_sync(snippet.warm_caches)() is None  # the same 10-minute slot


def test_signals_snippet_sees_failures_skips_and_lost_locks(
    sqlite: str, caplog: pytest.LogCaptureFixture
) -> None:
    from django_exclusive_jobs import exclusive_job, force_release

    load_snippet("signals_alerts")
    try:

        @exclusive_job("docs_failing_job")
        def failing() -> None:
            raise RuntimeError("the report server said no")

        @exclusive_job("docs_losing_job")
        def losing() -> None:
            force_release("docs_losing_job")

        caplog.set_level(logging.INFO, logger="ops")
        with pytest.raises(RuntimeError):
            failing()
        alerts = [r.getMessage() for r in caplog.records if r.name == "ops.alerts"]
        assert any("docs_failing_job failed" in line for line in alerts)
        metrics = [r.getMessage() for r in caplog.records if r.name == "ops.metrics"]
        assert any("job=docs_failing_job status=failed" in line for line in metrics)

        held = hold_in_other_thread("docs_failing_job")
        try:
            assert failing() is None
        finally:
            held.release()
        metrics = [r.getMessage() for r in caplog.records if r.name == "ops.metrics"]
        assert any("job=docs_failing_job status=skipped" in line for line in metrics)

        caplog.clear()
        losing()
        alerts = [r.getMessage() for r in caplog.records if r.name == "ops.alerts"]
        assert any("lock docs_losing_job (token 1) lost" in line for line in alerts)
    finally:
        for signal, uid in [
            (signals.job_finished, "ops_job_finished"),
            (signals.job_skipped, "ops_job_skipped"),
            (signals.lock_lost, "ops_lock_lost"),
        ]:
            signal.disconnect(dispatch_uid=uid)


def test_celery_snippet(sqlite: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Celery is not a dependency: a stand-in ``shared_task`` that keeps the function."""
    registered = []

    def shared_task(func: Any) -> Any:
        registered.append(func)
        return func

    monkeypatch.setitem(sys.modules, "celery", types.SimpleNamespace(shared_task=shared_task))
    snippet = load_snippet("celery_tasks")
    assert registered == [snippet.nightly_invoices]
    assert snippet.nightly_invoices() == "invoices sent"
    assert snippet.nightly_invoices() is None  # the second copy of tonight's task
    [run] = runs_of("nightly_invoices")
    assert run.slot is not None and (run.slot.hour, run.slot.minute) == (2, 30)


def test_django_tasks_snippet(sqlite: str) -> None:
    pytest.importorskip("django.tasks", reason="Django's tasks framework needs Django 6.0")
    snippet = load_snippet("django_tasks_framework")
    first = snippet.hourly_digest.enqueue()
    second = snippet.hourly_digest.enqueue()
    assert first.return_value == "digest sent"
    assert second.return_value is None
    assert len(runs_of("hourly_digest")) == 1


# --- the protocol page shows the code as it is ------------------------------------------


def test_protocol_page_shows_the_sql_the_lock_sends() -> None:
    """The SQL on how-it-works.md is, statement for statement, what lock/sql.py sends."""
    from django_exclusive_jobs.lock.sql import _statements

    page = (DOCS / "how-it-works.md").read_text()
    documented: dict[str, str] = {}
    for info, body in fenced_blocks(page):
        if info != "sql":
            continue
        key = None
        for line in body.splitlines():
            comment = re.match(r"-- (\w+):", line)
            if comment:
                key = comment.group(1)
                documented[key] = ""
            elif key is not None and not line.startswith("--"):
                documented[key] += " " + line
    sent = _statements("postgresql", f'"{JobLock._meta.db_table}"', True)

    def normal(sql: str) -> str:  # white space, and none inside parentheses
        return re.sub(r"\(\s+", "(", re.sub(r"\s+\)", ")", " ".join(sql.split())))

    assert {key: normal(sql) for key, sql in documented.items()} == {
        key: normal(sql) for key, sql in sent.items()
    }


def test_protocol_page_lists_every_module_of_the_package() -> None:
    """The layout on how-it-works.md names exactly the package's modules."""
    page = (DOCS / "how-it-works.md").read_text()
    [tree] = [body for _info, body in fenced_blocks(page) if "django_exclusive_jobs/" in body]
    documented = set()
    parents: list[str] = []
    for line in tree.splitlines()[1:]:
        branch = line.find("── ")
        if branch < 0:
            continue
        depth = (branch - 1) // 4
        entry = line[branch + 3 :].split()[0]
        parents[depth:] = [entry]
        documented.add("".join(parents))
    actual = {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if path.parts[-2] not in ("migrations", "commands")
        and not (path.name == "__init__.py" and path.parent != PACKAGE)
    }
    modules = {entry for entry in documented if entry.endswith(".py")}
    assert modules == actual
    assert "management/commands/" in documented
    commands = {path.stem for path in (PACKAGE / "management" / "commands").glob("[!_]*.py")}
    [line] = [line for line in tree.splitlines() if "── commands/" in line]
    assert set(re.findall(r"\w+", line.split("commands/", 1)[1])) == commands


# Retired names: none of them may come back into the pages, the README or the snippets.
# The settings and checks pages name the gone settings, to say that they are gone.
RETIRED = {
    r"\brelease_lock\b": "force_release()",
    r"\bowner\b": "holder",
    r"\b[Oo]utcome\b": "status (RunStatus)",
    r"--release\b": "exclusive_locks force-release",
    r"--force\b(?!-)": "--live",
    r"\[cron\]": "nothing: cronsim is a dependency",
    r"admin-release-confirmation": "admin-force-release-confirmation",
    r"Release (expired|selected) locks": "Force-release stale / selected locks",
    r"[Ll]ive locks?\b": "held lock",
    r"LAST_INSERT_ID": "nothing: the take is UPDATE, then SELECT",
    r"\bSQLITE_BUSY_TIMEOUT\b": "BUSY_TIMEOUT",
    r"\bPREPARE_STATEMENTS\b": "nothing: the lock has no prepared statements of its own",
}
NAMES_GONE_SETTINGS = {"reference/settings.md", "reference/checks.md"}
GONE_SETTING_PATTERNS = {rf"\b{key}\b" for key in conf.GONE}
# performance.md reports benchmarks of past versions too; it is checked by hand.
CHECKED_TEXTS = [
    *(page for page in PAGES if page.name != "performance.md"),
    README,
    *sorted(SNIPPETS.glob("*.py")),
]


@pytest.mark.parametrize("path", CHECKED_TEXTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_retired_names(path: Path) -> None:
    text = path.read_text()
    where = path.relative_to(DOCS).as_posix() if DOCS in path.parents else path.name
    for pattern, instead in RETIRED.items():
        if where in NAMES_GONE_SETTINGS and pattern in GONE_SETTING_PATTERNS:
            continue
        found = re.search(pattern, text)
        assert found is None, f"{where} says {found.group(0)!r}: use {instead}"


# --- what the commands print, as the reference says --------------------------------------


def documented_block(page: str, first: str) -> list[str]:
    """The lines of the text block on ``page`` that starts with ``first``."""
    text = (DOCS / page).read_text()
    [body] = [body for info, body in fenced_blocks(text) if body.startswith(first)]
    return body.splitlines()


def output_pattern(line: str) -> re.Pattern[str]:
    """A documented output line as a regex: CAPITALS are values, `` [...]`` is optional."""

    def literal(text: str) -> str:
        parts = re.split(r"([A-Z]+(?::[A-Z]+)*(?:: [A-Z]+)?)", text)
        return "".join(
            (r".+" if " " in part else r"\S+?") if index % 2 else re.escape(part)
            for index, part in enumerate(parts)
        )

    pattern, position = "", 0
    for optional in re.finditer(r" \[([^\[\]]*)\]", line):
        pattern += literal(line[position : optional.start()])
        pattern += f"(?: {literal(optional.group(1))})?"
        position = optional.end()
    return re.compile(pattern + literal(line[position:]))


def assert_lines_match(lines: list[str], documented: list[str]) -> None:
    patterns = [output_pattern(line) for line in documented]
    for line in lines:
        assert any(p.fullmatch(line) for p in patterns), f"undocumented output: {line!r}"
    for doc, pattern in zip(documented, patterns, strict=True):
        assert any(pattern.fullmatch(line) for line in lines), f"never printed: {doc!r}"


def test_run_exclusive_prints_the_documented_lines(sqlite: str, capsys: Any) -> None:
    load_snippet("quickstart_jobs")
    call_command("run_exclusive", "hourly_report")  # acquired, finished
    call_command("run_exclusive", "hourly_report")  # skipped: the slot already ran
    held = hold_in_other_thread("hourly_report")
    try:
        call_command("run_exclusive", "hourly_report")  # skipped: held by another
    finally:
        held.release()
    lines = capsys.readouterr().out.splitlines()
    documented = documented_block("reference/commands.md", "acquired NAME")
    assert_lines_match(lines, documented)
    # The sample lines of the quickstart have the documented shape too.
    patterns = [output_pattern(line) for line in documented]
    quickstart = (DOCS / "quickstart.md").read_text()
    samples = [
        line
        for info, body in fenced_blocks(quickstart)
        if info == "text"
        for line in body.splitlines()
        if line.startswith(("acquired ", "finished ", "skipped "))
    ]
    assert len(samples) == 3
    for line in samples:
        assert any(p.fullmatch(line) for p in patterns), line


def test_exclusive_locks_prints_the_documented_lines(sqlite: str) -> None:
    hold_in_other_thread("docs_stale")
    expire_now(sqlite, "docs_stale")
    held = hold_in_other_thread("docs_held")
    hold_in_other_thread("docs_free").release()

    def run(*args: str) -> list[str]:
        out = StringIO()
        call_command("exclusive_locks", *args, stdout=out)
        return out.getvalue().splitlines()

    # The JSON fields are the documented ones.
    reference = (DOCS / "reference" / "commands.md").read_text()
    [json_row] = [line for line in reference.splitlines() if line.startswith("| `--json` |")]
    fields = re.findall(r"`(\w+)`", json_row.split("objects with", 1)[1])
    records = json.loads("\n".join(run("list", "--json")))
    assert [list(record) for record in records] == [fields] * 3
    states = {record["name"]: record["state"] for record in records}
    assert states == {"docs_free": "free", "docs_held": "held", "docs_stale": "stale"}

    # The table's header is the one operations.md shows.
    operations = (DOCS / "operations.md").read_text()
    [example] = [body for _info, body in fenced_blocks(operations) if body.startswith("NAME ")]
    assert run()[0].split() == example.splitlines()[0].split()

    # force-release: a held lock needs --live; every line printed is documented.
    with pytest.raises(CommandError) as refused:
        run("force-release", "docs_held")
    assert refused.value.returncode == 1
    lines = [
        *run("force-release", "docs_stale"),
        *run("force-release", "docs_free"),
        *run("force-release", "docs_held", "--live"),
        *run("force-release", "--stale"),
    ]
    assert lines[0] == "force-released docs_stale (was stale, token 1)"
    assert_lines_match(lines, documented_block("reference/commands.md", "force-released NAME"))
    assert held.release() is False  # the holder finds its lock force-released


def test_operations_page_names_the_admin_actions() -> None:
    from django.contrib import admin

    model_admin = admin.site._registry[JobLock]
    page = (DOCS / "operations.md").read_text()
    for name in model_admin.actions:
        description = str(getattr(model_admin, name).short_description)
        assert f"**{description}**" in page, description
    template = (
        PACKAGE / "templates/admin/django_exclusive_jobs/joblock/force_release_confirmation.html"
    ).read_text()
    [checkbox] = re.findall(r'name="release_held"[^>]*> \{% translate "([^"]+)" %\}', template)
    assert f'"{checkbox}"' in page

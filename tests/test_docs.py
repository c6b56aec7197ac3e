"""The documentation cannot rot: every sample in docs/ is run or checked here.

* Python samples live in docs/snippets/ (the pages include them with ``literalinclude``);
  each is imported and exercised against the test database (SQLite).
* Shell, crontab, systemd and Kubernetes samples that call ``manage.py`` are parsed with
  the real command's parser, so an option that does not exist fails here.
* Reference pages list exactly the settings, system checks and signals the code has.

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
from django_exclusive_jobs.run import registry
from django_exclusive_jobs.checks import check_settings
from django_exclusive_jobs.lock.durations import parse_duration
from django_exclusive_jobs.models import JobLock, JobRun, RunStatus
from django_exclusive_jobs.run.schedules import make_schedule

from .conftest import clean_tables

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SNIPPETS = DOCS / "snippets"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)


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
    for page in PAGES:
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
        ["prune_job_runs", "--keep", "3"],
        ["exclusive_locks", "[--stale]", "[--purge]"],
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
        # A synopsis such as "exclusive_locks [--stale] [--json]": each option must exist.
        flags = {word.strip("[]") for word in args if word.strip("[]").startswith("--")}
        known = set(parser_of(name)._option_string_actions)
        assert flags - {"--"} <= known, f"{page}: unknown option(s) {flags - known}"
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
    command = load_command_class(get_commands()[name], name)
    return command.create_parser("manage.py", name)


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
    source = (ROOT / "django_exclusive_jobs" / "checks.py").read_text()
    ids = set(re.findall(r'id="(django_exclusive_jobs\.[EW]\d{3})"', source))
    page = (DOCS / "reference" / "checks.md").read_text()
    documented = set(re.findall(r"^#+ `(django_exclusive_jobs\.[EW]\d{3})`", page, re.MULTILINE))
    assert ids and documented == ids


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

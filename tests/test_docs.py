"""The documentation cannot rot: every sample in docs/ and the README is run or checked here.

* Python samples are written inline in the pages, as ordinary ```python blocks, so they
  read the same on a code host, in an editor and on the built site. Each one is marked
  with an HTML comment on the line right above its fence (invisible once rendered):

      <!-- sample: NAME -->       a test below runs it: ``load_sample("NAME")`` executes
                                  it as a module, ``settings_of("NAME")`` as a settings
                                  fragment, and the test checks what it does;
      <!-- not-run: REASON -->    it cannot run here (REASON says why); it is only
                                  compiled and linted.

  A Python block with neither mark, or a name that no test here runs, fails
  ``test_every_python_block_is_run_or_marked`` or ``test_every_sample_is_run``; the
  README's blocks are marked the same way. Every sample also passes ``ruff check`` and
  ``ruff format``.
* The quickstart is followed word for word by scripts/first_hour.py in CI; its marked
  steps are checked here with that script's own parser.
* Shell, crontab, systemd, Kubernetes and Docker samples that call ``manage.py`` (in the
  pages and the README) are parsed with the real command's parser, so an option that
  does not exist fails here.
* Reference pages list exactly the settings, system checks and signals the code has; the
  protocol page shows the SQL the lock sends and the files the package has; the output
  lines, admin actions and JSON fields are named as the code names them; and no page
  uses a name that was retired.

The Sphinx build itself (warnings are errors) runs in CI through scripts/docs.sh.
"""

from __future__ import annotations

import ast
import contextlib
import datetime as dt
import importlib.util
import json
import logging
import re
import shlex
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from io import StringIO
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

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
from django_exclusive_jobs.run.runner import Run
from django_exclusive_jobs.run.schedules import make_schedule
from django_exclusive_jobs.run.start import Start

from .conftest import clean_tables
from .helpers import expire_now
from .test_schedules import changes_of

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)
README = ROOT / "README.md"
PACKAGE = ROOT / "django_exclusive_jobs"
FIRST_HOUR = ROOT / "scripts" / "first_hour.py"


def where(path: Path) -> str:
    """A page's name as the messages give it: ``reference/settings.md``, ``README.md``."""
    return path.relative_to(DOCS).as_posix() if DOCS in path.parents else path.name


# --- the pages' fenced blocks -----------------------------------------------------------

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$", re.MULTILINE)
COMMENT = re.compile(r"^\s*<!--(?P<text>.*?)-->\s*$")


@dataclass(frozen=True)
class Block:
    """A fenced block of a page, with the HTML comments on the lines right above it."""

    path: Path
    line: int  # the opening fence's line, counted from 1
    info: str
    body: str
    comments: tuple[str, ...]

    @property
    def language(self) -> str:
        return self.info.split()[0].lower() if self.info else ""

    @property
    def where(self) -> str:
        return f"{where(self.path)}:{self.line}"

    def marks(self, key: str) -> list[str]:
        """The values of ``<!-- key: value -->`` comments above the block."""
        found = (re.fullmatch(rf"\s*{key}:(.*)", text, re.S) for text in self.comments)
        return [match.group(1).strip() for match in found if match]


def parse_blocks(text: str, path: Path) -> tuple[Block, ...]:
    """Every fenced block of a Markdown text, in order."""
    blocks = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        comments: list[str] = []
        above = index - 1
        while above >= 0 and (comment := COMMENT.match(lines[above])):
            comments.insert(0, comment["text"].strip())
            above -= 1
        fence, info, start = match["fence"], match["info"].strip(), index
        body = []
        index += 1
        while index < len(lines) and not lines[index].strip().startswith(fence):
            body.append(lines[index])
            index += 1
        blocks.append(Block(path, start + 1, info, "\n".join(body), tuple(comments)))
        index += 1
    return tuple(blocks)


@cache
def blocks_of(path: Path) -> tuple[Block, ...]:
    return parse_blocks(path.read_text(), path)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body) of every fenced block of a Markdown text."""
    return [(block.info, block.body) for block in parse_blocks(text, Path("-"))]


def test_docs_have_pages() -> None:
    names = {page.relative_to(DOCS).as_posix() for page in PAGES}
    assert {"index.md", "quickstart.md", "deploying.md", "how-it-works.md"} <= names
    assert len(PAGES) >= 11


def test_every_page_is_in_a_toctree() -> None:
    """A page outside every toctree is a Sphinx warning; say which one here."""
    listed = {"index"}
    for page in PAGES:
        for block in blocks_of(page):
            if block.info.startswith("{toctree}"):
                entries = [line.strip() for line in block.body.splitlines()]
                listed |= {
                    (page.parent / entry).relative_to(DOCS).as_posix()
                    for entry in entries
                    if entry and not entry.startswith(":")
                }
    assert {page.relative_to(DOCS).with_suffix("").as_posix() for page in PAGES} == listed


# --- the Python samples: inline, marked, and each one run by a test --------------------

PYTHON = {"python", "py", "python3"}
NOT_RUNNABLE = {"pycon", "ipython", "python-console"}
# The helpers that run a sample: a sample is run when a test here calls one with its name.
RUNNERS = {"load_sample", "settings_of"}


def sample_name(block: Block) -> str | None:
    """The name a test runs the block by; None for a block marked not-run, or unmarked."""
    if block.marks("not-run"):
        return None
    names = block.marks("sample")
    return names[0] if len(names) == 1 else None


def python_blocks() -> list[Block]:
    return [
        block
        for page in [*PAGES, README]
        for block in blocks_of(page)
        if block.language in PYTHON | NOT_RUNNABLE
    ]


def python_block_problems(block: Block) -> list[str]:
    """Why a Python block is neither run by a test nor marked as not runnable."""
    samples, not_run = block.marks("sample"), block.marks("not-run")
    problems = []
    if block.language in NOT_RUNNABLE:
        problems.append(f"a {block.language} session: write a ```python block")
    if len(samples) + len(not_run) > 1:
        problems.append("more than one <!-- sample: --> or <!-- not-run: --> mark")
    elif not_run:
        if not not_run[0]:
            problems.append("<!-- not-run: --> without a reason")
    elif sample_name(block) is None:
        problems.append(
            "unmarked: put <!-- sample: NAME --> right above the fence and run it in "
            "tests/test_docs.py, or <!-- not-run: REASON -->"
        )
    elif samples and not re.fullmatch(r"[a-z][a-z0-9_]*", samples[0]):
        problems.append(f"sample name {samples[0]!r}: use lower_case_with_underscores")
    try:
        compile(block.body, block.where, "exec")
    except SyntaxError as exc:
        problems.append(f"does not compile: {exc}")
    return [f"{block.where}: {problem}" for problem in problems]


@pytest.mark.parametrize("page", [*PAGES, README], ids=where)
def test_every_python_block_is_run_or_marked(page: Path) -> None:
    blocks = [block for block in python_blocks() if block.path == page]
    problems = [problem for block in blocks for problem in python_block_problems(block)]
    assert problems == []


def test_python_block_marks_are_checked(tmp_path: Path) -> None:
    """The check above catches an unmarked block, a mark without a reason, two marks."""
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nx = 1\n```\n\n"
        "<!-- not-run:  -->\n```python\nx = 1\n```\n\n"
        "<!-- sample: one -->\n<!-- not-run: needs a GPU -->\n```python\nx = 1\n```\n\n"
        "<!-- sample: two -->\n```python\nx = (\n```\n\n"
        "```pycon\n>>> x = 1\n```\n\n"
        "<!-- not-run: needs a GPU -->\n```python\nx = 1\n```\n\n"
        "<!-- sample: three -->\n<!-- quickstart: run -->\n```python\nx = 1\n```\n"
    )
    blocks = blocks_of(page)
    found = [python_block_problems(block) for block in blocks]
    assert "unmarked" in found[0][0]
    assert "without a reason" in found[1][0]
    assert "more than one" in found[2][0]
    assert "does not compile" in found[3][0]
    assert "pycon session" in found[4][0]
    assert found[5:] == [[], []]
    assert sample_name(blocks[6]) == "three"


def test_samples_have_one_name_each() -> None:
    names = [name for block in python_blocks() if (name := sample_name(block))]
    assert len(names) == len(set(names)), "two blocks share a sample name"
    assert {"readme_installed_apps", "readme_jobs", "readme_lock"} <= set(names)


def test_every_sample_is_run() -> None:
    """Each sample name is run by a test here, and each name a test runs is a sample."""
    sources = [Path(__file__), *sorted(Path(__file__).parent.glob("test_docs_*.py"))]
    run = {
        node.args[0].value
        for source in sources
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in RUNNERS
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }
    marked = {name for block in python_blocks() if (name := sample_name(block))}
    assert marked - run == set(), "samples no test runs"
    assert run - marked == set(), "tests run samples that no page has"


def test_no_literalinclude_left() -> None:
    """Code is shown inline: nothing is pulled in from files a reader cannot see."""
    for path in [*PAGES, README]:
        assert "literalinclude" not in path.read_text(), where(path)
    assert not (DOCS / "snippets").exists()
    assert "snippets" not in (DOCS / "conf.py").read_text()


def sample(name: str) -> Block:
    [block] = [block for block in python_blocks() if sample_name(block) == name]
    return block


def code_of(name: str) -> types.CodeType:
    """The sample compiled with the page's name and line numbers, for tracebacks."""
    block = sample(name)
    return compile("\n" * block.line + block.body, str(block.path), "exec")


def load_sample(name: str, **names: Any) -> types.ModuleType:
    """Run a sample as a module of its own (registering its jobs), with ``names`` (the
    sample's own imports stand-ins, say) defined in it first."""
    module = types.ModuleType(f"docs_sample_{name}")
    module.__file__ = str(sample(name).path)
    module.__dict__.update(names)
    sys.modules[module.__name__] = module
    exec(code_of(name), module.__dict__)
    return module


def settings_of(name: str, **names: Any) -> dict[str, Any]:
    """The settings a settings sample defines, run after ``names`` (earlier settings)."""
    namespace = dict(names)
    exec(code_of(name), namespace)
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
            for module in [key for key in sys.modules if key.startswith("docs_sample_")]:
                del sys.modules[module]
            connections.close_all()


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


def long_options(name: str, dests: set[str]) -> set[str]:
    """The ``--options`` of command ``name`` that set ``dests`` (one option per dest)."""
    options = {
        option
        for action in parser_of(name)._actions
        for option in action.option_strings
        if option.startswith("--") and action.dest in dests
    }
    assert len(options) == len(dests)
    return options


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


def test_settings_sample_spells_out_the_defaults() -> None:
    values = settings_of("settings_exclusive_jobs")["EXCLUSIVE_JOBS"]
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


def test_lock_database_sample_passes_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    values = settings_of("settings_lock_database")
    databases = values["DATABASES"]
    assert databases["locks"]["NAME"] == databases["default"]["NAME"]
    # Not override_settings: that would reset the test run's database connections.
    monkeypatch.setattr(settings, "DATABASES", databases)
    with override_settings(EXCLUSIVE_JOBS=values["EXCLUSIVE_JOBS"]):
        assert check_settings() == []
    # The same settings pointing the locks at the ATOMIC_REQUESTS alias get W001.
    with override_settings(EXCLUSIVE_JOBS={"DATABASE": "default"}):
        assert [message.id for message in check_settings()] == ["django_exclusive_jobs.W001"]


# --- the quickstart, as CI follows it --------------------------------------------------


@cache
def first_hour() -> types.ModuleType:
    """scripts/first_hour.py, the script that follows the quickstart in CI."""
    spec = importlib.util.spec_from_file_location("first_hour", FIRST_HOUR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def quickstart_steps() -> list[tuple[str, str, str]]:
    """(kind, path, body) of each marked step, parsed as first_hour.py parses them."""
    steps: list[tuple[str, str, str]] = first_hour().steps((DOCS / "quickstart.md").read_text())
    return steps


def test_quickstart_steps_are_complete() -> None:
    """The quickstart has every step of a new project, in an order that works."""
    steps = quickstart_steps()
    text = (DOCS / "quickstart.md").read_text()
    assert len(steps) == text.count("<!-- quickstart:"), "a step the script does not see"
    assert {kind for kind, _path, _body in steps} == {"run", "write", "append"}
    events = []  # what the script does, in order: a command line, or a file written
    for kind, path, body in steps:
        if kind == "run":
            events += [shlex.split(line) for line in body.strip().splitlines() if line.strip()]
        else:
            events.append([kind, path])
    order = [
        ["pip", "install", "django-exclusive-jobs[postgres]"],
        ["django-admin", "startproject", "mysite"],
        ["cd", "mysite"],
        ["python", "manage.py", "startapp", "reports"],
        ["append", "mysite/settings.py"],
        ["write", "reports/jobs.py"],
        ["python", "manage.py", "migrate"],  # every app: the job needs auth's tables too
        ["python", "manage.py", "check"],
        ["python", "manage.py", "run_exclusive", "hourly_report"],
    ]
    positions = [events.index(event) for event in order]  # ValueError: a step is missing
    assert positions == sorted(positions), "the steps are out of order"
    migrations = [event for event in events if event[2:3] == ["migrate"]]
    assert migrations == [["python", "manage.py", "migrate"]], "migrate every app"


def test_quickstart_files_are_the_samples_tests_run() -> None:
    """What CI writes into the new project is the code the tests below run."""
    written = [(kind, path, body) for kind, path, body in quickstart_steps() if kind != "run"]
    assert [(kind, path) for kind, path, _body in written] == [
        ("append", "mysite/settings.py"),
        ("append", "mysite/settings.py"),
        ("write", "reports/jobs.py"),
    ]
    names = ["quickstart_installed_apps", "quickstart_databases", "quickstart_jobs"]
    for (_kind, _path, body), name in zip(written, names, strict=True):
        assert body.strip() == sample(name).body.strip(), name
    jobs = sample("quickstart_jobs").body
    assert '@exclusive_job("hourly_report"' in jobs and "cron=" in jobs


def test_quickstart_settings_in_a_new_project(tmp_path: Path) -> None:
    """The quickstart's settings, added to what ``startproject`` writes, name both apps
    and the database first_hour.py creates."""
    call_command("startproject", "mysite", str(tmp_path), verbosity=0)
    path = tmp_path / "mysite" / "settings.py"
    project: dict[str, Any] = {"__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), project)
    project = {key: value for key, value in project.items() if key.isupper()}
    default_apps = list(project["INSTALLED_APPS"])
    project.update(settings_of("quickstart_installed_apps", **project))
    project.update(settings_of("quickstart_databases", **project))
    assert project["INSTALLED_APPS"] == [*default_apps, "django_exclusive_jobs", "reports"]
    # The app runs with the apps startproject installs: the test settings have them all.
    assert set(default_apps) <= set(settings.INSTALLED_APPS)
    assert project["DATABASES"] == {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "mysite",
            "USER": "postgres",
            "HOST": "127.0.0.1",
            "PORT": 5432,
        }
    }


# --- the Python samples, run for real --------------------------------------------------


def test_quickstart_job_runs_once_per_slot(sqlite: str) -> None:
    jobs = load_sample("quickstart_jobs")
    assert jobs.hourly_report() == 0  # ran: nobody joined in the last hour
    assert jobs.hourly_report() is None  # the same hourly slot: skipped
    [run] = runs_of("hourly_report")
    assert run.status == RunStatus.SUCCEEDED
    assert run.slot is not None and run.slot.minute == 0 and run.slot.second == 0


def test_quickstart_job_runs_from_the_command(sqlite: str, capsys: Any) -> None:
    load_sample("quickstart_jobs")
    call_command("run_exclusive", "hourly_report")
    call_command("run_exclusive", "hourly_report")
    out = capsys.readouterr().out
    assert "acquired hourly_report" in out
    assert "skipped hourly_report: slot" in out
    assert len(runs_of("hourly_report")) == 1


def test_python_lock_sample(sqlite: str, capsys: Any) -> None:
    module = load_sample("python_lock")
    assert module.rebuild_search_index() is True
    assert "rebuilding with fencing token 1" in capsys.readouterr().out
    # Another server (a thread, on its own connection) holds the lock: skipped.
    held = hold_in_other_thread("rebuild_search_index")
    try:
        assert module.rebuild_search_index() is False
        assert "skipped: held by" in capsys.readouterr().out
    finally:
        held.release()
    assert module.rebuild_search_index() is True
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


def test_manual_lock_sample(sqlite: str) -> None:
    module = load_sample("manual_lock")
    assert module.import_feed(["a", "b", "c"]) == 3
    lock = JobLock.objects.get(name="import_feed")
    assert lock.released_at is not None and lock.token == 1
    held = hold_in_other_thread("import_feed")
    try:
        assert module.import_feed(["a"]) is None
    finally:
        held.release()


def test_manual_lock_sample_refuses_to_commit_after_a_release(sqlite: str) -> None:
    """An operator releasing the lock mid-run makes ensure_held() refuse to commit."""
    from django_exclusive_jobs import force_release

    module = load_sample("manual_lock")

    class Items(list[str]):
        def __iter__(self) -> Iterator[str]:
            force_release("import_feed")  # cleared from the admin while we work
            return super().__iter__()

    assert module.import_feed(Items(["a"])) is None


def test_min_hold_vs_slots_sample(sqlite: str) -> None:
    module = load_sample("min_hold_vs_slots")
    assert module.refresh_rates() == "refreshed"
    assert module.refresh_rates() is None  # the same 15-minute slot
    assert JobLock.objects.get(name="refresh_rates").expires_at is not None
    assert module.send_digest() == "sent"
    assert module.send_digest() is None  # released, but closed for 60 s after start
    lock = JobLock.objects.with_state().get(name="send_digest")
    assert lock.state == "cooldown"  # type: ignore[attr-defined]
    assert lock.expires_at - lock.acquired_at >= dt.timedelta(seconds=60)


def test_management_command_job_sample(sqlite: str) -> None:
    from django.contrib.sessions.models import Session
    from django.utils import timezone

    Session.objects.create(
        session_key="old", session_data="", expire_date=timezone.now() - dt.timedelta(days=1)
    )
    module = load_sample("management_command_job")
    module.clear_sessions()
    assert not Session.objects.filter(session_key="old").exists()
    [run] = runs_of("clear_sessions")
    assert run.status == RunStatus.SUCCEEDED and run.slot is not None


def test_async_job_sample(sqlite: str) -> None:
    module = load_sample("async_job")
    assert async_to_sync(module.warm_caches)() == 3
    assert async_to_sync(module.warm_caches)() is None  # the same 10-minute slot


def test_signals_sample_sees_failures_skips_and_lost_locks(
    sqlite: str, caplog: pytest.LogCaptureFixture
) -> None:
    from django_exclusive_jobs import exclusive_job, force_release

    load_sample("signals_alerts")
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


def test_celery_sample(sqlite: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Celery is not a dependency: a stand-in ``shared_task`` that keeps the function."""
    registered = []

    def shared_task(func: Any) -> Any:
        registered.append(func)
        return func

    monkeypatch.setitem(sys.modules, "celery", types.SimpleNamespace(shared_task=shared_task))
    module = load_sample("celery_tasks")
    assert registered == [module.nightly_invoices]
    assert module.nightly_invoices() == "invoices sent"
    assert module.nightly_invoices() is None  # the second copy of tonight's task
    [run] = runs_of("nightly_invoices")
    assert run.slot is not None and (run.slot.hour, run.slot.minute) == (2, 30)


def test_celery_beat_moved_sample(sqlite: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The declaration that replaces a beat entry sends the task once per slot, by name,
    with its arguments and the slot in its headers (a stand-in Celery app records what
    is sent; tests/test_celery.py sends to a real worker)."""
    sent: list[tuple[str, dict[str, Any]]] = []

    def send_task(name: str, **options: Any) -> Any:
        sent.append((name, options))
        return types.SimpleNamespace(id=options["task_id"])

    app = types.SimpleNamespace(send_task=send_task)
    monkeypatch.setitem(sys.modules, "celery", types.SimpleNamespace(current_app=app))
    load_sample("celery_beat_moved")
    job = registry.get_job("send_invoices")
    assert job is not None
    Run(job).call()
    Run(job).call()  # a second server's send of the same slot: none
    [run] = runs_of("send_invoices")
    assert run.slot is not None and run.status == "enqueued"
    [(name, options)] = sent
    assert (name, options["kwargs"]) == ("reports.tasks.send_invoices", {"batch": 500})
    assert options["headers"]["exclusive_jobs_slot"] == run.slot.isoformat()
    assert run.task_result_id == options["task_id"]


def test_celery_beat_job_sample(sqlite: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job an import adds its schedules to sends the task a schedule's arguments
    name, with its arguments and queue (a stand-in Celery app records what is sent;
    tests/test_celery_beat.py imports real rows and sends to a real worker)."""
    sent: list[tuple[str, dict[str, Any]]] = []

    def send_task(name: str, **options: Any) -> Any:
        sent.append((name, options))
        return types.SimpleNamespace(id=options["task_id"])

    app = types.SimpleNamespace(send_task=send_task)
    monkeypatch.setitem(sys.modules, "celery", types.SimpleNamespace(current_app=app))
    registry._jobs.pop("celery_beat", None)  # the test app declares one too
    load_sample("celery_beat_job")
    job = registry.get_job("celery_beat")
    assert job is not None
    given = {"task": "reports.tasks.send", "args": [1], "kwargs": {"x": 2}, "queue": "q"}
    Run(job.with_arguments(given), start=Start.run_now("ops")).call()
    [(name, options)] = sent
    assert (name, options["args"], options["kwargs"], options["queue"]) == (
        "reports.tasks.send", [1], {"x": 2}, "q",
    )  # fmt: skip


def test_runtime_schedule_sample(sqlite: str) -> None:
    """The schedule is added, changed and paused through the one door, each audited."""
    from django_exclusive_jobs.models import JobChange, RunTimeSchedule

    load_sample("runtime_schedule")
    row = RunTimeSchedule.objects.get(name="customer_report:acme")
    assert (row.cron, row.timezone, row.kwargs, row.enabled) == (
        "0 7 * * 1", "Europe/Paris", {"customer": "acme"}, False,
    )  # fmt: skip
    changes = JobChange.objects.filter(name="customer_report:acme").order_by("at", "id")
    assert [change.action for change in changes] == [
        "schedule_added", "schedule_edited", "schedule_edited",
    ]  # fmt: skip


def test_django_tasks_sample(sqlite: str, django_tasks: None) -> None:
    """Below @task, the lock is taken by whatever runs the task: here the immediate
    backend, in this process (the test settings' default backend only stores tasks)."""
    module = load_sample("django_tasks_framework")
    first = module.hourly_digest.using(backend="immediate").enqueue()
    second = module.hourly_digest.using(backend="immediate").enqueue()
    assert first.return_value == "digest sent"
    assert second.return_value is None
    assert len(runs_of("hourly_digest")) == 1


# --- tasks.md: a task enqueued once per slot, run by django-tasks-db's worker ----------


@pytest.fixture
def django_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    """``django.tasks`` for the samples: Django's own from 6.0, before it the backport
    (``django_tasks``) under that name, as the page's Django 5.2 section says to use."""
    try:
        import django.tasks  # noqa: F401
    except ImportError:
        import django_tasks
        import django_tasks.base

        monkeypatch.setitem(sys.modules, "django.tasks", django_tasks)
        monkeypatch.setitem(sys.modules, "django.tasks.base", django_tasks.base)


def test_tasks_settings_samples() -> None:
    """The page's settings are the ones the tests run with: django-tasks-db's app, and
    its backend as the default; on Django 5.2 the backport's app as well."""
    page = settings_of("tasks_settings", INSTALLED_APPS=["django_exclusive_jobs"])
    assert page["INSTALLED_APPS"] == ["django_exclusive_jobs", "django_tasks_db"]
    assert page["TASKS"] == {"default": settings.TASKS["default"]}
    assert "django_tasks_db" in settings.INSTALLED_APPS
    backport = settings_of("tasks_settings_backport", INSTALLED_APPS=[])
    assert backport["INSTALLED_APPS"] == ["django_tasks", "django_tasks_db"]
    assert all(importlib.util.find_spec(app) for app in backport["INSTALLED_APPS"])


def sample_output_pattern(line: str) -> re.Pattern[str]:
    """A sample output line as a regex: every ``key=value`` stands for any value."""
    words = (
        re.escape(word.split("=", 1)[0]) + r"=\S+" if "=" in word else re.escape(word)
        for word in line.split()
    )
    return re.compile(" ".join(words))


def test_tasks_job_sample_enqueues_once_per_slot_and_a_worker_runs_it(
    sqlite: str, django_tasks: None, capsys: Any
) -> None:
    """Two starts of one slot enqueue the task once, with its slot; django-tasks-db's
    worker runs it; the history, the lines and the jobs page say what the page says."""
    import signal

    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import reverse
    from django_tasks_db.models import DBTaskResult

    from django_exclusive_jobs import exclusive_job
    from django_exclusive_jobs.health import overview

    module = load_sample("tasks_job")
    job = registry.get_job("nightly_signups")
    assert job is not None and job.task is module.nightly_signups  # the task, unchanged
    assert hasattr(module.nightly_signups, "enqueue")
    with pytest.raises(LockConfigurationError, match="every= or cron="):
        exclusive_job("no_schedule")(module.nightly_signups)

    call_command("run_exclusive", "nightly_signups")
    call_command("run_exclusive", "nightly_signups")  # the same slot: skipped
    [run] = runs_of("nightly_signups")
    assert run.slot is not None and (run.slot.hour, run.slot.minute) == (2, 30)
    assert (run.status, run.task_backend) == (RunStatus.ENQUEUED, "default")
    [queued] = DBTaskResult.objects.using(sqlite).all()
    assert str(queued.id) == run.task_result_id
    assert queued.args_kwargs == {"args": [], "kwargs": {"slot": run.slot.isoformat()}}

    # The acquired and finished lines have the shape the page shows.
    lines = capsys.readouterr().out.splitlines()
    [shown] = [
        body.splitlines()
        for info, body in fenced_blocks((DOCS / "tasks.md").read_text())
        if info == "text" and body.startswith("acquired ")
    ]
    assert len(lines) == 3 and lines[2].startswith("skipped nightly_signups: slot ")
    for line, example in zip(lines[:2], shown, strict=True):
        assert sample_output_pattern(example).fullmatch(line), (line, example)

    # One user joined in the day before the slot: the worker counts it.
    get_user_model().objects.create(username="ada", date_joined=run.slot - dt.timedelta(hours=1))
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        call_command("db_worker", "--batch", "--no-startup-delay", "--no-reload", verbosity=0)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    result = module.nightly_signups.get_result(run.task_result_id)
    assert (str(result.status), result.return_value) == ("SUCCESSFUL", 1)

    # The jobs page shows the backend's status of the last enqueue; the badge is the job's.
    [health] = [job for job in overview(using=sqlite).jobs if job.name == "nightly_signups"]
    assert health.task_status == "SUCCESSFUL" and health.badge == "ok"
    assert health.as_dict()["last_run"]["task_status"] == "SUCCESSFUL"
    admin = get_user_model().objects.create_superuser("root", "root@example.com", "x")
    try:  # the user goes with the test: an admin test after it makes its own "root"
        client = Client()
        client.force_login(admin)
        page = client.get(reverse("admin:django_exclusive_jobs_jobstate_changelist"))
    finally:
        get_user_model().objects.filter(username__in=["root", "ada"]).delete()
    assert page.status_code == 200
    assert "task: SUCCESSFUL" in page.content.decode()


# --- the README's samples --------------------------------------------------------------


def test_readme_installed_apps_sample() -> None:
    apps = settings_of("readme_installed_apps")["INSTALLED_APPS"]
    assert apps == [..., "django_exclusive_jobs"]  # "...": the apps the project has


def test_readme_job_runs_once_per_slot(sqlite: str) -> None:
    """The README's job, with a stand-in for the report it sends."""
    sent: list[str] = []
    module = load_sample("readme_jobs", send_the_report=lambda: sent.append("report"))
    module.hourly_report()
    module.hourly_report()  # the same hourly slot: skipped
    assert sent == ["report"]
    [run] = runs_of("hourly_report")
    assert run.status == RunStatus.SUCCEEDED
    assert run.slot is not None and run.slot.minute == 0


def test_readme_lock_sample(sqlite: str) -> None:
    """The README's lock runs the block with its token, and passes when it is held."""
    tokens: list[int] = []

    def rebuild_index(fencing_token: int) -> None:
        tokens.append(fencing_token)

    load_sample("readme_lock", rebuild_index=rebuild_index)
    assert tokens == [1]
    held = hold_in_other_thread("rebuild_index")
    try:
        load_sample("readme_lock", rebuild_index=rebuild_index)  # LockHeld: passes
    finally:
        held.release()
    assert tokens == [1]


# --- deploying.md: every recipe parsed, the database settings tried on PostgreSQL -------


def test_deploying_recipes_call_commands_that_parse() -> None:
    """Each way of triggering the job on deploying.md has manage.py lines, and so is
    checked by test_sample_command_line_parses."""
    text = (DOCS / "deploying.md").read_text()
    sections = {section.split("\n", 1)[0]: section for section in text.split("\n## ")[1:]}
    triggers = [title for title in sections if not title.startswith(("Behind", "With", "A copy"))]
    assert len(triggers) == 4, triggers  # cron, systemd, Kubernetes, Docker
    for title in triggers:
        lines = [
            argv
            for info, body in fenced_blocks(sections[title])
            for line in body.replace("\\\n", " ").splitlines()
            if "manage.py" in line and (argv := _argv_after_manage_py(line))
        ]
        assert lines, f"deploying.md, {title}: no manage.py command line in a block"
        assert all(argv[:2] == ["run_exclusive", "hourly_report"] for argv in lines), title
    kinds = {info.split()[0] for info, body in fenced_blocks(text) if "manage.py" in body}
    assert {"text", "ini", "yaml"} <= kinds
    assert sum(page == "deploying.md" for page, _argv in CALLS) >= 6


def alias_with(base: str, alias: str, database: dict[str, Any]) -> str:
    """A new alias to ``base``'s database, with a sample's connection settings (its
    name, user, host and port are the reader's own, so ``base``'s stay)."""
    config = dict(connections[base].settings_dict)
    own = {"NAME", "USER", "PASSWORD", "HOST", "PORT", "OPTIONS"}
    config.update({key: value for key, value in database.items() if key not in own})
    config["OPTIONS"] = {**config.get("OPTIONS", {}), **database.get("OPTIONS", {})}
    connections.settings[alias] = config
    return alias


def drop_alias(alias: str) -> None:
    connection = connections[alias]
    connection.close()
    if getattr(connection, "pool", None) is not None:
        connection.close_pool()
    del connections[alias]
    del connections.settings[alias]


def test_pgbouncer_sample_and_the_lock_keep_no_session_state(postgres: str) -> None:
    """With the sample's settings the lock sends single statements only: no SET, no
    advisory lock, no prepared statement left on the server connection."""
    from django_exclusive_jobs import exclusive_lock

    database = settings_of("deploying_pgbouncer")["DATABASES"]["default"]
    assert database["ENGINE"] == "django.db.backends.postgresql"
    assert database["DISABLE_SERVER_SIDE_CURSORS"] is True
    assert "prepare_threshold" not in database.get("OPTIONS", {})
    alias = alias_with(postgres, "docs_pgbouncer", database)
    try:
        connection = connections[alias]
        sent: list[str] = []

        def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            sent.append(sql)
            return execute(sql, params, many, context)

        with connection.execute_wrapper(record):
            for _ in range(8):  # more than psycopg's default prepare_threshold (5)
                with exclusive_lock("docs_pgbouncer", ttl="1m", using=alias) as lock:
                    lock.renew()
                    lock.ensure_held()
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_prepared_statements")
            assert cursor.fetchone()[0] == 0
        assert connection.connection.prepare_threshold is None
    finally:
        drop_alias(alias)
    assert len(sent) >= 8 * 4
    # Savepoints: the name's first take creates its row in one short transaction.
    statements = {"SELECT", "UPDATE", "WITH", "INSERT", "SAVEPOINT", "RELEASE", "ROLLBACK"}
    assert {sql.split()[0].upper() for sql in sent} <= statements
    assert not [sql for sql in sent if "advisory" in sql.lower()]


def test_connection_pool_sample_works_with_the_lock(postgres: str) -> None:
    """Django's pool: the lock, and its keep-alive thread, take connections from it."""
    from django_exclusive_jobs import exclusive_lock

    database = settings_of("deploying_pool")["DATABASES"]["default"]
    assert database["ENGINE"] == "django.db.backends.postgresql"
    assert database["OPTIONS"] == {"pool": True}
    pytest.importorskip("psycopg_pool", reason="Django's connection pool needs psycopg[pool]")
    alias = alias_with(postgres, "docs_pool", database)
    try:
        assert connections[alias].pool is not None
        with exclusive_lock("docs_pool", ttl=2, using=alias) as lock:
            first_lease = lock.expires_at
            deadline = time.monotonic() + 10
            while lock.expires_at == first_lease and time.monotonic() < deadline:
                threading.Event().wait(0.05)
            # the keep-alive thread renewed through a connection of the pool
            assert lock.expires_at > first_lease
            lock.ensure_held()
        assert lock.token == 1
        assert connections[alias].pool.get_stats()["requests_num"] >= 2
    finally:
        drop_alias(alias)


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


# Retired names: none of them may come back into the pages (code included) or the README.
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
# Every page (the lab notes of past versions are in benchmarks/NOTES.md, outside the docs).
CHECKED_TEXTS = [*PAGES, README]


@pytest.mark.parametrize("path", CHECKED_TEXTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_retired_names(path: Path) -> None:
    text = path.read_text()
    where = path.relative_to(DOCS).as_posix() if DOCS in path.parents else path.name
    for pattern, instead in RETIRED.items():
        if where in NAMES_GONE_SETTINGS and pattern in GONE_SETTING_PATTERNS:
            continue
        found = re.search(pattern, text)
        assert found is None, f"{where} says {found.group(0)!r}: use {instead}"


# --- how-it-works.md: what a daylight-saving change does to each kind of schedule -------

DST_YEAR = 2026
DST_ZONES = ("Europe/Paris", "America/New_York", "Australia/Lord_Howe")
# The table's columns: a job's declaration, and how far from a change its slots are shown
# (a daily job: its slot that night; an hourly one: the hour either side).
DST_JOBS = {
    '`cron="30 2 * * *"`': ({"cron": "30 2 * * *"}, dt.timedelta(hours=12)),
    '`cron="0 * * * *"`': ({"cron": "0 * * * *"}, dt.timedelta(hours=1)),
    '`every="1h"`': ({"every": "1h"}, dt.timedelta(hours=1)),
}


def dst_table() -> list[str]:
    """The daylight-saving table of how-it-works.md, computed: for each change of UTC
    offset of each zone in DST_YEAR (from the tz database), the slots the schedule code
    gives near it, on the zone's clock, as ``exclusive_jobs next`` shows them."""
    header = ["time zone", f"{DST_YEAR} change", *DST_JOBS]
    lines = [_row(header), "|" + "|".join(["---"] * len(header)) + "|"]
    for zone in DST_ZONES:
        for change in changes_of(zone, DST_YEAR):
            cells = [zone, _dst_change(zone, change)]
            for declared, span in DST_JOBS.values():
                shown = _slots_near(zone, declared, change, span)
                cells.append(", ".join(_clock(slot.local) for slot in shown))
            lines.append(_row(cells))
    return lines


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _clock(moment: dt.datetime) -> str:
    """``03:00 +02:00``: a time on its zone's clock, with its UTC offset."""
    return f"{moment:%H:%M} {moment.isoformat()[-6:]}"


def _dst_change(zone: str, change: dt.datetime) -> str:
    """``29 March: 02:00 +01:00 → 03:00 +02:00, 02:00-03:00 does not exist``."""
    tz = ZoneInfo(zone)
    old = (change - dt.timedelta(minutes=1)).astimezone(tz).utcoffset()
    assert old is not None
    before, after = change.astimezone(dt.timezone(old)), change.astimezone(tz)
    if after.replace(tzinfo=None) > before.replace(tzinfo=None):
        gap = f"{before:%H:%M}-{after:%H:%M} does not exist"
    else:
        gap = f"{after:%H:%M}-{before:%H:%M} comes twice"
    return f"{after.day} {after:%B}: {_clock(before)} → {_clock(after)}, {gap}"


def _slots_near(
    zone: str, declared: dict[str, str], change: dt.datetime, span: dt.timedelta
) -> list[Any]:
    """The slots of a job declared so in ``zone`` from ``span`` before ``change`` to
    ``span`` after it, as the ``next`` command computes them (an ``every=`` job's zone
    is ``TIME_ZONE``)."""
    from django_exclusive_jobs.run.preview import upcoming

    with override_settings(TIME_ZONE=zone):
        cron_zone = zone if "cron" in declared else None
        schedule = make_schedule(**declared, timezone=cron_zone)  # type: ignore[arg-type]
        job = registry.Job(name="dst", func=lambda: None, schedule=schedule)
        start = change - span - dt.timedelta(microseconds=1)
        coming = upcoming(job, start, 2 * span // dt.timedelta(minutes=30) + 2)
    return [slot for slot in coming if slot.slot <= change + span]


def test_daylight_saving_table_is_what_the_schedules_do() -> None:
    """The table on how-it-works.md is computed again here, from the real transitions
    of its zones and the real schedule code: it cannot drift."""
    page = section("how-it-works.md", "### Daylight saving")
    shown = [line for line in page.splitlines() if line.startswith("|")]
    assert shown == dst_table(), "\n".join(["how-it-works.md should show:", *dst_table()])


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
    load_sample("quickstart_jobs")
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


def test_python_samples_pass_ruff() -> None:
    """The samples are held to the project's lint and format rules, as code files are.
    F821 (undefined name) is left to the tests that run them: a settings fragment uses
    the settings above it, and the README's samples call the reader's own functions."""
    ruff_main = pytest.importorskip("ruff.__main__", reason="ruff is in the dev extra")
    ruff = ruff_main.find_ruff_bin()
    problems = []
    for block in python_blocks():
        name = f"docs/{block.where.replace(':', '_line_').replace('/', '_')}.py"
        ignore = "F821"
        for argv in (
            [ruff, "check", "--quiet", "--ignore", ignore, "--stdin-filename", name, "-"],
            [ruff, "format", "--diff", "--quiet", "--stdin-filename", name, "-"],
        ):
            result = subprocess.run(
                argv, input=block.body + "\n", capture_output=True, text=True, cwd=ROOT
            )
            if result.returncode != 0:
                problems.append(f"{block.where}: {argv[1]}\n{result.stdout}{result.stderr}")
    assert not problems, "\n".join(problems)


# --- scheduler.md: the jobs, the health check, the receiver, the lines and exit codes ---


def section(page: str, heading: str) -> str:
    """The text of ``page`` under ``heading`` (a line of its own), up to the next heading
    of the same or a higher level."""
    text = (DOCS / page).read_text()
    level = heading.split(" ", 1)[0]
    body = text.split(f"\n{heading}\n", 1)[1]
    ends = [m.start() for m in re.finditer(rf"^#{{1,{len(level)}}} ", body, re.MULTILINE)]
    return body[: ends[0]] if ends else body


def test_scheduler_jitter_sample(sqlite: str) -> None:
    """The page's jittered job: hourly, each slot starting within 10 minutes after it."""
    import datetime as dt

    load_sample("scheduler_jitter", fetch_all_feeds=lambda: None)
    job = registry.get_job("refresh_feeds")
    assert job is not None and job.jitter == dt.timedelta(minutes=10)
    slots = [dt.datetime(2026, 11, 24, hour, tzinfo=dt.UTC) for hour in range(24)]
    offsets = [job.start_of(slot) - slot for slot in slots]
    assert all(dt.timedelta(0) <= each < dt.timedelta(minutes=10) for each in offsets)
    assert len(set(offsets)) > 1  # "differs from hour to hour"


def test_scheduler_several_schedules_sample(sqlite: str) -> None:
    """One function, two jobs, each run with its own arguments; a direct call is refused."""
    import datetime as dt

    from django_exclusive_jobs.run import control

    sent: list[str] = []
    module = load_sample("scheduler_several_schedules", send_report=sent.append)
    daily, weekly = registry.get_job("report:daily"), registry.get_job("report:weekly")
    assert daily is not None and weekly is not None
    assert (daily.kwargs, weekly.kwargs) == ({"period": "day"}, {"period": "week"})
    assert weekly.schedule is not None and "Europe/Paris" in weekly.schedule.describe()
    assert daily.ttl == weekly.ttl == "30m" and daily.jitter == dt.timedelta(minutes=5)
    for name in ("report:daily", "report:weekly"):
        assert control.run_now(name, by="docs", using=sqlite).status == RunStatus.SUCCEEDED
    assert sent == ["day", "week"]
    assert [run.kwargs for run in runs_of("report:weekly")] == [{"period": "week"}]
    with pytest.raises(TypeError, match="several schedules"):
        module.report("day")


def test_scheduler_jobs_sample(sqlite: str) -> None:
    """The page's jobs: each has a schedule and the policy the page says, and runs."""
    from django.contrib.auth import get_user_model
    from django.core.cache import cache

    from django_exclusive_jobs.lock.clock import database_now

    module = load_sample("scheduler_jobs", fetch_exchange_rates=lambda: {"EUR": 1.0})
    names = ("expire_sessions", "hourly_signups", "refresh_rates")
    jobs = {name: registry.get_job(name) for name in names}
    policies = {
        name: (job.catch_up.policy, job.catch_up.limit)
        for name, job in jobs.items()
        if job is not None and job.schedule is not None
    }
    assert policies == {
        "expire_sessions": ("latest", 10),
        "hourly_signups": ("all", 24),
        "refresh_rates": ("skip", 10),
    }
    # What exclusive_scheduler serves: every job with a schedule.
    from django_exclusive_jobs.management.commands.exclusive_scheduler import Command

    assert {job.name for job in Command()._jobs(list(names), None)} == set(names)

    assert module.expire_sessions() is None
    assert [run.status for run in runs_of("expire_sessions")] == [RunStatus.SUCCEEDED]

    users = get_user_model().objects
    now = database_now(sqlite)
    made = [
        users.create(username=f"docs_{minutes}", date_joined=now - dt.timedelta(minutes=minutes))
        for minutes in (10, 30, 70, 90, 150)
    ]
    try:
        counted = module.hourly_signups()  # called as the scheduler does: slot is given
        [run] = runs_of("hourly_signups")
        assert run.slot is not None
        since = run.slot - dt.timedelta(hours=1)
        # Users other tests left in that hour count too.
        others = users.exclude(pk__in=[user.pk for user in made])
        before = others.filter(date_joined__gte=since, date_joined__lt=run.slot).count()
        assert counted == before + sum(since <= user.date_joined < run.slot for user in made)
    finally:
        users.filter(pk__in=[user.pk for user in made]).delete()

    # "skip": a start more than the slot tolerance (30 s) after its slot runs nothing.
    cache.delete("exchange_rates")
    every_5m = make_schedule(every="5m")
    assert every_5m is not None
    started = database_now(sqlite)
    current = every_5m.slot_at(started)
    late = started - current > dt.timedelta(seconds=31)
    # Not its first run (a first run has nothing before it to account for): it ran before.
    JobRun.objects.using(sqlite).create(
        name="refresh_rates",
        slot=current - dt.timedelta(minutes=5),
        status=RunStatus.SUCCEEDED,
        started_at=started,
    )
    module.refresh_rates()
    [run] = [run for run in runs_of("refresh_rates") if run.slot == current]
    ran = (RunStatus.SUCCEEDED, {"EUR": 1.0})
    assert (run.status, cache.get("exchange_rates")) in [(RunStatus.MISSED, None), ran]
    if late:
        assert run.status == RunStatus.MISSED


def test_scheduler_health_sample(sqlite: str) -> None:
    from django.test import RequestFactory

    from django_exclusive_jobs.run.heartbeat import Heartbeat

    module = load_sample("scheduler_health")
    request = RequestFactory().get("/health/schedulers/")
    assert module.schedulers(request).status_code == 503  # none yet
    beat = Heartbeat(sqlite, ["hourly_signups"])
    beat.beat()
    response = module.schedulers(request)
    assert response.status_code == 200
    [alive] = json.loads(response.content)["alive"]
    assert alive["jobs"] == ["hourly_signups"] and alive["host"] and alive["pid"]
    beat.stopped()  # a clean exit
    assert module.schedulers(request).status_code == 503


def test_scheduler_overlap_sample() -> None:
    load_sample("scheduler_overlap", pull_the_warehouse_feed=lambda: None)
    job = registry.get_job("sync_inventory")
    assert job is not None and job.overlap.name == "buffer_one"


def test_scheduler_groups_sample() -> None:
    load_sample(
        "scheduler_groups", dump_the_database=lambda: None, vacuum_the_big_tables=lambda: None
    )
    backup, vacuum = registry.get_job("backup"), registry.get_job("vacuum")
    assert backup is not None and backup.groups == ("db-maintenance",)
    assert vacuum is not None and vacuum.groups == ("db-maintenance", "io")
    assert vacuum.overlap.waits_for_group and not backup.overlap.waits_for_group


def test_scheduler_timeout_sample() -> None:
    load_sample("scheduler_timeout", export_everything_to_the_warehouse=lambda: None)
    job = registry.get_job("warehouse_export")
    assert job is not None and job.time_limit == 45 * 60


def test_scheduler_in_process_sample() -> None:
    load_sample("scheduler_in_process", delete_expired_sessions=lambda: None)
    job = registry.get_job("clear_sessions")
    assert job is not None and job.in_process and job.runs_in_thread


def test_scheduler_slot_missed_sample(sqlite: str, caplog: pytest.LogCaptureFixture) -> None:
    from django_exclusive_jobs import exclusive_job
    from django_exclusive_jobs.lock.clock import database_now

    load_sample("scheduler_slot_missed")
    try:

        @exclusive_job("docs_missed", every="1h", keepalive=False)
        def hourly() -> str:
            return "ran"

        schedule = make_schedule(every="1h")
        assert schedule is not None
        current = schedule.slot_at(database_now(sqlite))
        before = current - dt.timedelta(hours=3)
        JobRun.objects.using(sqlite).create(
            name="docs_missed", slot=before, status=RunStatus.SUCCEEDED, started_at=before
        )
        caplog.set_level(logging.WARNING, logger="ops.alerts")
        assert hourly() == "ran"  # the latest slot runs; the two before it were missed
        alerts = [r.getMessage() for r in caplog.records if r.name == "ops.alerts"]
        assert len(alerts) == 2
        assert all(line.startswith("job docs_missed: slot ") for line in alerts)
        assert all("missed (noticed by " in line for line in alerts)
    finally:
        signals.slot_missed.disconnect(dispatch_uid="ops_slot_missed")


def test_exclusive_scheduler_exit_codes_match_the_docs() -> None:
    """The exit codes of the reference and the scheduler page are the command's --help."""
    from django_exclusive_jobs.management.commands.exclusive_scheduler import EPILOG

    codes = re.findall(r"^  (\d+) ", EPILOG, re.MULTILINE)
    assert codes == ["0", "2"]
    reference = section("reference/commands.md", "## `exclusive_scheduler`")
    page = section("scheduler.md", "## Options and exit codes")
    for text in (reference, page):
        assert re.findall(r"^\| (\d+) \|", text, re.MULTILINE) == codes
    # Both list every option of the command (but Django's own).
    options = long_options(
        "exclusive_scheduler",
        {"jobs", "exclude", "database", "max_concurrent", "grace", "skip_schedules"},
    )
    for text in (reference, page):
        assert set(re.findall(r"^\| `(--[a-z-]+)", text, re.MULTILINE)) == options


def test_the_line_for_slots_that_came_during_a_run_is_documented(
    sqlite: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A start after a run that lasted past two slots records them skipped (overlap="skip")
    and prints the documented line for them, then runs its own slot."""
    from django_exclusive_jobs import exclusive_job
    from django_exclusive_jobs.lock.clock import database_now

    @exclusive_job("docs_overran", every="1d", keepalive=False)
    def daily() -> None:
        pass

    schedule = make_schedule(every="1d")
    assert schedule is not None
    current = schedule.slot_at(database_now(sqlite))
    before = current - dt.timedelta(days=3)
    JobRun.objects.using(sqlite).create(
        name="docs_overran",
        slot=before,
        status=RunStatus.SUCCEEDED,
        started_at=before,
        finished_at=current - dt.timedelta(hours=1),
        duration=(current - before).total_seconds() - 3600,
    )
    caplog.set_level(logging.INFO, logger="django_exclusive_jobs")
    call_command("run_exclusive", "docs_overran", verbosity=0)
    lines = [r.getMessage() for r in caplog.records if r.name == "django_exclusive_jobs"]
    skipped = [line for line in lines if line.startswith("skipped docs_overran: ")]
    assert_lines_match(skipped, documented_block("reference/commands.md", "skipped NAME: N"))
    first, last = before + dt.timedelta(days=1), before + dt.timedelta(days=2)
    assert skipped == [
        f"skipped docs_overran: 2 slot(s) came while its previous run still ran "
        f"(overlap=skip), {first.isoformat()} .. {last.isoformat()}; recorded"
    ]
    statuses = [run.status for run in JobRun.objects.using(sqlite).filter(name="docs_overran")]
    assert sorted(statuses) == ["skipped"] * 2 + ["succeeded"] * 2


def test_missed_slot_lines_are_documented(sqlite: str, caplog: pytest.LogCaptureFixture) -> None:
    """A late start under catch_up="skip" prints both documented lines, and no other."""
    from django_exclusive_jobs import exclusive_job
    from django_exclusive_jobs.lock.clock import database_now

    # No tolerance: a start is on time only at the very instant of its slot.
    @exclusive_job("docs_late", every="1d", slot_tolerance=0, catch_up="skip", keepalive=False)
    def daily() -> None:
        raise AssertionError("a late start under catch_up='skip' runs nothing")

    schedule = make_schedule(every="1d", tolerance=0)
    assert schedule is not None
    before = schedule.slot_at(database_now(sqlite)) - dt.timedelta(days=3)
    JobRun.objects.using(sqlite).create(
        name="docs_late", slot=before, status=RunStatus.SUCCEEDED, started_at=before
    )
    caplog.set_level(logging.INFO, logger="django_exclusive_jobs")
    call_command("run_exclusive", "docs_late", verbosity=0)
    lines = [r.getMessage() for r in caplog.records if r.name == "django_exclusive_jobs"]
    assert_lines_match(lines, documented_block("reference/commands.md", "missed NAME"))
    assert lines[0].startswith("missed docs_late: 3 slot(s) no server ran, ")
    statuses = [run.status for run in JobRun.objects.using(sqlite).filter(name="docs_late")]
    assert sorted(statuses) == ["missed"] * 3 + ["succeeded"]


def test_exclusive_scheduler_prints_the_documented_lines(sqlite: str, tmp_path: Path) -> None:
    """A scheduler that runs a job and is stopped in the middle of it prints documented
    lines only, on standard output and standard error."""
    import signal

    from .helpers import reaped
    from .test_command import command_env, wait_for
    from .test_scheduler import start_scheduler

    marker = tmp_path / "marker.txt"
    env = command_env(marker, TICK_EVERY="1s", JOB_SECONDS="60")
    with reaped() as started:
        process = start_scheduler(
            started, sqlite, "--jobs", "steady", "--grace", "0", "--verbosity", "2", env=env
        )
        # The job itself has begun (its first line), not only its run row: a SIGTERM
        # between the two stops the start, and there is then nothing to wait for. The job
        # has a 30 s lease: a 3 s one could end on a loaded machine before the signal comes
        # (no renewal reached the job in time), and the run then ends as lost, not stopped.
        wait_for(lambda: marker.exists() and "steady-start " in marker.read_text(), timeout=60)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    patterns = [
        output_pattern(line)
        for first in ("scheduler started", "acquired NAME", "missed NAME", "skipped NAME: N")
        for line in documented_block("reference/commands.md", first)
    ]
    lines = [line for line in (out + err).splitlines() if line.strip()]
    for line in lines:
        assert any(p.fullmatch(line) for p in patterns), f"undocumented output: {line!r}"
    assert out.splitlines()[0].startswith("scheduler started: 1 job(s), max 10 at once; ")
    assert out.splitlines()[-1] == "scheduler stopped"
    said = "\n".join(lines)
    assert "\nacquired steady token=" in said
    assert "\nstopping: waiting up to 0s for 1 running job(s): steady\n" in said
    assert "\nfinished steady status=interrupted " in said


# --- operations.md: the jobs page, exclusive_jobs, the health view, the alert recipes ---


def test_exclusive_jobs_exit_codes_and_options_match_the_docs() -> None:
    """The reference lists the exit codes of exclusive_jobs --help, and every option."""
    from django_exclusive_jobs.management.commands.exclusive_jobs import EPILOG

    codes = re.findall(r"(\d) [a-z-]", EPILOG.split("exit codes:", 1)[1])
    assert codes == ["0", "1", "2", "3", "4"]
    reference = section("reference/commands.md", "## `exclusive_jobs`")
    assert re.findall(r"^\| (\d+) \|", reference, re.MULTILINE) == codes
    options = long_options(
        "exclusive_jobs",
        {
            *("json", "check", "database", "by", "kwargs", "reason", "until"),
            *("start", "end", "dry_run", "wait", "yes", "count", "beat_database"),
        },
    )
    assert set(re.findall(r"^\| `(--[a-z-]+)", reference, re.MULTILINE)) == options
    actions = {
        choice
        for action in parser_of("exclusive_jobs")._actions
        if not action.option_strings and action.choices
        for choice in action.choices
    }
    assert set(re.findall(r"^\| `([a-z][a-z-]*)[ `]", reference, re.MULTILINE)) == actions


def test_exclusive_jobs_prints_the_documented_lines(sqlite: str) -> None:
    """--check prints one documented line per kind of problem; pause and resume too; the
    table's header is the one operations.md shows."""
    from django_exclusive_jobs import exclusive_job
    from django_exclusive_jobs.lock.clock import database_now
    from django_exclusive_jobs.models import Scheduler

    def run(*args: str) -> tuple[int, list[str]]:
        out = StringIO()
        try:
            call_command("exclusive_jobs", *args, "--database", sqlite, stdout=out)
        except SystemExit as exc:
            return int(exc.code or 0), out.getvalue().splitlines()
        return 0, out.getvalue().splitlines()

    code, clean = run("--check")
    assert code == 0 and clean[0].startswith("ok: ")

    now = database_now(sqlite)
    hour = dt.timedelta(hours=1)
    for name in ("docs_overdue", "docs_noticed"):
        exclusive_job(name, every="1h")(lambda: None)
    exclusive_job("docs_long")(lambda: None)
    every_hour = make_schedule(every="1h")
    assert every_hour is not None
    current = every_hour.slot_at(now)
    runs = JobRun.objects.using(sqlite)
    # failing: its last run failed.
    JobLock.objects.using(sqlite).update_or_create(name="broken", defaults={"token": 1})
    runs.create(name="broken", status=RunStatus.FAILED, started_at=now, finished_at=now)
    # stale lock: a holder that never released it.
    hold_in_other_thread("slow")
    expire_now(sqlite, "slow")
    # missed, before anyone notices: the slot two hours back ran, none since.
    JobLock.objects.using(sqlite).create(name="docs_overdue", token=1)
    runs.create(name="docs_overdue", slot=current - 2 * hour, status="succeeded", started_at=now)
    # missed, as a start recorded it: the current slot's row says so.
    JobLock.objects.using(sqlite).create(name="docs_noticed", token=1)
    runs.create(name="docs_noticed", slot=current, status=RunStatus.MISSED, started_at=now)
    # running long: an hour into a run whose median is one second.
    long = hold_in_other_thread("docs_long")
    runs.create(name="docs_long", status="running", token=long.token, started_at=now - hour)
    for _ in range(3):
        runs.create(name="docs_long", status="succeeded", started_at=now - hour, duration=1.0)
    # running long past its warn_after: an hour into a run of a job warned after 30 min.
    exclusive_job("docs_warned", warn_after="30m")(lambda: None)
    warned = hold_in_other_thread("docs_warned")
    runs.create(name="docs_warned", status="running", token=warned.token, started_at=now - hour)
    # no scheduler alive: the one that served "tick" stopped beating.
    Scheduler.objects.using(sqlite).create(
        instance="gone",
        host="web-1",
        pid=1,
        jobs=["tick"],
        started_at=now - hour,
        last_beat_at=now - hour,
    )

    # unserved: a run asked for now waits, and no live scheduler serves the job.
    from django_exclusive_jobs.run import control

    control.request_run("quick", by="alice", using=sqlite)
    # never ran: declared two hours ago, every hour, and no run since.
    exclusive_job("docs_new", every="1h")(lambda: None)
    JobLock.objects.using(sqlite).update_or_create(
        name="docs_new", defaults={"token": 0, "created_at": now - 2 * hour}
    )
    # unserved: a slot went unrun and no live scheduler serves the job (the live one
    # serves the jobs above, which are missed or never ran instead).
    exclusive_job("docs_unserved", every="1h")(lambda: None)
    JobLock.objects.using(sqlite).create(name="docs_unserved", token=1)
    runs.create(name="docs_unserved", slot=current - 2 * hour, status="succeeded", started_at=now)
    Scheduler.objects.using(sqlite).create(
        instance="alive",
        host="web-2",
        pid=2,
        jobs=["docs_overdue", "docs_new", "docs_noticed"],
        started_at=now,
        last_beat_at=now,
    )
    # interrupted: twice in a row (one graceful stop is no problem).
    exclusive_job("docs_cut")(lambda: None)
    for _ in range(2):
        runs.create(name="docs_cut", status=RunStatus.INTERRUPTED, started_at=now, finished_at=now)

    # a scheduler started with --skip-schedules, alive.
    Scheduler.objects.using(sqlite).create(
        instance="skipper", host="web-3", pid=3, started_at=now, last_beat_at=now,
        skips_schedules=True,
    )  # fmt: skip

    code, problems = run("--check")
    assert code == 1
    # SKIP_SCHEDULES here: its own line (the jobs' slot problems are left out then).
    with override_settings(EXCLUSIVE_JOBS={"SKIP_SCHEDULES": True}):
        skipped_code, skipped = run("--check")
    assert skipped_code == 1
    printed = clean + problems + skipped
    assert_lines_match(printed, documented_block("reference/commands.md", "ok: N"))

    # pause and resume print the documented lines; a paused job's start says who paused it.
    lines = [*run("pause", "quick", "--by", "alice")[1], *run("resume", "quick")[1]]
    assert_lines_match(lines, documented_block("reference/commands.md", "paused NAME"))

    # The table's header is the one operations.md shows.
    operations = (DOCS / "operations.md").read_text()
    [example] = [body for _info, body in fenced_blocks(operations) if body.startswith("JOB ")]
    assert run()[1][0].split() == example.splitlines()[0].split()
    long.release()


def test_exclusive_jobs_backfill_prints_the_documented_lines(
    sqlite: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every line a backfill prints (its dry run, its runs, a held lock, a job without
    ``slot``) is one commands.md documents, as are the lines operations.md shows."""
    from django_exclusive_jobs.lock.clock import database_now

    current = make_schedule(every="1h").slot_at(database_now(sqlite))  # type: ignore[union-attr]
    three, one = current - 3 * dt.timedelta(hours=1), current - dt.timedelta(hours=1)
    JobRun.objects.using(sqlite).create(
        name="backfill_hourly", slot=three, status="succeeded", started_at=three
    )

    def run(name: str, *args: str) -> list[str]:
        out, err = StringIO(), StringIO()
        span = ["--from", three.isoformat(), "--to", one.isoformat()]
        with contextlib.suppress(SystemExit):
            call_command("exclusive_jobs", "backfill", name, *span, *args, stdout=out, stderr=err)
        return out.getvalue().splitlines() + err.getvalue().splitlines()

    lines = run("backfill_hourly", "--dry-run") + run("backfill_slotless", "--dry-run")
    held = hold_in_other_thread("backfill_hourly")
    try:
        lines += run("backfill_hourly", "--wait", "0")
    finally:
        held.release()
    lines += run("backfill_hourly")
    # Its warnings went to the log (pytest's handler), not to the command's output.
    lines += [r.getMessage() for r in caplog.records if r.name == "django_exclusive_jobs"]
    counts = re.compile(r"(?<=slot\(s\): )(none|\d+ [a-z ]+(, \d+ [a-z ]+)*)")
    shown = [counts.sub("COUNTS", line) for line in lines]
    documented = documented_block("reference/commands.md", "backfill NAME:")
    runs = documented_block("reference/commands.md", "acquired NAME")
    patterns = [output_pattern(line) for line in documented + runs]
    for line in shown:
        assert any(p.fullmatch(line) for p in patterns), f"undocumented output: {line!r}"
    said = {
        doc for doc, p in zip(documented, patterns, strict=False) if any(map(p.fullmatch, shown))
    }
    stop = "backfill of NAME stopped by signal N; run it again with --from SLOT"
    assert set(documented) - said == {stop}  # that one: tests/test_backfill.py
    operations = (DOCS / "operations.md").read_text()
    [sample] = [body for _info, body in fenced_blocks(operations) if body.startswith("backfill ")]
    for line in sample.splitlines():
        assert any(p.fullmatch(counts.sub("COUNTS", line)) for p in patterns), line


def test_exclusive_jobs_next_prints_the_documented_lines(
    sqlite: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sample of ``next`` is its output, word for word, at the database time it
    shows; each line it prints is a documented one, and its JSON has the documented
    fields."""
    from django_exclusive_jobs import exclusive_job
    from django_exclusive_jobs.management.commands import exclusive_jobs

    def run(*args: str) -> list[str]:
        out = StringIO()
        call_command("exclusive_jobs", "next", *args, stdout=out)
        return out.getvalue().splitlines()

    reference = (DOCS / "reference" / "commands.md").read_text()
    prompt = "$ python manage.py exclusive_jobs next "
    [sample] = [body for _info, body in fenced_blocks(reference) if body.startswith(prompt)]
    command, *shown = sample.splitlines()
    now = dt.datetime.fromisoformat(re.findall(r" after (\S+) \(database time\)", shown[0])[0])
    monkeypatch.setattr(exclusive_jobs, "database_now", lambda using: now)
    exclusive_job("nightly_export", cron="30 2 * * *", timezone="Europe/Paris", jitter="10m")(
        lambda: None
    )
    printed = run(*shlex.split(command.removeprefix(prompt)))
    assert printed == shown

    documented = documented_block("reference/commands.md", "next N slot(s) of NAME")
    schedule = registry.get_job("nightly_export").schedule.describe()  # type: ignore[union-attr]
    assert_lines_match([printed[0].replace(schedule, "SCHEDULE"), *run("quick")], documented)

    [json_row] = [line for line in reference.splitlines() if "with `next`, an object" in line]
    said = json_row.split("with `next`, an object with", 1)[1].split("(", 1)[0]
    fields, slot_fields = (re.findall(r"`(\w+)`", part) for part in said.split("each slot"))
    answer = json.loads("\n".join(run("nightly_export", "--json")))
    assert list(answer) == fields
    assert [list(slot) for slot in answer["slots"]] == [slot_fields] * 10
    unscheduled = json.loads("\n".join(run("quick", "--json")))
    assert (unscheduled["schedule"], unscheduled["slots"]) == (None, [])


def test_paused_skip_line_is_the_documented_one(sqlite: str, capsys: Any) -> None:
    from django_exclusive_jobs.run import control

    control.pause("quick", by="alice (admin)", using=sqlite)
    call_command("run_exclusive", "quick")
    [line] = capsys.readouterr().out.splitlines()
    operations = (DOCS / "operations.md").read_text()
    [example] = [
        body.strip()
        for _info, body in fenced_blocks(operations)
        if body.strip().startswith("skipped nightly_export: paused by ")
    ]
    pattern = re.escape(example).replace("nightly_export", "quick")
    pattern = re.sub(r"2026\\-11\\-24T09:12:03\\\+00:00", r"\\S+", pattern)
    assert re.fullmatch(pattern, line), (line, example)


def test_health_view_samples(sqlite: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The URL and settings samples route the view; it answers the token as documented,
    with the documented fields."""
    from django.test import Client

    from django_exclusive_jobs.lock.clock import database_now

    monkeypatch.setenv("JOBS_HEALTH_TOKEN", "s3cret-from-the-environment")
    jobs_settings = settings_of("health_token")["EXCLUSIVE_JOBS"]
    assert jobs_settings == {"HEALTH_TOKEN": "s3cret-from-the-environment"}
    monkeypatch.delenv("JOBS_HEALTH_TOKEN")
    assert settings_of("health_token")["EXCLUSIVE_JOBS"] == {"HEALTH_TOKEN": None}

    module = load_sample("health_urls")
    bearer = {"Authorization": "Bearer s3cret-from-the-environment"}
    with override_settings(ROOT_URLCONF=module.__name__, EXCLUSIVE_JOBS=jobs_settings):
        client = Client()
        assert client.get("/jobs/health/").status_code == 403
        assert client.get("/jobs/health/").json() == {"error": "forbidden"}
        assert client.get("/jobs/health/", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
        fine = client.get("/jobs/health/", headers=bearer)
        assert fine.status_code == 200 and fine.json()["ok"] is True
        now = database_now(sqlite)
        JobLock.objects.using(sqlite).update_or_create(name="broken", defaults={"token": 1})
        JobRun.objects.using(sqlite).create(
            name="broken", status=RunStatus.FAILED, started_at=now, finished_at=now
        )
        answer = client.get("/jobs/health/", headers=bearer)
    assert answer.status_code == 503
    body = answer.json()
    assert body["ok"] is False and body["problems"][0].startswith("broken: failing: ")
    assert "no-cache" in answer["Cache-Control"]

    # The fields operations.md shows are the ones the view returns.
    operations = (DOCS / "operations.md").read_text()
    [example] = [json.loads(body) for info, body in fenced_blocks(operations) if info == "json"]
    assert list(example) == list(body)
    [broken] = [job for job in body["jobs"] if job["name"] == "broken"]
    [shown] = example["jobs"]
    assert list(shown) == list(broken)
    assert set(shown["last_run"]) <= set(broken["last_run"])
    assert shown["health"] == broken["health"] == "failing"


# Django 6.1 warns that a project without MAILERS relies on default mailers: a matter of
# the project's settings, not of the recipe.
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::PendingDeprecationWarning")
def test_alerts_mail_sample(sqlite: str, mailoutbox: list[Any]) -> None:
    """The e-mail recipe mails the ADMINS once per failed run and once per missed slot."""
    from django_exclusive_jobs import exclusive_job
    from django_exclusive_jobs.lock.clock import database_now

    load_sample("alerts_mail")
    try:

        @exclusive_job("docs_mail_failing")
        def failing() -> None:
            raise RuntimeError("the report server said no")

        @exclusive_job("docs_mail_hourly", every="1h", keepalive=False)
        def hourly() -> str:
            return "ran"

        import django

        # Django 6.0 takes plain addresses (and deprecates the (name, address) pairs).
        admins: list[Any] = ["ops@example.com"]
        if django.VERSION < (6, 0):
            admins = [("Ops", "ops@example.com")]
        with override_settings(ADMINS=admins):
            with pytest.raises(RuntimeError):
                failing()
            [mail] = mailoutbox
            assert mail.subject.endswith("Job docs_mail_failing failed")
            assert "the report server said no" in mail.body
            assert mail.to == ["ops@example.com"]

            schedule = make_schedule(every="1h")
            assert schedule is not None
            before = schedule.slot_at(database_now(sqlite)) - dt.timedelta(hours=3)
            JobRun.objects.using(sqlite).create(
                name="docs_mail_hourly", slot=before, status=RunStatus.SUCCEEDED, started_at=before
            )
            assert hourly() == "ran"  # the latest slot runs; the two before it were missed
        missed = [mail.subject for mail in mailoutbox[1:]]
        assert len(missed) == 2
        assert all("Job docs_mail_hourly: slot " in subject for subject in missed)
        assert all(subject.endswith(" UTC missed") for subject in missed)
    finally:
        signals.job_finished.disconnect(dispatch_uid="mail_job_finished")
        signals.slot_missed.disconnect(dispatch_uid="mail_slot_missed")


def test_operations_page_shows_the_jobs_screenshots() -> None:
    """The jobs page's screenshots are on the page and in the repository; the old summary
    page's are gone."""
    page = (DOCS / "operations.md").read_text()
    shown = ("admin-jobs", "admin-jobs-dark", "admin-jobs-pause-confirmation")
    pictures = ("admin-jobs-strips-light", "admin-job-light", "admin-job-dark")
    for name in shown + pictures:
        assert f"_static/screenshots/{name}.png)" in page
        assert (DOCS / "_static" / "screenshots" / f"{name}.png").exists()
    for path in PAGES:
        assert "admin-summary" not in path.read_text(), where(path)


# --- observe.md ---------------------------------------------------------------------------


def test_observe_settings_samples_turn_each_integration_on_and_pass_the_checks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SENTRY_DSN", raising=False)  # the sample's init() sends nothing
    traces = settings_of("observe_opentelemetry_settings")["EXCLUSIVE_JOBS"]
    monitors = settings_of("observe_sentry_settings")["EXCLUSIVE_JOBS"]
    assert traces == {"OPENTELEMETRY": True} and monitors == {"SENTRY_MONITORS": True}
    with override_settings(EXCLUSIVE_JOBS=traces):
        assert check_settings() == []
    with override_settings(EXCLUSIVE_JOBS=monitors):
        # The test app's jobs every 2 s can have no Sentry monitor (W004); nothing else.
        assert {message.id for message in check_settings()} == {"django_exclusive_jobs.W004"}

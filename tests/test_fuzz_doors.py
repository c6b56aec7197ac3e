"""Fuzzed at every door (issue 41, item 6): hostile values against each command's options
and each admin form and action, on every backend.

Each door is one test; hypothesis draws its values from tests/fuzz_strategies.py (extreme
dates in several zones, extreme durations as text, control and format characters, huge
and deeply nested JSON, huge cron, unicode names), mixed with plausible values so that
both branches run. For every example:

- a command exits 0 only for a value that may be accepted, and then did what it says;
  else it exits 2 with exactly one non-empty line on standard error; never a traceback,
  never a control or format character (ESC, NUL, CR, C0, C1, U+2028/9, bidi) in what it
  prints;
- an admin form answers 302 only for values that may be accepted (then the jobs page,
  the job's page, health and metrics still answer, and undoing it works), else 200 with
  the form's error; never 500;
- a refused value changed no row (JobLock, JobRun, JobState, JobChange, RunRequest and,
  for the admin, its log) and left no lock.

Commands run in this process (the argv path of ``manage.py``, its stdout and stderr and
the app's log handler pointed at buffers); one test per command runs the nastiest known
value through a real ``python -m django`` process. One test fuzzes the admin with a real
``exclusive_scheduler`` serving a healthy job beside the fuzzed one: it must keep
serving it.

Examples per test: ``EXAMPLES`` below (CI: derandomized, so CI is reproducible); set
``EXCLUSIVE_JOBS_FUZZ_EXAMPLES`` to run more (a number per test) locally, and
``EXCLUSIVE_JOBS_FUZZ_PHASES`` to choose hypothesis' phases.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import traceback
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.core.management import ManagementUtility, get_commands
from django.db import connections
from django.test import Client, override_settings
from django.urls import reverse
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from django_exclusive_jobs import try_acquire, values
from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.models import JobChange, JobLock, JobRun, JobState, RunRequest
from django_exclusive_jobs.run import control, overrides, preview
from django_exclusive_jobs.run.registry import get_job

from . import fuzz_strategies as fs
from .conftest import clean_tables
from .fuzz_strategies import EITHER, INVALID, VALID, Verdict
from .process_output import Output
from .test_command import ROOT, command_env, wait_for
from .test_scheduler import scheduler_env, schedulers, start_scheduler

# Run in the README suite on every database; the Django 6.x stages of CI leave them out
# (the doors themselves are checked there by tests/test_doors.py).
# no_deadline: at nice 10, but for the test beside a scheduler (tests/cpu_report.py).
pytestmark = [pytest.mark.slow, pytest.mark.no_deadline]

__all__ = ["schedulers"]  # a fixture

# --- how many examples ---------------------------------------------------------------------

CI = bool(os.environ.get("CI"))
MORE = int(os.environ.get("EXCLUSIVE_JOBS_FUZZ_EXAMPLES") or 0)
# Examples per door (each also runs its explicit @example cases first).
EXAMPLES = {
    "run_exclusive": 40,
    "pause": 30,
    "run": 25,
    "next": 30,
    "backfill": 30,
    "locks": 30,
    "prune": 25,
    "admin_pause": 20,
    "admin_override": 20,
    "admin_run_now": 20,
    "admin_backfill": 20,
    "admin_resume_back": 15,
    "scheduler": 5,
}


# Exploring locally: EXCLUSIVE_JOBS_FUZZ_PHASES=generate (or explicit,generate,shrink...)
# runs only those phases (an explicit example that fails stops hypothesis before it
# generates any).
PHASES = [
    Phase[name.strip()]
    for name in os.environ.get(
        "EXCLUSIVE_JOBS_FUZZ_PHASES", "explicit,reuse,generate,target,shrink"
    ).split(",")
]


def fuzzed(door: str) -> settings:
    return settings(
        max_examples=MORE or EXAMPLES[door],
        deadline=None,
        derandomize=CI,
        database=None,
        print_blob=True,
        phases=PHASES,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )


# --- output that cannot be forged ----------------------------------------------------------


def forbidden(text: str) -> list[str]:
    """The control and format characters in ``text`` (a newline ends a line: allowed)."""
    refused = {"Cc", "Cf", "Zl", "Zp", "Cs"}
    return sorted({repr(char) for char in text if char != "\n" and _category(char) in refused})


def _category(char: str) -> str:
    return unicodedata.category(char)


# --- commands, in this process -------------------------------------------------------------


@dataclass(frozen=True)
class Ran:
    argv: tuple[str, ...]
    code: int
    out: str
    err: str

    def said(self) -> str:
        shown = [arg if len(arg) < 200 else f"{arg[:200]}...({len(arg)})" for arg in self.argv]
        return (
            f"{shown!r} exit {self.code}\nstdout: {self.out[:2000]!r}\nstderr: {self.err[:2000]!r}"
        )


def run_command(*argv: str) -> Ran:
    """``manage.py ARGV`` as the shell runs it (its argv path: parsing, one-line errors,
    exit codes), in this process; stdout, stderr and the app's log lines captured."""
    out, err = io.StringIO(), io.StringIO()
    handlers = [
        handler
        for handler in logging.getLogger("django_exclusive_jobs").handlers
        if type(handler) is logging.StreamHandler
    ]
    streams = [handler.setStream(err) for handler in handlers]
    code = 0
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                command = ManagementUtility(["manage.py", *argv]).fetch_command(argv[0])
                command.run_from_argv(["manage.py", *argv])
            except SystemExit as exc:
                if isinstance(exc.code, int):
                    code = exc.code
                elif exc.code is None:
                    code = 0
                else:  # sys.exit("text"): Python prints it and exits 1
                    print(exc.code, file=sys.stderr)
                    code = 1
            except Exception:  # what Python's last-resort handler would print
                traceback.print_exc()
                code = 1
    finally:
        for handler, stream in zip(handlers, streams, strict=True):
            handler.setStream(stream)
        connections.close_all()
    return Ran(tuple(argv), code, out.getvalue(), err.getvalue())


def snapshot(alias: str, *, admin_log: bool = False) -> dict[str, Any]:
    """Every row a door could change; a row the database cannot read back is a change."""
    tables: dict[str, Any] = {}
    for model in (JobLock, JobRun, JobState, JobChange, RunRequest):
        try:
            rows = model.objects.using(alias).order_by("pk").values_list()
            tables[model.__name__] = [repr(row) for row in rows]
        except Exception as exc:  # a value it stored and cannot read: that is a change
            tables[model.__name__] = f"unreadable: {exc!r}"
    if admin_log:
        tables["LogEntry"] = list(LogEntry.objects.order_by("pk").values_list("pk", flat=True))
    return tables


def held_locks(alias: str) -> list[str]:
    return list(JobLock.objects.using(alias).held().values_list("name", flat=True))


def assert_command_contract(
    ran: Ran,
    verdict: Verdict,
    before: dict[str, Any],
    alias: str,
    *,
    refusals: frozenset[int] = frozenset({2}),
) -> bool:
    """The contract of a command's door for one example; True if it was accepted."""
    said = ran.said()
    assert "Traceback" not in ran.out + ran.err, said
    assert not forbidden(ran.out + ran.err), f"{forbidden(ran.out + ran.err)} in\n{said}"
    if ran.code == 0:
        assert verdict is not INVALID, f"accepted a value that must be refused:\n{said}"
        return True
    assert ran.code in refusals, f"refused with exit {ran.code}, not {sorted(refusals)}:\n{said}"
    assert verdict is not VALID, f"refused a value that must be accepted:\n{said}"
    lines = ran.err.splitlines()
    assert len(lines) == 1 and lines[0].strip(), f"not one line on stderr:\n{said}"
    assert snapshot(alias) == before, f"a refused command changed rows:\n{said}"
    assert held_locks(alias) == [], f"a refused command left a lock:\n{said}"
    return False


def database_option(alias: str) -> st.SearchStrategy[str]:
    """Mostly the backend under test, sometimes a hostile alias."""
    return fs.mostly(st.just(alias), fs.names, odds=5)


def alias_verdict(given: str) -> Verdict:
    return VALID if given in connections.settings else INVALID


def not_a_job(name: str) -> bool:
    """A hostile NAME must not happen to name a job or a command (``slow`` sleeps, ``spin``
    spins): those are run as they are."""
    return name not in get_commands() and get_job(name) is None


hostile_names = fs.names.filter(not_a_job)


def job_verdict(name: str) -> Verdict:
    return VALID if get_job(name) is not None else INVALID


# --- run_exclusive NAME [options] ----------------------------------------------------------

# option: (job, positive, least, at most this many seconds it must be taken). The slot
# tolerance goes to tick (every 2 s): a start within the tolerance before its slot waits
# for it, and before an hourly job's slot that could be minutes.
DURATION_OPTIONS: dict[str, tuple[str, bool, dt.timedelta, float]] = {
    "--wait": ("quick", False, dt.timedelta(0), 3600),
    "--timeout": ("quick", True, dt.timedelta(0), 86400),
    "--ttl": ("quick", True, dt.timedelta(0), 3600),
    "--min-hold": ("quick", False, dt.timedelta(0), 60),
    "--grace": ("quick", False, dt.timedelta(0), 3600),
    "--slot-tolerance": ("tick", False, dt.timedelta(0), 600),  # capped at a third of 2 s
    "--every": ("quick", True, dt.timedelta(seconds=1), 86400),
}


@st.composite
def run_exclusive_cases(draw: st.DrawFn, alias: str) -> tuple[list[str], Verdict, str]:
    """An argv of run_exclusive, its verdict, and the job it runs."""
    if draw(st.integers(0, 3)) == 0:
        cron = draw(fs.crons)
        job, argv, verdicts = "quick", [f"--cron={cron}"], [fs.cron_verdict(cron)]
        if draw(st.booleans()):
            zone = draw(fs.zones)
            argv += [f"--timezone={zone}"]
            verdicts.append(fs.zone_verdict(zone))
    else:
        option = draw(st.sampled_from(sorted(DURATION_OPTIONS)))
        job, positive, least, most = DURATION_OPTIONS[option]
        value = draw(fs.durations)
        argv = [f"{option}={value}"]
        verdicts = [fs.duration_verdict(value, positive=positive, least=least, most_plausible=most)]
    name = job
    if draw(st.integers(0, 4)) == 0:
        name = draw(hostile_names)
        verdicts.append(job_verdict(name))
    database = draw(database_option(alias))
    verdicts.append(alias_verdict(database))
    # (run_exclusive takes what follows "--" for a program: NAME comes last, as is.)
    return [*argv, "--database", database, name], fs.combine(*verdicts), job


def test_run_exclusive_options(alias: str) -> None:
    @fuzzed("run_exclusive")
    @given(run_exclusive_cases(alias))
    @example((["--wait", "999999999d", "--database", alias, "quick"], INVALID, "quick"))
    @example((["--timeout", "750000d", "--database", alias, "quick"], INVALID, "quick"))
    @example((["--every", "P999999999D", "--database", alias, "quick"], INVALID, "quick"))
    @example((["--ttl", "1e308", "--database", alias, "quick"], INVALID, "quick"))
    @example((["--grace", "nan", "--database", alias, "quick"], INVALID, "quick"))
    @example((["--slot-tolerance", "5s", "--database", alias, "tick"], VALID, "tick"))
    @example(([f"--cron={fs.HOSTILE_CRONS[0]}", "--database", alias, "quick"], INVALID, "quick"))
    @example((["--database", alias, "qu\u202eick\u2028"], INVALID, "quick"))
    def examples(case: tuple[list[str], Verdict, str]) -> None:
        argv, verdict, job = case
        clean_tables(alias)
        before = snapshot(alias)
        ran = run_command("run_exclusive", *argv)
        if not assert_command_contract(ran, verdict, before, alias):
            return
        # Accepted: it ran (or skipped a slot it had no business running), and let go.
        runs = JobRun.objects.using(alias).filter(name=job)
        assert not runs.filter(status="running").exists(), ran.said()
        if not any(arg.startswith("--min-hold") for arg in argv):
            assert held_locks(alias) == [], ran.said()
        scheduled = any(arg.startswith(("--cron", "--every")) for arg in argv)
        if job == "quick" and not scheduled:
            assert runs.filter(status="succeeded").count() == 1, ran.said()

    examples()


# --- exclusive_jobs pause / resume ---------------------------------------------------------


@st.composite
def pause_cases(draw: st.DrawFn, alias: str, now: dt.datetime) -> dict[str, Any]:
    name = draw(st.sampled_from(["digest", "summary:weekly"]))
    case: dict[str, Any] = {"name": name, "argv": [], "verdicts": []}
    if draw(st.integers(0, 4)):
        until = draw(fs.moments(now))
        case["until"] = until
        case["argv"] += [f"--until={until}"]
        zone = get_job(name).zone  # type: ignore[union-attr]
        case["verdicts"].append(fs.until_verdict(until, zone, now, stripped=False))
    for option in ("--reason", "--by"):
        if draw(st.booleans()):
            text = draw(fs.texts)
            case[option] = text
            case["argv"] += [f"{option}={text}"]
            judge = fs.reason_verdict(text) if option == "--reason" else fs.by_verdict(text)
            case["verdicts"].append(judge)
    if draw(st.integers(0, 9)) == 0:  # --check goes with list: pause must not pass silently
        case["argv"] += ["--check"]
        case["verdicts"].append(INVALID)
    database = draw(database_option(alias))
    case["argv"] += ["--database", database]
    case["verdicts"].append(alias_verdict(database))
    case["resume"] = draw(fs.texts)
    return case


def test_exclusive_jobs_pause_and_resume(alias: str) -> None:
    now = database_now(alias)

    @fuzzed("pause")
    @given(pause_cases(alias, now))
    @example(
        {
            "name": "summary:weekly",
            "argv": ["--until=0001-01-01T00:00", "--database", alias],
            "verdicts": [INVALID],
            "resume": "",
        }
    )
    @example(
        {
            "name": "digest",
            "argv": ["--until=9999-12-31T23:59-12:00", "--database", alias],
            "verdicts": [INVALID],
            "resume": "",
        }
    )
    @example(
        {
            "name": "digest",
            "argv": ["--until=2020-01-01T00:00", "--database", alias],
            "verdicts": [INVALID],
            "resume": "",
        }
    )
    @example(
        {
            "name": "digest",
            "argv": ["--check", "--database", alias],
            "verdicts": [INVALID],
            "resume": "",
        }
    )
    @example(
        {
            "name": "digest",
            "argv": [
                f"--reason=upgrade{fs.FORGED_LINE}",
                "--by=\x1b]0;pwned\x07",
                "--database",
                alias,
            ],
            "verdicts": [INVALID],
            "resume": "\x1b[2J",
        }
    )
    def examples(case: dict[str, Any]) -> None:
        name = case["name"]
        clean_tables(alias)
        before = snapshot(alias)
        ran = run_command("exclusive_jobs", "pause", name, *case["argv"])
        if not assert_command_contract(ran, fs.combine(*case["verdicts"]), before, alias):
            return
        state = JobState.objects.using(alias).get(name=name)
        assert state.paused, ran.said()
        if "--reason" in case:
            assert state.pause_reason.strip() == case["--reason"].strip(), ran.said()
        if "until" in case:
            zone = get_job(name).zone  # type: ignore[union-attr]
            expected = fs.moment_or_none(case["until"], zone)
            assert expected is not None and state.paused_until == expected, ran.said()
        pages_answer(alias, name)
        # Resume, with a reason of its own: refused or done, and a plain one always works.
        before = snapshot(alias)
        again = run_command("exclusive_jobs", "resume", name, f"--reason={case['resume']}",
                            "--database", alias)  # fmt: skip
        if assert_command_contract(again, fs.reason_verdict(case["resume"]), before, alias):
            assert f"resumed {name}" in again.out, again.said()
        else:
            plain = run_command("exclusive_jobs", "resume", name, "--database", alias)
            assert plain.code == 0 and f"resumed {name}" in plain.out, plain.said()
        assert not JobState.objects.using(alias).get(name=name).paused

    examples()


# --- exclusive_jobs run NAME --kwargs ------------------------------------------------------


def test_exclusive_jobs_run_with_kwargs(alias: str) -> None:
    @fuzzed("run")
    @given(fs.arguments, database_option(alias))
    @example(fs.HOSTILE_JSON[0], alias)
    @example(fs.HOSTILE_JSON[2], alias)
    @example(fs.HOSTILE_JSON[3], alias)
    @example('{"limit": "\\u0000"}', alias)
    @example('{"limit": 1e999}', alias)
    @example('{"limit": 4.810776117877146e+16}', alias)  # PostgreSQL gave it back an int
    @example('{"limit": "\U0001f680 launch"}', alias)  # an emoji: stored everywhere
    def examples(given: str, database: str) -> None:
        clean_tables(alias)
        before = snapshot(alias)
        verdict = fs.combine(fs.arguments_verdict(given, all_needed=False), alias_verdict(database))
        parsed = _loads(given)
        fails = (
            isinstance(parsed, dict)
            and "recipients" in parsed
            and not (
                isinstance(parsed["recipients"], list)
                and all(isinstance(item, str) for item in parsed["recipients"])
            )
        )
        if verdict is VALID and fails:
            verdict = EITHER  # taken, and the run fails (exit 1): its function says so
        ran = run_command("exclusive_jobs", "run", "digest", f"--kwargs={given}",
                          "--database", database)  # fmt: skip
        if ran.code == 1 and fails:  # the job's own failure, recorded as such
            [run] = JobRun.objects.using(alias).filter(name="digest")
            assert run.status == "failed" and not forbidden(ran.out + ran.err), ran.said()
            return
        if not assert_command_contract(ran, verdict, before, alias):
            return
        [run] = JobRun.objects.using(alias).filter(name="digest")
        assert run.status == "succeeded" and run.requested_by, ran.said()
        declared = get_job("digest").kwargs  # type: ignore[union-attr]
        assert run.kwargs == {**declared, **(parsed or {})}, ran.said()
        assert held_locks(alias) == []

    examples()


def _loads(text: str) -> Any:
    try:
        return json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError):
        return None


# --- exclusive_jobs next NAME -n N ---------------------------------------------------------


def test_exclusive_jobs_next(alias: str) -> None:
    @fuzzed("next")
    @given(
        fs.counts,
        st.booleans(),
        fs.mostly(st.sampled_from(["digest", "summary:weekly", "quick"]), hostile_names),
        database_option(alias),
    )
    @example("9" * 5000, False, "digest", alias)
    @example("\u0665", False, "digest", alias)
    @example("1000", True, "summary:weekly", alias)
    def examples(count: str, as_json: bool, name: str, database: str) -> None:
        clean_tables(alias)
        before = snapshot(alias)
        verdict = fs.combine(
            fs.count_verdict(count, preview.MAX_SLOTS), job_verdict(name), alias_verdict(database)
        )
        # NAME right after the action (argparse: a "--" after options would not give it).
        argv = ["exclusive_jobs", "next", name, "--database", database, f"-n{count}"]
        ran = run_command(*argv, *(["--json"] if as_json else []))
        if not assert_command_contract(ran, verdict, before, alias):
            return
        assert snapshot(alias) == before, ran.said()  # next only reads
        job = get_job(name)
        assert job is not None
        if job.schedule is None:
            return
        number = int(count)
        if as_json:
            assert len(json.loads(ran.out)["slots"]) == number, ran.said()
        else:
            assert ran.out.startswith(f"next {number} slot(s) of {name} after "), ran.said()
            assert len(ran.out.splitlines()) == number + 2, ran.said()

    examples()


# --- exclusive_jobs backfill NAME --from --to ----------------------------------------------


def hour_starts(start: dt.datetime, end: dt.datetime) -> int:
    """How many slots of an hourly job lie from ``start`` to ``end`` (both included)."""
    first = start.replace(minute=0, second=0, microsecond=0)
    if first < start:
        first += dt.timedelta(hours=1)
    if end < first:
        return 0
    return int((end - first) // dt.timedelta(hours=1)) + 1


@st.composite
def ranges(draw: st.DrawFn, now: dt.datetime) -> tuple[str, str]:
    """A plausible range of past hours (``to`` empty: now), or hostile moments."""
    if draw(st.booleans()):
        back = draw(st.integers(0, 24 * 45))
        start = (now - dt.timedelta(hours=back, minutes=draw(st.integers(0, 59)))).replace(
            second=0, microsecond=0, tzinfo=None
        )
        length = draw(st.integers(-3, 6))
        end = start + dt.timedelta(hours=length)
        shown = draw(st.sampled_from(["%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S"]))
        return start.strftime(shown), draw(st.sampled_from([end.strftime(shown)] * 3 + [""]))
    return draw(fs.moments(now)), draw(st.one_of(st.just(""), fs.moments(now)))


def range_verdict(start: str, end: str, now: dt.datetime, *, stripped: bool) -> tuple[Verdict, int]:
    """A backfill's range of backfill_hourly (UTC): its verdict, and its slot count."""
    zone = dt.UTC
    first = fs.moment_or_none(start, zone, stripped=stripped)
    last = fs.moment_or_none(end, zone, stripped=stripped) if end.strip() else now
    if first is None or last is None or "\x00" in start + end:
        return INVALID, 0
    if first > last:
        return INVALID, 0
    slots = hour_starts(first, min(last, now))
    if slots > 1000:
        return INVALID, slots
    plausible = fs.PLAUSIBLE_MOMENT.match(start.strip()) and (
        not end or fs.PLAUSIBLE_MOMENT.match(end.strip())
    )
    if last > now - dt.timedelta(minutes=5) or not plausible:
        return EITHER, slots  # the range reaches now, or a hostile value the validator takes
    return VALID, slots


def test_exclusive_jobs_backfill(alias: str) -> None:
    now = database_now(alias)

    @fuzzed("backfill")
    @given(ranges(now), st.booleans(), st.one_of(st.none(), fs.durations), database_option(alias))
    @example(("0001-01-01T00:00", ""), True, None, alias)
    @example(("2026-01-01T00:00", "9999-12-31T23:59:59.999999"), True, None, alias)
    @example(("1970-01-01T00:00+14:00", "1970-01-01T03:00+14:00"), True, None, alias)
    @example((f"{now:%Y-%m-%d}T00:00", ""), False, "999999999d", alias)
    def examples(given: tuple[str, str], dry_run: bool, wait: str | None, database: str) -> None:
        start, end = given
        clean_tables(alias)
        before = snapshot(alias)
        verdict, slots = range_verdict(start, end, now, stripped=False)
        if verdict is not INVALID and not dry_run and slots > 6:
            dry_run = True  # runs at most a few slots here
        argv = ["exclusive_jobs", "backfill", "backfill_hourly", f"--from={start}"]
        argv += [f"--to={end}"] if end else []
        argv += ["--dry-run"] if dry_run else []
        verdicts = [verdict, alias_verdict(database)]
        if wait is not None:
            argv += [f"--wait={wait}"]
            verdicts.append(fs.duration_verdict(wait))
        ran = run_command(*argv, "--database", database)
        if not assert_command_contract(ran, fs.combine(*verdicts), before, alias):
            return
        said = ran.out.count("would run backfill_hourly slot=")
        ran_slots = JobRun.objects.using(alias).filter(name="backfill_hourly", backfill=True)
        if dry_run:
            assert snapshot(alias) == before, ran.said()
            if verdict is VALID:
                assert said == slots, ran.said()
        elif verdict is VALID:
            assert ran_slots.filter(status="succeeded").count() == slots, ran.said()
        assert held_locks(alias) == [], ran.said()

    examples()


# --- exclusive_locks -----------------------------------------------------------------------

FREE_LOCK = "fuzz-lock"


@st.composite
def locks_cases(draw: st.DrawFn, alias: str) -> tuple[list[str], Verdict, str]:
    """argv, verdict, and what an accepted one does: "list", "json", "free", "none"."""
    action = draw(st.sampled_from(["list", "force-release", "force-release", None]))
    name: str | None
    if action == "force-release":  # a NAME or --stale, mostly
        name = draw(fs.mostly(st.sampled_from([FREE_LOCK, "no-such-lock"]), fs.names, odds=2))
        name = draw(st.sampled_from([name, name, name, None]))
        stale = draw(st.sampled_from([name is None] * 4 + [name is not None]))
    else:
        name = draw(st.sampled_from([None] * 4 + [FREE_LOCK]))
        stale = draw(st.booleans())
    live, as_json = draw(st.booleans()), draw(st.booleans())
    database = draw(database_option(alias))
    # The options first, then ACTION -- NAME: argparse takes them together (a NAME may
    # start with "-").
    argv = [flag for flag, on in (("--stale", stale), ("--live", live), ("--json", as_json)) if on]
    argv += ["--database", database, *([action] if action else [])]
    argv += ["--", name] if name is not None else []
    verdicts = [alias_verdict(database)]
    if action in ("list", None):
        verdicts.append(INVALID if name is not None else VALID)
        outcome = ("json" if as_json else "list") + ("-stale" if stale else "")
    else:
        if (name is None) == (not stale):
            verdicts.append(INVALID)
        elif name is not None:
            verdicts.append(
                INVALID if fs.refused_by(lambda: values.name(name, what="Lock name")) else VALID
            )
        outcome = "stale" if stale else ("free" if name == FREE_LOCK else "none")
    return argv, fs.combine(*verdicts), outcome


def test_exclusive_locks(alias: str) -> None:
    @fuzzed("locks")
    @given(locks_cases(alias))
    @example((["--database", alias, "force-release", "--", "ev\u202eil\u2028"], INVALID, "none"))
    @example((["--database", alias, "force-release", "--", "a" * 100_000], INVALID, "none"))
    @example((["--database", alias, "force-release", "--", "x\x1b[2J"], INVALID, "none"))
    def examples(case: tuple[list[str], Verdict, str]) -> None:
        argv, verdict, outcome = case
        clean_tables(alias)
        lock = try_acquire(FREE_LOCK, using=alias, ttl=600)
        assert lock is not None
        lock.release()
        before = snapshot(alias)
        ran = run_command("exclusive_locks", *argv)
        # A name the validator takes that no lock has: exit 1, one line, as documented.
        refusals = frozenset({1}) if outcome == "none" and verdict is VALID else frozenset({2})
        if ran.code == 1 and outcome == "none" and verdict is VALID:
            lines = ran.err.splitlines()
            assert len(lines) == 1 and "No lock named" in lines[0], ran.said()
            assert not forbidden(ran.out + ran.err) and snapshot(alias) == before, ran.said()
            return
        if not assert_command_contract(ran, verdict, before, alias, refusals=refusals):
            return
        if outcome.startswith("json"):
            listed = [record["name"] for record in json.loads(ran.out)]
            assert listed == ([] if outcome.endswith("stale") else [FREE_LOCK]), ran.said()
        elif outcome == "list":
            assert ran.out.splitlines()[1].split()[:2] == [FREE_LOCK, "free"], ran.said()
        elif outcome == "list-stale":
            assert ran.out == "no stale locks\n", ran.said()
        elif outcome == "free":
            assert ran.out.startswith((f"{FREE_LOCK} was already free", "force-released")), (
                ran.said()
            )
        elif outcome == "stale":
            assert ran.out == "force-released 0 stale lock(s)\n", ran.said()
        assert held_locks(alias) == []

    examples()


# --- prune_job_runs --older-than -----------------------------------------------------------


def test_prune_job_runs_older_than(alias: str) -> None:
    @fuzzed("prune")
    @given(fs.durations, st.booleans(), database_option(alias))
    @example("999999999d", False, alias)
    @example("P999999999D", False, alias)
    @example("1e308", True, alias)
    @example("3654d", False, alias)
    def examples(older: str, dry_run: bool, database: str) -> None:
        clean_tables(alias)
        assert run_command("run_exclusive", "quick", "--database", alias).code == 0
        assert run_command("run_exclusive", "quick", "--database", alias).code == 0
        before = snapshot(alias)
        verdict = fs.combine(fs.duration_verdict(older), alias_verdict(database))
        argv = ["prune_job_runs", f"--older-than={older}", "--database", database]
        ran = run_command(*argv, *(["--dry-run"] if dry_run else []))
        if not assert_command_contract(ran, verdict, before, alias):
            return
        verb = "would delete" if dry_run else "deleted"
        assert re.fullmatch(rf"{verb} \d+ job run\(s\) finished more than .* ago\n", ran.out), (
            ran.said()
        )
        if dry_run:
            assert snapshot(alias) == before, ran.said()
        # Never the job's last run.
        assert JobRun.objects.using(alias).filter(name="quick").exists(), ran.said()

    examples()


# --- one real process per command, with the nastiest known value --------------------------

NASTIEST = {
    "run_exclusive": ("run_exclusive", "quick", "--wait", "999999999d"),
    "exclusive_jobs-pause": (
        "exclusive_jobs",
        "pause",
        "summary:weekly",
        "--until",
        "0001-01-01T00:00",
        "--reason",
        "\x1b]0;pwned\x07\x1b[2J" + fs.FORGED_LINE,
    ),
    "exclusive_jobs-run": ("exclusive_jobs", "run", "digest", "--kwargs", fs.HOSTILE_JSON[0]),
    "exclusive_jobs-next": ("exclusive_jobs", "next", "digest", "-n", "9" * 5000),
    "exclusive_locks": ("exclusive_locks", "force-release", "ev\u202eil\u2028\x1b[2J"),
    "prune_job_runs": ("prune_job_runs", "--older-than", "P999999999D"),
}


@pytest.mark.parametrize("case", sorted(NASTIEST))
def test_the_real_command_line_refuses_the_nastiest_value(alias: str, case: str) -> None:
    clean_tables(alias)
    before = snapshot(alias)
    done = subprocess.run(
        [sys.executable, "-m", "django", *NASTIEST[case], "--database", alias],
        cwd=ROOT,
        env=command_env(),
        capture_output=True,
        timeout=120,
    )
    out, err = (stream.decode("utf-8", errors="replace") for stream in (done.stdout, done.stderr))
    said = f"exit {done.returncode}\nstdout: {out[:2000]!r}\nstderr: {err[:2000]!r}"
    assert done.returncode == 2, said
    assert "Traceback" not in out + err, said
    control = re.compile(
        rb"[\x00-\x09\x0b-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\xa8-\xae]|\xe2\x81[\xa6-\xa9]"
    )
    assert not control.search(done.stdout + done.stderr), said
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].strip(), said
    assert snapshot(alias) == before, said
    assert held_locks(alias) == [], said


# --- the admin -----------------------------------------------------------------------------

ACT = "admin:django_exclusive_jobs_jobstate_act"
JOBS = reverse("admin:django_exclusive_jobs_jobstate_changelist")
JOB = reverse("admin:django_exclusive_jobs_jobstate_job")


def act(action: str) -> str:
    return reverse(ACT, args=[action])


@pytest.fixture
def operator(alias: str) -> Iterator[Client]:
    """A staff user who may view and change jobs, logged in; the admin on ``alias``."""
    user = User.objects.create_user("fuzz-operator", password="pw", is_staff=True)
    for codename in ("view_jobstate", "change_jobstate"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client(raise_request_exception=False)
    client.force_login(user)
    try:
        with override_settings(EXCLUSIVE_JOBS={"DATABASE": alias}):
            yield client
    finally:
        LogEntry.objects.all().delete()
        User.objects.filter(username="fuzz-operator").delete()


class HiddenInputs(HTMLParser):
    """The hidden inputs of a page's forms, as a browser posts them back."""

    def __init__(self) -> None:
        super().__init__()
        self.found: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        given = dict(attrs)
        if tag == "input" and given.get("type") == "hidden" and given.get("name"):
            self.found[str(given["name"])] = given.get("value") or ""


def hidden_inputs(page: Any) -> dict[str, str]:
    parser = HiddenInputs()
    parser.feed(page.content.decode())
    return {
        name: value
        for name, value in parser.found.items()
        if name not in ("csrfmiddlewaretoken", "confirm")
    }


def failed(response: Any) -> str:
    exc = getattr(response, "exc_info", None)
    shown = "".join(traceback.format_exception(*exc))[-3000:] if exc else ""
    return f"status {response.status_code}\n{shown}"


def has_form_error(response: Any) -> bool:
    return 'class="errorlist' in response.content.decode()


def assert_form_door(
    response: Any, verdict: Verdict, before: dict[str, Any], alias: str, what: str
) -> bool:
    """The contract of an admin form for one example; True if it was accepted (302)."""
    said = f"{what}\n{failed(response)}"
    assert response.status_code in (200, 302), said
    if response.status_code == 302:
        assert verdict is not INVALID, f"accepted a value that must be refused: {said}"
        return True
    assert verdict is not VALID, f"refused a value that must be accepted: {said}"
    assert has_form_error(response), f"came back without saying why: {said}"
    assert snapshot(alias, admin_log=True) == before, f"a refused form changed rows: {said}"
    assert held_locks(alias) == [], said
    return False


def pages_answer(alias: str, name: str, client: Client | None = None) -> None:
    """The jobs page, the job's page, health and metrics still answer, never 500."""
    if client is None:
        user = User.objects.create_user("fuzz-viewer", is_staff=True)
        user.user_permissions.add(Permission.objects.get(codename="view_jobstate"))
        client = Client(raise_request_exception=False)
        client.force_login(user)
        try:
            with override_settings(EXCLUSIVE_JOBS={"DATABASE": alias}):
                pages_answer(alias, name, client)
        finally:
            user.delete()
        return
    for url, data, allowed in (
        (JOBS, {}, {200}),
        (JOB, {"job": name}, {200}),
        ("/jobs/health", {}, {200, 503}),
        ("/jobs/metrics", {}, {200}),
    ):
        page = client.get(url, data)
        assert page.status_code in allowed, f"{url} {data}: {failed(page)}"
        if url == "/jobs/health":
            assert not any("database: " in problem for problem in page.json()["problems"]), (
                page.json()
            )


def typed(value: str) -> str:
    """``value`` as a browser sends it: UTF-8, so a lone surrogate arrives as U+FFFD
    (the test client, unlike a raw request, cannot send one at all)."""
    return value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def typed_all(form: dict[str, str]) -> dict[str, str]:
    return {key: typed(value) for key, value in form.items()}


def short(value: str) -> str:
    return value if len(value) < 200 else f"{value[:200]!r}...({len(value)} characters)"


def shown(form: dict[str, str]) -> str:
    return repr({key: short(value) for key, value in form.items()})


# Pause…: Why and Until, on the job's clock (its cron zone in force, else TIME_ZONE)


@st.composite
def admin_pause_cases(draw: st.DrawFn, now: dt.datetime) -> dict[str, str]:
    return {
        "zone": draw(st.sampled_from(["", *fs.ZONES])),  # a cron override's zone, if any
        "reason": draw(st.one_of(fs.plausible_text, fs.texts)),
        "until": draw(st.one_of(st.just(""), fs.moments(now))),
    }


def test_admin_pause_form(alias: str, operator: Client) -> None:
    now = database_now(alias)

    @fuzzed("admin_pause")
    @given(admin_pause_cases(now))
    @example({"zone": "America/St_Johns", "reason": "x", "until": "9999-12-31T23:59"})
    @example({"zone": "Europe/Paris", "reason": "x", "until": "0001-01-01T00:00"})
    @example({"zone": "Pacific/Kiritimati", "reason": "x", "until": "0001-01-01T00:00"})
    @example({"zone": "", "reason": "x", "until": "2020-01-01T00:00"})
    @example({"zone": "", "reason": "ok\x1b]0;pwned\x07" + fs.FORGED_LINE, "until": ""})
    def examples(case: dict[str, str]) -> None:
        case = typed_all(case)
        clean_tables(alias)
        job = get_job("digest")
        assert job is not None
        if case["zone"]:  # the job's clock in force: a cron schedule's zone
            cron = {"schedule": {"cron": "0 * * * *", "timezone": case["zone"]}}
            overrides.override(job, cron, reason="clock", by="fuzz", using=alias)
        zone = overrides.job_in_force("digest", using=alias).zone
        page = operator.get(act("pause"), {"job": "digest"})
        assert page.status_code == 200, failed(page)
        form = {**hidden_inputs(page), "job": "digest", "confirm": "yes"}
        form |= {"reason": case["reason"], "until": case["until"]}
        verdict = fs.reason_verdict(case["reason"], required=True, stripped=True)
        if case["until"].strip():
            until = fs.until_verdict(case["until"], zone, now, stripped=True)
            verdict = fs.combine(verdict, until)
        before = snapshot(alias, admin_log=True)
        done = operator.post(act("pause"), form)
        if not assert_form_door(done, verdict, before, alias, shown(form)):
            return
        state = JobState.objects.using(alias).get(name="digest")
        assert state.paused and state.pause_reason == case["reason"].strip(), shown(form)
        if case["until"].strip() and verdict is VALID:
            expected = fs.moment_or_none(case["until"], zone, stripped=True)
            assert state.paused_until == expected, shown(form)
        pages_answer(alias, "digest", operator)
        resumed = operator.post(act("resume"), {"job": "digest", "confirm": "yes"})
        assert resumed.status_code == 302, failed(resumed)
        assert not JobState.objects.using(alias).get(name="digest").paused

    examples()


# Override…: cron, timezone, every, arguments, timeout, overlap, Why; preview, then confirm

OVERLAP_CHOICES = ["skip", "buffer_one", "buffer_all", "cancel_other"]


OVERRIDE_FIELDS = ["schedule", "arguments", "timeout", "overlap", "reason"]


@st.composite
def override_cases(draw: st.DrawFn) -> dict[str, str]:
    """The override form: up to two of its fields hostile, the others plausible."""
    hostile = draw(st.sets(st.sampled_from(OVERRIDE_FIELDS), max_size=2))
    if "schedule" in hostile:
        kind = draw(st.sampled_from(["cron", "every", "both", "none"]))
        cron, zone, every = fs.crons, fs.zones, fs.hostile_durations
    else:
        kind = draw(st.sampled_from(["cron", "every", "every"]))
        cron = st.sampled_from(fs.VALID_CRONS)
        zone, every = st.sampled_from(["", *fs.ZONES]), fs.plausible_durations
    plausible = {
        "arguments": st.builds(
            lambda to, limit: json.dumps({"recipients": to, "limit": limit}),
            st.lists(st.emails(), max_size=2),
            st.integers(0, 100),
        ),
        "timeout": st.one_of(st.just(""), fs.plausible_durations),
        "overlap": st.sampled_from(OVERLAP_CHOICES),
        "reason": fs.plausible_text,
    }
    hostile_values = {
        "arguments": fs.hostile_arguments,
        "timeout": fs.hostile_durations,
        "overlap": st.one_of(st.sampled_from(["allow_all", "", " skip"]), fs.hostile_texts),
        "reason": fs.hostile_texts,
    }
    form = {
        "cron": draw(cron) if kind in ("cron", "both") else "",
        "timezone": draw(zone) if kind == "cron" else "",
        "every": draw(every) if kind in ("every", "both") else "",
    }
    for field in ("arguments", "timeout", "overlap", "reason"):
        form[field] = draw(hostile_values[field] if field in hostile else plausible[field])
    return form


def override_verdict(form: dict[str, str]) -> Verdict:
    cron, every = form["cron"].strip(), form["every"].strip()
    verdicts = [
        fs.reason_verdict(form["reason"], required=True, stripped=True),
        fs.arguments_verdict(form["arguments"], all_needed=True, stripped=True),
        VALID if form["overlap"] in OVERLAP_CHOICES else INVALID,
    ]
    if bool(cron) == bool(every):
        verdicts.append(INVALID)
    elif cron:
        verdicts += [fs.cron_verdict(form["cron"], stripped=True)]
        verdicts += [fs.zone_verdict(form["timezone"], stripped=True)]
    else:
        longest = values.LONGEST.total_seconds()
        one_second = dt.timedelta(seconds=1)
        verdicts.append(
            fs.duration_verdict(
                form["every"], least=one_second, most_plausible=longest, stripped=True
            )
        )
    if form["timeout"].strip():
        verdicts.append(fs.duration_verdict(form["timeout"], positive=True, stripped=True))
    return fs.combine(*verdicts)


def test_admin_override_form(alias: str, operator: Client) -> None:
    plain = {
        "cron": "",
        "timezone": "",
        "every": "2h",
        "arguments": '{"recipients": ["ops@example.com"], "limit": 5}',
        "timeout": "",
        "overlap": "skip",
        "reason": "load",
    }

    @fuzzed("admin_override")
    @given(override_cases())
    @example({**plain, "every": "999999999d"})
    @example({**plain, "every": "750000d"})
    @example({**plain, "every": "P999999999D"})
    @example({**plain, "cron": fs.HOSTILE_CRONS[0], "every": ""})
    @example({**plain, "arguments": fs.HOSTILE_JSON[2]})
    @example({**plain, "arguments": fs.HOSTILE_JSON[1]})
    @example({**plain, "timeout": "1e308"})
    @example({**plain, "reason": "load\x1b[2J" + fs.FORGED_LINE})
    @example({**plain, "cron": "0 * * * *", "every": "", "timezone": "Europe/Paris\x00"})
    def examples(case: dict[str, str]) -> None:
        case = typed_all(case)
        clean_tables(alias)
        page = operator.get(act("override"), {"job": "digest"})
        assert page.status_code == 200, failed(page)
        form = {**hidden_inputs(page), "job": "digest", **case}
        verdict = override_verdict(case)
        before = snapshot(alias, admin_log=True)
        checked = operator.post(act("override"), form)  # the preview: saves nothing
        said = shown(case)
        assert checked.status_code == 200, f"preview: {said}\n{failed(checked)}"
        assert snapshot(alias, admin_log=True) == before, f"the preview saved: {said}"
        if verdict is INVALID:
            assert has_form_error(checked), f"preview took a value that must be refused: {said}"
        elif verdict is VALID:
            assert not has_form_error(checked), f"preview refused a valid value: {said}"
        confirm = {**form, **hidden_inputs(checked), **case, "confirm": "yes"}
        saved = operator.post(act("override"), confirm)
        if not assert_form_door(saved, verdict, before, alias, said):
            return
        assert JobChange.objects.using(alias).filter(name="digest").exists(), said
        pages_answer(alias, "digest", operator)
        back = operator.post(act("back"), {"job": "digest", "confirm": "yes"})
        assert back.status_code == 302, failed(back)
        assert JobState.objects.using(alias).get(name="digest").override == {}

    examples()


# Run now (arguments)


def test_admin_run_now_form(alias: str, operator: Client) -> None:
    @fuzzed("admin_run_now")
    @given(fs.arguments)
    @example(fs.HOSTILE_JSON[0])
    @example(fs.HOSTILE_JSON[2])
    @example(fs.HOSTILE_JSON[3])
    @example('{"limit": "\\u0000"}')
    @example('{"limit": "\\ud800"}')
    @example('{"limit": "\U0001f680 launch"}')  # an emoji: stored everywhere
    def examples(given: str) -> None:
        given = typed(given)
        clean_tables(alias)
        page = operator.get(act("run"), {"job": "digest"})
        assert page.status_code == 200, failed(page)
        form = {**hidden_inputs(page), "job": "digest", "arguments": given, "confirm": "yes"}
        verdict = fs.arguments_verdict(given, all_needed=False, stripped=True)
        before = snapshot(alias, admin_log=True)
        done = operator.post(act("run"), form)
        if not assert_form_door(done, verdict, before, alias, short(given)):
            return
        [asked] = RunRequest.objects.using(alias).filter(name="digest")
        if verdict is VALID:
            parsed = json.loads(given.strip()) if given.strip() else {}
            assert asked.kwargs in (parsed, {**get_job("digest").kwargs, **parsed}), short(given)  # type: ignore[union-attr]
        pages_answer(alias, "digest", operator)

    examples()


# Backfill… (From, To): previewed by GET, asked for by POST


def test_admin_backfill_form(alias: str, operator: Client) -> None:
    now = database_now(alias)

    @fuzzed("admin_backfill")
    @given(ranges(now))
    @example(("0001-01-01T00:00", ""))
    @example(("9999-12-31T23:59", ""))
    @example(("2026-01-01T00:00", "9999-12-31T23:59:59.999999"))
    @example(("1970-01-01T00:00+14:00", "1970-01-01T03:00+14:00"))
    @example(("\u202e2030-01-01", ""))
    def examples(given: tuple[str, str]) -> None:
        start, end = typed(given[0]), typed(given[1])
        clean_tables(alias)
        verdict, slots = range_verdict(start, end, now, stripped=True)
        data = {"job": "backfill_hourly", "start": start, "end": end}
        before = snapshot(alias, admin_log=True)
        seen = operator.get(act("backfill"), data)
        assert seen.status_code == 200, f"{given}\n{failed(seen)}"
        assert snapshot(alias, admin_log=True) == before, f"the preview asked: {given}"
        if verdict is INVALID:
            assert has_form_error(seen), f"preview took a range that must be refused: {given}"
        form = {**data, "confirm": "yes"}
        done = operator.post(act("backfill"), form)
        if not assert_form_door(done, verdict, before, alias, repr(given)):
            return
        asked = RunRequest.objects.using(alias).filter(name="backfill_hourly")
        if verdict is VALID:
            assert asked.count() == slots, given
        pages_answer(alias, "backfill_hourly", operator)

    examples()


# Resume, Back to the code: Why (optional)


def test_admin_resume_and_back_to_the_code(alias: str, operator: Client) -> None:
    @fuzzed("admin_resume_back")
    @given(st.sampled_from(["resume", "back"]), fs.texts)
    @example("resume", "done\x1b]0;pwned\x07" + fs.FORGED_LINE)
    @example("back", "done\u202e\u2066")
    @example("back", "a" * 100_000)
    def examples(action: str, reason: str) -> None:
        reason = typed(reason)
        clean_tables(alias)
        job = get_job("digest")
        assert job is not None
        control.pause("digest", by="fuzz", using=alias, reason="set up")
        overrides.override(job, {"schedule": {"every": "2h"}}, reason="set up", by="fuzz",
                           using=alias)  # fmt: skip
        page = operator.get(act(action), {"job": "digest"})
        assert page.status_code == 200, failed(page)
        form = {**hidden_inputs(page), "job": "digest", "reason": reason, "confirm": "yes"}
        verdict = fs.reason_verdict(reason, stripped=True)
        before = snapshot(alias, admin_log=True)
        done = operator.post(act(action), form)
        accepted = assert_form_door(done, verdict, before, alias, f"{action} {short(reason)}")
        if not accepted:  # the plain one always works
            done = operator.post(act(action), {**form, "reason": ""})
            assert done.status_code == 302, failed(done)
        state = JobState.objects.using(alias).get(name="digest")
        if action == "resume":
            assert not state.paused
        else:
            assert state.override == {}
        pages_answer(alias, "digest", operator)

    examples()


# --- a scheduler beside the doors ----------------------------------------------------------


def test_a_scheduler_beside_the_doors_keeps_serving_its_other_jobs(
    alias: str, operator: Client, schedulers: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    """A real scheduler serves tick (every second) and digest; digest is fuzzed through the
    admin's Override… and Pause… (confirm=yes). Whatever the forms accept, the scheduler
    lives and tick keeps getting runs, during and after."""
    clean_tables(alias)
    # Unbuffered: the test reads its lines ("digest: overridden ...") as they come. It
    # reads the rows every 0.3 s (not every 5 s), and tick comes every second: the test
    # waits for what each example must show (the override read, read back, a tick run),
    # not for the wall clock.
    env = scheduler_env(
        tmp_path / "marker",
        PYTHONUNBUFFERED="1",
        TICK_EVERY="1s",
        EXCLUSIVE_JOBS_TEST_REQUEST_POLL="0.3",
    )
    server = start_scheduler(schedulers, alias, "--jobs", "tick", "digest", env=env)
    output = Output(server)
    ticks = JobRun.objects.using(alias).filter(name="tick")

    def alive() -> str:
        return "" if server.poll() is None else f"the scheduler died:\n{output.tail()}"

    def ticked(after: int) -> Callable[[], bool]:
        return lambda: server.poll() is not None or ticks.count() > after

    def wait(until: Callable[[], bool], what: str) -> None:
        try:
            wait_for(until, timeout=30)
        except AssertionError:
            raise AssertionError(f"{what}: not in 30 s\n{output.tail()}") from None

    wait_for(ticked(0), timeout=90)  # started
    assert not alive(), alive()
    began = ticks.count()
    accepted: list[str] = []
    now = database_now(alias)

    @fuzzed("scheduler")
    @given(
        st.one_of(st.sampled_from(fs.HOSTILE_DURATIONS), fs.durations),
        st.sampled_from(["", "", "", *fs.ZONES]),
        st.one_of(st.sampled_from(fs.HOSTILE_MOMENTS), fs.moments(now)),
    )
    @example("999999999d", "", "")
    @example("750000d", "", "")
    @example("", "America/St_Johns", "9999-12-31T23:59")
    @example("", "Europe/Paris", "0001-01-01T00:00")
    def examples(every: str, zone: str, until: str) -> None:
        every, until = typed(every), typed(until)
        override = {
            "job": "digest",
            "cron": "0 * * * *" if zone else "",
            "timezone": zone,
            "every": "" if zone else every,
            "arguments": '{"recipients": ["ops@example.com"], "limit": 5}',
            "timeout": "",
            "overlap": "skip",
            "reason": "fuzz",
            "confirm": "yes",
        }
        page = operator.get(act("override"), {"job": "digest"})
        override = {**hidden_inputs(page), **override}
        # Counted before the form is sent: the scheduler may read the override (and say
        # so) before the post returns to the test.
        seen = output.count("digest: overridden")
        read_back = output.count("digest: back to its code")
        said = operator.post(act("override"), override)
        pause = {"job": "digest", "reason": "fuzz", "until": until, "confirm": "yes"}
        state = JobState.objects.using(alias).filter(name="digest").first()
        overridden = said.status_code == 302 and state is not None and bool(state.override)
        if overridden:
            accepted.append(f"override every={short(every)!r} zone={zone!r}")

            def read() -> bool:  # the scheduler has read the override (or died)
                return server.poll() is not None or output.count("digest: overridden") > seen

            wait(read, "the scheduler reads the override")
            assert not alive(), f"{alive()}\naccepted: {accepted}"
        form = operator.get(act("pause"), {"job": "digest"})
        paused = operator.post(act("pause"), {**hidden_inputs(form), **pause})
        if paused.status_code == 302:
            accepted.append(f"pause until={short(until)!r} on {zone or 'UTC'}")
        # tick goes on: one more run
        wait(ticked(ticks.count()), "tick runs")
        assert not alive(), f"{alive()}\naccepted: {accepted}"
        # Undo: Resume and Back to the code always work.
        for action in ("resume", "back"):
            undone = operator.post(act(action), {"job": "digest", "confirm": "yes"})
            assert undone.status_code == 302, f"{action}: {failed(undone)}\naccepted: {accepted}"
        state = JobState.objects.using(alias).filter(name="digest").first()
        assert state is None or (not state.paused and state.override == {})
        if overridden:  # it has read the way back too, before the next example

            def back() -> bool:
                return server.poll() is not None or output.count("digest: back to its code") > (
                    read_back
                )

            wait(back, "the scheduler reads the way back to the code")
            assert not alive(), f"{alive()}\naccepted: {accepted}"

    examples()
    during = ticks.count()
    assert during > began, f"no tick ran during the fuzzing\n{output.tail()}"
    wait(ticked(during + 1), "tick runs after")
    assert not alive(), f"{alive()}\naccepted: {accepted}"
    server.send_signal(signal.SIGTERM)
    assert server.wait(30) == 0, output.tail()
    for thread in output.threads:
        thread.join(10)
    assert "Traceback" not in "\n".join(output.lines), output.tail()

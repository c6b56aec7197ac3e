"""``manage.py run_exclusive NAME [options] [-- PROGRAM ARGS...]``: run NAME on one server."""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import logging
import shutil
import sys
from collections.abc import Callable
from typing import Any

from django.core.management import call_command, get_commands
from django.core.management.base import CommandError, CommandParser
from django.db import connections

from django_exclusive_jobs import values
from django_exclusive_jobs.conf import app_settings
from django_exclusive_jobs.lock.errors import LockConfigurationError
from django_exclusive_jobs.logs import line
from django_exclusive_jobs.management.base import JobCommand, duration_option
from django_exclusive_jobs.management.output import line_printer, one_line
from django_exclusive_jobs.run.arguments import describe as describe_arguments
from django_exclusive_jobs.run.catchup import CANCEL_WAIT, OVERLAPS, make_overlap
from django_exclusive_jobs.run.child import ChildProgram
from django_exclusive_jobs.run.jitter import make_jitter
from django_exclusive_jobs.run.registry import Job, all_jobs, get_job, schedules_of
from django_exclusive_jobs.run.retries import make_retries
from django_exclusive_jobs.run.run_info import current_run, in_environment
from django_exclusive_jobs.run.runner import EXIT_USAGE, Run, call_each_due
from django_exclusive_jobs.run.schedules import make_schedule, with_tolerance
from django_exclusive_jobs.run.start import Start
from django_exclusive_jobs.run.status import RunStatus

logger = logging.getLogger("django_exclusive_jobs")

EPILOG = """\
NAME is a job declared with @exclusive_job, else a management command of that name;
after "--", any program, run as a child process (NAME is then only the lock's name).

exit codes:
  0    ran and succeeded, or skipped because another server holds the lock
  1    the job failed (a child program's own non-zero code is passed through)
  2    usage or configuration error (unknown NAME, bad option, migrations not applied)
  3    the database cannot be reached (the job is not run)
  4    the lock was lost during the run (a child program is terminated)
  124  the run passed its timeout and was stopped (as timeout(1))
  128+N  stopped by signal N (SIGTERM: 143, SIGINT: 130); the lock is released
"""


class Command(JobCommand):
    epilog = EPILOG
    help = "Run a job, management command or program on exactly one server at a time."
    unreachable_note = "The job was not run."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", nargs="?", help="the job (and lock) name")
        _lock_options(parser)
        _stop_options(parser)
        _schedule_options(parser)
        _slot_options(parser)
        parser.add_argument("--list", action="store_true", help="list registered jobs")

    def run_from_argv(self, argv: list[str]) -> None:
        # Everything after "--" is a program to run, not options for us.
        if "--" in argv:
            cut = argv.index("--")
            self._program: list[str] | None = argv[cut + 1 :]
            argv = argv[:cut]
        else:
            self._program = None
        self._extra: list[str] = []
        self._called_from_command_line = True
        parser = self.create_parser(argv[0], argv[1])
        options, extra = parser.parse_known_args(argv[2:])
        self._extra = extra
        cmd_options = vars(options)
        args = cmd_options.pop("args", ())
        try:
            self.execute(*args, **cmd_options)
        except CommandError as exc:
            self.stderr.write(f"{exc.__class__.__name__}: {exc}")
            sys.exit(exc.returncode)
        finally:
            connections.close_all()

    def handle(self, *args: Any, **options: Any) -> None:
        program = options.get("program") or getattr(self, "_program", None)
        extra = list(options.get("extra") or getattr(self, "_extra", []))
        if options["list"]:
            self._list()
            return
        name = options["name"]
        if not name:
            raise CommandError("Give the job's NAME (or --list to see the jobs).", returncode=2)
        grace = self._check(options)
        job, make_target = self._target(name, program, extra, grace)
        job = job.but(**self._overrides(job, options))
        report = line_printer(self, logger, options["verbosity"])
        if app_settings.SKIP_SCHEDULES:  # a cron line is a scheduled start
            said = (
                f"skipped {job.name}: schedules are skipped here (SKIP_SCHEDULES); "
                f"'manage.py exclusive_jobs run {job.name}' runs it now"
            )
            report(line("skipped", said, job_name=job.name), True)
            sys.exit(options["skipped_exit_code"])

        def make_run(due: dt.datetime | None) -> Run:
            """One run: a cron line fires at the slot, so it waits for the slot's start
            (its jitter); a retry's start is its ``retry_at`` (``due``)."""
            target, child = make_target()
            return Run(
                job,
                report=report,
                start=Start.cron(retry_at=due),
                supervised=True,
                grace=grace,
                cancel_wait=CANCEL_WAIT,
                target=target,
                on_lost=child.on_lost if child else None,
                on_timeout=child.on_timeout if child else None,
                on_stop=child.on_signal if child else None,
            )

        # catch_up="all", retries, buffered slots: each run in turn, as the scheduler does.
        result = call_each_due(make_run)
        if result.status == RunStatus.SKIPPED:
            code = options["skipped_exit_code"]
        else:
            code = result.exit_code
        if code:
            sys.exit(code)

    def _check(self, options: dict[str, Any]) -> float:
        """Refuse bad options before anything runs; the grace in seconds."""
        if not 0 <= options["skipped_exit_code"] <= 255:
            raise CommandError("--skipped-exit-code must be between 0 and 255.", returncode=2)
        return values.duration(options["grace"], what="grace").total_seconds()

    def _overrides(self, job: Job, options: dict[str, Any]) -> dict[str, Any]:
        """What the command line changes about the job's declared settings."""
        overrides = {
            "ttl": options["ttl"],
            "min_hold": options["min_hold"],
            "wait": options["wait"],
            "using": options["database"],
            "keepalive": options["keepalive"],
            "timeout": options["timeout"],
        }
        tolerance = options["slot_tolerance"]
        declared = options["every"] is None and options["cron"] is None
        if declared and tolerance is not None and job.schedule is not None:
            # The declared schedule, with this tolerance (--timezone still needs --cron).
            if options["timezone"] is not None:
                make_schedule(timezone=options["timezone"])  # says why not
            overrides["schedule"] = with_tolerance(job.schedule, tolerance)
        else:
            overrides["schedule"] = make_schedule(
                every=options["every"],
                cron=options["cron"],
                timezone=options["timezone"],
                tolerance=tolerance,
            )
        if options["retries"] is not None or options["retry_backoff"] is not None:
            overrides.update(self._retries(job, options, scheduled=bool(overrides["schedule"])))
        if options["overlap"] is not None:
            if overrides["schedule"] is None and job.schedule is None:
                raise CommandError(
                    "--overlap only applies with --every or --cron, or to a job that "
                    "declares a schedule.",
                    returncode=EXIT_USAGE,
                )
            overrides["overlap"] = make_overlap(options["overlap"], job.catch_up)
        if options["jitter"] is not None or overrides["schedule"] is not None:
            jitter = job.jitter if options["jitter"] is None else options["jitter"]
            overrides["jitter"] = make_jitter(jitter, overrides["schedule"] or job.schedule)
        return overrides

    def _retries(self, job: Job, options: dict[str, Any], *, scheduled: bool) -> dict[str, Any]:
        """``--retries`` and ``--retry-backoff``, checked as ``@exclusive_job`` checks them."""
        if not scheduled and job.schedule is None:
            raise CommandError(
                "--retries only applies with --every or --cron, or to a job that declares a "
                "schedule.",
                returncode=EXIT_USAGE,
            )
        retries = job.retries if options["retries"] is None else options["retries"]
        backoff = options["retry_backoff"]
        if backoff is None:
            backoff = job.retry_backoff if retries else None
        try:
            retries, delta = make_retries(retries, backoff)
        except LockConfigurationError as exc:
            raise CommandError(
                str(exc).replace("retry_backoff", "--retry-backoff"), returncode=EXIT_USAGE
            ) from None
        return {"retries": retries, "retry_backoff": delta}

    def _target(
        self, name: str, program: list[str] | None, extra: list[str], grace: float
    ) -> tuple[Job, Callable[[], tuple[Any, ChildProgram | None]]]:
        """The job, and what makes each run's target: a program (a child process of its
        own each time), a management command, or (None) the job's own function."""
        if program is not None:
            if not program:
                raise CommandError("Nothing after '--': give the program to run.", returncode=2)
            if shutil.which(program[0]) is None:
                raise CommandError(f"Program {program[0]!r} was not found.", returncode=2)
            if extra:
                raise CommandError(f"Unknown option(s): {' '.join(extra)}", returncode=2)

            def a_program() -> tuple[Any, ChildProgram | None]:
                child = ChildProgram(program, grace=grace)
                return child, child

            return Job(name, _noop), a_program
        job = get_job(name)
        if job is not None:
            if extra:
                raise CommandError(f"Unknown option(s): {' '.join(extra)}", returncode=2)
            return job, lambda: (None, None)
        if name in get_commands() and name != "run_exclusive":

            def a_command(lock: Any) -> Any:
                with in_environment(current_run()):  # the run's facts, as a program's
                    return call_command(name, *extra)

            return Job(name, _noop), lambda: (a_command, None)
        raise CommandError(_unknown(name), returncode=EXIT_USAGE)

    def _list(self) -> None:
        jobs = all_jobs()
        if not jobs:
            self.stdout.write("No jobs are registered with @exclusive_job.")
        for job in jobs:
            schedule = job.schedule.describe() if job.schedule else "no schedule"
            if job.jitter:
                schedule += f" jitter {job.jitter}"
            arguments = f"  {describe_arguments(job.kwargs)}" if job.kwargs else ""
            self.stdout.write(
                one_line(
                    f"{job.name}  ttl={job.ttl or 'default'}  "
                    f"min_hold={job.min_hold or 'default'}  {schedule}  {job.target}{arguments}"
                )
            )


def _unknown(name: str) -> str:
    """One line: what is wrong, the closest registered names, and how to see them all."""
    several = schedules_of(name)
    if several:
        return (
            f"Job {name!r} has several schedules, each a job of its own: run one of "
            f"{', '.join(map(repr, several))}."
        )
    names = [job.name for job in all_jobs()]
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
    return (
        f"Unknown job {name!r}: no @exclusive_job or management command has that name.{hint} "
        f"'manage.py run_exclusive --list' shows all {len(names)} jobs; to run a program, "
        "put it after '--'."
    )


def _noop() -> None:
    return None


def _lock_options(parser: CommandParser) -> None:
    """How the lock is taken and held: its lease, waiting for it, its database, the exit
    code when another server holds it."""
    parser.add_argument(
        "--ttl",
        type=duration_option("ttl", positive=True),
        help="lease length, e.g. 90, 90s, 15m, 1h",
    )
    parser.add_argument(
        "--min-hold",
        type=duration_option("min_hold"),
        help="keep the lock at least this long after start",
    )
    parser.add_argument(
        "--wait",
        type=duration_option("wait"),
        help="wait up to this long for the lock instead of skipping",
    )
    parser.add_argument("--database", help="database alias for the lock table")
    parser.add_argument(
        "--keepalive",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="renew the lease while the job runs (default: the job's keepalive=, "
        "else EXCLUSIVE_JOBS['KEEPALIVE'])",
    )
    parser.add_argument(
        "--skipped-exit-code",
        type=int,
        default=0,
        help="exit code when another server holds the lock (default 0)",
    )


def _stop_options(parser: CommandParser) -> None:
    """When a run is stopped, and how long it may take to end."""
    parser.add_argument(
        "--timeout",
        type=duration_option("timeout", positive=True),
        help="stop the run if it lasts longer than this (default: the job's timeout=, "
        "else EXCLUSIVE_JOBS['TIMEOUT'], else no limit)",
    )
    parser.add_argument(
        "--grace",
        type=duration_option("grace"),
        default="10s",
        help="how long a job stopped at its timeout, or a child program sent SIGTERM, "
        "may take to end before it is killed (default 10s)",
    )


def _schedule_options(parser: CommandParser) -> None:
    """The job's schedule: its slots, when a start serves one, when each starts."""
    parser.add_argument(
        "--every",
        type=duration_option("every", least=dt.timedelta(seconds=1)),
        help="the job's schedule: run once per slot of this length",
    )
    parser.add_argument(
        "--cron",
        help="the job's schedule as a cron expression, e.g. '0 * * * *' or @daily",
    )
    parser.add_argument("--timezone", help="time zone of --cron (default: TIME_ZONE)")
    parser.add_argument(
        "--slot-tolerance",
        type=duration_option("slot tolerance"),
        help="how early a start may be and still serve the coming slot (default 30s)",
    )
    parser.add_argument(
        "--jitter",
        type=duration_option("jitter"),
        help="start each slot up to this long after it, the same on every server "
        "(default: the job's jitter=; 0 starts at once)",
    )


def _slot_options(parser: CommandParser) -> None:
    """What becomes of a slot whose run did not succeed, or that comes during a run."""
    parser.add_argument(
        "--retries",
        type=int,
        help="run a slot whose run did not succeed again, at most this many times, "
        "waiting --retry-backoff first (default: the job's retries=)",
    )
    parser.add_argument(
        "--retry-backoff",
        type=duration_option("retry_backoff"),
        help="wait before a retry, doubled for each next one (default: the job's, else 30s)",
    )
    parser.add_argument(
        "--overlap",
        choices=OVERLAPS,
        help="what becomes of slots that come while a run still runs: skip them "
        "(default), run the latest (buffer_one) or each (buffer_all) right after it, "
        "stop the run for the newer slot (cancel_other), or run each slot at its time "
        "beside any still running (allow_all)",
    )

"""``manage.py exclusive_scheduler``: run every scheduled job, each slot once, on every server."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import replace
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import connections

from django_exclusive_jobs.conf import app_settings
from django_exclusive_jobs.integrations import flush as flush_integrations
from django_exclusive_jobs.lock.validation import resolve_alias
from django_exclusive_jobs.management.base import JobCommand, duration_option
from django_exclusive_jobs.management.output import line_printer
from django_exclusive_jobs.run.forkserver import settings_reproducible
from django_exclusive_jobs.run.registry import Job, all_jobs
from django_exclusive_jobs.run.runner import EXIT_USAGE
from django_exclusive_jobs.run.scheduler import Scheduler

logger = logging.getLogger("django_exclusive_jobs")

EPILOG = """\
Run it on every server (a systemd service, a container's command, a Kubernetes
Deployment with any number of replicas): each slot of each job runs on one of them.
Each run happens in a child process; its lock, history and log lines are those of
`run_exclusive NAME` at that slot.

exit codes:
  0    stopped by SIGTERM or SIGINT (running jobs got --grace to end)
  2    usage or configuration error (unknown job, no scheduled job, bad option,
       migrations not applied)
A database that cannot be reached is waited for (one line on stderr), not an exit.
"""


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {value!r}")
    return number


class Command(JobCommand):
    epilog = EPILOG
    help = "Run every job that has a schedule, each slot once across all servers running this."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--jobs", nargs="+", metavar="NAME", help="serve only these jobs")
        parser.add_argument("--exclude", nargs="+", metavar="NAME", help="serve all but these")
        parser.add_argument(
            "--database", help="database alias of the lock table (default: as run_exclusive)"
        )
        parser.add_argument(
            "--max-concurrent",
            type=_positive,
            default=10,
            help="at most this many jobs running at once on this server (default 10)",
        )
        parser.add_argument(
            "--grace",
            type=duration_option("--grace"),
            default="20s",
            help="on SIGTERM/SIGINT, how long running jobs may take to end before they are "
            "stopped (default 20s; keep it under your platform's kill timeout)",
        )
        parser.add_argument(
            "--skip-schedules",
            action="store_true",
            help="start no scheduled slot, only runs asked for now and backfills (a staging "
            "copy; the setting SKIP_SCHEDULES does the same)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings_reproducible():
            raise CommandError(
                "The scheduler runs each job in a process that loads the settings again: "
                "give them as a module (DJANGO_SETTINGS_MODULE), not settings.configure().",
                returncode=EXIT_USAGE,
            )
        skip = options["skip_schedules"] or app_settings.SKIP_SCHEDULES
        jobs = self._jobs(options["jobs"], options["exclude"])
        alias = resolve_alias(options["database"])
        if options["database"]:
            jobs = [replace(job, using=alias) for job in jobs]
        # Runs asked for now: every job this scheduler may run (with --jobs, only those).
        on_request = [
            job
            for job in all_jobs()
            if (not options["jobs"] or job.name in options["jobs"])
            and job.name not in (options["exclude"] or [])
        ]
        if options["database"]:
            on_request = [replace(job, using=alias) for job in on_request]
        scheduler = Scheduler(
            jobs,
            on_request=on_request,
            using=alias,
            max_concurrent=options["max_concurrent"],
            grace=options["grace"].total_seconds(),
            # At verbosity 1, a server's skips (another server ran the slot) are left out.
            report=line_printer(self, logger, options["verbosity"], skips=False),
            skip_schedules=skip,
        )
        code = 1  # run() raised
        try:
            code = scheduler.run()
        finally:
            connections.close_all()
            if scheduler.left_running:
                # In-process runs that outlived the grace: the process ends now, and
                # their threads with it, whatever the interpreter's exit would wait for
                # (an async job's event loop thread, say); their leases end by themselves.
                flush_integrations()
                logging.shutdown()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        if code:
            sys.exit(code)

    def _jobs(self, only: list[str] | None, exclude: list[str] | None) -> list[Job]:
        """The jobs whose declared schedules it serves: every job's, or those chosen's
        (one-line errors). A job without a schedule may be chosen: the scheduler serves
        its schedules added at run time, and its runs asked for now."""
        known = {job.name: job for job in all_jobs()}
        for name in (only or []) + (exclude or []):
            if name not in known:
                raise CommandError(
                    f"Unknown job {name!r}: 'manage.py run_exclusive --list' shows the jobs.",
                    returncode=EXIT_USAGE,
                )
        return [
            job
            for job in known.values()
            if job.schedule is not None
            and (not only or job.name in only)
            and job.name not in (exclude or [])
        ]

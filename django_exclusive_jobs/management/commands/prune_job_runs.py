"""``manage.py prune_job_runs [--older-than 30d] [--dry-run]``: delete old run history."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from django_exclusive_jobs.conf import app_settings
from django_exclusive_jobs.lock.durations import parse_duration
from django_exclusive_jobs.lock.validation import resolve_alias
from django_exclusive_jobs.management.base import JobCommand, duration_option
from django_exclusive_jobs.run.pruning import prune_runs

EPILOG = """\
exit codes: 0 done; 2 usage or configuration error (a bad duration or database alias,
migrations not applied); 3 the database cannot be reached.
"""


class Command(JobCommand):
    epilog = EPILOG
    help = (
        "Delete finished job runs older than --older-than (default EXCLUSIVE_JOBS['KEEP_RUNS'])."
        " Never deletes a running run, a job's last run, or the run that marks a job's"
        " latest slot."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=duration_option("--older-than"),
            help="e.g. 30d, 12h (default: KEEP_RUNS)",
        )
        parser.add_argument("--dry-run", action="store_true", help="count, delete nothing")
        parser.add_argument("--database", help="database alias of the run table")

    def handle(self, *args: Any, **options: Any) -> None:
        given = options["older_than"]  # parsed by its type=, unless call_command() passed it
        older_than = parse_duration(app_settings.KEEP_RUNS if given is None else given)
        alias = resolve_alias(options["database"])
        count = prune_runs(older_than, using=alias, dry_run=options["dry_run"])
        verb = "would delete" if options["dry_run"] else "deleted"
        if options["verbosity"] >= 1:
            self.stdout.write(f"{verb} {count} job run(s) finished more than {older_than} ago")

"""``manage.py prune_job_runs [--older-than 30d] [--dry-run]``: delete old run history."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_exclusive_jobs.checks import settings_error
from django_exclusive_jobs.conf import app_settings
from django_exclusive_jobs.lock.durations import parse_duration
from django_exclusive_jobs.lock.errors import LockConfigurationError
from django_exclusive_jobs.lock.validation import resolve_alias
from django_exclusive_jobs.management.output import QuietOnClosedPipe
from django_exclusive_jobs.run.history import prune_runs


class Command(QuietOnClosedPipe):
    requires_system_checks: list[str] = []  # only this app's, in handle()
    help = (
        "Delete finished job runs older than --older-than (default EXCLUSIVE_JOBS['KEEP_RUNS'])."
        " Never deletes a running run, a job's last run, or the run that marks a job's"
        " latest slot."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than", help="e.g. 30d, 12h (default: KEEP_RUNS)")
        parser.add_argument("--dry-run", action="store_true", help="count, delete nothing")
        parser.add_argument("--database", help="database alias of the run table")

    def handle(self, *args: Any, **options: Any) -> None:
        problem = settings_error()
        if problem:
            raise CommandError(problem, returncode=2)
        try:
            older_than = parse_duration(
                options["older_than"] or app_settings.KEEP_RUNS, what="--older-than"
            )
            alias = resolve_alias(options["database"])
        except LockConfigurationError as exc:
            raise CommandError(str(exc), returncode=2) from exc
        if older_than.total_seconds() < 0:
            raise CommandError("--older-than must not be negative.", returncode=2)
        count = prune_runs(older_than, using=alias, dry_run=options["dry_run"])
        verb = "would delete" if options["dry_run"] else "deleted"
        if options["verbosity"] >= 1:
            self.stdout.write(f"{verb} {count} job run(s) finished more than {older_than} ago")

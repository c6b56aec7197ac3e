"""``manage.py exclusive_jobs [--json | --check] | pause NAME | resume NAME | run NAME
[--kwargs JSON] | backfill NAME --from T | next NAME [-n N] [--json] |
import-celery-beat [NAME] [--dry-run]``."""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import connections

from django_exclusive_jobs import values
from django_exclusive_jobs.health import JobHealth, Overview, overview
from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.lock.errors import LockConfigurationError
from django_exclusive_jobs.lock.retry import run_statement
from django_exclusive_jobs.lock.validation import check_outside_transaction, resolve_alias
from django_exclusive_jobs.management.base import (
    JobCommand,
    count_option,
    duration_option,
    kwargs_option,
    moment_option,
    operator,
    reason_option,
)
from django_exclusive_jobs.management.output import given, line_printer, one_line
from django_exclusive_jobs.run import backfill, celery_beat, control, overrides, preview
from django_exclusive_jobs.run.registry import get_job
from django_exclusive_jobs.values import printable

EPILOG = """\
With no action: every job, its schedule, last run and health, as a table (or --json).
--check prints one line per problem and exits 1 if there is any (for monitors and probes).
pause / resume NAME [--reason TEXT] [--until T]: persisted, and recorded in the audit
with who and why; a paused job's starts skip (exit 0) and record its slots as paused,
until resumed or until T (database time).
run NAME [--kwargs JSON]: run the job once now, here, under its lock (recorded as a
manual run, with its arguments); --kwargs update the job's declared kwargs for this run
(the given ones win), checked against its function before anything runs.
backfill NAME --from T [--to T]: run here, oldest first, each slot of the job from T to
T (default now) that has no run that succeeded, once across all servers; --dry-run only
lists them. A time without a zone is in the job's cron time zone, else TIME_ZONE. A job
whose function takes no slot argument needs --yes (each run would do the same work).
import-celery-beat [NAME] [--dry-run]: add each of django-celery-beat's periodic tasks
as a run-time schedule of the job NAME (default celery_beat, declared by
celery_beat_job()); --dry-run only says what it would add and what it cannot carry.
next NAME [-n N]: the job's next N slots (default 10) after the database's time, in UTC
and in its time zone (its cron time zone, else TIME_ZONE), with their start if it has a
jitter; a job without a schedule has none (one line, exit 0).

exit codes: 0 all well (or done); 1 --check found problems, or import-celery-beat could
not carry a periodic task (each one said), or run NAME failed or its
lock is held, or a backfilled slot did not succeed or was not run (its lock stayed held
past --wait); 2 usage or configuration error (unknown job, a bad range, --kwargs that
are not JSON or do not fit the job's function, migrations not applied); 3 the database
cannot be reached; run NAME also exits as run_exclusive does: 4 the lock was lost,
128+N stopped by signal N (backfill too).
"""


logger = logging.getLogger("django_exclusive_jobs")
NEXT_SLOTS = 10  # next NAME shows this many slots without -n
BY_LENGTH = 255  # --by: what the audit and the run history keep of who asks


class Command(JobCommand):
    epilog = EPILOG
    help = "List jobs and their health; pause, resume, run one now or backfill its slots."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "action",
            nargs="?",
            choices=["list", "pause", "resume", "run", "backfill", "next", "import-celery-beat"],
            default="list",
        )
        parser.add_argument(
            "name", nargs="?", help="the job, with pause, resume, run, backfill, next"
        )
        parser.add_argument(
            "--json", action="store_true", help="the list, or next's slots, as JSON"
        )
        parser.add_argument(
            "--check", action="store_true", help="one line per problem; exit 1 if any"
        )
        parser.add_argument("--database", help="database alias of the lock table")
        parser.add_argument(
            "--beat-database",
            help="import-celery-beat: where django-celery-beat's tables are (default: "
            "where Django's routers read them)",
        )
        _pause_options(parser)
        _run_options(parser)
        _backfill_options(parser)
        _next_options(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        using = resolve_alias(options["database"])
        check_outside_transaction(using)
        action, name = options["action"], options["name"]
        _refuse_misplaced(action, options)
        if action == "list":
            if name:
                raise CommandError("list takes no NAME.", returncode=2)
            self._list(using, as_json=options["json"], check=options["check"])
            return
        if action == "import-celery-beat":
            self._import_celery_beat(name or celery_beat.JOB, using, options)
            return
        if not name:
            raise CommandError(f"{action} needs the job's NAME.", returncode=2)
        if get_job(name) is None:
            raise CommandError(
                f"Unknown job {name!r}: 'manage.py exclusive_jobs' lists the jobs.", returncode=2
            )
        if options["kwargs"] is not None and action != "run":
            raise CommandError("--kwargs goes with run.", returncode=2)
        who = operator(options["by"])
        if action == "backfill":
            self._backfill(name, who, using, options)
        elif options["start"] or options["end"] or options["dry_run"] or options["yes"]:
            raise CommandError("--from, --to, --dry-run and --yes go with backfill.", returncode=2)
        elif options["wait"] is not None:
            raise CommandError("--wait goes with backfill.", returncode=2)
        elif action == "next":
            self._next(name, using, options)
        elif action == "pause":
            until = options["until"]
            if until is not None:  # a time without a zone is on the job's clock in force
                zone = overrides.job_in_force(name, using=using).zone
                until = values.moment(until, what="--until", zone=zone)
            control.pause(name, by=who, using=using, reason=options["reason"], until=until)
            ends = f"until {until.isoformat()}" if until else "until it is resumed"
            self.stdout.write(one_line(f"paused {name}: its starts skip {ends}"))
        elif action == "resume":
            if control.resume(name, by=who, using=using, reason=options["reason"]):
                self.stdout.write(one_line(f"resumed {name}"))
            else:
                self.stdout.write(one_line(f"{name} was not paused"))
        else:
            report = line_printer(self, logger, options["verbosity"])
            given = options["kwargs"]
            result = control.run_now(name, by=who, using=using, report=report, kwargs=given)
            if result.exit_code or result.status == "skipped":
                sys.exit(result.exit_code or 1)

    def _backfill(self, name: str, who: str, using: str, options: dict[str, Any]) -> None:
        job = get_job(name)
        assert job is not None
        if options["start"] is None:
            raise CommandError("backfill needs --from: the oldest slot to run.", returncode=2)
        plan = backfill.plan(job, options["start"], options["end"], using=using)
        if plan.warning:
            self.stderr.write(one_line(f"warning: {plan.warning}"))
        if options["dry_run"]:
            self.stdout.write(one_line(plan.describe()))
            for slot in sorted([*plan.slots, *plan.done]):
                if slot in plan.done:
                    self.stdout.write(
                        one_line(
                            f"would skip {name} slot={slot.isoformat()}: already {plan.done[slot]}"
                        )
                    )
                else:
                    self.stdout.write(one_line(f"would run {name} slot={slot.isoformat()}"))
            return
        if plan.warning and not options["yes"]:
            raise CommandError(
                f"Not backfilled: {name} takes no slot argument; give --yes to run it once "
                "per slot anyway.",
                returncode=2,
            )
        report = line_printer(self, logger, options["verbosity"])
        done = backfill.run_slots(plan, by=who, using=using, wait=options["wait"], report=report)
        if done.exit_code:
            sys.exit(done.exit_code)

    def _import_celery_beat(self, name: str, using: str, options: dict[str, Any]) -> None:
        """django-celery-beat's periodic tasks as run-time schedules of ``name``."""
        if options["start"] or options["end"] or options["yes"] or options["kwargs"]:
            said = "import-celery-beat takes only --dry-run, --by and --beat-database."
            raise CommandError(said, returncode=2)
        source = options["beat_database"]
        if source is not None and source not in connections.settings:
            known = ", ".join(sorted(connections.settings))
            said = f"Unknown database alias {source!r} for --beat-database; known aliases: {known}."
            raise CommandError(said, returncode=2)
        try:
            plan = celery_beat.import_tasks(
                name, using=using, by=operator(options["by"]), dry_run=options["dry_run"],
                source=options["beat_database"],
            )  # fmt: skip
        except LockConfigurationError as exc:
            raise CommandError(str(exc), returncode=2) from None
        done = "would import" if options["dry_run"] else "imported"
        for carried in plan.carried:
            said = overrides.describe("schedule", celery_beat.spec_of(carried.settings))
            self.stdout.write(one_line(f"{done} {carried.task} as {name}:{carried.key}: {said}"))
            if carried.left_out:
                left = ", ".join(carried.left_out)
                self.stdout.write(one_line(f"  not carried of {carried.task}: {left}"))
        for task in plan.existing:
            self.stdout.write(one_line(f"already imported: {task}"))
        for missing in plan.not_carried:
            self.stdout.write(one_line(f"not carried: {missing.task}: {missing.why}"))
        said = (
            f"{len(plan.carried)} {done}, {len(plan.existing)} already imported, "
            f"{len(plan.not_carried)} not carried"
        )
        self.stdout.write(one_line(said))
        if plan.not_carried:
            sys.exit(1)

    def _next(self, name: str, using: str, options: dict[str, Any]) -> None:
        job = overrides.job_in_force(name, using=using, strict=True)  # an operator's, if any
        now = run_statement(using, lambda: database_now(using))
        slots = preview.upcoming(job, now, options["count"] or NEXT_SLOTS)
        schedule = job.schedule.describe() if job.schedule else None
        if options["json"]:
            said = {
                "name": job.name,
                "schedule": schedule,
                "timezone": str(job.zone),
                "now": now.isoformat(),
                "slots": [slot.as_dict() for slot in slots],
            }
            self.stdout.write(json.dumps(said, indent=2))
        elif schedule is None:
            self.stdout.write(
                one_line(
                    f"{job.name} has no schedule (every= or cron=): no slot comes; it runs "
                    "only when it is started."
                )
            )
        else:
            jitter = f" jitter {job.jitter}" if job.jitter else ""
            self.stdout.write(
                one_line(
                    f"next {len(slots)} slot(s) of {job.name} after {_shown(now)} (database "
                    f"time): {given(schedule)}{jitter}"
                )
            )
            self._slots(slots, str(job.zone), jittered=bool(job.jitter))

    def _slots(self, slots: list[preview.Upcoming], zone: str, *, jittered: bool) -> None:
        """The slots as a table: in UTC, on the job's zone's clock, and their start."""
        rows = [["UTC", zone, "START (UTC)"]]
        for slot in slots:
            rows.append([_shown(slot.slot), _shown(slot.local), _shown(slot.start, "milliseconds")])
        if not jittered:
            rows = [row[:2] for row in rows]
        self._columns(rows)

    def _list(self, using: str, *, as_json: bool, check: bool) -> None:
        jobs = run_statement(using, lambda: overview(using))
        if as_json:
            self.stdout.write(json.dumps(jobs.as_dict(), indent=2))
        elif check:
            for line in jobs.problems:  # a problem may quote a reason or a job's error
                self.stdout.write(printable(line))
            if not jobs.problems:
                self.stdout.write(f"ok: {len(jobs.jobs)} job(s), no problem")
        else:
            self._table(jobs)
        if check and jobs.problems:
            sys.exit(1)

    def _table(self, jobs: Overview) -> None:
        rows = [("JOB", "HEALTH", "SCHEDULE", "NEXT SLOT", "LAST RUN", "FAILED/MISSED 24H")]
        for job in jobs.jobs + jobs.undeclared:
            last = job.last_run
            rows.append(
                (
                    _named(job),
                    job.badge,
                    f"{job.schedule} ({job.timezone})" if job.timezone else job.schedule,
                    job.next_slot.isoformat(timespec="seconds") if job.next_slot else "-",
                    f"{last.status} {last.started_at.isoformat(timespec='seconds')}"
                    if last
                    else "-",
                    f"{job.failures_24h}/{job.missed_24h}",
                )
            )
        self._columns(rows)
        for job in jobs.jobs:  # an operator's override: drift from the code
            for drift in job.overrides:
                why = f": {given(job.override_reason)}" if job.override_reason else ""
                code = "the code has changed since: it says" if drift["changed"] else "code says"
                self.stdout.write(
                    one_line(
                        f"{job.name}: {drift['setting']} {given(drift['value'])} overridden by "
                        f"{given(job.overridden_by)}{why}; {code} {given(drift['code'])}"
                    )
                )
        alive = f"{jobs.schedulers_alive} scheduler(s) alive"
        if not jobs.schedulers_alive and jobs.last_beat is not None:
            alive = f"no scheduler alive since {jobs.last_beat.isoformat(timespec='seconds')}"
        self.stdout.write(f"{alive}; {len(jobs.problems)} problem(s)")

    def _columns(self, rows: list[Any]) -> None:
        """Rows of cells as columns, each as wide as its widest cell (a cell is text
        from people or jobs: a name, a schedule; escaped and cut as such)."""
        rows = [[printable(cell) for cell in row] for row in rows]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            self.stdout.write(
                "  ".join(
                    cell.ljust(width) for cell, width in zip(row, widths, strict=True)
                ).rstrip()
            )


def _shown(moment: dt.datetime, timespec: str = "seconds") -> str:
    return moment.isoformat(timespec=timespec)


def _named(job: JobHealth) -> str:
    """The job's name, with its arguments if it has any."""
    if not job.declared:
        return f"{job.name} (not declared any more)"
    return f"{job.name} {job.arguments}" if job.arguments else job.name


def _refuse_misplaced(action: str, options: dict[str, Any]) -> None:
    """An option given with an action it does not go with: one line, exit 2."""
    if options["count"] is not None and action != "next":
        raise CommandError("-n goes with next.", returncode=2)
    if options["check"] and action != "list":
        raise CommandError("--check goes with list.", returncode=2)
    if options["json"] and action not in ("list", "next"):
        raise CommandError("--json goes with list and next.", returncode=2)
    if (options["reason"] and action not in ("pause", "resume")) or (
        options["until"] and action != "pause"
    ):
        said = "--reason goes with pause and resume, --until with pause."
        raise CommandError(said, returncode=2)
    if options["beat_database"] and action != "import-celery-beat":
        raise CommandError("--beat-database goes with import-celery-beat.", returncode=2)


def _pause_options(parser: CommandParser) -> None:
    """Who asks and why (in the audit), and when a pause ends by itself."""
    parser.add_argument(
        "--by",
        type=reason_option("--by", limit=BY_LENGTH),
        help="who asks (default: user@host of this shell)",
    )
    parser.add_argument(
        "--reason",
        type=reason_option("--reason"),
        default="",
        help="pause, resume: why (in the audit)",
    )
    parser.add_argument(
        "--until",
        type=moment_option("--until"),
        help="pause: when the pause ends by itself (database time), ISO 8601; without a "
        "zone, in the job's cron time zone, else TIME_ZONE",
    )


def _run_options(parser: CommandParser) -> None:
    """run: the run's arguments."""
    parser.add_argument(
        "--kwargs",
        type=kwargs_option("--kwargs"),
        help='run: the arguments, a JSON object such as \'{"day": "2026-11-24"}\'; they '
        "update the job's declared kwargs (the given ones win)",
    )


def _backfill_options(parser: CommandParser) -> None:
    """backfill: the range of slots, and how it goes."""
    parser.add_argument(
        "--from",
        dest="start",
        type=moment_option("--from"),
        help="backfill: the oldest slot, ISO 8601; without a zone, in the job's cron time "
        "zone, else TIME_ZONE",
    )
    parser.add_argument(
        "--to",
        dest="end",
        type=moment_option("--to"),
        help="backfill: the newest slot, as --from (default: now)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="backfill: list the slots; run nothing"
    )
    parser.add_argument(
        "--wait",
        type=duration_option("--wait"),
        help="backfill: how long to wait for the job's lock while another run of it "
        "goes on, before stopping (default: the job's ttl)",
    )
    parser.add_argument(
        "--yes",
        action="store_true",
        help="backfill: go on although the job's function takes no slot argument",
    )


def _next_options(parser: CommandParser) -> None:
    """next: how many of the job's next slots."""
    parser.add_argument(
        "-n",
        "--count",
        type=count_option("-n", preview.MAX_SLOTS),
        help=f"next: how many slots (default {NEXT_SLOTS}, at most {preview.MAX_SLOTS})",
    )

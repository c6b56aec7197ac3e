"""System checks for ``EXCLUSIVE_JOBS`` and the jobs' declarations: one ID per problem, each
in docs/reference/checks."""

from __future__ import annotations

import datetime as dt
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning

from . import values
from .conf import DEFAULTS, GONE
from .lock.validation import MAX_TTL, MIN_TTL
from .logs import FORMATS as LOG_FORMATS

SETTING = "EXCLUSIVE_JOBS"
PREFIX = "django_exclusive_jobs."
SQLITE_RETURNING = (3, 35, 0)
# A HEALTH_TOKEN shorter than this draws W006: it can be guessed.
HEALTH_TOKEN_LENGTH = 16


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    user = getattr(settings, SETTING, {})
    if not isinstance(user, dict):
        return [
            Error(
                f"{SETTING} must be a dict, not {type(user).__name__}.",
                hint=f"Set {SETTING} = {{'TTL': '5m'}} or remove it.",
                id=PREFIX + "E001",
            )
        ]
    messages: list[CheckMessage] = []
    unknown = sorted(set(user) - set(DEFAULTS) - set(GONE))
    if unknown:
        messages.append(
            Error(
                f"{SETTING} has unknown key(s): {', '.join(map(repr, unknown))}.",
                hint=f"Known keys: {', '.join(sorted(DEFAULTS))}.",
                id=PREFIX + "E002",
            )
        )
    for key in sorted(set(user) & set(GONE)):
        messages.append(Warning(f"{SETTING}[{key!r}] is ignored: {GONE[key]}.", id=PREFIX + "W002"))
    merged = {**DEFAULTS, **user}
    messages += _check_values(merged)
    messages += _check_databases(merged["DATABASE"])
    messages += _check_integrations(merged)
    return messages


def check_jobs(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The ``jobs`` modules that raised when Django started (see ``autodiscover``), and
    the ``in_process=True`` jobs that the ``TIMEOUT`` setting puts in a process."""
    from .run.registry import all_jobs, startup_problems

    messages: list[CheckMessage] = [
        Error(
            str(problem),
            hint="Fix the declaration: until then the jobs of this module are not "
            "registered and the commands of django_exclusive_jobs refuse to run (exit 2).",
            id=PREFIX + "E014",
        )
        for problem in startup_problems
    ]
    try:
        moved = [job.name for job in all_jobs() if job.in_process and not job.runs_in_thread]
    except Exception:  # a bad TIMEOUT: E003 says so
        moved = []
    if moved:
        messages.append(
            Warning(
                f"{SETTING}['TIMEOUT'] gives in_process=True job(s) a timeout, which "
                f"nothing could enforce in a thread, so the scheduler runs them in a "
                f"process of their own: {', '.join(moved)}.",
                hint=f"Drop {SETTING}['TIMEOUT'] and give timeout= to the jobs that "
                "need one, or leave in_process out of these.",
                id=PREFIX + "W005",
            )
        )
    return messages


def configuration_error() -> str | None:
    """The first serious problem with the settings or the jobs' declarations, as one line.

    For the commands, which run only this app's checks (a cron line starts fast, and an
    operator's command must work while another app's check fails) and refuse to run on
    an error, so that nothing runs half-configured.
    """
    errors = [message for message in check_settings() + check_jobs() if message.is_serious()]
    if not errors:
        return None
    more = f" And {len(errors) - 1} more: 'manage.py check' lists them." if errors[1:] else ""
    return f"{errors[0].msg} ({errors[0].id}){more}"


def _check_values(merged: dict[str, Any]) -> list[CheckMessage]:
    """Each setting's own range (a value that is not a duration is E003 wherever it is)."""
    found = _Found(merged)
    _check_lock_settings(found)
    _check_run_settings(found)
    _check_output_settings(found)
    return found.messages


@dataclass
class _Found:
    """The settings' values being checked, and the messages found so far, in order."""

    merged: dict[str, Any]
    messages: list[CheckMessage] = field(default_factory=list)

    def duration(self, key: str, most: dt.timedelta = values.LONGEST) -> dt.timedelta | None:
        # values.duration: its parser and its longest; the lower bounds are each
        # setting's own check.
        try:
            return values.duration(
                self.merged[key], what=f"{SETTING}[{key!r}]", least=dt.timedelta.min, most=most
            )
        except ValueError as exc:
            self.messages.append(
                Error(
                    str(exc),
                    hint="Use seconds or a string like '90s', '15m', '1h'.",
                    id=PREFIX + "E003",
                )
            )
            return None

    def error(self, id: str, key: str, problem: str, hint: str | None = None) -> None:
        self.messages.append(Error(f"{SETTING}[{key!r}] {problem}", hint=hint, id=PREFIX + id))


def _check_lock_settings(found: _Found) -> None:
    """The lock's: TTL, MIN_HOLD, DATABASE, KEEPALIVE."""
    error, merged = found.error, found.merged
    ttl = found.duration("TTL", dt.timedelta.max)
    hold = found.duration("MIN_HOLD", dt.timedelta.max)
    if ttl is not None and not MIN_TTL <= ttl <= MAX_TTL:
        error(
            "E004",
            "TTL",
            f"must be between {MIN_TTL.total_seconds():g}s and {MAX_TTL.days} days.",
            "A lease of a few minutes suits most jobs; keep-alive renews it.",
        )
    if hold is not None and (hold < dt.timedelta(0) or (ttl is not None and hold > ttl)):
        error("E005", "MIN_HOLD", "must be between 0 and TTL.", "A longer hold outlives the lease.")
    alias = merged["DATABASE"]
    if alias is not None and alias not in settings.DATABASES:
        error(
            "E006",
            "DATABASE",
            f"is {alias!r}, which is not in DATABASES.",
            f"Use one of: {', '.join(sorted(settings.DATABASES))}, or None.",
        )
    if not isinstance(merged["KEEPALIVE"], bool):
        error("E007", "KEEPALIVE", "must be True or False.")


def _check_run_settings(found: _Found) -> None:
    """The runs': SLOT_TOLERANCE, KEEP_RUNS, RUNNING_LONG_FACTOR, TIMEOUT, BUSY_TIMEOUT;
    the scheduler's LISTEN."""
    error, merged = found.error, found.merged
    tolerance = found.duration("SLOT_TOLERANCE")
    if tolerance is not None and tolerance < dt.timedelta(0):
        error("E008", "SLOT_TOLERANCE", "must not be negative.", "How early a start may be.")
    keep = found.duration("KEEP_RUNS")
    if keep is not None and keep <= dt.timedelta(0):
        error("E009", "KEEP_RUNS", "must be positive.", "prune_job_runs keeps this much history.")
    factor = merged["RUNNING_LONG_FACTOR"]
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 1:
        error("E010", "RUNNING_LONG_FACTOR", f"must be a number above 1, not {factor!r}.")
    timeout = None if merged["TIMEOUT"] is None else found.duration("TIMEOUT")
    if timeout is not None and timeout <= dt.timedelta(0):
        error("E015", "TIMEOUT", "must be positive, or None for no limit.")
    busy = found.duration("BUSY_TIMEOUT")
    if busy is not None and busy < dt.timedelta(0):
        error("E011", "BUSY_TIMEOUT", "must not be negative.")
    if not isinstance(merged["LISTEN"], bool):
        error("E018", "LISTEN", "must be True or False.")
    if not isinstance(merged["SKIP_SCHEDULES"], bool):
        error("E019", "SKIP_SCHEDULES", "must be True or False.")


def _check_output_settings(found: _Found) -> None:
    """What it shows: the health and metrics views' HEALTH_TOKEN, the LOG_FORMAT."""
    merged = found.merged
    token = merged["HEALTH_TOKEN"]
    if token is not None and (not isinstance(token, str) or len(token) < HEALTH_TOKEN_LENGTH):
        found.messages.append(
            Warning(
                f"{SETTING}['HEALTH_TOKEN'] is {_token_said(token)}: a short token can be "
                "guessed, and it opens the health and metrics views.",
                hint=f"Use a random string of at least {HEALTH_TOKEN_LENGTH} characters, "
                "e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'.",
                id=PREFIX + "W006",
            )
        )
    if merged["LOG_FORMAT"] not in LOG_FORMATS:
        found.error(
            "E016", "LOG_FORMAT", f"must be 'text' or 'json', not {merged['LOG_FORMAT']!r}."
        )


def _token_said(token: object) -> str:
    if not isinstance(token, str):
        return f"a {type(token).__name__}, not a string"
    return f"{len(token)} character(s) long"


def _check_databases(alias: str | None) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    if alias is not None and settings.DATABASES.get(alias, {}).get("ATOMIC_REQUESTS"):
        messages.append(
            Warning(
                f"The lock database {alias!r} has ATOMIC_REQUESTS on; a lock taken in a "
                "view would be invisible to other servers until the request ends.",
                hint="Point EXCLUSIVE_JOBS['DATABASE'] at a second alias without "
                "ATOMIC_REQUESTS for the same database.",
                id=PREFIX + "W001",
            )
        )
    if not settings.USE_TZ:
        messages.append(
            Error(
                "USE_TZ = False is not supported: leases, slots and run history are times on "
                "the database's clock, and local times repeat an hour each autumn, when two "
                "servers could both hold a lock.",
                hint="Set USE_TZ = True (Django's default since 5.0).",
                id=PREFIX + "E013",
            )
        )
    uses_sqlite = any("sqlite3" in str(db.get("ENGINE", "")) for db in settings.DATABASES.values())
    if uses_sqlite and sqlite3.sqlite_version_info < SQLITE_RETURNING:
        messages.append(
            Error(
                f"SQLite {sqlite3.sqlite_version} is too old for the lock: it needs 3.35 or "
                "later (UPDATE ... RETURNING).",
                hint="Use a Python built against a newer SQLite, or the pysqlite3 package.",
                id=PREFIX + "E012",
            )
        )
    return messages


def _check_integrations(merged: dict[str, Any]) -> list[CheckMessage]:
    """The monitoring integrations: on or off, and what an enabled one lacks. Only a
    warning: a job runs whether or not it is watched."""
    messages: list[CheckMessage] = []
    enabled = []
    for key, package in (("OPENTELEMETRY", "opentelemetry-api"), ("SENTRY_MONITORS", "sentry-sdk")):
        if not isinstance(merged[key], bool):
            messages.append(Error(f"{SETTING}[{key!r}] must be True or False.", id=PREFIX + "E017"))
        elif merged[key]:
            enabled.append((key, package))
    if not enabled:
        return messages  # nothing of the integrations is imported
    from .integrations import EXTRAS, installed

    for key, package in enabled:
        if not installed(key):
            messages.append(
                Warning(
                    f"{SETTING}[{key!r}] is on, but {package} is not installed: nothing is "
                    "reported.",
                    hint=f"pip install 'django-exclusive-jobs[{EXTRAS[key]}]', or turn it off.",
                    id=PREFIX + "W003",
                )
            )
        elif key == "SENTRY_MONITORS":
            from .integrations.sentry import unmonitored

            messages += [
                Warning(
                    f"No Sentry cron monitor for {problem}.",
                    hint="Its runs send no check-ins; see the docs' Observe page.",
                    id=PREFIX + "W004",
                )
                for problem in unmonitored()
            ]
    return messages

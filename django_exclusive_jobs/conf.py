"""Settings: one dict, ``EXCLUSIVE_JOBS``, read at each use so ``override_settings`` works."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # How long a lease lasts before another server may take the lock over.
    "TTL": dt.timedelta(minutes=5),
    # "Lock at least for": on release the lease stays until acquired_at + MIN_HOLD.
    "MIN_HOLD": dt.timedelta(0),
    # Renew the lease from a background thread while a job runs (every TTL / 3).
    "KEEPALIVE": True,
    # Database alias for the lock table; None asks the database routers.
    "DATABASE": None,
    # How early a server may start and still serve the coming slot (capped at a third
    # of the schedule's interval).
    "SLOT_TOLERANCE": dt.timedelta(seconds=30),
    # How long run history is kept by prune_job_runs.
    "KEEP_RUNS": dt.timedelta(days=30),
    # A run is "running long" when it has lasted this many times the job's median
    # successful duration.
    "RUNNING_LONG_FACTOR": 3,
    # How long to keep retrying a statement the database refused for contention:
    # SQLite's "database is locked", a MySQL/MariaDB deadlock or row-lock timeout.
    "BUSY_TIMEOUT": dt.timedelta(seconds=30),
    # How long a run may last before it is stopped (SIGTERM, then SIGKILL after a grace)
    # and recorded timed_out; None: no limit. A job's timeout= overrides it.
    "TIMEOUT": None,
    # A shared secret for the optional health view (monitors send it as a Bearer
    # token); None: only staff who may view jobs see the view.
    "HEALTH_TOKEN": None,
    # What the commands print for each decision: "text" (a sentence) or "json" (one JSON
    # object per line: the sentence and its fields, see django_exclusive_jobs/logs.py).
    "LOG_FORMAT": "text",
    # On PostgreSQL, schedulers LISTEN for run-now requests, stops and operators'
    # changes instead of polling for them every 5 s (not behind PgBouncer in transaction
    # mode: see run/listening.py). False: poll everywhere.
    "LISTEN": True,
    # True: no scheduled slot starts here (the scheduler, run_exclusive's cron lines),
    # while runs asked for now and backfills still do: a staging copy of production.
    # Shown on every page, in --check, the health view and a metric.
    "SKIP_SCHEDULES": False,
    # One OpenTelemetry span per run, on the server that won it (needs opentelemetry-api;
    # the project configures the SDK and its exporter).
    "OPENTELEMETRY": False,
    # Each scheduled job's Sentry cron monitor, kept to its declaration, and a check-in
    # per slot from the server that won it (needs sentry-sdk, initialised by the project).
    "SENTRY_MONITORS": False,
}

# Settings that existed before and what became of them (system check W002).
GONE = {
    "PREPARE_STATEMENTS": "the lock's statements run through Django's cursor like every "
    "other query (to prepare statements, set the driver's own options in DATABASES)",
    "SQLITE_BUSY_TIMEOUT": "it is called BUSY_TIMEOUT now (it covers MySQL and MariaDB too)",
    "SUSPECT_FACTOR": "it is called RUNNING_LONG_FACTOR now (one word for a long run)",
}


class _Settings:
    """Lazy view of ``settings.EXCLUSIVE_JOBS`` merged over :data:`DEFAULTS`."""

    def user_settings(self) -> Any:
        return getattr(settings, "EXCLUSIVE_JOBS", {})

    def __getattr__(self, key: str) -> Any:
        if key not in DEFAULTS:
            raise AttributeError(key)
        user = self.user_settings()
        if isinstance(user, dict) and key in user:
            return user[key]
        return DEFAULTS[key]


app_settings = _Settings()

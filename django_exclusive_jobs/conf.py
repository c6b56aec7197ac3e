"""Settings: one dict, ``EXCLUSIVE_JOBS``, read at each use so ``override_settings`` works."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

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
    # A held lock is "suspect" when its run has lasted this many times the job's
    # median successful duration.
    "SUSPECT_FACTOR": 3,
    # How long to keep retrying when SQLite says "database is locked" (and a MariaDB or
    # MySQL statement picked as a deadlock victim or timed out waiting for a row lock).
    "SQLITE_BUSY_TIMEOUT": dt.timedelta(seconds=30),
    # PostgreSQL: make the lock's statements prepared statements once a connection has
    # run them a few times, so the server stops planning them on every call.
    "PREPARE_STATEMENTS": True,
}


class _Settings:
    """Lazy view of ``settings.EXCLUSIVE_JOBS`` merged over :data:`DEFAULTS`.

    The merged values are kept until Django says the setting changed
    (``override_settings`` and pytest-django's ``settings`` do), so the lock's hot path
    does not go through the settings object at every call.
    """

    def __init__(self) -> None:
        self._merged: dict[str, Any] | None = None

    def user_settings(self) -> Any:
        return getattr(settings, "EXCLUSIVE_JOBS", {})

    def __getattr__(self, key: str) -> Any:
        merged = self._merged
        if merged is None:
            user = self.user_settings()
            merged = {**DEFAULTS, **user} if isinstance(user, dict) else dict(DEFAULTS)
            self._merged = merged
        if key not in DEFAULTS:
            raise AttributeError(key)
        return merged[key]

    def reload(self, **kwargs: Any) -> None:
        if kwargs.get("setting") in (None, "EXCLUSIVE_JOBS"):
            self._merged = None


app_settings = _Settings()
setting_changed.connect(app_settings.reload, dispatch_uid="django_exclusive_jobs.conf")

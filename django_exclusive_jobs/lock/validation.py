"""Checks on what a caller asks for, made before any SQL is sent."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections, router

from .. import values
from ..conf import app_settings
from .durations import DurationLike
from .errors import LockConfigurationError, LockDatabaseError
from .retry import one_line

MAX_NAME_LENGTH = 255  # values.NAME_LENGTH
MIN_TTL = dt.timedelta(milliseconds=100)
# A lease past the year 9999 is NULL on SQLite and MySQL, which reads as "free".
MAX_TTL = dt.timedelta(days=366)


def validate_name(name: object) -> str:
    """A lock's name: :func:`values.name` says what it may be."""
    return values.name(name, what="Lock name")


def validate_timing(
    ttl: DurationLike | None, min_hold: DurationLike | None, *, use_settings: bool = True
) -> tuple[dt.timedelta, dt.timedelta]:
    """Check ``ttl`` and ``min_hold``; with ``use_settings`` fill gaps from EXCLUSIVE_JOBS.

    Without it only the values given are checked (at import time, before the system
    checks have looked at the settings).
    """
    if ttl is None and not use_settings:
        ttl_delta = dt.timedelta.max
    else:
        given = app_settings.TTL if ttl is None else ttl
        ttl_delta = values.duration(given, what="ttl", positive=True, most=dt.timedelta.max)
    if MAX_TTL < ttl_delta < dt.timedelta.max:  # max: no ttl given, checked at run time
        raise LockConfigurationError(
            f"ttl must be at most {MAX_TTL.days} days, got {ttl_delta}: keep-alive renews "
            "a lease while the job runs, so a long one only delays a crashed server's release."
        )
    if ttl_delta < MIN_TTL:
        raise LockConfigurationError(
            f"ttl must be at least {MIN_TTL.total_seconds():g}s, got "
            f"{ttl_delta.total_seconds():g}s: the lease would end before the job starts."
        )
    if min_hold is None and not use_settings:
        return ttl_delta, dt.timedelta(0)
    given_hold = app_settings.MIN_HOLD if min_hold is None else min_hold
    hold = values.duration(given_hold, what="min_hold", most=dt.timedelta.max)
    if hold > ttl_delta:
        raise LockConfigurationError(
            f"min_hold ({hold.total_seconds():g}s) must not be longer than ttl "
            f"({ttl_delta.total_seconds():g}s): the lease could end before the hold."
        )
    return ttl_delta, hold


def validate_timeout(timeout: DurationLike | None) -> dt.timedelta | None:
    """A run's time limit: a positive duration, or None for none."""
    if timeout is None:
        return None
    return values.duration(timeout, what="timeout", positive=True)


def validate_wait(wait: DurationLike | None) -> float:
    return 0.0 if wait is None else values.duration(wait, what="wait").total_seconds()


def resolve_alias(using: str | None) -> str:
    """The database alias for the lock table: argument, setting, then routers."""
    from ..models import JobLock  # models: not before apps are ready

    alias = using if using is not None else app_settings.DATABASE or router.db_for_write(JobLock)
    if not isinstance(alias, str) or alias not in connections.settings:
        known = ", ".join(sorted(connections.settings))
        raise LockConfigurationError(
            f"Unknown database alias {alias!r} for the lock table; known aliases: {known}."
        )
    try:
        connections[alias]  # loads the backend: its driver must be installed
    except ImproperlyConfigured as exc:
        raise LockConfigurationError(_driver_missing(alias, exc)) from None
    return alias


EXTRAS = {"postgresql": "postgres", "mysql": "mysql"}


def _driver_missing(alias: str, exc: ImproperlyConfigured) -> str:
    engine = str(connections.settings[alias].get("ENGINE", ""))
    extra = next((name for vendor, name in EXTRAS.items() if vendor in engine), None)
    install = f" Install it: pip install 'django-exclusive-jobs[{extra}]'." if extra else ""
    return f"Database {alias!r} cannot be used: {' '.join(str(exc).split())}.{install}"


def check_outside_transaction(alias: str) -> None:
    """Refuse to lock inside a transaction: other servers could not see the lock."""
    connection: Any = connections[alias]
    try:
        autocommit = connection.get_autocommit()
    except DatabaseError as exc:
        connection.close_if_unusable_or_obsolete()
        raise LockDatabaseError(f"Cannot reach database {alias!r}: {one_line(exc)}") from exc
    if connection.in_atomic_block or not autocommit:
        raise LockConfigurationError(
            f"The lock's database {alias!r} is inside a transaction (atomic block, "
            "ATOMIC_REQUESTS or a TestCase), so other servers could not see the lock until "
            "it commits. Take the lock outside the transaction, or point "
            "EXCLUSIVE_JOBS['DATABASE'] at a second alias for the same database."
        )

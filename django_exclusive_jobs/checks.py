"""System checks for ``EXCLUSIVE_JOBS``. Each ID is documented in docs/reference/checks."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning

from .conf import DEFAULTS
from .durations import parse_duration

SETTING = "EXCLUSIVE_JOBS"


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    user = getattr(settings, SETTING, {})
    if not isinstance(user, dict):
        return [
            Error(
                f"{SETTING} must be a dict, not {type(user).__name__}.",
                hint=f"Set {SETTING} = {{'TTL': '5m'}} or remove it.",
                id="django_exclusive_jobs.E001",
            )
        ]
    errors: list[CheckMessage] = []
    unknown = sorted(set(user) - set(DEFAULTS))
    if unknown:
        errors.append(
            Error(
                f"{SETTING} has unknown key(s): {', '.join(map(repr, unknown))}.",
                hint=f"Known keys: {', '.join(sorted(DEFAULTS))}.",
                id="django_exclusive_jobs.E002",
            )
        )
    merged = {**DEFAULTS, **user}

    def duration(key: str) -> dt.timedelta | None:
        try:
            return parse_duration(merged[key], what=f"{SETTING}[{key!r}]")
        except ValueError as exc:
            errors.append(
                Error(
                    str(exc),
                    hint="Use seconds or a string like '90s', '15m', '1h'.",
                    id="django_exclusive_jobs.E003",
                )
            )
            return None

    ttl = duration("TTL")
    if ttl is not None and ttl <= dt.timedelta(0):
        errors.append(
            Error(
                f"{SETTING}['TTL'] must be positive.",
                hint="A lease of a few minutes suits most jobs; keep-alive renews it.",
                id="django_exclusive_jobs.E003",
            )
        )
    hold = duration("MIN_HOLD")
    if hold is not None and (hold < dt.timedelta(0) or (ttl is not None and hold > ttl)):
        errors.append(
            Error(
                f"{SETTING}['MIN_HOLD'] must be between 0 and TTL.",
                hint="MIN_HOLD longer than the lease would let the lease end first.",
                id="django_exclusive_jobs.E004",
            )
        )
    busy = duration("SQLITE_BUSY_TIMEOUT")
    if busy is not None and busy < dt.timedelta(0):
        errors.append(
            Error(
                f"{SETTING}['SQLITE_BUSY_TIMEOUT'] must not be negative.",
                id="django_exclusive_jobs.E003",
            )
        )
    tolerance = duration("SLOT_TOLERANCE")
    if tolerance is not None and tolerance < dt.timedelta(0):
        errors.append(
            Error(
                f"{SETTING}['SLOT_TOLERANCE'] must not be negative.",
                hint="It is how early a server may start and still serve the coming slot.",
                id="django_exclusive_jobs.E007",
            )
        )
    keep = duration("KEEP_RUNS")
    if keep is not None and keep <= dt.timedelta(0):
        errors.append(
            Error(
                f"{SETTING}['KEEP_RUNS'] must be positive.",
                hint="prune_job_runs deletes runs older than this; 30 days is the default.",
                id="django_exclusive_jobs.E007",
            )
        )
    factor = merged["SUSPECT_FACTOR"]
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 1:
        errors.append(
            Error(
                f"{SETTING}['SUSPECT_FACTOR'] must be a number above 1, not {factor!r}.",
                hint="A run is suspect when it lasts this many times its job's median.",
                id="django_exclusive_jobs.E008",
            )
        )
    alias = merged["DATABASE"]
    if alias is not None and alias not in settings.DATABASES:
        errors.append(
            Error(
                f"{SETTING}['DATABASE'] is {alias!r}, which is not in DATABASES.",
                hint=f"Use one of: {', '.join(sorted(settings.DATABASES))}, or None.",
                id="django_exclusive_jobs.E005",
            )
        )
    elif alias is not None and settings.DATABASES[alias].get("ATOMIC_REQUESTS"):
        errors.append(
            Warning(
                f"The lock database {alias!r} has ATOMIC_REQUESTS on; a lock taken in a "
                "view would be invisible to other servers until the request ends.",
                hint="Point EXCLUSIVE_JOBS['DATABASE'] at a second alias without "
                "ATOMIC_REQUESTS for the same database.",
                id="django_exclusive_jobs.W001",
            )
        )
    for key in ("KEEPALIVE", "PREPARE_STATEMENTS"):
        if not isinstance(merged[key], bool):
            errors.append(
                Error(
                    f"{SETTING}[{key!r}] must be True or False.",
                    id="django_exclusive_jobs.E006",
                )
            )
    return errors

"""Sentry cron monitors: each scheduled job's monitor, kept to its declaration, and one
check-in per slot from the server that won it.

Enabled by ``EXCLUSIVE_JOBS["SENTRY_MONITORS"] = True``; needs ``sentry-sdk``, initialised
by the project. A run that serves a slot of its job's schedule sends ``in_progress`` with
the monitor's configuration (Sentry creates or updates the monitor from it), then ``ok``
or ``error`` when the slot's last attempt ends. Servers that skip send nothing; a slot no
server ran is Sentry's to find (it expects a check-in at each slot), and a start that
records it missed sends nothing more, so each missed slot is reported once. Runs asked
for now and backfills do not check in: they are not the schedule's.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import re
import uuid
from typing import Any, cast

from ..conf import app_settings
from ..lock.durations import parse_duration
from ..lock.lock import Lock
from ..run.registry import Job, all_jobs, get_job
from ..run.schedules import Cron, Every
from ..run.shutdown import KILL_AFTER
from ..run.status import RunStatus
from ..signals import job_finished, job_started
from .receivers import connect_receivers, quietly

TOOL = "Sentry"
DISPATCH = "django_exclusive_jobs.sentry"
SLUG_MAX = 50  # Sentry's longest monitor slug
MAX_RUNTIME = 40_320  # minutes (28 days): the longest Sentry accepts
# Check-in ids are the same on every server for one job's slot: a retry that another
# server runs carries on the check-in its first attempt opened.
NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://pypi.org/project/django-exclusive-jobs/")
OK_ENDS = (RunStatus.SUCCEEDED, RunStatus.ENQUEUED, RunStatus.CANCELLED)


def monitor_slug(name: str) -> str:
    """The monitor's slug: the job's name as Sentry spells slugs (lowercase letters,
    digits, ``-`` and ``_``, not only digits, at most 50), shortened with a hash of the
    name when it is longer."""
    slug = re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-") or "job"
    if slug.isdigit():
        slug = f"job-{slug}"
    if len(slug) > SLUG_MAX:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        slug = f"{slug[: SLUG_MAX - len(digest) - 1].rstrip('-')}-{digest}"
    return slug


def check_in_id(name: str, slot: dt.datetime) -> str:
    return uuid.uuid5(NAMESPACE, f"{name}@{slot.astimezone(dt.UTC).isoformat()}").hex


def _minutes(seconds: float) -> int:
    return max(1, math.ceil(seconds / 60))


def every_schedule(period: dt.timedelta) -> dict[str, Any] | None:
    """An ``every=`` schedule as Sentry's: a crontab when its slots fall on one (they are
    counted from 1970-01-01 00:00 UTC, a Thursday), else an interval; None when Sentry
    has no such schedule (less than a minute, or not whole minutes)."""
    minutes, rest = divmod(period.total_seconds(), 60)
    if rest or minutes < 1:
        return None
    m = int(minutes)
    hours = m // 60
    if 60 % m == 0:
        crontab = "* * * * *" if m == 1 else f"*/{m} * * * *"
    elif m % 60 == 0 and 24 % hours == 0:
        crontab = "0 * * * *" if hours == 1 else f"0 */{hours} * * *"
    elif m == 24 * 60:
        crontab = "0 0 * * *"
    elif m == 7 * 24 * 60:
        crontab = "0 0 * * 4"
    else:
        for unit, size in (("week", 7 * 24 * 60), ("day", 24 * 60), ("hour", 60)):
            if m % size == 0:
                return {"type": "interval", "value": m // size, "unit": unit}
        return {"type": "interval", "value": m, "unit": "minute"}
    return {"type": "crontab", "value": crontab}


def monitor_config(job: Job) -> dict[str, Any] | None:
    """The monitor Sentry keeps for ``job``, from its declaration; None when it has no
    schedule, or one Sentry cannot express (see :func:`unmonitored`)."""
    schedule = job.schedule
    if isinstance(schedule, Cron):
        config: dict[str, Any] = {
            "schedule": {"type": "crontab", "value": schedule.expression},
            "timezone": schedule.timezone,
        }
    elif isinstance(schedule, Every):
        every = every_schedule(schedule.period)
        if every is None:
            return None
        config = {"schedule": every, "timezone": "UTC"}
    else:
        return None
    assert schedule is not None
    # Late by up to its jitter, and by the clocks' differences its slot tolerance allows.
    tolerance = schedule.tolerance
    if tolerance is None:
        tolerance = parse_duration(app_settings.SLOT_TOLERANCE, what="SLOT_TOLERANCE")
    config["checkin_margin"] = _minutes((job.jitter + tolerance).total_seconds())
    limit = job.time_limit
    if job.warn_seconds is not None:
        # warn_after: Sentry marks the check-in timed out then, as we say running long.
        config["max_runtime"] = min(MAX_RUNTIME, _minutes(job.warn_seconds))
    elif limit is not None:
        # A slot's check-in stays open through its retries: each attempt's timeout (and
        # the SIGKILL grace after it), and the backoffs between them.
        attempts = job.retries + 1
        backoffs = sum(job.retry.delay(a).total_seconds() for a in range(1, attempts))
        config["max_runtime"] = min(
            MAX_RUNTIME, _minutes(attempts * (limit + KILL_AFTER) + backoffs)
        )
    return config


def unmonitored() -> list[str]:
    """Each scheduled job that cannot have a monitor, and why, one line each (system check
    W004): a schedule Sentry cannot express, or a slug another job's monitor has."""
    problems: list[str] = []
    slugs: dict[str, str] = {}
    for job in all_jobs():
        if job.schedule is None:
            continue
        if monitor_config(job) is None:
            problems.append(
                f"job {job.name!r}: it runs {job.schedule.describe()}, and Sentry's schedules "
                "are whole minutes"
            )
            continue
        slug = monitor_slug(job.name)
        if slug in slugs:
            problems.append(
                f"job {job.name!r}: its slug {slug!r} is taken by job {slugs[slug]!r}; rename one"
            )
        slugs.setdefault(slug, job.name)
    return problems


def _checks_in(name: str, slot: dt.datetime | None, backfill: bool) -> dict[str, Any] | None:
    """The monitor config of a run that checks in; None for one that does not."""
    job = get_job(name)
    if job is None or slot is None or backfill:
        return None
    return monitor_config(job)


@quietly(TOOL, "the start")
def on_started(
    sender: Any,
    name: str,
    lock: Lock,
    slot: dt.datetime | None = None,
    backfill: bool = False,
    **kwargs: Any,
) -> None:
    config = _checks_in(name, slot, backfill)
    if config is None:
        return
    assert slot is not None
    from sentry_sdk.crons import capture_checkin  # optional package (its extra)

    capture_checkin(
        monitor_slug=monitor_slug(name),
        check_in_id=check_in_id(name, slot),
        status="in_progress",
        monitor_config=cast(Any, config),
    )


@quietly(TOOL, "the end")
def on_finished(
    sender: Any,
    name: str,
    lock: Lock,
    status: str,
    duration: float,
    attempt: int = 1,
    final: bool = True,
    slot: dt.datetime | None = None,
    backfill: bool = False,
    **kwargs: Any,
) -> None:
    if not final:  # retries=N: the slot runs again; its last attempt closes the check-in
        return
    config = _checks_in(name, slot, backfill)
    if config is None:
        return
    assert slot is not None
    from sentry_sdk.crons import capture_checkin  # optional package (its extra)

    capture_checkin(
        monitor_slug=monitor_slug(name),
        check_in_id=check_in_id(name, slot),
        status="ok" if status in OK_ENDS else "error",
        # A retry's own duration is not the slot's: Sentry measures from the check-in's start.
        duration=duration if attempt == 1 else None,
        monitor_config=cast(Any, config),
    )


RECEIVERS = ((job_started, on_started), (job_finished, on_finished))


def connect() -> None:
    connect_receivers(RECEIVERS, DISPATCH)


def disconnect() -> None:
    connect_receivers(RECEIVERS, DISPATCH, connected=False)

"""What ``@exclusive_job(...)`` declares: its arguments checked once, each by its named
check, and the jobs a function runs as (one, or one per schedule of ``schedules=``).

Every check here is what was passed to the decorator; the settings' defaults are the
system checks' job (``checks.py``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import values
from ..lock.durations import DurationLike
from ..lock.errors import LockConfigurationError
from ..lock.validation import validate_timeout, validate_timing, validate_wait
from . import slot_locks
from .arguments import check_kwargs
from .catchup import CatchUp, make_catch_up, make_overlap
from .jitter import make_jitter
from .policies import SKIP, Overlap, find_overlap
from .registry import Job
from .retries import make_retries
from .schedules import SCHEDULE_SEPARATOR, Schedule, make_schedule, several_schedules

# Each schedule by its name ("" for the one of every=/cron=, or none), its arguments.
Schedules = dict[str, tuple[Schedule | None, object]]


@dataclass(frozen=True)
class Declaration:
    """The decorator's arguments, checked: the jobs' name (None: the function's), each
    schedule with its arguments and its jitter, and the settings every job shares."""

    name: str | None
    schedules: Schedules
    spread: dict[str, dt.timedelta]
    given_kwargs: bool  # kwargs= was given: a single schedule's are checked too
    several: bool  # schedules= was given: each schedule is a job of its own
    shared: dict[str, Any]  # the Job settings all its jobs have alike

    @property
    def scheduled(self) -> bool:
        return all_scheduled(self.schedules)


def refuse_removed(removed: dict[str, Any]) -> None:
    """Arguments the decorator no longer takes: ``retry_failed=`` says what replaced it,
    any other one is refused as Python refuses an unexpected keyword argument."""
    if "retry_failed" in removed:
        raise LockConfigurationError(
            "retry_failed= was replaced by retries=N (and retry_backoff=): declare how many "
            "times a failed slot is run again, e.g. retries=1."
        )
    if removed:
        raise TypeError(
            f"exclusive_job() got an unexpected keyword argument {next(iter(removed))!r}"
        )


def check_lock_options(
    on_held: str,
    ttl: DurationLike | None,
    min_hold: DurationLike | None,
    wait: DurationLike | None,
    timeout: DurationLike | None,
) -> dt.timedelta | None:
    """``on_held``, the lease (``ttl``, ``min_hold``), ``wait``, checked; the ``timeout``
    as the jobs keep it."""
    if on_held not in ("skip", "raise"):
        raise LockConfigurationError(f"on_held must be 'skip' or 'raise', not {on_held!r}.")
    validate_timing(ttl, min_hold, use_settings=False)
    time_limit = validate_timeout(timeout)
    if wait is not None:
        validate_wait(wait)
    return time_limit


def declared_schedules(
    schedules: dict[str, dict[str, Any]] | None,
    every: DurationLike | None,
    cron: str | None,
    timezone: str | None,
    kwargs: dict[str, Any] | None,
    tolerance: DurationLike | None,
) -> Schedules:
    """Each schedule by its name: the one of ``every=``/``cron=`` (or none) under "",
    else each of ``schedules=``, which then holds every schedule's settings."""
    if schedules is None:
        schedule = make_schedule(every=every, cron=cron, timezone=timezone, tolerance=tolerance)
        return {"": (schedule, {} if kwargs is None else kwargs)}
    if (every, cron, timezone, kwargs) != (None, None, None, None):
        raise LockConfigurationError(
            "With schedules=, give cron=, every=, timezone= and kwargs= in each schedule."
        )
    return dict(several_schedules(schedules, tolerance=tolerance))


def all_scheduled(schedules: Schedules) -> bool:
    """Every one of the jobs has a schedule (``every=`` or ``cron=``)."""
    return all(schedule is not None for schedule, _ in schedules.values())


def scheduled_policies(
    schedules: Schedules,
    retries: int,
    retry_backoff: DurationLike | None,
    catch_up: str,
    catch_up_limit: int,
    catch_up_window: DurationLike | None,
    overlap: str,
) -> tuple[int, dt.timedelta, CatchUp, Overlap]:
    """``retries`` (and its backoff), ``catch_up`` and ``overlap``: each checked, and
    refused if changed for a job without a schedule."""
    retries, backoff = make_retries(retries, retry_backoff)
    if retries and not all_scheduled(schedules):
        raise LockConfigurationError("retries only applies with every= or cron=.")
    changed = (catch_up, catch_up_limit, catch_up_window) != ("latest", 10, None)
    if changed and not all_scheduled(schedules):
        raise LockConfigurationError("catch_up only applies with every= or cron=.")
    policy = make_catch_up(catch_up, catch_up_limit, catch_up_window)
    if find_overlap(overlap) != SKIP and not all_scheduled(schedules):
        raise LockConfigurationError("overlap only applies with every= or cron=.")
    return retries, backoff, policy, make_overlap(overlap, policy)


def check_pause_after(pause_after: int | None) -> None:
    if pause_after is not None and (
        isinstance(pause_after, bool) or not isinstance(pause_after, int) or pause_after < 1
    ):
        raise LockConfigurationError(
            f"pause_after must be a whole number of failures of 1 or more, got {pause_after!r}."
        )


def check_warn_after(
    warn_after: DurationLike | None, time_limit: dt.timedelta | None
) -> dt.timedelta | None:
    """``warn_after``: a positive duration, shorter than the job's ``timeout`` if it
    declares one (else a run would be stopped before it is ever running long)."""
    if warn_after is None:
        return None
    limit = values.duration(warn_after, what="warn_after", positive=True)
    if time_limit is not None and limit >= time_limit:
        raise LockConfigurationError(
            f"warn_after ({limit.total_seconds():g}s) must be shorter than the timeout "
            f"({time_limit.total_seconds():g}s): a run is stopped at its timeout."
        )
    return limit


def check_in_process(
    in_process: bool, time_limit: dt.timedelta | None, overlapping: Overlap
) -> None:
    """``in_process=True`` only for a job nothing must stop: no timeout, no overlap that
    stops a run."""
    if not isinstance(in_process, bool):
        raise LockConfigurationError(f"in_process must be True or False, not {in_process!r}.")
    if in_process and (time_limit is not None or overlapping.needs_child_process):
        stopper = "timeout=" if time_limit is not None else f"overlap={overlapping.name!r}"
        raise LockConfigurationError(
            f"in_process=True runs the job in a thread of the scheduler, which nothing can "
            f"stop, so {stopper} could not stop it: leave in_process out (a child process) "
            f"or drop {stopper}."
        )


def check_groups(group: object, overlapping: Overlap) -> tuple[str, ...]:
    """``group``: its names (see ``values.groups``); not with ``overlap="allow_all"``,
    whose slots run side by side."""
    if group is None:
        return ()
    names = values.groups(group)
    if overlapping.lock_per_slot:
        raise LockConfigurationError(
            "group= keeps a job's runs from running beside another member's, and "
            "overlap='allow_all' runs its slots side by side: choose one."
        )
    return names


def declare(
    name: str | None,
    *,
    ttl: DurationLike | None,
    min_hold: DurationLike | None,
    wait: DurationLike | None,
    using: str | None,
    on_held: str,
    keepalive: bool | None,
    every: DurationLike | None,
    cron: str | None,
    timezone: str | None,
    slot_tolerance: DurationLike | None,
    retries: int,
    retry_backoff: DurationLike | None,
    catch_up: str,
    catch_up_limit: int,
    catch_up_window: DurationLike | None,
    timeout: DurationLike | None,
    overlap: str,
    jitter: DurationLike | None,
    kwargs: dict[str, Any] | None,
    schedules: dict[str, dict[str, Any]] | None,
    pause_after: int | None,
    in_process: bool,
    warn_after: DurationLike | None,
    group: str | list[str] | tuple[str, ...] | None,
) -> Declaration:
    """``@exclusive_job``'s arguments, each checked at its door (LockConfigurationError)."""
    time_limit = check_lock_options(on_held, ttl, min_hold, wait, timeout)
    long_after = check_warn_after(warn_after, time_limit)
    declared = declared_schedules(schedules, every, cron, timezone, kwargs, slot_tolerance)
    retries, backoff, policy, overlapping = scheduled_policies(
        declared, retries, retry_backoff, catch_up, catch_up_limit, catch_up_window, overlap
    )
    spread = {key: make_jitter(jitter, schedule) for key, (schedule, _) in declared.items()}
    check_pause_after(pause_after)
    check_in_process(in_process, time_limit, overlapping)
    groups = check_groups(group, overlapping)
    shared = {
        "ttl": ttl,
        "min_hold": min_hold,
        "wait": wait,
        "using": using,
        "on_held": on_held,
        "keepalive": keepalive,
        "catch_up": policy,
        "timeout": time_limit,
        "overlap": overlapping,
        "retries": retries,
        "retry_backoff": backoff,
        "pause_after": pause_after,
        "in_process": in_process,
        "warn_after": long_after,
        "groups": groups,
    }
    return Declaration(name, declared, spread, kwargs is not None, schedules is not None, shared)


def make_jobs(declaration: Declaration, func: Callable[..., Any], task: Any = None) -> list[Job]:
    """The jobs ``func`` runs as, named ``name`` or ``module.qualname`` (plus
    ``:schedule`` for each of several schedules), their arguments checked."""
    # A failing declaration's job is read from this frame's ``name`` (see
    # ``registry._problem``): the name given, or None.
    name = declaration.name
    base = values.name(name or f"{func.__module__}.{func.__qualname__}")
    jobs = []
    for key, (schedule, arguments) in declaration.schedules.items():
        job_name = _job_name(base, key, declaration.shared["overlap"])
        # What its own starts call it with must fit. A single schedule without
        # kwargs= may serve direct calls that pass arguments: not checked.
        if declaration.given_kwargs or key:
            what = f"Schedule {key!r}: kwargs" if key else "kwargs"
            arguments = check_kwargs(task.func if task else func, arguments, what=what)
        assert isinstance(arguments, dict)
        jobs.append(
            Job(
                job_name,
                func,
                schedule=schedule,
                task=task,
                jitter=declaration.spread[key],
                kwargs=arguments,
                **declaration.shared,
            )
        )
    return jobs


def _job_name(base: str, key: str, overlapping: Overlap) -> str:
    """The job's name: ``base``, or ``base:key`` for schedule ``key``; short enough for
    each slot's lock with ``overlap="allow_all"``; not a concurrency group's lock's."""
    job_name = values.name(f"{base}{SCHEDULE_SEPARATOR}{key}" if key else base)
    if job_name.startswith(values.GROUP_PREFIX):
        raise LockConfigurationError(
            f"A job's name may not start with {values.GROUP_PREFIX!r}: the locks of "
            f"concurrency groups are named so; {job_name[:40]!r} needs another name."
        )
    longest = values.NAME_LENGTH - slot_locks.LENGTH
    if overlapping.lock_per_slot and len(job_name) > longest:
        raise LockConfigurationError(
            f"With overlap='allow_all' a job's name has at most {longest} characters "
            f"(each slot's lock adds the slot's time to it); {job_name[:40]!r}... "
            f"has {len(job_name)}."
        )
    return job_name

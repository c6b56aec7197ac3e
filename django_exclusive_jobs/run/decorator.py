"""``@exclusive_job``: a function that runs on one server at a time."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar, overload

from ..lock.durations import DurationLike
from ..lock.errors import LockConfigurationError, LockHeld
from ..lock.lock import Lock
from .declaration import (
    Declaration,
    check_in_process,
    check_lock_options,
    check_pause_after,
    declared_schedules,
    make_jobs,
    refuse_removed,
    scheduled_policies,
)
from .jitter import make_jitter
from .registry import Job, register
from .runner import Run, RunResult
from .start import Start
from .status import RunStatus
from .tasks import enqueuer, is_task

F = TypeVar("F", bound=Callable[..., Any])


@overload
def exclusive_job(name: F) -> F: ...


@overload
def exclusive_job(
    name: str | None = None,
    *,
    ttl: DurationLike | None = None,
    min_hold: DurationLike | None = None,
    wait: DurationLike | None = None,
    using: str | None = None,
    on_held: str = "skip",
    keepalive: bool | None = None,
    every: DurationLike | None = None,
    cron: str | None = None,
    timezone: str | None = None,
    slot_tolerance: DurationLike | None = None,
    retries: int = 0,
    retry_backoff: DurationLike | None = None,
    catch_up: str = "latest",
    catch_up_limit: int = 10,
    catch_up_window: DurationLike | None = None,
    timeout: DurationLike | None = None,
    overlap: str = "skip",
    jitter: DurationLike | None = None,
    kwargs: dict[str, Any] | None = None,
    schedules: dict[str, dict[str, Any]] | None = None,
    pause_after: int | None = None,
    in_process: bool = False,
) -> Callable[[F], F]: ...


def exclusive_job(
    name: Any = None,
    *,
    ttl: DurationLike | None = None,
    min_hold: DurationLike | None = None,
    wait: DurationLike | None = None,
    using: str | None = None,
    on_held: str = "skip",
    keepalive: bool | None = None,
    every: DurationLike | None = None,
    cron: str | None = None,
    timezone: str | None = None,
    slot_tolerance: DurationLike | None = None,
    retries: int = 0,
    retry_backoff: DurationLike | None = None,
    catch_up: str = "latest",
    catch_up_limit: int = 10,
    catch_up_window: DurationLike | None = None,
    timeout: DurationLike | None = None,
    overlap: str = "skip",
    jitter: DurationLike | None = None,
    kwargs: dict[str, Any] | None = None,
    schedules: dict[str, dict[str, Any]] | None = None,
    pause_after: int | None = None,
    in_process: bool = False,
    **removed: Any,
) -> Any:
    """Run the decorated function under the lock ``name`` (default ``module.qualname``).

    When another server holds the lock the function does not run: the call logs one
    INFO line and returns None, or raises :class:`LockHeld` with ``on_held="raise"``.
    The job is registered, so ``manage.py run_exclusive NAME`` can run it. ``async def``
    functions work too.

    With ``every="1h"`` or ``cron="0 * * * *"`` (and ``timezone=``, default
    ``settings.TIME_ZONE``) each scheduled slot runs once: a server that starts a little
    late finds the slot taken and skips, even after the first run released the lock.
    ``retries=N`` runs a slot whose run failed, timed out, was interrupted or lost its
    lock (a crashed server's run is marked lost once another server takes the lock over)
    again, at most N times, each attempt ``retry_backoff`` (default 30s, doubling per
    attempt, at most an hour) after the previous one ended, by whichever server comes
    first; a direct call never waits for a retry. Slots no server ran are recorded
    ``missed``;
    ``catch_up`` says what a late start runs: ``"latest"`` (the most recent missed slot,
    once), ``"skip"`` (nothing: wait for the next slot) or ``"all"`` (each missed slot in
    order, at most ``catch_up_limit``, none older than ``catch_up_window``). ``overlap``
    says what becomes of slots that come while the job's previous run still runs:
    ``"skip"`` (recorded skipped), ``"buffer_one"`` (the latest runs right after it),
    ``"buffer_all"`` (each runs, in order, at most ``catch_up_limit``) or
    ``"cancel_other"`` (the newer slot stops the run, on whatever server) or
    ``"allow_all"`` (each slot runs at its time, beside any still running). A function
    with a ``slot`` parameter is given the slot (a UTC datetime) it serves; one with a
    ``token`` parameter, its lock's fencing token (an int that grows at every take: pass
    it to writes that must refuse a holder that was taken over).

    The other arguments: ``ttl`` (lease length; default ``EXCLUSIVE_JOBS["TTL"]``),
    ``min_hold`` (keep the lock closed until this long after the start, for jobs
    without a schedule), ``wait`` (poll this long for a held lock instead of skipping),
    ``using`` (the lock's database alias), ``keepalive`` (renew the lease while the job
    runs; default ``EXCLUSIVE_JOBS["KEEPALIVE"]``), ``slot_tolerance`` (how early a start
    may be and still serve the coming slot; default ``EXCLUSIVE_JOBS["SLOT_TOLERANCE"]``).
    ``timeout`` (a run lasting longer is stopped: SIGTERM to its process group, SIGKILL
    after a grace, recorded ``timed_out``; default ``EXCLUSIVE_JOBS["TIMEOUT"]``, no
    limit). The timeout stops runs started by the scheduler and by ``run_exclusive``; a
    direct call of the decorated function (in a web request, say) is never stopped.
    Durations are seconds or strings such as ``"90s"``, ``"15m"``, ``"1h"``.

    ``jitter="5m"`` starts each slot up to that long after it (an offset every server
    computes alike from the job and the slot); ``kwargs={...}`` are the (JSON) keyword
    arguments its runs pass; ``schedules={"daily": {"cron": ..., "kwargs": {...}}, ...}``
    declares several schedules, each a job of its own named ``NAME:daily``.
    ``pause_after=3`` pauses the job once its last 3 runs have failed (a slot's last
    attempt each): a health problem and the ``job_paused`` signal, until resumed.
    ``in_process=True`` has the scheduler run it in a thread of its own process instead
    of a child process: far less CPU per run, for light jobs, but a run cannot be
    stopped (no ``timeout=``, no ``overlap="cancel_other"``) and a crash of the
    interpreter takes the scheduler with it (see ``run/thread.py``).
    """
    if callable(name):
        return exclusive_job()(name)
    refuse_removed(removed)
    time_limit = check_lock_options(on_held, ttl, min_hold, wait, timeout)
    declared = declared_schedules(schedules, every, cron, timezone, kwargs, slot_tolerance)
    retries, backoff, policy, overlapping = scheduled_policies(
        declared, retries, retry_backoff, catch_up, catch_up_limit, catch_up_window, overlap
    )
    spread = {key: make_jitter(jitter, schedule) for key, (schedule, _) in declared.items()}
    check_pause_after(pause_after)
    check_in_process(in_process, time_limit, overlapping)
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
    }
    declaration = Declaration(
        name, declared, spread, kwargs is not None, schedules is not None, shared
    )

    def decorate(func: F) -> F:
        return _decorate(declaration, func)

    return decorate


def _decorate(declaration: Declaration, func: F) -> F:
    """``func`` as the job(s) ``declaration`` declares, registered."""
    if is_task(func):
        return _schedule_task(declaration, func)
    jobs = make_jobs(declaration, func)
    for job in jobs:
        register(job)
    if declaration.several:
        return _several(func, jobs)  # type: ignore[return-value]
    # A direct call is an ordinary call: the caller's arguments, none recorded.
    [job] = jobs
    direct = replace(job, kwargs={})
    wrapper = _async_wrapper(direct) if job.is_async else _sync_wrapper(direct)
    wrapper.job = job  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def _schedule_task(declaration: Declaration, task: F) -> F:
    """A django.tasks Task: its job enqueues it; the Task itself is returned as is."""
    if not declaration.scheduled:
        raise LockConfigurationError(
            "A django.tasks Task needs every= or cron=: its job enqueues it at each slot."
        )
    for job in make_jobs(declaration, enqueuer(task), task=task):
        register(job)
    return task


def _several(func: Callable[..., Any], jobs: list[Job]) -> Callable[..., Any]:
    """A function with several schedules: each is a job of its own (``wrapper.jobs``); a
    direct call could not say which one's slot it serves, so it is refused."""
    names = ", ".join(repr(job.name) for job in jobs)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"{func.__qualname__} has several schedules ({names}), so a direct call would "
            f"not know which one it runs: run one with 'manage.py run_exclusive "
            f"{jobs[0].name}', or call {func.__qualname__}.__wrapped__(...) without a lock."
        )

    wrapper.jobs = {job.name: job for job in jobs}  # type: ignore[attr-defined]
    return wrapper


def _sync_wrapper(job: Job) -> Callable[..., Any]:
    @functools.wraps(job.func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        run = Run(job, start=Start.call())
        result = run.call(lambda lock: job.func(*args, **_given(job, run, lock, kwargs)))
        if result.status == RunStatus.SKIPPED:
            return _after_skip(job, result)
        return _returned(result)

    return wrapper


def _async_wrapper(job: Job) -> Callable[..., Any]:
    @functools.wraps(job.func)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        run = Run(job, start=Start.call())
        result = await run.acall(lambda lock: job.func(*args, **_given(job, run, lock, kwargs)))
        if result.status == RunStatus.SKIPPED:
            return _after_skip(job, result)
        return _returned(result)

    return wrapper


def _given(job: Job, run: Run, lock: Lock, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The caller's keyword arguments, plus ``slot`` and ``token`` (the lock's fencing
    token) if the function takes them and the caller did not give them."""
    given: dict[str, Any] = {}
    if job.wants_slot and "slot" not in kwargs:
        given["slot"] = run.job_slot
    if job.wants_token and "token" not in kwargs:
        given["token"] = lock.token
    return {**kwargs, **given}


def _after_skip(job: Job, result: RunResult) -> None:
    if job.on_held == "raise":
        raise LockHeld(job.name, holder=result.holder, expires_at=result.held_until)
    return None


def _returned(result: RunResult) -> Any:
    """What the decorated call gives back: the job's value, or its exception raised."""
    if result.exception is not None:
        raise result.exception
    return result.value

"""``@exclusive_job``: a function that runs on one server at a time."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar, overload

from ..lock.durations import DurationLike
from ..lock.errors import LockConfigurationError, LockHeld
from ..lock.lock import Lock
from .declaration import Declaration, declare, make_jobs, refuse_removed
from .registry import Job, register
from .run_info import current_run
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
    warn_after: DurationLike | None = None,
    group: str | list[str] | tuple[str, ...] | None = None,
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
    warn_after: DurationLike | None = None,
    group: str | list[str] | tuple[str, ...] | None = None,
    **removed: Any,
) -> Any:
    """Run the decorated function under the lock ``name`` (default ``module.qualname``).
    When another server holds the lock the function does not run: the call logs one INFO
    line and returns None (``on_held="raise"``: :class:`LockHeld`). The job is registered
    for ``run_exclusive NAME`` and the scheduler; ``async def`` works too.

    ``every="1h"`` or ``cron="0 * * * *"`` (``timezone=``): each slot runs once, across
    servers. ``retries``/``retry_backoff``: a slot whose run did not succeed runs again.
    ``catch_up`` (``"latest"``, ``"skip"``, ``"all"``; ``catch_up_limit``,
    ``catch_up_window``): what a late start runs. ``overlap`` (``"skip"``, ``"buffer_one"``,
    ``"buffer_all"``, ``"cancel_other"``, ``"allow_all"``): slots that come during a run.
    ``jitter``: start each slot up to that long after it. ``kwargs``: the runs' JSON
    arguments; ``schedules``: several schedules, each the job ``NAME:KEY``. ``timeout``:
    stop a longer run. ``pause_after=N``: pause after N failed slots. ``in_process=True``:
    the scheduler runs it in a thread. ``warn_after``: a run that lasts that long is said
    running long. ``group``: no two jobs of a group (one name, or several) run at once.
    ``ttl``, ``keepalive``, ``min_hold``, ``wait``, ``using``,
    ``slot_tolerance``: the lock's lease, renewal, closed time, wait, database, early
    allowance. A function with ``slot``, ``token`` or ``run`` parameters gets them.
    Durations: seconds or ``"90s"``, ``"15m"``, ``"1h"``. Defaults, bounds: docs/reference/api.md.
    """
    # Every argument but these two (at the top, ``locals()`` holds just the arguments).
    options = {key: value for key, value in locals().items() if key not in ("name", "removed")}
    if callable(name):
        return exclusive_job()(name)
    refuse_removed(removed)
    declaration = declare(name, **options)

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
    """The caller's keyword arguments, plus ``slot``, ``token`` (the lock's fencing token)
    and ``run`` (its ``RunInfo``) if the function takes them and the caller did not give
    them."""
    given: dict[str, Any] = {}
    if job.wants_slot and "slot" not in kwargs:
        given["slot"] = run.job_slot
    if job.wants_token and "token" not in kwargs:
        given["token"] = lock.token
    if job.wants_run and "run" not in kwargs:
        given["run"] = current_run()
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

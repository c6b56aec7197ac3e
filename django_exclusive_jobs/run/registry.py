"""Registered jobs: what ``@exclusive_job`` declares and ``run_exclusive`` can run by name."""

from __future__ import annotations

import datetime as dt
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import autodiscover_modules

from ..lock.durations import DurationLike
from .catchup import CatchUp
from .schedules import Schedule


@dataclass(frozen=True)
class Job:
    """A job registered by ``@exclusive_job``: its function and how it is run."""

    name: str
    func: Callable[..., Any]
    ttl: DurationLike | None = None
    min_hold: DurationLike | None = None
    wait: DurationLike | None = None
    using: str | None = None
    on_held: str = "skip"
    keepalive: bool | None = None
    schedule: Schedule | None = None
    retry_failed: bool = False
    catch_up: CatchUp = field(default_factory=CatchUp)
    task: Any = None  # a django.tasks Task this job enqueues at each slot

    def but(self, **changes: Any) -> Job:
        """This job with some settings changed (a command line's options), checked as the
        decorator checks them; a change of ``None`` leaves that setting as declared."""
        from ..lock.validation import validate_timing

        given = {key: value for key, value in changes.items() if value is not None}
        if not given:
            return self
        validate_timing(given.get("ttl", self.ttl), given.get("min_hold", self.min_hold))
        return replace(self, **given)

    @property
    def target(self) -> str:
        return f"{self.func.__module__}.{self.func.__qualname__}"

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.func)

    @property
    def wants_slot(self) -> bool:
        """The function takes a ``slot`` argument: it is given the slot it serves."""
        return "slot" in inspect.signature(self.func).parameters

    def call(self, slot: dt.datetime | None) -> Any:
        """Run the function as a scheduled start does: no arguments but ``slot``."""
        kwargs = {"slot": slot} if self.wants_slot else {}
        if self.is_async:
            from asgiref.sync import async_to_sync

            return async_to_sync(self.func)(**kwargs)
        return self.func(**kwargs)


_jobs: dict[str, Job] = {}


def register(job: Job) -> None:
    """Add ``job``; a second, different function under one name is a start-up error."""
    existing = _jobs.get(job.name)
    if existing is not None and existing.target != job.target:
        raise ImproperlyConfigured(
            f"Two jobs are named {job.name!r}: {existing.target} and {job.target}. "
            "Give one of them another name in @exclusive_job(...)."
        )
    _jobs[job.name] = job


def get_job(name: str) -> Job | None:
    return _jobs.get(name)


def all_jobs() -> list[Job]:
    return sorted(_jobs.values(), key=lambda job: job.name)


def autodiscover() -> None:
    """Import the ``jobs`` module of every installed app, as the admin does for ``admin``."""
    autodiscover_modules("jobs")

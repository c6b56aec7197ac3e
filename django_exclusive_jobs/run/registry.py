"""Registered jobs: what ``@exclusive_job`` declares and ``run_exclusive`` can run by name."""

from __future__ import annotations

import copy
import datetime as dt
import functools
import inspect
import traceback
import zoneinfo
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field, replace
from importlib import import_module
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import module_has_submodule

from ..lock.durations import DurationLike
from ..lock.errors import LockConfigurationError
from . import jitter as jitters
from .catchup import CatchUp
from .policies import SKIP, Overlap, overlap_policy
from .retries import DEFAULT_BACKOFF, Retries
from .schedules import SCHEDULE_SEPARATOR, Schedule


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
    retries: int = 0  # attempts after the first for a slot whose run did not succeed
    retry_backoff: dt.timedelta = DEFAULT_BACKOFF
    catch_up: CatchUp = field(default_factory=CatchUp)
    task: Any = None  # a django.tasks Task this job enqueues at each slot
    timeout: DurationLike | None = None  # None: EXCLUSIVE_JOBS["TIMEOUT"]
    overlap: Overlap = SKIP  # slots that come during a run: see catchup.py, policies.py
    # Each slot starts this much after it at most (a fixed offset per job and slot).
    jitter: dt.timedelta = jitters.NONE
    # The keyword arguments its runs call the function with (JSON, checked by the decorator).
    kwargs: dict[str, Any] = field(default_factory=dict, hash=False)
    # Paused by the app after this many failed runs in a row (None: never).
    pause_after: int | None = None
    # The scheduler runs it in a thread of its own process, not a child process (see
    # ``thread.py`` and :attr:`runs_in_thread`).
    in_process: bool = False
    # The arguments this run was asked for with (run now), over ``kwargs``: they win over
    # an operator's override of the kwargs too (see ``overrides.apply``).
    given: dict[str, Any] = field(default_factory=dict, hash=False)
    # A run that lasts this long is "running long" (said, signalled) and goes on.
    warn_after: dt.timedelta | None = None
    # Its concurrency groups: no two jobs of a group run at the same time (``groups.py``).
    groups: tuple[str, ...] = ()
    # A schedule added at run time (``runtime_schedules.py``): its slots from
    # ``starts_at`` to before ``ends_at``.
    added: bool = False
    starts_at: dt.datetime | None = None
    ends_at: dt.datetime | None = None

    def but(self, **changes: Any) -> Job:
        """This job with some settings changed (a command line's options), checked as the
        decorator checks them; a change of ``None`` leaves that setting as declared."""
        from ..lock.validation import validate_timeout, validate_timing, validate_wait

        given = {key: value for key, value in changes.items() if value is not None}
        if not given:
            return self
        validate_timing(given.get("ttl", self.ttl), given.get("min_hold", self.min_hold))
        if "timeout" in given:
            given["timeout"] = validate_timeout(given["timeout"])
        if "wait" in given:
            validate_wait(given["wait"])
        if isinstance(given.get("overlap"), str):  # a name, as the decorator takes it
            given["overlap"] = overlap_policy(given["overlap"])
        return replace(self, **given)

    def with_arguments(self, given: dict[str, Any]) -> Job:
        """This job as a run asked for with ``given`` arguments runs it: its declared
        ``kwargs`` (its schedule's, for ``NAME:schedule``) updated by ``given``, the given
        ones winning. Not checked: :meth:`check_arguments` is, when they are asked for."""
        if not given:
            return self
        return replace(self, kwargs={**self.kwargs, **given}, given={**self.given, **given})

    def check_arguments(self, given: object) -> dict[str, Any]:
        """``given``, if a run may be asked for with them: a dict that, over the declared
        ``kwargs``, is JSON and fits the function, as the decorator checks its ``kwargs``
        (else LockConfigurationError, one line)."""
        from .arguments import check_kwargs

        if not isinstance(given, dict):
            check_kwargs(self.func, given, what="The arguments")  # says it is not a dict
        assert isinstance(given, dict)
        what = "The run's arguments (its declared kwargs updated by those given)"
        check_kwargs(self.func, self.with_arguments(given).kwargs, what=what)
        return given

    @property
    def warn_seconds(self) -> float | None:
        """Its ``warn_after=`` in seconds; None: running long is judged by its median."""
        return None if self.warn_after is None else self.warn_after.total_seconds()

    @property
    def time_limit(self) -> float | None:
        """Seconds a run may last before it is stopped (its ``timeout=``, else the
        ``TIMEOUT`` setting); None: no limit."""
        from ..conf import app_settings
        from ..lock.durations import parse_duration

        timeout = app_settings.TIMEOUT if self.timeout is None else self.timeout
        if timeout is None:
            return None
        return parse_duration(timeout, what="timeout").total_seconds()

    @property
    def runs_in_thread(self) -> bool:
        """The scheduler runs it in a thread of its own process (``in_process=True``,
        see ``thread.py``), unless its run must be stoppable: it has a timeout (from
        the ``TIMEOUT`` setting or an operator's override) or ``overlap="cancel_other"``."""
        return self.in_process and self.time_limit is None and not self.overlap.needs_child_process

    @property
    def buffers(self) -> bool:
        """Its ``overlap`` runs a slot that came during a run, after it (``"buffer_one"``,
        ``"buffer_all"``, ``"cancel_other"``), rather than skip it or run it alongside."""
        return self.overlap.buffers

    @property
    def rechecks(self) -> bool:
        """A scheduler looks again at a slot another server claimed or holds, rather
        than wait for the next slot: that run may fail and be retried (``retries``), or
        the slots that come during it are run (:attr:`buffers`)."""
        return bool(self.retries) or self.buffers

    @property
    def retry(self) -> Retries:
        """When a slot's unsuccessful attempt is run again (see ``run/retries.py``)."""
        return Retries(self.retries, self.retry_backoff, self.schedule)

    @property
    def target(self) -> str:
        return f"{self.func.__module__}.{self.func.__qualname__}"

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.func)

    @property
    def wants_slot(self) -> bool:
        """The function takes a ``slot`` argument: it is given the slot it serves."""
        return "slot" in parameters_of(self.func)

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        """The job's time zone: its ``cron=`` schedule's, else ``TIME_ZONE``. A time given
        without a zone is in it, and its slots are shown on its clock."""
        name = getattr(self.schedule, "timezone", None) or settings.TIME_ZONE or "UTC"
        return zoneinfo.ZoneInfo(name)

    def start_of(self, slot: dt.datetime) -> dt.datetime:
        """When ``slot`` starts: the slot, plus this job's jitter offset for it."""
        return slot + jitters.offset(self.name, slot, self.jitter)

    @property
    def wants_token(self) -> bool:
        """The function takes a ``token`` argument: it is given its lock's fencing token."""
        return "token" in parameters_of(self.func)

    @property
    def wants_run(self) -> bool:
        """The function takes a ``run`` argument: it is given its run (``RunInfo``)."""
        return "run" in parameters_of(self.func)

    def call(self, slot: dt.datetime | None, token: int | None = None, run: Any = None) -> Any:
        """Run the function as a scheduled start does: with its ``kwargs``, ``slot``,
        ``token`` (the run's fencing token) and ``run`` (its ``RunInfo``), the last three
        if it takes them."""
        kwargs = copy.deepcopy(self.kwargs)  # a run that changes them changes no other run
        if self.wants_slot:
            kwargs["slot"] = slot
        if self.wants_token:
            kwargs["token"] = token
        if self.wants_run:
            kwargs["run"] = run
        if self.is_async:
            from asgiref.sync import async_to_sync

            return async_to_sync(self.func)(**kwargs)
        return self.func(**kwargs)


@functools.cache
def parameters_of(func: Callable[..., Any]) -> frozenset[str]:
    """The names of ``func``'s parameters, read once per function: the fork server reads
    them for every job before it forks (see ``process.serve_forks``), so a run's child
    does not."""
    return frozenset(inspect.signature(func).parameters)


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


def function_of(name: str) -> Job | None:
    """The declared job whose function ``name`` runs: its own, or for a schedule added at
    run time (``JOB:KEY``, ``runtime_schedules.py``) its job's. A child process runs it
    with the run's arguments."""
    return _jobs.get(name) or _jobs.get(name.rpartition(SCHEDULE_SEPARATOR)[0])


def all_jobs() -> list[Job]:
    return sorted(_jobs.values(), key=lambda job: job.name)


def warn_afters() -> dict[str, float]:
    """Each job's ``warn_after=`` in seconds, by name (those that have one)."""
    return {job.name: job.warn_seconds for job in _jobs.values() if job.warn_seconds is not None}


def schedules_of(name: str) -> list[str]:
    """The jobs of ``name``'s several schedules (``name:daily``, ...), if it has any."""
    prefix = name + SCHEDULE_SEPARATOR
    return [job.name for job in all_jobs() if job.name.startswith(prefix)]


@dataclass(frozen=True)
class StartupProblem:
    """A ``jobs`` module that raised on import (a bad ``cron=``, ``every=`` or ``ttl=``, a
    duplicate name, an import error), as one line naming the job, when known, and where."""

    job: str | None
    file: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        if self.job is None:
            return f"{where}: {self.message}"
        return f"Job {self.job!r} ({where}): {self.message}"


PACKAGE = __name__.partition(".")[0] + "."

# What autodiscover() could not import: the system check E014 reports it, and every
# command of this app refuses to run while it is not empty.
startup_problems: list[StartupProblem] = []


def autodiscover() -> None:
    """Import the ``jobs`` module of every installed app, as the admin does for ``admin``.

    A module that raises stops neither ``django.setup()`` (the site, ``migrate`` and
    ``check`` keep working) nor the other apps' modules: its problem goes to
    ``startup_problems`` and the jobs it had registered are taken out again.
    """
    startup_problems.clear()
    for app_config in apps.get_app_configs():
        if not module_has_submodule(app_config.module, "jobs"):
            continue
        module = f"{app_config.name}.jobs"
        before = dict(_jobs)
        try:
            import_module(module)
        except Exception as exc:
            _jobs.clear()
            _jobs.update(before)
            startup_problems.append(_problem(module, exc))


def _problem(module: str, exc: Exception) -> StartupProblem:
    """What went wrong in ``module``: the job being declared, the file and line."""
    spec = find_spec(module)
    file = spec.origin if spec is not None and spec.origin else module
    line = exc.lineno if isinstance(exc, SyntaxError) else None
    job: str | None = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == file:
            line = lineno  # the module's deepest line: the decorator, the import
        # The first of our frames knows the job: @exclusive_job(name, ...) was given its
        # name, register() its Job.
        if job is None and frame.f_globals.get("__name__", "").startswith(PACKAGE):
            given = frame.f_locals.get("job", frame.f_locals.get("name"))
            job = (
                given.name if isinstance(given, Job) else given if isinstance(given, str) else None
            )
    message = " ".join(str(exc).split())
    if not isinstance(exc, (LockConfigurationError, ImproperlyConfigured)):
        message = f"{type(exc).__name__}: {message}"  # not our words: say what it is
    return StartupProblem(job, _shown(file), line, message)


def _shown(path: str) -> str:
    """``path`` relative to the current directory when it is below it."""
    with suppress(ValueError):
        return str(Path(path).relative_to(Path.cwd()))
    return path

"""Run a scheduled Django job on exactly one server when every server runs the same crontab."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0.dev0"

__all__ = [
    "JobLockError",
    "Lock",
    "LockConfigurationError",
    "LockDatabaseError",
    "LockHeld",
    "LockLost",
    "RunInfo",
    "add_schedule",
    "celery_beat_job",
    "change_schedule",
    "current_run",
    "delete_schedule",
    "exclusive_job",
    "exclusive_lock",
    "force_release",
    "list_schedules",
    "pause_schedule",
    "resume_schedule",
    "schedule_celery_task",
    "try_acquire",
]

# Django imports this package before the app registry is ready: public names load on
# first use, so nothing here touches models or settings at import.
_LAZY = {
    "JobLockError": "lock.errors",
    "LockConfigurationError": "lock.errors",
    "LockDatabaseError": "lock.errors",
    "LockHeld": "lock.errors",
    "LockLost": "lock.errors",
    "Lock": "lock.lock",
    "RunInfo": "run.run_info",
    "current_run": "run.run_info",
    "add_schedule": "run.runtime_schedules",
    "celery_beat_job": "run.celery_beat",
    "change_schedule": "run.runtime_schedules",
    "delete_schedule": "run.runtime_schedules",
    "list_schedules": "run.runtime_schedules",
    "pause_schedule": "run.runtime_schedules",
    "resume_schedule": "run.runtime_schedules",
    "exclusive_job": "run.decorator",
    "exclusive_lock": "lock.acquire",
    "force_release": "lock.acquire",
    "schedule_celery_task": "run.celery_tasks",
    "try_acquire": "lock.acquire",
}

if TYPE_CHECKING:
    from .lock.acquire import exclusive_lock, force_release, try_acquire
    from .lock.errors import (
        JobLockError,
        LockConfigurationError,
        LockDatabaseError,
        LockHeld,
        LockLost,
    )
    from .lock.lock import Lock
    from .run.celery_beat import celery_beat_job
    from .run.celery_tasks import schedule_celery_task
    from .run.decorator import exclusive_job
    from .run.run_info import RunInfo, current_run
    from .run.runtime_schedules import (
        add_schedule,
        change_schedule,
        delete_schedule,
        list_schedules,
        pause_schedule,
        resume_schedule,
    )


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_exclusive_jobs' has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value

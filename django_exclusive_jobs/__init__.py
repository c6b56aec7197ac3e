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
    "exclusive_job",
    "exclusive_lock",
    "release_lock",
    "try_acquire",
]

# The lock engine imports models, which Django forbids before the app registry is
# ready; load public names on first use instead of at import.
_LAZY = {
    "JobLockError": "exceptions",
    "LockConfigurationError": "exceptions",
    "LockDatabaseError": "exceptions",
    "LockHeld": "exceptions",
    "LockLost": "exceptions",
    "Lock": "locks",
    "exclusive_job": "decorators",
    "exclusive_lock": "locks",
    "release_lock": "locks",
    "try_acquire": "locks",
}

if TYPE_CHECKING:
    from .decorators import exclusive_job
    from .exceptions import (
        JobLockError,
        LockConfigurationError,
        LockDatabaseError,
        LockHeld,
        LockLost,
    )
    from .locks import Lock, exclusive_lock, release_lock, try_acquire


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_exclusive_jobs' has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value

"""Exceptions raised by django-exclusive-jobs. All derive from :class:`JobLockError`."""

from __future__ import annotations

import datetime as dt


class JobLockError(Exception):
    """Base class for every error this app raises."""


class LockConfigurationError(JobLockError, ValueError):
    """The lock was asked for with bad input or in a setting where it cannot work.

    Raised before any SQL is sent.
    """


class LockHeld(JobLockError):
    """Another holder has the lock; nothing was run."""

    def __init__(
        self,
        name: str,
        *,
        holder: str = "",
        expires_at: dt.datetime | None = None,
        token: int | None = None,
    ) -> None:
        self.name = name
        self.holder = holder
        self.expires_at = expires_at
        self.token = token  # the holder's fencing token
        detail = f" by {holder}" if holder else ""
        until = f" until {expires_at.isoformat()}" if expires_at else ""
        super().__init__(f"Lock {name!r} is held{detail}{until}.")


class LockLost(JobLockError):
    """The lease ran out, or the lock was force-released or taken over, while it was held.

    Work guarded by the lock must stop: another server may already be running.
    """

    def __init__(self, name: str, token: int | None, reason: str) -> None:
        self.name = name
        self.token = token
        self.reason = reason
        super().__init__(f"Lock {name!r} (token {token}) was lost: {reason}")


class LockDatabaseError(JobLockError):
    """The lock's database could not answer within the retry bound; nothing was decided."""

"""The one duration parser: ``90``, ``90s``, ``1.5m``, ``15m``, ``1h``, ``2d``, ``PT15M``.

Every duration a user writes (decorator arguments, settings, command options) goes
through :func:`parse_duration`. Django's own parser adds ``01:30:00`` and ISO 8601.
"""

from __future__ import annotations

import datetime as dt
import math
import re

from django.utils.dateparse import parse_duration as django_parse_duration

from .errors import LockConfigurationError

UNITS = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
SUFFIXED = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|m|min|h|d)?\s*$", re.IGNORECASE)

DurationLike = dt.timedelta | int | float | str


def parse_duration(value: DurationLike, *, what: str = "duration") -> dt.timedelta:
    """Return ``value`` as a timedelta; raise :class:`LockConfigurationError` (a ValueError).

    Numbers are seconds. Negative values are returned as they are; callers decide what
    range is valid.
    """
    if isinstance(value, dt.timedelta):
        return value
    try:
        if isinstance(value, bool):
            raise ValueError(f"{what} must be seconds or a duration like '15m', not a bool")
        if isinstance(value, (int, float)):
            if not math.isfinite(value):
                raise ValueError(f"{what} must be finite, got {value!r}")
            return dt.timedelta(seconds=value)
        if not isinstance(value, str):
            raise ValueError(
                f"{what} must be seconds or a duration string, not {type(value).__name__}"
            )
        match = SUFFIXED.match(value)
        if match:
            number, unit = match.groups()
            return dt.timedelta(seconds=float(number) * UNITS[(unit or "s").lower()])
        parsed = django_parse_duration(value.strip()) if value.strip() else None
        if parsed is None:
            raise ValueError(
                f"{what} {value!r} is not a duration: use seconds (90) or a number with a "
                "unit (90s, 15m, 1h, 2d)"
            )
        return parsed
    except OverflowError:
        raise LockConfigurationError(f"{what} {value!r} is too long.") from None
    except ValueError as exc:
        if isinstance(exc, LockConfigurationError):
            raise
        raise LockConfigurationError(f"{exc}.") from None

"""Parse the durations users write: ``90``, ``90s``, ``1.5m``, ``15m``, ``1h``, ``2d``.

Django's own :func:`~django.utils.dateparse.parse_duration` covers ``01:30:00`` and
ISO 8601 (``PT15M``); this adds the unit-suffixed forms people type in a crontab.
"""

from __future__ import annotations

import datetime as dt
import math
import re

from django.utils.dateparse import parse_duration as _django_parse_duration

_UNITS = {
    "ms": 0.001,
    "s": 1,
    "sec": 1,
    "m": 60,
    "min": 60,
    "h": 3600,
    "d": 86400,
}
_SUFFIXED = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|m|min|h|d)?\s*$", re.IGNORECASE)

DurationLike = dt.timedelta | int | float | str


def parse_duration(value: DurationLike, *, what: str = "duration") -> dt.timedelta:
    """Return ``value`` as a timedelta, or raise ``ValueError`` with a one-line message.

    Numbers are seconds. Negative values are returned as they are; callers decide
    what range is valid.
    """
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a number of seconds or a duration like '15m', not a bool")
    if isinstance(value, dt.timedelta):
        return value
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"{what} must be finite, got {value!r}")
        try:
            return dt.timedelta(seconds=value)
        except OverflowError:
            raise ValueError(f"{what} {value!r} is too long") from None
    if isinstance(value, str):
        if not value.strip():
            raise ValueError(f"{what} is empty: use seconds (90) or a duration like 15m")
        match = _SUFFIXED.match(value)
        if match:
            number, unit = match.groups()
            try:
                return dt.timedelta(seconds=float(number) * _UNITS[(unit or "s").lower()])
            except OverflowError:
                raise ValueError(f"{what} {value!r} is too long") from None
        parsed = _django_parse_duration(value.strip())
        if parsed is not None:
            return parsed
        raise ValueError(
            f"{what} {value!r} is not a duration: use seconds (90) or a number with a unit "
            "(90s, 15m, 1h, 2d)"
        )
    raise ValueError(f"{what} must be seconds or a duration string, not {type(value).__name__}")

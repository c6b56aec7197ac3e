"""How the admin shows times and durations: to the second, in the project's time zone.

Django's default ``DATETIME_FORMAT`` stops at the minute, so six slots of a job that
runs every 10 seconds would read alike.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.utils import timezone
from django.utils.dateformat import format as date_format
from django.utils.timesince import timeuntil
from django.utils.translation import ngettext

SECONDS = "Y-m-d H:i:s"


def moment(value: dt.datetime | None) -> str:
    """``2026-11-24 09:12:03`` in the current time zone, or a dash."""
    if value is None:
        return "—"
    return date_format(timezone.localtime(value) if timezone.is_aware(value) else value, SECONDS)


def timestamp(field: str, label: Any) -> Callable[[Any, Any], str]:
    """A ModelAdmin method for a column showing the datetime ``field`` to the second:
    ``started = timestamp("started_at", _("started at"))`` in the class body."""

    @admin.display(description=label, ordering=field)
    def show(model_admin: Any, obj: Any) -> str:
        return moment(getattr(obj, field))

    return show


def span(later: dt.datetime, earlier: dt.datetime) -> str:
    """How long from ``earlier`` to ``later``: in seconds under two minutes (a lease of a
    few seconds must not read "0 minutes"), else as Django says it."""
    seconds = (later - earlier).total_seconds()
    if seconds < 120:
        whole = int(seconds)
        return ngettext("%(n)d second", "%(n)d seconds", whole) % {"n": whole}
    return timeuntil(later, earlier)


def duration(value: float) -> str:
    """A run's duration: ms under a second, then s, min and h."""
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"

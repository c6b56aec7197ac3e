"""The app's pages' one tag: the lines that say schedules are skipped, atop every page."""

from __future__ import annotations

from typing import Any

from django import template

from ..conf import app_settings
from ..health import SKIPPED_HERE, Overview

register = template.Library()


@register.simple_tag(takes_context=True)
def skipped_lines(context: Any) -> list[str]:
    """SKIP_SCHEDULES here (no query); on a page that read the overview (the jobs pages),
    also each live scheduler started with --skip-schedules."""
    seen = context.get("overview")
    if isinstance(seen, Overview):
        return seen.switch_problems
    return [SKIPPED_HERE] if app_settings.SKIP_SCHEDULES else []

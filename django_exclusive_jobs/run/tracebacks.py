"""How a run's error is stored and reported: its type's name and its traceback, bounded.

Shared by the child that reports a job's exception (``process.py``) and the history row
that records it (``history.py``), below both.
"""

from __future__ import annotations

import traceback

TRACEBACK_LIMIT = 16_000


def error_type(exc: BaseException) -> str:
    """The exception's class name (for a job run in a child process: the child's)."""
    return getattr(exc, "error_type", None) or type(exc).__qualname__


def bounded_traceback(exc: BaseException) -> str:
    """The exception and its traceback, cut in the middle if longer than the limit."""
    text = getattr(exc, "traceback_text", None) or "".join(
        traceback.format_exception(type(exc), exc, exc.__traceback__)
    )
    if len(text) <= TRACEBACK_LIMIT:
        return text
    head = TRACEBACK_LIMIT // 4
    cut = len(text) - TRACEBACK_LIMIT
    return f"{text[:head]}\n[... {cut} characters cut ...]\n{text[cut + head :]}"

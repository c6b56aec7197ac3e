"""What the app's commands print: quiet on a closed pipe, one line per decision."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from django.core.management.base import BaseCommand


class QuietOnClosedPipe(BaseCommand):
    """A command whose output may be piped into ``head``: a closed pipe ends it quietly."""

    def execute(self, *args: Any, **options: Any) -> Any:
        try:
            return super().execute(*args, **options)
        except BrokenPipeError:
            # The reader went away (``| head``): nothing is wrong, so exit 0 without a
            # traceback, and point stdout at /dev/null so the final flush cannot fail.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(0)


def shown_by_logging(logger: logging.Logger, level: int) -> bool:
    """Whether a record at ``level`` reaches a handler the project configured.

    Python's last-resort handler (used when nobody configured any) does not count, nor
    does a NullHandler.
    """
    if not logger.isEnabledFor(level):
        return False
    current: Any = logger
    while current is not None:
        for handler in current.handlers:
            if not isinstance(handler, logging.NullHandler) and handler.level <= level:
                return True
        if not current.propagate:
            return False
        current = current.parent
    return False

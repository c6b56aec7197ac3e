"""What the app's commands print: one line per decision, shown once."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand

from ..conf import app_settings
from ..logs import Line, given, one_line, shown

# one_line: a line a command writes in text mode, as the decision lines are shown:
# control and format characters escaped, so that no name, reason or message in it can
# end it or start another; not cut (the text from people and jobs in it is cut where the
# line is made: given).
__all__ = ["given", "line_printer", "one_line", "shown_by_logging"]


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


def line_printer(
    command: BaseCommand, logger: logging.Logger, verbosity: int, *, skips: bool = True
) -> Callable[[str, bool], None]:
    """Prints each decision line once: unless the project's logging already shows it.

    Normal lines go to stdout (not at verbosity 0; lines about skips only when ``skips``
    or at verbosity 2), the others to stderr: as sentences (text from people and jobs
    escaped: ``Line.shown``), or with ``LOG_FORMAT="json"`` as JSON objects (the sentence
    and its fields).
    """

    as_json = app_settings.LOG_FORMAT == "json"
    if as_json:
        _warnings_as_json()

    def report(line: str, normal: bool) -> None:
        if shown_by_logging(logger, logging.INFO if normal else logging.WARNING):
            return
        printed = line.as_json() if as_json and isinstance(line, Line) else shown(line)
        if not normal:
            command.stderr.write(printed)
        elif verbosity >= 1 and (skips or verbosity >= 2 or not line.startswith("skipped ")):
            command.stdout.write(printed)

    return report


def _warnings_as_json() -> None:
    """``LOG_FORMAT="json"`` and no logging configured for the app's records: its
    warnings that are no decision line (a lock found lost, a run marked lost) would reach
    Python's last-resort handler as plain text. They go to stderr as JSON objects instead
    (once per process)."""
    from ..logs import JSONFormatter, logger

    if shown_by_logging(logger, logging.WARNING):
        return  # the project's logging shows them, in its own format
    handler = logging.StreamHandler()  # stderr
    handler.setLevel(logging.WARNING)
    handler.setFormatter(JSONFormatter())
    logger.addHandler(handler)

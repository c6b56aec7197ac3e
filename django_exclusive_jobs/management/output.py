"""What the app's commands print: quiet on a closed pipe, one line per decision."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandParser


class QuietOnClosedPipe(BaseCommand):
    """A command of this app: its ``epilog`` (exit codes) shown as written under --help,
    no abbreviated options (an old --force must not pass as --force-color), and output
    that may be piped into ``head``: a closed pipe ends it quietly."""

    epilog = ""

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        kwargs.setdefault("epilog", self.epilog)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        return super().create_parser(prog_name, subcommand, **kwargs)

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


def line_printer(
    command: BaseCommand, logger: logging.Logger, verbosity: int, *, skips: bool = True
) -> Callable[[str, bool], None]:
    """Prints each decision line once: unless the project's logging already shows it.

    Normal lines go to stdout (not at verbosity 0; lines about skips only when ``skips``
    or at verbosity 2), the others to stderr.
    """

    def report(line: str, normal: bool) -> None:
        if shown_by_logging(logger, logging.INFO if normal else logging.WARNING):
            return
        if not normal:
            command.stderr.write(line)
        elif verbosity >= 1 and (skips or verbosity >= 2 or not line.startswith("skipped ")):
            command.stdout.write(line)

    return report

"""The base of this app's commands: one error contract, written once.

Each command parses its arguments, calls the library and prints; what goes wrong ends it
here, with one line on standard error and the exit code of its kind (the table in
docs/reference/commands.md):

- 2: a bad option value or usage (argparse's one line), an error in the settings or in
  a job's declaration found at start-up, an unknown job or database alias, migrations
  not applied (``LockConfigurationError``);
- 3: the database cannot be reached (``LockDatabaseError``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import logging
import os
import socket
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from django.core.management.base import BaseCommand, CommandError, CommandParser

from .. import values
from ..checks import configuration_error
from ..lock.errors import LockConfigurationError, LockDatabaseError
from ..run.arguments import parse_kwargs
from ..run.runner import EXIT_DATABASE, EXIT_USAGE

logger = logging.getLogger("django_exclusive_jobs")


class JobCommand(BaseCommand):
    """A command of this app.

    Before ``handle()``: refuses to run, with one line and exit 2, while the settings or
    a job's declaration has an error (only this app's checks run: a cron start stays
    quick, and an operator's command works while another app's check fails). Around it:
    maps the library's errors to their exit code and one line, keeps Python's
    last-resort handler from printing the library's log lines a second time (the
    command prints its own), and ends quietly on a closed pipe (``| head``). Its
    ``epilog`` (exit codes) is shown under --help as written, and options are never
    abbreviated (an old --force must not pass as --force-color).
    """

    epilog = ""
    requires_system_checks: list[str] = []  # this app's own run in execute()
    # Said after "the database cannot be reached", e.g. "The job was not run."
    unreachable_note = ""

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        kwargs.setdefault("epilog", self.epilog)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.__class__ = OneLineErrors  # Django builds the parser; only error() differs
        return parser

    def execute(self, *args: Any, **options: Any) -> Any:
        problem = configuration_error()
        if problem:
            raise CommandError(problem, returncode=EXIT_USAGE)
        quiet = logging.NullHandler()
        logger.addHandler(quiet)
        try:
            return super().execute(*args, **options)
        except LockConfigurationError as exc:
            raise CommandError(str(exc), returncode=EXIT_USAGE) from exc
        except LockDatabaseError as exc:
            line = f"{exc} {self.unreachable_note}".rstrip()
            raise CommandError(line, returncode=EXIT_DATABASE) from exc
        except BrokenPipeError:
            # The reader went away (``| head``): nothing is wrong, so exit 0 without a
            # traceback, and point stdout at /dev/null so the final flush cannot fail.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(0)
        finally:
            logger.removeHandler(quiet)


class OneLineErrors(CommandParser):
    """A bad argument on the command line is one line and exit 2, without the usage
    block before it (``--help`` shows that)."""

    def error(self, message: str) -> NoReturn:
        if not self.called_from_command_line:
            super().error(message)  # raises CommandError for call_command()
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def moment_option(option: str) -> Callable[[str], str]:
    """argparse ``type=`` of ``option``: an ISO 8601 date or time, with or without a zone,
    that ``values.moment`` takes (a time without a zone read as UTC here). Returned as
    typed: the command reads it again with ``values.moment`` in the job's zone, once the
    job is known, so that its bounds are those of the moment it means."""

    def parse(value: str) -> str:
        try:
            values.moment(value, what=option)
        except LockConfigurationError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value.strip()

    return parse


def kwargs_option(option: str) -> Callable[[str], object]:
    """argparse ``type=`` of ``option``: a JSON object of a run's arguments, checked by
    ``values.json_arguments`` (what they must be for the job is checked once it is known)."""

    def parse(value: str) -> object:
        try:
            return parse_kwargs(value)
        except LockConfigurationError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def duration_option(option: str, **bounds: Any) -> Callable[[str], dt.timedelta]:
    """argparse ``type=`` of ``option``: a duration checked by ``values.duration`` (not
    negative, at most the longest; ``bounds`` are its ``least``, ``most``, ``positive``)."""

    def parse(value: str) -> dt.timedelta:
        try:
            return values.duration(value, what=option, **bounds)
        except LockConfigurationError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def reason_option(option: str, *, limit: int = values.REASON_LENGTH) -> Callable[[str], str]:
    """argparse ``type=`` of ``option`` (``--reason``, ``--by``): one line of text checked
    by ``values.reason`` (at most ``limit`` characters, no control or format character)."""

    def parse(value: str) -> str:
        try:
            return values.reason(value, what=option, limit=limit)
        except LockConfigurationError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def name_option(what: str) -> Callable[[str], str]:
    """argparse ``type=`` of a NAME argument: a name checked by ``values.name`` (one that
    fails it can name no job or lock, so it is a usage error, not "not found")."""

    def parse(value: str) -> str:
        try:
            return values.name(value, what=what)
        except LockConfigurationError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def count_option(option: str, most: int) -> Callable[[str], int]:
    """argparse ``type=`` of ``option``: a whole number from 1 to ``most``."""

    def parse(value: str) -> int:
        try:
            parsed = int(value)
        except ValueError:
            parsed = 0
        if not 1 <= parsed <= most:
            raise argparse.ArgumentTypeError(
                f"{option} must be a whole number from 1 to {most}, got {value!r}."
            )
        return parsed

    return parse


def operator(given: str = "") -> str:
    """Who runs a command, as the audit and the run history record it: ``--by``, else
    ``user@host``."""
    return given or f"{getpass.getuser()}@{socket.gethostname()}"

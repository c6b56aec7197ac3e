from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from tests.testapp.jobs import mark


class Command(BaseCommand):
    help = "Append a line to $MARKER (for run_exclusive's tests)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("word", nargs="?", default="command")

    def handle(self, *args: Any, **options: Any) -> None:
        mark(options["word"])

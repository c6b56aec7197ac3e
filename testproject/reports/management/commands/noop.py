from typing import Any

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Does nothing: the baseline that benchmarks/bench_command.py compares against."

    def handle(self, *args: Any, **options: Any) -> None:
        return None

from typing import Any

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Does nothing and skips system checks, like run_exclusive: the fair baseline."
    requires_system_checks: list[str] = []

    def handle(self, *args: Any, **options: Any) -> None:
        return None

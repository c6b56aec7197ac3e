from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand

from tests.testapp.jobs import facts_line


class Command(BaseCommand):
    help = "Write the EXCLUSIVE_JOBS_* environment to $MARKER (for run_exclusive's tests)."

    def handle(self, *args: Any, **options: Any) -> None:
        facts_line({k: v for k, v in os.environ.items() if k.startswith("EXCLUSIVE_JOBS_")})

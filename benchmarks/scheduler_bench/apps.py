"""The benchmark's app: in a scheduler process, counts the statements it sends."""

from __future__ import annotations

import os
import sys

from django.apps import AppConfig


class SchedulerBenchConfig(AppConfig):
    name = "scheduler_bench"

    def ready(self) -> None:
        # Only the scheduler process counts: not its fork server, nor bench_scheduler.py.
        if os.environ.get("BENCH_STATEMENTS") and "exclusive_scheduler" in sys.argv:
            from . import counting

            counting.install(os.environ["BENCH_STATEMENTS"])

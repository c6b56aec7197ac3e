"""Settings of the scheduler benchmark: one database, chosen by ``$BENCH_BACKEND``.

``postgresql`` (127.0.0.1:5432, user postgres) or ``mysql`` (MariaDB/MySQL on
127.0.0.1:3306, user root); the database is ``bench_scheduler`` on either, which
``bench_scheduler.py`` creates and migrates. ``sqlite``: the file ``$BENCH_SQLITE``
(``/tmp/bench_scheduler.sqlite3``), for the idle measurement.
"""

from __future__ import annotations

import os
from typing import Any

SECRET_KEY = "benchmark-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django_exclusive_jobs", "scheduler_bench.apps.SchedulerBenchConfig"]

DB_NAME = "bench_scheduler"
_backend = os.environ.get("BENCH_BACKEND", "postgresql")
DATABASES: dict[str, dict[str, Any]]
if _backend == "postgresql":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": DB_NAME,
            "USER": "postgres",
            "HOST": "127.0.0.1",
            "PORT": "5432",
        }
    }
elif _backend == "mysql":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": DB_NAME,
            "USER": "root",
            "HOST": "127.0.0.1",
            "PORT": "3306",
            "OPTIONS": {"charset": "utf8mb4"},
        }
    }
elif _backend == "sqlite":
    # One file that every scheduler process of the run shares (one machine), in WAL mode.
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("BENCH_SQLITE", "/tmp/bench_scheduler.sqlite3"),
            "OPTIONS": {"init_command": "PRAGMA journal_mode=WAL;"},
        }
    }
else:
    raise RuntimeError(f"BENCH_BACKEND must be postgresql, mysql or sqlite, not {_backend!r}")

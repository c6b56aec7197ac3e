"""Settings of the fault campaign: one database, chosen by ``$CAMPAIGN_BACKEND``.

``postgresql`` (127.0.0.1, user postgres) or ``mysql`` (MariaDB/MySQL, user root), the
database ``$CAMPAIGN_DB_NAME`` reached on ``$CAMPAIGN_DB_PORT``: each process of the
campaign has its own TCP proxy there, which the nemesis can cut or slow down. ``sqlite``:
the file ``$CAMPAIGN_SQLITE_PATH`` (no proxy). The app's lines are logged as JSON on
stderr (``JSONFormatter``), so the campaign collects them into its history.
"""

from __future__ import annotations

import os
from typing import Any

SECRET_KEY = "campaign-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django_exclusive_jobs", "campaign_project.apps.CampaignConfig"]

DB_NAME = os.environ.get("CAMPAIGN_DB_NAME", "campaign")
_backend = os.environ.get("CAMPAIGN_BACKEND", "postgresql")
_port = os.environ.get("CAMPAIGN_DB_PORT")
DATABASES: dict[str, dict[str, Any]]
if _backend == "postgresql":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": DB_NAME,
            "USER": "postgres",
            "HOST": "127.0.0.1",
            "PORT": _port or "5432",
            "OPTIONS": {
                "connect_timeout": 5,
                "keepalives": 1,
                "keepalives_idle": 5,
                "keepalives_interval": 2,
                "keepalives_count": 3,
            },
        }
    }
elif _backend == "mysql":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": DB_NAME,
            "USER": "root",
            "HOST": "127.0.0.1",
            "PORT": _port or "3306",
            "OPTIONS": {"charset": "utf8mb4", "connect_timeout": 5},
        }
    }
elif _backend == "sqlite":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("CAMPAIGN_SQLITE_PATH", "campaign.sqlite3"),
            "OPTIONS": {"timeout": 10},
        }
    }
else:
    raise RuntimeError(f"CAMPAIGN_BACKEND must be postgresql, mysql or sqlite, not {_backend!r}")

EXCLUSIVE_JOBS = {"LOG_FORMAT": "json", "DATABASE": "default"}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "django_exclusive_jobs.logs.JSONFormatter"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "json"}},
    "loggers": {
        "django_exclusive_jobs": {"handlers": ["stderr"], "level": "INFO", "propagate": False}
    },
}

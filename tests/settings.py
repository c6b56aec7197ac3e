"""Settings for the test suite: SQLite, PostgreSQL and MariaDB/MySQL side by side.

Each backend is an alias; tests run once per alias. A server that cannot be reached is
left out (tests on it are skipped with the reason) except under CI, where it fails.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import environ

env = environ.Env()
BASE_DIR = Path(__file__).resolve().parent
ARTIFACTS = BASE_DIR / ".artifacts"
ARTIFACTS.mkdir(exist_ok=True)
# Lets two test runs share the database servers without dropping each other's databases.
SUFFIX = os.environ.get("EXCLUSIVE_JOBS_TEST_DB_SUFFIX", "")
# Each pytest-xdist worker (scripts/test.sh runs four, and two CPU-only) has databases
# of its own.
if os.environ.get("PYTEST_XDIST_WORKER"):
    SUFFIX += f"_{os.environ['PYTEST_XDIST_WORKER']}"

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "tests.urls"
STATIC_URL = "/static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_exclusive_jobs",
    "django_tasks_db",
    "tests.testapp",
]
# django-celery-beat (the dev extra), whose periodic tasks tests/test_celery_beat.py
# imports: only in the commands that test starts (EXCLUSIVE_JOBS_TEST_CELERY_BEAT=1), which
# make its tables and rows too. Anywhere else it would import Celery as each of the
# hundreds of commands the tests start sets Django up, and migrate its tables in every
# test database (CI: 350-550 s of CPU more, and a starved machine).
if os.environ.get("EXCLUSIVE_JOBS_TEST_CELERY_BEAT"):
    INSTALLED_APPS.append("django_celery_beat")

# Django's tasks framework: django.tasks from Django 6.0, the django_tasks backport before.
try:
    import django.tasks  # noqa: F401

    _TASKS = "django.tasks"
except ImportError:
    _TASKS = "django_tasks"
TASKS = {
    "default": {"BACKEND": "django_tasks_db.DatabaseBackend"},
    "immediate": {"BACKEND": f"{_TASKS}.backends.immediate.ImmediateBackend"},
}
# Worker processes of the task tests keep the task table on this alias.
TASKS_DATABASE = os.environ.get("EXCLUSIVE_JOBS_TEST_TASKS_DB")
if TASKS_DATABASE:
    DATABASE_ROUTERS = ["tests.routers.TasksRouter"]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]


def _reachable(config: dict[str, object]) -> str | None:
    """None if a TCP connection opens, else the reason."""
    host = str(config.get("HOST") or "127.0.0.1")
    port = int(str(config.get("PORT") or 0))
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError as exc:
        return f"{host}:{port} unreachable ({exc})"
    return None


DATABASES: dict[str, dict[str, object]] = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(ARTIFACTS / "default.sqlite3"),
        "TEST": {"NAME": str(ARTIFACTS / f"test_default{SUFFIX}.sqlite3")},
        "OPTIONS": {"timeout": 10},
    },
}
UNAVAILABLE: dict[str, str] = {}

_servers = {
    "postgres": env.db_url("TEST_POSTGRES_URL", default="postgres://postgres@127.0.0.1:5432/test"),
    "mysql": env.db_url("TEST_MYSQL_URL", default="mysql://root@127.0.0.1:3306/test"),
}
_servers["mysql"].setdefault("OPTIONS", {})["charset"] = "utf8mb4"
_servers["postgres"]["TEST"] = {"NAME": f"test_exclusive_jobs{SUFFIX}"}
_servers["mysql"]["TEST"] = {
    "NAME": f"test_exclusive_jobs{SUFFIX}",
    "CHARSET": "utf8mb4",
    "COLLATION": "utf8mb4_unicode_ci",
}

for _alias, _config in _servers.items():
    _reason = _reachable(_config)
    if _reason and not os.environ.get("CI"):
        UNAVAILABLE[_alias] = _reason
        continue
    DATABASES[_alias] = _config
_bouncer = os.environ.get("EXCLUSIVE_JOBS_TEST_PGBOUNCER_PORT")
if _bouncer and "postgres" in DATABASES:
    # A process of the PgBouncer test: through PgBouncer in transaction mode, with
    # Django's setting for it (docs/deploying.md).
    DATABASES["postgres"].update(HOST="127.0.0.1", PORT=_bouncer, DISABLE_SERVER_SIDE_CURSORS=True)
if "postgres" in DATABASES:
    # A second alias to the same database: the documented way to take locks while the
    # main alias is inside a transaction.
    DATABASES["postgres_locks"] = {**DATABASES["postgres"], "TEST": {"MIRROR": "postgres"}}

# Worker processes started by the tests connect to the test databases the parent made.
_names = os.environ.get("EXCLUSIVE_JOBS_TEST_DB_NAMES")
if _names:
    for _alias, _name in json.loads(_names).items():
        if _alias in DATABASES:
            DATABASES[_alias] = {**DATABASES[_alias], "NAME": _name, "TEST": {}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_exclusive_jobs": {"handlers": ["console"], "level": "WARNING"}},
}

# A process a test starts may be given the app's settings (JSON), as a deployment's would.
if os.environ.get("EXCLUSIVE_JOBS_TEST_SETTINGS"):
    EXCLUSIVE_JOBS = json.loads(os.environ["EXCLUSIVE_JOBS_TEST_SETTINGS"])

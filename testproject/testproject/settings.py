"""Demo project settings, read from the environment with django-environ.

DATABASE_URL picks the database (default: an SQLite file beside this project), e.g.
``postgres://postgres@127.0.0.1:5432/test`` or ``mysql://root@127.0.0.1:3306/test``.
"""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env(DEBUG=(bool, False))

SECRET_KEY = env("SECRET_KEY", default="demo-only-not-secret")
DEBUG = env("DEBUG")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])
USE_TZ = True
TIME_ZONE = env("TIME_ZONE", default="UTC")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_exclusive_jobs",
    "reports",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "testproject.urls"
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
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": env.db_url("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'demo.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Several processes on one SQLite file: wait for each other's writes.
    DATABASES["default"].setdefault("OPTIONS", {})["timeout"] = 20

EXCLUSIVE_JOBS = {
    "TTL": env("EXCLUSIVE_JOBS_TTL", default="5m"),
    # A staging copy sets it: no scheduled slot starts there (docs/deploying.md).
    "SKIP_SCHEDULES": env.bool("EXCLUSIVE_JOBS_SKIP_SCHEDULES", default=False),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_exclusive_jobs": {"handlers": ["console"], "level": "WARNING"}},
}

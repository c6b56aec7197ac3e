"""settings.py: add the app; it brings two tables (JobLock, JobRun) and an admin."""

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_exclusive_jobs",
    "reports",  # your app, with the jobs in reports/jobs.py
]

"""What ``migrate`` does for the app: make the lock row of every declared job."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.apps import apps as global_apps
from django.apps.registry import Apps
from django.db import DEFAULT_DB_ALIAS, router


def prepare_job_locks(
    app_config: AppConfig,
    using: str = DEFAULT_DB_ALIAS,
    apps: Apps = global_apps,
    **kwargs: Any,
) -> None:
    """``post_migrate`` receiver: each declared job gets its (free) lock row on ``using``.

    So servers that start together never race to insert a job's row (each loser would be
    an ``ERROR`` line in the database's log). Skipped where the router keeps the lock
    table off ``using`` and while the app's tables are not migrated there.
    """
    from ..lock.acquire import prepare_locks
    from ..models import JobLock
    from ..run.registry import all_jobs

    if not router.allow_migrate_model(using, JobLock):
        return
    try:  # the state migrate left: the lock table and run history's tokens must exist
        apps.get_model(app_config.label, "JobLock")
        apps.get_model(app_config.label, "JobRun")
    except LookupError:
        return
    prepare_locks([job.name for job in all_jobs()], using=using)

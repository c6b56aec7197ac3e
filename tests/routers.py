"""Keeps django-tasks-db's table on the alias a task test chose (EXCLUSIVE_JOBS_TEST_TASKS_DB)."""

from __future__ import annotations

from typing import Any

from django.conf import settings


class TasksRouter:
    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return self._alias(model)

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return self._alias(model)

    def _alias(self, model: Any) -> str | None:
        if model.__module__.startswith("django_tasks_db."):
            return str(settings.TASKS_DATABASE)
        return None

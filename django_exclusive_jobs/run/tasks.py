"""Django's tasks framework: a scheduled Task is enqueued once per slot, not run here.

``@exclusive_job(cron=...)`` on a ``django.tasks`` Task (Django 6.0+), or on one of the
``django_tasks`` backport (Django 5.2), registers a job whose run is one ``enqueue()``:
at each slot, the one server that wins it enqueues the task to the task's own backend
and queue; workers run it. The history records the enqueue (status ``enqueued``, the
task result's id and backend). Neither package is needed by this app.
"""

from __future__ import annotations

import datetime as dt
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any


@dataclass(frozen=True)
class Enqueued:
    """A run that enqueued a task: the task result's id and the backend's alias."""

    result_id: str
    backend: str


def is_task(obj: object) -> bool:
    """Whether ``obj`` is a Task of ``django.tasks`` or of the ``django_tasks`` backport."""
    for module in ("django.tasks.base", "django_tasks.base"):
        try:
            task_class = import_module(module).Task
        except ImportError:
            continue
        if isinstance(obj, task_class):
            return True
    return False


def enqueuer(task: Any) -> Callable[..., Enqueued]:
    """The job's function for ``task``: enqueue it with the job's arguments, and the slot
    if it takes one.

    The slot is passed as an ISO 8601 string: task arguments must be JSON.
    """
    wants_slot = "slot" in inspect.signature(task.func).parameters

    def enqueue(slot: dt.datetime | None = None, **kwargs: Any) -> Enqueued:
        if wants_slot:
            kwargs["slot"] = slot.isoformat() if slot else None
        result = task.enqueue(**kwargs)
        return Enqueued(str(result.id), str(result.backend))

    enqueue.__module__ = task.func.__module__
    enqueue.__qualname__ = task.func.__qualname__
    enqueue.__name__ = task.func.__name__
    return enqueue


def result_status(task: Any, result_id: str, backend: str) -> str:
    """What the backend the run enqueued to says about it ("" if it cannot tell)."""
    try:
        task = task.using(backend=backend) if backend else task
        if not task.get_backend().supports_get_result:
            return ""
        return str(task.get_result(result_id).status)
    except Exception:  # the result was pruned, or the backend is down: say nothing
        return ""

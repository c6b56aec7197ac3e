"""Celery tasks on a schedule, sent once per slot: Celery beat, highly available.

``schedule_celery_task("digest", "reports.tasks.send_digest", cron="0 8 * * 1")``
declares a job whose run is one ``app.send_task()``: at each slot the one server that
wins it sends the task, by name, to Celery's broker; Celery's workers run it. Every
server runs the same schedule (``exclusive_scheduler``, or a cron line each), so no
single beat process is left to fail. The message carries the slot in its headers
(``exclusive_jobs_slot``, with ``exclusive_jobs_name``, ``_attempt`` and ``_token``),
and its task id is the same on every server for a slot's attempt, so a worker may drop
a duplicate; the run is recorded ``enqueued`` with that id.

Call it where jobs are declared (an app's ``jobs`` module). Celery is imported only when
a task is sent: ``pip install django-exclusive-jobs[celery]`` where the jobs run.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from importlib import import_module
from typing import Any

from ..lock.errors import LockConfigurationError
from .decorator import exclusive_job
from .registry import Job, get_job
from .run_info import RunInfo
from .tasks import Enqueued

# The task ids of a job's slots: uuid5 of (this namespace, "NAME SLOT ATTEMPT").
TASK_IDS = uuid.UUID("6f1d9a52-4a8e-4c39-9d1f-2f6a0f8f3c21")
HEADER = "exclusive_jobs_"


def schedule_celery_task(
    name: str,
    task: str,
    *,
    app: Any = None,
    args: Sequence[Any] = (),
    queue: str | None = None,
    **options: Any,
) -> Job:
    """Send the Celery task named ``task`` once per slot of the job ``name``.

    ``app``: the Celery app or its dotted path (``"proj.celery.app"``; default Celery's
    current app); ``args`` and ``kwargs=`` (JSON): what the task is called with;
    ``queue``: where it is sent (default: the task's routing). Every other argument is
    ``@exclusive_job``'s (``every=`` or ``cron=``, ``timezone=``, ``catch_up=``,
    ``retries=``, ``group=`` ...). Returns the job.
    """
    if not isinstance(task, str) or not task.strip():
        raise LockConfigurationError(f"task must be a Celery task's name, not {task!r}.")
    if options.get("every") is None and options.get("cron") is None:
        raise LockConfigurationError(
            f"schedule_celery_task({name!r}) needs every= or cron=: it sends {task} at each slot."
        )
    if not isinstance(args, list | tuple):
        raise LockConfigurationError(f"args must be a list, not {type(args).__name__}.")
    exclusive_job(name, **options)(sender(task, app, list(args), queue))
    job = get_job(name)
    assert job is not None
    return job


def sender(task: str, app: Any, args: list[Any], queue: str | None) -> Callable[..., Enqueued]:
    """The job's function: send ``task`` with the run's facts in its headers."""

    def send(run: RunInfo, **kwargs: Any) -> Enqueued:
        celery = _app(app)
        slot = run.slot.isoformat() if run.slot else None
        task_id = str(uuid.uuid5(TASK_IDS, f"{run.name} {slot} {run.attempt}")) if slot else None
        headers = {
            f"{HEADER}name": run.name,
            f"{HEADER}slot": slot,
            f"{HEADER}attempt": run.attempt,
            f"{HEADER}token": run.token,
        }
        options: dict[str, Any] = {"headers": headers, "task_id": task_id}
        if queue:
            options["queue"] = queue
        result = celery.send_task(task, args=args, kwargs=kwargs, **options)
        return Enqueued(str(result.id), "celery")

    send.__qualname__ = send.__name__ = f"send {task}"
    return send


def _app(app: Any) -> Any:
    """The Celery app: as given, imported from its dotted path, or Celery's current app."""
    if app is None:
        return import_module("celery").current_app
    if isinstance(app, str):
        module, _, attribute = app.rpartition(".")
        return getattr(import_module(module), attribute)
    return app

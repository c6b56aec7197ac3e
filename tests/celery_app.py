"""A Celery app for tests/test_celery.py: its worker runs ``tests.record``, which writes
what it was sent (its label, the slot in its headers, its task id) to $MARKER.

The broker is the machine's RabbitMQ ($CELERY_BROKER); each test uses a queue of its
own ($CELERY_QUEUE), so tests running side by side never take each other's messages.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

app = Celery(
    "exclusive_jobs_tests",
    broker=os.environ.get("CELERY_BROKER", "amqp://guest:guest@127.0.0.1:5672//"),
)
app.conf.update(
    task_default_queue=os.environ.get("CELERY_QUEUE", "exclusive_jobs_tests"),
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    # No remote control: its queue is named after the worker's node, and workers of
    # tests running side by side would clash on it.
    worker_enable_remote_control=False,
)


@app.task(bind=True, name="tests.record")
def record(self: Any, label: str, **kwargs: Any) -> None:
    headers = self.request.headers or {}
    slot = self.request.get("exclusive_jobs_slot") or headers.get("exclusive_jobs_slot")
    name = self.request.get("exclusive_jobs_name") or headers.get("exclusive_jobs_name")
    with open(os.environ["MARKER"], "a") as marker:
        marker.write(f"{label} {slot} {self.request.id} {name} {sorted(kwargs.items())}\n")

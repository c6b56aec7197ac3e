"""What operators do to a job: pause it, resume it, ask for a run now.

Pausing is a row in the database (``JobState``), so every server honours it: a start
of a paused job takes the lock, sees the pause, and skips (exit 0). Slots that pass
while a job is paused are neither run nor counted as missed.

A run asked for now is a ``RunRequest`` row. The command runs it at once, here; one
asked for in the admin is run by the next scheduler that polls (within seconds). The
run takes the job's lock like any other and marks the request taken in the same
decision, so two clicks give two runs and two schedulers never run one request twice.
A manual run is recorded without a slot, with who asked; a paused job still runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..lock.clock import DatabaseNow
from ..lock.retry import run_statement
from .registry import get_job
from .runner import Run, RunResult

if TYPE_CHECKING:
    from ..models import RunRequest


def pause(name: str, *, by: str, using: str) -> None:
    """Pause ``name`` on every server until :func:`resume`."""
    from ..models import JobState

    values = {"paused": True, "paused_at": DatabaseNow(), "paused_by": by[:255]}
    run_statement(
        using, lambda: JobState.objects.using(using).update_or_create(name=name, defaults=values)
    )


def resume(name: str, *, by: str, using: str) -> None:
    """Let ``name`` run again from its next slot; the slots of the pause are not missed."""
    from ..models import JobState

    values = {"paused": False, "resumed_at": DatabaseNow(), "resumed_by": by[:255]}
    run_statement(
        using,
        lambda: JobState.objects.using(using).filter(name=name, paused=True).update(**values),
    )


def request_run(name: str, *, by: str, using: str) -> RunRequest:
    """Ask for one run of ``name`` outside its schedule (a scheduler will run it)."""
    from ..models import RunRequest

    return run_statement(
        using,
        lambda: RunRequest.objects.using(using).create(
            name=name, requested_by=by[:255], requested_at=DatabaseNow()
        ),
    )


def pending(names: list[str], *, using: str) -> list[RunRequest]:
    """Requests for these jobs that no run has taken yet, oldest first (one query)."""
    from ..models import RunRequest

    return run_statement(
        using,
        lambda: list(
            RunRequest.objects.using(using)
            .filter(taken_at__isnull=True, name__in=names)
            .order_by("id")
        ),
    )


def run_now(
    name: str, *, by: str, using: str, report: Callable[[str, bool], None] | None = None
) -> RunResult:
    """Run ``name`` once now in this process, as a manual run asked for by ``by``.

    No request row: nothing a scheduler could take first. If the lock is held, nothing
    runs (the result is SKIPPED).
    """
    job = get_job(name)
    assert job is not None
    return Run(job.but(using=using), requested_by=by, report=report).call()

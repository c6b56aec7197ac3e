"""Run requests as a run takes them, and the stops a newer slot asks of an older run.

A ``RunRequest`` is marked taken in one conditional UPDATE (:func:`take`), so a request is
run once or cancelled, never both; a stop is a request too (``stop_token``). The run
(``runner.py``, ``history.py``) and the scheduler use these; the operators' side (asking,
cancelling) is ``control.py``, which gives these names too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lock.clock import DatabaseNow
from ..lock.retry import run_statement

if TYPE_CHECKING:
    from ..models import RunRequest


STOP_POLL = 2.0  # seconds between two looks for a stop, by a cancel_other run_exclusive


def ask_to_stop(name: str, *, token: int, by: str, using: str) -> bool:
    """Ask the run of ``name`` holding ``token`` to stop (once: False if it was asked)."""
    from ..models import RunRequest  # models: not before apps are ready

    requests = RunRequest.objects.using(using)
    if run_statement(using, requests.stop_asked(name, token).exists):
        return False
    run_statement(
        using,
        lambda: requests.ask(
            name=name, stop_token=token, requested_by=by[:255], requested_at=DatabaseNow()
        ),
    )
    return True


def find_stop(name: str, *, token: int, using: str) -> RunRequest | None:
    """The waiting stop asked of the run of ``name`` holding ``token``, if any."""
    from ..models import RunRequest  # models: not before apps are ready

    waiting = RunRequest.objects.using(using).waiting_stop(name, token)
    return run_statement(using, waiting.first)


def take(request: RunRequest, *, by: str, using: str) -> bool:
    """Mark ``request`` taken by ``by``; False if another took (or cancelled) it first."""
    from ..models import RunRequest  # models: not before apps are ready

    requests = RunRequest.objects.using(using)
    values = {"taken_at": DatabaseNow(), "taken_by": by[:255]}
    return bool(run_statement(using, lambda: requests.take(request.pk, **values)))


def close_stops(name: str, *, below: int, using: str) -> None:
    """Stops asked of runs of ``name`` older than token ``below`` are moot: those runs
    have ended (the lock has a newer holder)."""
    from ..models import RunRequest  # models: not before apps are ready

    requests = RunRequest.objects.using(using)
    values = {"taken_at": DatabaseNow(), "taken_by": "(the run had ended)"}
    run_statement(using, lambda: requests.close_stops_below(name, below, **values))

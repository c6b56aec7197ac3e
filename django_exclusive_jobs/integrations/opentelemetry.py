"""OpenTelemetry traces: one span per run, on the server that won it.

Enabled by ``EXCLUSIVE_JOBS["OPENTELEMETRY"] = True``; needs ``opentelemetry-api`` (the
project configures the SDK and its exporter, as for its requests). The span starts at the
lock's acquisition and ends with the run; the take, the claim of the slot and the release
are events on it, as are a lost lock and the slots the start found missed. A start that
skips makes no span (twenty servers, one span per slot): its skip is an event on the
span that is current, if any (a web request's, for a direct call). While a job executes
in this thread, its span is the current one, so the spans of its queries nest in it.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..lock.lock import Lock
from ..run.registry import get_job
from ..run.schedules import Cron, Every
from ..run.status import RunStatus

# Where the job runs, the run's trace is continued by the run layer itself.
from ..run.tracing import TOOL as TOOL
from ..run.tracing import continued as continued
from ..run.tracing import export_spans as export_spans
from ..signals import job_finished, job_skipped, job_started, lock_lost, slot_missed
from .receivers import connect_receivers, quietly

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span

PREFIX = "exclusive_jobs."
DISPATCH = "django_exclusive_jobs.opentelemetry"


class _Runs:
    """The span of each run under way in this process, by its lock, and what was current
    before it (restored at its end). Keep-alive's thread reads it for a lost lock."""

    def __init__(self) -> None:
        self._spans: dict[tuple[str, str, int], tuple[Span, Context | None]] = {}
        self._mutex = threading.Lock()
        # The missed slots a start found, waiting for its span (or its skip), per thread.
        self.missed = threading.local()

    @staticmethod
    def key(lock: Lock) -> tuple[str, str, int]:
        return lock.using, lock.name, lock.token

    def add(self, lock: Lock, span: Span, previous: Context | None) -> None:
        with self._mutex:
            self._spans[self.key(lock)] = (span, previous)

    def get(self, lock: Lock) -> Span | None:
        with self._mutex:
            found = self._spans.get(self.key(lock))
        return found[0] if found else None

    def pop(self, lock: Lock) -> tuple[Span, Context | None] | None:
        with self._mutex:
            return self._spans.pop(self.key(lock), None)

    def take_missed(self) -> list[tuple[str, dt.datetime]]:
        pending: list[tuple[str, dt.datetime]] = getattr(self.missed, "slots", [])
        self.missed.slots = []
        return pending


runs = _Runs()


def carrier_of(lock: Lock) -> dict[str, str]:
    """The W3C trace context of ``lock``'s run span (empty if it has none), for the job's
    own process: see :func:`continued`."""
    from opentelemetry import propagate, trace  # optional package (its extra)

    span = runs.get(lock)
    carrier: dict[str, str] = {}
    if span is not None:
        propagate.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def tracer() -> Any:
    from opentelemetry import trace  # optional package (its extra)

    return trace.get_tracer("django_exclusive_jobs", __version__)


def _ns(moment: dt.datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


def schedule_attributes(name: str, slot: dt.datetime | None, backfill: bool) -> dict[str, Any]:
    """The FaaS attributes of a run: a slot of its schedule is a timer's invocation."""
    job = get_job(name)
    schedule = job.schedule if job is not None else None
    scheduled = slot is not None and not backfill
    attributes: dict[str, Any] = {"faas.trigger": "timer" if scheduled else "other"}
    if slot is not None:
        attributes["faas.time"] = slot.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    if isinstance(schedule, Cron):
        attributes["faas.cron"] = schedule.expression
        attributes[PREFIX + "timezone"] = schedule.timezone
    elif isinstance(schedule, Every):
        attributes[PREFIX + "every"] = schedule.period.total_seconds()
    return attributes


@quietly(TOOL, "the start")
def on_started(
    sender: Any,
    name: str,
    lock: Lock,
    slot: dt.datetime | None = None,
    attempt: int = 1,
    backfill: bool = False,
    in_process: bool = False,
    **kwargs: Any,
) -> None:
    from opentelemetry import context, trace  # optional package (its extra)

    now = time.time_ns()
    # The lock was taken on the database's clock: a clock a little ahead of this one must
    # not start the span after its own events.
    acquired = min(_ns(lock.acquired_at), now) if lock.acquired_at is not None else now
    attributes: dict[str, Any] = {
        PREFIX + "job": name,
        PREFIX + "token": lock.token,
        PREFIX + "holder": lock.holder,
        PREFIX + "attempt": attempt,
        PREFIX + "backfill": backfill,
        PREFIX + "database": lock.using,
        **schedule_attributes(name, slot, backfill),
    }
    if slot is not None:
        attributes[PREFIX + "slot"] = slot.isoformat()
    if lock.name != name:
        attributes[PREFIX + "lock"] = lock.name  # overlap="allow_all": the slot's own lock
    # A consumer: the run is the service's entry point for its trigger (the slot), as the
    # FaaS conventions have it for an incoming invocation that is not a request.
    span = tracer().start_span(
        f"exclusive_job {name}",
        kind=trace.SpanKind.CONSUMER,
        attributes=attributes,
        start_time=acquired,
    )
    take = {PREFIX + "token": lock.token, PREFIX + "lock": lock.name}
    if lock.expires_at is not None:
        take[PREFIX + "expires_at"] = lock.expires_at.isoformat()
    span.add_event("exclusive_jobs.take", take, timestamp=acquired)
    for missed_name, missed in runs.take_missed():
        if missed_name == name:
            span.add_event("exclusive_jobs.missed", {PREFIX + "slot": missed.isoformat()})
    span.add_event(
        "exclusive_jobs.claim",
        {PREFIX + "attempt": attempt, **({PREFIX + "slot": slot.isoformat()} if slot else {})},
        timestamp=now,
    )
    previous = None
    if in_process:  # the job runs here now: its queries' spans nest in this one
        previous = context.get_current()
        context.attach(trace.set_span_in_context(span))
    runs.add(lock, span, previous)


@quietly(TOOL, "the end")
def on_finished(
    sender: Any,
    name: str,
    lock: Lock,
    status: str,
    exception: BaseException | None = None,
    attempt: int = 1,
    final: bool = True,
    **kwargs: Any,
) -> None:
    from opentelemetry import context, trace  # optional package (its extra)

    found = runs.pop(lock)
    if found is None:
        return
    span, previous = found
    if previous is not None:
        # Not detach(token): an async job's end comes in another copy of the context.
        context.attach(previous)
    span.add_event("exclusive_jobs.release", {PREFIX + "status": status})
    span.set_attribute(PREFIX + "status", status)
    span.set_attribute(PREFIX + "final", final)
    if status in RunStatus.failures():
        if exception is not None:
            span.record_exception(exception)
        description = f"{status}: {exception}" if exception is not None else status
        span.set_status(trace.Status(trace.StatusCode.ERROR, description))
    span.end()


@quietly(TOOL, "the skip")
def on_skipped(sender: Any, name: str, holder: str, **kwargs: Any) -> None:
    from opentelemetry import trace  # optional package (its extra)

    missed = [slot.isoformat() for missed_name, slot in runs.take_missed() if missed_name == name]
    span = trace.get_current_span()
    if not span.is_recording():  # a cron line's start: nothing to attach it to
        return
    attributes: dict[str, Any] = {PREFIX + "job": name, PREFIX + "holder": holder}
    slot = kwargs.get("slot")
    if slot is not None:
        attributes[PREFIX + "slot"] = slot.isoformat()
    if missed:  # the slots this start found missed before it chose not to run
        attributes[PREFIX + "missed"] = missed
    span.add_event("exclusive_jobs.skip", attributes)


@quietly(TOOL, "a missed slot")
def on_missed(sender: Any, name: str, slot: dt.datetime, **kwargs: Any) -> None:
    pending = getattr(runs.missed, "slots", [])
    runs.missed.slots = [*pending, (name, slot)]


@quietly(TOOL, "a lost lock")
def on_lost(sender: Any, lock: Lock, reason: str, **kwargs: Any) -> None:
    span = runs.get(lock)
    if span is not None:
        span.add_event("exclusive_jobs.lost", {PREFIX + "reason": reason})


RECEIVERS = (
    (job_started, on_started),
    (job_finished, on_finished),
    (job_skipped, on_skipped),
    (slot_missed, on_missed),
    (lock_lost, on_lost),
)


def connect() -> None:
    connect_receivers(RECEIVERS, DISPATCH)


def disconnect() -> None:
    connect_receivers(RECEIVERS, DISPATCH, connected=False)

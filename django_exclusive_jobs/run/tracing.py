"""The run's trace, carried to the job's own process (or thread) and continued there.

The run knows no monitoring tool: the OpenTelemetry integration, once connected
(``integrations.connect_enabled``), sets the hook that gives a run's trace context
(:func:`set_context_of`); unset, a run hands none on and the job runs outside any trace.
Where the job runs, :func:`continued` makes the run's span the parent of what it traces.
Both never raise: a failure is one warning line and the job runs all the same.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger("django_exclusive_jobs")

TOOL = "OpenTelemetry"

# The integration's carrier_of(lock): the W3C trace context of the lock's run span.
_context_of: Callable[[Any], dict[str, str]] | None = None


def set_context_of(hook: Callable[[Any], dict[str, str]] | None) -> None:
    """The hook :func:`trace_context` asks (None: no trace context is handed on)."""
    global _context_of
    _context_of = hook


def trace_context(lock: Any) -> dict[str, str]:
    """The trace context of ``lock``'s run, for the job's own process (the scheduler's
    child), so what the job traces nests in the run's span: empty unless OpenTelemetry
    is on. Never raises."""
    if _context_of is None:
        return {}
    try:
        return _context_of(lock)
    except Exception as exc:
        logger.warning("%s: no trace context for the job's process: %s", TOOL, exc)
        return {}


@contextmanager
def continued(carrier: dict[str, str], *, flush: bool = True) -> Iterator[None]:
    """Where the scheduler runs the job (its child process, or a thread of its own for
    ``in_process=True``): while the job runs, the run's span is the parent of what it
    traces. ``flush``: what it traced is exported at the end (a child process ends with
    ``os._exit``; a thread leaves it to the scheduler's exporter). A failure here is one
    warning line; the job runs all the same."""
    token = None
    try:
        # Optional package (the opentelemetry extra): imported only for a traced run.
        from opentelemetry import context, propagate

        token = context.attach(propagate.extract(carrier))
    except Exception as exc:
        logger.warning("%s: could not continue the run's trace: %s", TOOL, exc)
    try:
        yield
    finally:
        try:
            # Optional package (the opentelemetry extra): imported only for a traced run.
            from opentelemetry import context

            if token is not None:
                context.detach(token)
            if flush:
                export_spans()
        except Exception as exc:
            logger.warning("%s: could not export the job's spans: %s", TOOL, exc)


def export_spans(timeout: float | None = None) -> None:
    """Export the spans the tracer provider still holds (its ``force_flush``, waiting at
    most ``timeout`` seconds if given), if it has one."""
    # Optional package (the opentelemetry extra): imported only when tracing is on.
    from opentelemetry import trace

    export = getattr(trace.get_tracer_provider(), "force_flush", None)
    if export is not None and timeout is not None:
        export(int(timeout * 1000))
    elif export is not None:
        export()

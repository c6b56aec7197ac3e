"""Optional integrations with monitoring tools, each off unless enabled in ``EXCLUSIVE_JOBS``.

Each one is a module of signal receivers, imported and connected by ``AppConfig.ready()``
only when its setting is on, so a project without it imports none of this. A receiver
never stops a job: whatever goes wrong in it (a tracer, a transport) is one warning line.
"""

from __future__ import annotations

import logging
from importlib.util import find_spec

from ..conf import app_settings
from ..run import tracing
from ..run.tracing import trace_context as trace_context  # its home is the run layer
from .receivers import connect_receivers as connect_receivers
from .receivers import quietly as quietly

logger = logging.getLogger("django_exclusive_jobs")

# The setting that turns each integration on, and the module it needs importable.
PACKAGES = {"OPENTELEMETRY": "opentelemetry.trace", "SENTRY_MONITORS": "sentry_sdk.crons"}
EXTRAS = {"OPENTELEMETRY": "opentelemetry", "SENTRY_MONITORS": "sentry"}
# The integrations connected in this process (by connect_enabled).
connected: set[str] = set()


def installed(key: str) -> bool:
    """The package the integration of setting ``key`` needs can be imported."""
    try:
        return find_spec(PACKAGES[key]) is not None
    except ImportError:  # its parent package is missing
        return False


def connect_enabled() -> None:
    """Connect the receivers of each integration whose setting is on and whose package is
    installed (system check W003 says when one is on and its package is missing)."""
    if app_settings.OPENTELEMETRY is True and installed("OPENTELEMETRY"):
        from . import opentelemetry  # only when on: a project without it imports none of this

        opentelemetry.connect()
        connected.add("OPENTELEMETRY")
        # The run hands its trace context to the job's process through this hook.
        tracing.set_context_of(opentelemetry.carrier_of)
    if app_settings.SENTRY_MONITORS is True and installed("SENTRY_MONITORS"):
        from . import sentry  # only when on: a project without it imports none of this

        sentry.connect()
        connected.add("SENTRY_MONITORS")


def flush(timeout: float = 2.0) -> None:
    """Export what each connected integration still holds (spans, check-ins), waiting
    at most ``timeout`` seconds each: before a process ends with ``os._exit``, which
    skips their own flush at exit. Never raises."""
    try:
        if "OPENTELEMETRY" in connected:
            tracing.export_spans(timeout)
        if "SENTRY_MONITORS" in connected:
            import sentry_sdk  # optional package: imported only when its integration is on

            sentry_sdk.flush(timeout=timeout)
    except Exception as exc:
        logger.warning("could not export what the monitoring integrations hold: %s", exc)

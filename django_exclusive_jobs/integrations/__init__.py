"""Optional integrations with monitoring tools, each off unless enabled in ``EXCLUSIVE_JOBS``.

Each one is a module of signal receivers, imported and connected by ``AppConfig.ready()``
only when its setting is on, so a project without it imports none of this. A receiver
never stops a job: whatever goes wrong in it (a tracer, a transport) is one warning line.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from importlib.util import find_spec
from typing import Any

from ..run import tracing
from ..run.tracing import trace_context as trace_context  # its home is the run layer

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
    from ..conf import app_settings

    if app_settings.OPENTELEMETRY is True and installed("OPENTELEMETRY"):
        from . import opentelemetry

        opentelemetry.connect()
        connected.add("OPENTELEMETRY")
        # The run hands its trace context to the job's process through this hook.
        tracing.set_context_of(opentelemetry.carrier_of)
    if app_settings.SENTRY_MONITORS is True and installed("SENTRY_MONITORS"):
        from . import sentry

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
            import sentry_sdk

            sentry_sdk.flush(timeout=timeout)
    except Exception as exc:
        logger.warning("could not export what the monitoring integrations hold: %s", exc)


def connect_receivers(receivers: Any, dispatch: str, *, connected: bool = True) -> None:
    """Connect (or, with ``connected=False``, disconnect) an integration's receivers,
    each under a dispatch uid of its own."""
    for signal, receiver in receivers:
        uid = f"{dispatch}.{receiver.__name__}"
        if connected:
            signal.connect(receiver, dispatch_uid=uid)
        else:
            signal.disconnect(receiver, dispatch_uid=uid)


def quietly(tool: str, what: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A signal receiver that never raises: a failure is one warning line, and the job
    goes on (Django's ``Signal.send`` would raise it into the run)."""

    def decorate(receiver: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(receiver)
        def wrapper(*args: Any, **kwargs: Any) -> None:
            try:
                receiver(*args, **kwargs)
            except Exception as exc:
                name = kwargs.get("name") or getattr(kwargs.get("lock"), "name", "?")
                logger.warning(
                    "%s: could not report %s of %s (the job is not affected): %s: %s",
                    tool,
                    what,
                    name,
                    type(exc).__name__,
                    " ".join(str(exc).split()),
                )

        return wrapper

    return decorate

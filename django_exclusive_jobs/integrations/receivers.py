"""What every integration's receivers share: connecting them, and never raising."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("django_exclusive_jobs")


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

"""Listening instead of polling: on PostgreSQL a scheduler is woken by a ``NOTIFY``.

Every write a scheduler must react to (a run asked for now, a stop, an operator's pause
or override: ``models.wake_schedulers``) sends a ``NOTIFY`` in its transaction. The
scheduler ``LISTEN``\\s on its own connection and waits on the connection's socket beside
its children and signals; when a notification comes it reads the requests and the
operators' rows at once, and never else, instead of every ``REQUEST_POLL`` seconds.

It polls as before where it cannot listen: not PostgreSQL, a driver without psycopg 3's
``notifies(timeout=)``, a database with ``DISABLE_SERVER_SIDE_CURSORS`` (Django's
setting for PgBouncer in transaction mode, which gives each transaction any server
connection: a ``LISTEN`` would be left on one of them), or ``EXCLUSIVE_JOBS["LISTEN"]``
set to False. A notification is lost with its connection: after a reconnect the
scheduler listens again and reads once (:meth:`Listener.moved`).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from django.db import connections

from ..conf import app_settings
from ..models.requests import WAKE_CHANNEL

logger = logging.getLogger("django_exclusive_jobs")


def can_listen(using: str) -> bool:
    """Whether a scheduler on ``using`` listens (see the module's text)."""
    connection = connections[using]
    if not app_settings.LISTEN or connection.vendor != "postgresql":
        return False
    if connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
        return False
    try:
        import psycopg
    except ImportError:  # psycopg2
        return False
    return "timeout" in inspect.signature(psycopg.Connection.notifies).parameters


class Listener:
    """The scheduler's ``LISTEN`` on its connection to ``using``; inert if it cannot."""

    def __init__(self, using: str) -> None:
        self.using = using
        self.wanted = can_listen(using)
        self._on: Any = None  # the driver's connection it listens on; None: not listening

    @property
    def listening(self) -> bool:
        return self._on is not None

    def listen(self) -> None:
        """``LISTEN`` on the current connection (one statement; the caller retries)."""
        if not self.wanted:
            return
        self._on = None
        connection = connections[self.using]
        with connection.cursor() as cursor:
            cursor.execute(f'LISTEN "{WAKE_CHANNEL}"')
        self._on = connection.connection

    def moved(self) -> bool:
        """Whether it should listen but the connection it listened on is gone (closed
        after an error, reopened since): then nothing it would have heard reaches it."""
        return self.wanted and connections[self.using].connection is not self._on

    def fileno(self) -> int | None:
        """The socket to wait on beside the children and signals, while listening."""
        if self._on is None:
            return None
        try:
            return int(self._on.fileno())
        except Exception:  # closed under us
            self._on = None
            return None

    def heard(self) -> bool:
        """Whether a notification came (read without waiting: those the driver received
        during other statements, then the socket's). A broken connection counts as one,
        so the caller reads what it may have missed once it is back."""
        if self._on is None:
            return False
        try:
            return sum(1 for _ in self._on.notifies(timeout=0)) > 0
        except Exception as exc:  # the driver's own error: the connection is gone
            logger.debug("stopped listening on %s: %s", self.using, exc)
            self._on = None
            return True

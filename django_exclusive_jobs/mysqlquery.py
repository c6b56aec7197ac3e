"""MariaDB and MySQL (mysqlclient): send the lock's hot statements as one query each.

A statement sent through a cursor pays for the cursor, for quoting every parameter and for
building a description of every result. The lock's statements are the same text at every
call except for the name, token and thread, so their text is rendered once per database
session with the other values already quoted by the driver, and each call quotes only
what varies and sends the query through mysqlclient's connection (``query``,
``store_result``, ``next_result``). Rows are converted by the same converters the
connection gives its cursors.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

from .sessions import PLACEHOLDER, SessionState

Rows = list[tuple[Any, ...]]
_CLIENT_ERRORS = 2000  # MySQL's client library numbers its own errors from here
_MAX_TEMPLATES = 256


class _Session(SessionState):
    """The statements rendered for one database session."""

    attribute = "_exclusive_jobs_mysql"

    def __init__(self, raw: Any) -> None:
        super().__init__(raw)
        self.templates: dict[tuple[str, tuple[Any, ...]], tuple[list[bytes], list[int]]] = {}


def usable(connection: Any) -> bool:
    """Whether the connection is mysqlclient's (the only driver this path knows)."""
    return bool(connection.vendor == "mysql" and connection.Database.__name__ == "MySQLdb")


def run(
    connection: Any,
    sql: str,
    constants: tuple[Any, ...],
    varying: tuple[int, ...],
    params: list[Any],
    insert_id: bool = False,
) -> tuple[int, Rows]:
    """Run ``sql`` with ``params``; return its row count and its rows.

    ``constants`` are the compiled parameters (the same at every call but for the
    positions in ``varying``, and a name bound again after them). With ``insert_id``
    the rows are one row holding the value the statement gave ``LAST_INSERT_ID()``.
    """
    raw = connection.connection
    state = _Session.of(connection)
    key = (sql, constants)
    template = state.templates.get(key)
    if template is None:
        if len(state.templates) >= _MAX_TEMPLATES:  # a ttl that changes at every call
            state.templates.clear()
        template = state.templates[key] = _render(raw, sql, constants, varying, len(params))
    pieces, slots = template
    parts = list(pieces)
    bound = (*varying, *range(len(constants), len(params)))
    for slot, index in zip(slots, bound, strict=True):
        value = params[index]
        if isinstance(value, str):
            parts[slot] = raw.string_literal(value.encode(raw.encoding))
        else:
            parts[slot] = b"%d" % value
    try:
        raw.query(b"".join(parts))
        count = raw.affected_rows()
        rows = [(raw.insert_id(),)] if insert_id else _rows(raw.store_result())
        while raw.next_result() == 0:
            rows = _rows(raw.store_result())
    except connection.Database.Error as exc:
        # The server's own errors (a deadlock, a lock wait timeout, a missing table)
        # leave the connection in step: it stays open for the caller to retry or to
        # ask what went wrong. Client errors (2000 and up) mean it is not.
        code = exc.args[0] if exc.args else None
        if not isinstance(code, int) or code >= _CLIENT_ERRORS:
            _close(raw)
        raise
    except BaseException:
        # Interrupted half-way through a request: results may be left unread and the
        # connection out of step, so close it (Django opens a new one).
        _close(raw)
        raise
    return count, rows


def _close(raw: Any) -> None:
    if raw.open:
        with suppress(Exception):
            raw.close()


def _rows(result: Any) -> Rows:
    return [] if result is None else list(result.fetch_row(0))


def _render(
    raw: Any, sql: str, constants: tuple[Any, ...], varying: tuple[int, ...], count: int
) -> tuple[list[bytes], list[int]]:
    """``sql`` as byte pieces: constants quoted in place; the slots left for the rest."""
    pieces: list[bytes] = []
    slots: list[int] = []
    bound = iter(range(count))
    position = 0
    for match in PLACEHOLDER.finditer(sql):
        pieces.append(sql[position : match.start()].encode(raw.encoding))
        position = match.end()
        if match.group() == "%%":
            pieces.append(b"%")
            continue
        index = next(bound)
        if index in varying or index >= len(constants):
            slots.append(len(pieces))
            pieces.append(b"")
        else:
            pieces.append(raw.literal(constants[index]))
    pieces.append(sql[position:].encode(raw.encoding))
    return pieces, slots

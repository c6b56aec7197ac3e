"""MariaDB and MySQL (mysqlclient): send the lock's hot statements as one query each.

A statement sent through a cursor pays for the cursor, for quoting every parameter and for
building a description of every result. The lock's statements are the same text at every
call except for the name, token and thread, so their text is rendered once per database
session with the other values already quoted by the driver, and each call quotes only
what varies and sends the query through mysqlclient's connection (``query``,
``store_result``, ``next_result``). Rows are converted by the same converters the
connection gives its cursors.

Once a session has sent one statement a few times, it is prepared on the server
(``PREPARE name FROM '...'``, the SQL form, as mysqlclient has no binary protocol) and
then sent as ``EXECUTE name USING <the varying values>``: the server parses the short
``EXECUTE`` instead of the whole statement. With many servers on few cores that parsing
is what they queue for. The name is a hash of the prepared text, so a name on a session
always means this very statement. A statement the session no longer has (the server
said "unknown prepared statement") runs as text and is prepared again; after a few such
misses on one connection (a PREPARE the server refused counts as one) it stops preparing
there. Each session prepares at most ``MAX_PREPARED`` statements.
``EXCLUSIVE_JOBS["PREPARE_STATEMENTS"] = False`` turns it off.
"""

from __future__ import annotations

import hashlib
from contextlib import suppress
from typing import Any

from .conf import app_settings
from .sessions import PLACEHOLDER, SessionState

Rows = list[tuple[Any, ...]]
_CLIENT_ERRORS = 2000  # MySQL's client library numbers its own errors from here
_UNKNOWN_STATEMENT = 1243  # ER_UNKNOWN_STMT_HANDLER: the session has no such statement
_MAX_TEMPLATES = 256
# Runs of one statement on a session before it is prepared (a process that takes one lock
# and exits never pays for a PREPARE); statements prepared per session at most; misses on
# a session before it stops preparing.
PREPARE_AFTER = 3
MAX_PREPARED = 16
MAX_MISSES = 3


class _Template:
    """One statement rendered for one session: byte pieces, the slots left for values."""

    __slots__ = ("pieces", "prepared", "slots", "uses")

    def __init__(self, pieces: list[bytes], slots: list[int]) -> None:
        self.pieces = pieces
        self.slots = slots
        self.uses = 0
        self.prepared: bytes | None = None  # b"EXECUTE name" once the session has it


class _Session(SessionState):
    """The statements rendered, and those prepared, for one database session."""

    attribute = "_exclusive_jobs_mysql"

    def __init__(self, raw: Any) -> None:
        super().__init__(raw)
        self.templates: dict[tuple[str, tuple[Any, ...]], _Template] = {}
        self.prepared = 0
        self.misses = 0


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
    bound = (*varying, *range(len(constants), len(params)))
    values = [_literal(raw, params[index]) for index in bound]
    try:
        if template.prepared is None:
            template.uses += 1
            if template.uses >= PREPARE_AFTER and _may_prepare(state):
                _prepare(connection, raw, state, template)
        if template.prepared is not None:
            try:
                raw.query(_execute(template.prepared, values))
            except connection.Database.Error as exc:
                if _code(exc) != _UNKNOWN_STATEMENT:
                    raise
                _missed(state, template)  # gone from the session: text now, prepare later
                raw.query(_text(template, values))
        else:
            raw.query(_text(template, values))
        count = raw.affected_rows()
        rows = [(raw.insert_id(),)] if insert_id else _rows(raw.store_result())
        while raw.next_result() == 0:
            rows = _rows(raw.store_result())
    except connection.Database.Error as exc:
        # The server's own errors (a deadlock, a lock wait timeout, a missing table)
        # leave the connection in step: it stays open for the caller to retry or to
        # ask what went wrong. Client errors (2000 and up) mean it is not.
        if _client_side(exc):
            _close(raw)
        raise
    except BaseException:
        # Interrupted half-way through a request: results may be left unread and the
        # connection out of step, so close it (Django opens a new one).
        _close(raw)
        raise
    return count, rows


def _may_prepare(state: _Session) -> bool:
    return (
        state.prepared < MAX_PREPARED
        and state.misses < MAX_MISSES
        and bool(app_settings.PREPARE_STATEMENTS)
    )


def _prepare(connection: Any, raw: Any, state: _Session, template: _Template) -> None:
    """Prepare the template's statement on the session, under a name hashed from its text."""
    body = _text(template, [b"?"] * len(template.slots))
    name = b"exclusive_jobs_" + hashlib.sha256(body).hexdigest()[:40].encode()
    try:
        raw.query(b"PREPARE " + name + b" FROM " + raw.string_literal(body))
    except connection.Database.Error as exc:
        if _client_side(exc):
            raise
        # Say, the server's max_prepared_stmt_count is reached, or the table is not
        # migrated yet: text for now; a session that keeps failing stops trying.
        _missed(state, template)
        return
    state.prepared += 1
    template.prepared = b"EXECUTE " + name


def _missed(state: _Session, template: _Template) -> None:
    """The statement is not (or no longer) prepared: count it, and start counting again."""
    template.prepared = None
    template.uses = 0
    state.misses += 1


def _execute(prepared: bytes, values: list[bytes]) -> bytes:
    return prepared + b" USING " + b", ".join(values) if values else prepared


def _text(template: _Template, values: list[bytes]) -> bytes:
    """The template with ``values`` in its slots (``?`` marks, for the prepared form)."""
    parts = list(template.pieces)
    for slot, value in zip(template.slots, values, strict=True):
        parts[slot] = value
    return b"".join(parts)


def _literal(raw: Any, value: Any) -> bytes:
    if isinstance(value, str):
        return bytes(raw.string_literal(value.encode(raw.encoding)))
    return b"%d" % value


def _code(exc: BaseException) -> int | None:
    code = exc.args[0] if exc.args else None
    return code if isinstance(code, int) else None


def _client_side(exc: BaseException) -> bool:
    """An error of the client library (or one without a number): the session is not usable."""
    code = _code(exc)
    return code is None or code >= _CLIENT_ERRORS


def _close(raw: Any) -> None:
    if raw.open:
        with suppress(Exception):
            raw.close()


def _rows(result: Any) -> Rows:
    return [] if result is None else list(result.fetch_row(0))


def _render(
    raw: Any, sql: str, constants: tuple[Any, ...], varying: tuple[int, ...], count: int
) -> _Template:
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
    return _Template(pieces, slots)

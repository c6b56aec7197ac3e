"""PostgreSQL: run the lock's hot statements as named prepared statements.

Django binds parameters on the client, so the server parses and plans every statement it
receives, and each statement also pays for a psycopg cursor and client-side quoting. Once
one database session has run a lock statement a few times, it is prepared under a name of
our own (``Parse``) and from then on executed by that name (``Bind``/``Execute``) through
psycopg's public libpq layer (``psycopg.pq``): one message each way, parameters sent as
text, results read with the loaders Django configured on the connection.

* **The name is a hash of the statement's text and parameter types.** A statement of that
  name on a server session is always this very statement, whoever prepared it. That is
  what makes it safe behind a pooler that hands one client several server sessions (or
  one session to several clients): psycopg's own names (``_pg3_0``, ...) are numbered per
  client connection and could name another client's statement there.
* **Only in autocommit outside atomic blocks.** There a failed execution is an error and
  nothing more; inside a transaction it would abort the transaction.
* **A statement missing on the session** (a pooler in transaction mode moved us, or
  ``DISCARD ALL``) runs plainly and is prepared again; after a few misses on one
  connection it stops preparing there. "cached plan must not change result type" after a
  migration: the statement is dropped and prepared again.
* Not with psycopg 2, and not with ``server_side_binding`` (psycopg prepares by itself
  there); ``EXCLUSIVE_JOBS["PREPARE_STATEMENTS"] = False`` turns it off.
"""

from __future__ import annotations

import hashlib
import select
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from .conf import app_settings
from .sessions import PLACEHOLDER, SessionState

# How often a statement runs on one connection before it is prepared (a process that
# takes one lock and exits never pays for a Parse), and how often a prepared statement may
# go missing on one connection before that connection stops preparing.
PREPARE_AFTER = 3
MAX_MISSES = 3

# Python type of a compiled parameter -> (SQL type for the name's hash, type oid).
_PG_TYPES = {
    "bool": ("boolean", 16),
    "str": ("text", 25),
    "int": ("bigint", 20),
    "Int2": ("smallint", 21),
    "Int4": ("integer", 23),
    "Int8": ("bigint", 20),
    "float": ("double precision", 701),
    "timedelta": ("interval", 1186),
    "datetime": ("timestamp with time zone", 1184),
}
_TIMESTAMPTZ = 1184
# The server does not have the statement (a new session, or a pooler sent us to another
# one), or its result shape changed under it (a migration altered the table).
_MISSING = {"26000", "0A000"}
_ALREADY_THERE = "42P05"
_MAX_CONSTANTS = 256

Rows = list[tuple[Any, ...]]


@dataclass(frozen=True)
class Prepared:
    """A statement's prepared form: its name, ``$n`` text and parameter types."""

    name: str
    body: str
    types: tuple[int, ...]
    varying: tuple[int, ...]  # positions bound at each call (name, token, thread)
    name_again: int | None  # where the name is bound a second time, if it is


def preparable(
    vendor: str, sql: str, params: Any, varying: tuple[int, ...], name_at: int, name_again: bool
) -> Prepared | None:
    """The prepared form of a PostgreSQL statement, if every parameter has a known type.

    A name bound again at the end (``name_again``) is given a parameter of its own.
    """
    if vendor != "postgresql":
        return None
    known = [_PG_TYPES.get(type(param).__name__) for param in params]
    if any(found is None for found in known):
        return None
    types = [found for found in known if found is not None]
    if name_again:
        types.append(types[name_at])
    numbers = iter(range(1, len(types) + 1))
    body = PLACEHOLDER.sub(lambda m: "%" if m.group() == "%%" else f"${next(numbers, 0)}", sql)
    if next(numbers, None) is not None or "$0" in body:
        return None
    text = f"({', '.join(sql_type for sql_type, _ in types)}) AS {body}"
    name = "exclusive_jobs_" + hashlib.sha256(text.encode()).hexdigest()[:40]
    again = len(params) if name_again else None
    return Prepared(name, body, tuple(oid for _, oid in types), varying, again)


class _Session(SessionState):
    """What one database session has prepared, and the encoders and loaders it uses."""

    attribute = "_exclusive_jobs_prepared"

    def __init__(self, raw: Any) -> None:
        super().__init__(raw)
        self.uses: dict[str, int] = {}
        self.ready: set[str] = set()
        self.misses = 0
        self.constants: dict[tuple[str, tuple[Any, ...]], list[bytes | None]] = {}
        self.loaders: dict[int, Callable[[bytes], Any]] = {}
        # The time zone the connection's timestamptz loader was made for, and the
        # session's TimeZone when the loaders were made. When either changes after
        # connecting (settings changed), Django's cursors read times their own way:
        # then the statement runs plainly on one of them.
        self.timezone = _loader_timezone(raw)
        self.session_zone = raw.info.parameter_status("TimeZone")
        # Text is encoded as psycopg's own str dumper does (UTF-8 for SQL_ASCII).
        encoding = raw.info.encoding
        self.encoding = "utf-8" if encoding == "ascii" else encoding


def session(connection: Any) -> _Session:
    """This connection's session state (new whenever Django opened a new connection)."""
    return _Session.of(connection)


def _loader_timezone(raw: Any) -> Any:
    from psycopg.pq import Format

    return getattr(raw.adapters.get_loader(_TIMESTAMPTZ, Format.TEXT), "timezone", None)


def run(
    connection: Any,
    prepared: Prepared,
    constants: tuple[Any, ...],
    params: list[Any],
    returning: bool,
) -> tuple[int, Rows] | None:
    """Execute ``prepared`` with ``params``: (row count, rows), or None to run it plainly.

    ``constants`` are the statement's compiled parameters: the values other than the
    name, token and thread are the same at every call with them, so they are encoded once.

    None when preparing is off or not safe here, before the statement has been used
    ``PREPARE_AFTER`` times on this session, and when the server did not have it.
    """
    raw = connection.connection
    if (
        not connection.autocommit
        or connection.in_atomic_block
        or not hasattr(raw, "pgconn")  # psycopg 2
        or connection.settings_dict.get("OPTIONS", {}).get("server_side_binding")
        or not app_settings.PREPARE_STATEMENTS
    ):
        return None
    state = session(connection)
    if (
        state.misses >= MAX_MISSES
        or state.timezone != connection.timezone
        or state.session_zone != raw.info.parameter_status("TimeZone")
    ):
        return None
    name = prepared.name.encode()
    if prepared.name not in state.ready:
        uses = state.uses[prepared.name] = state.uses.get(prepared.name, 0) + 1
        if uses < PREPARE_AFTER:
            return None
        result = _exchange(
            raw, lambda pg: pg.send_prepare(name, prepared.body.encode(), prepared.types)
        )
        if _failed(result) and _sqlstate(result) != _ALREADY_THERE:  # same name, same statement
            state.uses[prepared.name] = 0  # say, a table not migrated yet: try again later
            state.misses += 1
            return None
        state.ready.add(prepared.name)
    args = _arguments(raw, state, prepared, constants, params)
    result = _exchange(raw, lambda pg: pg.send_query_prepared(name, args))
    if _failed(result):
        sqlstate = _sqlstate(result)
        if sqlstate not in _MISSING:
            raise _error(raw, result)
        state.ready.discard(prepared.name)
        state.uses[prepared.name] = 0
        state.misses += 1
        if sqlstate == "0A000":  # the old plan is useless now: drop it
            with suppress(raw.Error):
                _exchange(raw, lambda pg: pg.send_query(b"DEALLOCATE " + name))
        return None
    count = result.command_tuples
    if count is None:
        count = result.ntuples
    if not returning:
        return count, []
    loaders = [_loader(connection, state, result.ftype(i)) for i in range(result.nfields)]
    rows = [
        tuple(
            None if (value := result.get_value(row, i)) is None else loaders[i](value)
            for i in range(result.nfields)
        )
        for row in range(result.ntuples)
    ]
    return count, rows


def _arguments(
    raw: Any, state: _Session, prepared: Prepared, constants: tuple[Any, ...], params: list[Any]
) -> list[Any]:
    """The parameters as text: constants encoded once per session, the rest at each call."""
    key = (prepared.name, constants)  # the name fixes the types: 1 and True differ
    encoded = state.constants.get(key)
    if encoded is None:
        if len(state.constants) >= _MAX_CONSTANTS:  # a ttl that changes at every call
            state.constants.clear()
        encoded = state.constants[key] = [_dump(raw, param) for param in params]
    args = list(encoded)
    encoding = state.encoding
    for index in prepared.varying:
        value = params[index]
        args[index] = value.encode(encoding) if isinstance(value, str) else b"%d" % value
    if prepared.name_again is not None:
        args[prepared.name_again] = params[prepared.name_again].encode(encoding)
    return args


def _dump(raw: Any, value: Any) -> bytes:
    from psycopg.adapt import PyFormat

    dumper = raw.adapters.get_dumper(type(value), PyFormat.TEXT)(type(value), raw)
    dumped = dumper.upgrade(value, PyFormat.TEXT).dump(value)  # a plain int picks its size
    return b"" if dumped is None else bytes(dumped)


def _loader(connection: Any, state: _Session, oid: int) -> Callable[[bytes], Any]:
    """Load one text value of type ``oid`` as Django's cursors on this connection would."""
    load: Callable[[bytes], Any] | None = state.loaders.get(oid)
    if load is None:
        from psycopg.pq import Format

        raw = connection.connection
        loader_class = raw.adapters.get_loader(oid, Format.TEXT)
        if loader_class is None:
            return lambda value: bytes(value).decode(raw.info.encoding)
        load = state.loaders[oid] = loader_class(oid, raw).load
    return load


# --- one exchange with the server -----------------------------------------------------


def _exchange(raw: Any, send: Callable[[Any], None]) -> Any:
    """Send one request on psycopg connection ``raw`` and return its (last) result.

    The connection is non-blocking (psycopg makes it so); waits are on the socket, so a
    signal handler still runs. If anything interrupts the exchange half-way, the
    connection is closed: its protocol state is unknown, and Django opens a new one.
    """
    pgconn = raw.pgconn
    with raw.lock:
        try:
            send(pgconn)
            while pgconn.flush():
                if _wait(pgconn.socket, writing=True):
                    pgconn.consume_input()
            result = None
            while True:
                while pgconn.is_busy():
                    _wait(pgconn.socket)
                    pgconn.consume_input()
                got = pgconn.get_result()
                if got is None:
                    break
                if result is None or not _failed(result):
                    result = got
        except BaseException:
            with suppress(Exception):
                raw.close()
            raise
    if result is None:  # pragma: no cover - libpq always answers a request
        raise raw.OperationalError("the server sent no result")
    return result


if hasattr(select, "poll"):

    def _wait(fd: int, *, writing: bool = False) -> bool:
        """Wait until ``fd`` can be read (or written); True if it can be read."""
        poller = select.poll()
        poller.register(fd, select.POLLIN | (select.POLLOUT if writing else 0))
        events = 0
        while not events:
            events = sum(event for _, event in poller.poll())
        return bool(events & (select.POLLIN | select.POLLERR | select.POLLHUP))

else:  # pragma: no cover - Windows

    def _wait(fd: int, *, writing: bool = False) -> bool:
        readable: list[int] = []
        writable: list[int] = []
        while not (readable or writable):
            readable, writable, _ = select.select([fd], [fd] if writing else [], [fd])
        return bool(readable)


def _failed(result: Any) -> bool:
    from psycopg.pq import ExecStatus

    return result.status not in (ExecStatus.COMMAND_OK, ExecStatus.TUPLES_OK)


def _sqlstate(result: Any) -> str | None:
    from psycopg.pq import DiagnosticField

    code = result.error_field(DiagnosticField.SQLSTATE)
    return code.decode() if code else None


def _error(raw: Any, result: Any) -> Exception:
    """The exception psycopg itself raises for this result (class, message, diag)."""
    from psycopg import errors

    return errors.error_from_result(result, encoding=raw.info.encoding)

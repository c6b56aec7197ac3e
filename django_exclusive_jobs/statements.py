"""The lock's hot statements: built by the ORM once, then run with new values each time.

Building a query through the ORM costs more CPU than the indexed statement it sends, and
with ten servers on two cores that CPU is what they queue for. So each hot statement
(take, renew, release, and the read that follows a take where there is no ``RETURNING``)
is compiled once per shape with placeholder values, and every call binds its own. The
SQL still comes from the ORM: ``DatabaseNow``, quoting and interval arithmetic.

Two more savings, each used only where it cannot change what a statement does:

* **PostgreSQL.** Django binds parameters on the client, so the server parses and plans
  every statement again. A statement run a few times on one connection is made a named
  prepared statement (SQL ``PREPARE``, then ``EXECUTE``). Its name is a hash of its text
  and parameter types, so a name found on a pooled server connection always means this
  very statement. A connection where it keeps going missing (a pooler in transaction
  mode) stops trying. ``EXCLUSIVE_JOBS["PREPARE_STATEMENTS"] = False`` turns it off.
* **MariaDB and MySQL.** There is no ``UPDATE ... RETURNING``, so the read of the row
  that tells who won is sent with the ``UPDATE`` in one request: one round trip, not two.
"""

from __future__ import annotations

import hashlib
import re
import weakref
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import Field
from django.db.models.sql import UpdateQuery

from .conf import app_settings

if TYPE_CHECKING:
    from .models import JobLock, JobLockQuerySet

# Placeholders the ORM compiles into a statement once; each call binds real values.
NAME = "\x00exclusive-jobs-name\x00"
TOKEN = -7_770_000_000_001
THREAD = -7_770_000_000_002
_SLOT_NAMES = {NAME: "name", TOKEN: "token", THREAD: "thread"}

# PostgreSQL: how often a statement runs on one connection before it is prepared (a
# process that takes one lock and exits never pays for a PREPARE), and how often a
# prepared statement may go missing on one connection before it stops preparing.
PREPARE_AFTER = 3
MAX_MISSES = 3

Converters = dict[int, tuple[list[Any], Any]]
Rows = list[tuple[Any, ...]]


@dataclass(frozen=True)
class Prepared:
    """A statement's SQL ``PREPARE`` form and what its ``EXECUTE`` needs (PostgreSQL)."""

    name: str
    prepare_sql: str
    arg_count: int
    varying: tuple[int, ...]  # positions bound at each call (name, token, thread)
    constants: tuple[tuple[int, Any], ...]  # the other positions and their values


@dataclass(frozen=True)
class Compiled:
    """A statement built by the ORM once, with the positions of its varying parameters."""

    sql: str
    params: tuple[Any, ...]
    slots: dict[Any, int]
    returning: bool
    name_again: bool = False  # the name is bound once more at the end
    then_select: bool = False  # a SELECT follows in the same request; its rows are returned
    converters: Converters = field(default_factory=dict)
    prepared: Prepared | None = None

    def bind(self, **values: Any) -> list[Any]:
        params = list(self.params)
        for placeholder, index in self.slots.items():
            # Keep the driver's own wrapper type (psycopg's Int8 for a bigint, say).
            params[index] = type(params[index])(values[_SLOT_NAMES[placeholder]])
        if self.name_again:
            params.append(values["name"])
        return params


_compiled: dict[tuple[Any, ...], Compiled | None] = {}


def _cached(cache_key: tuple[Any, ...], make: Callable[[], Compiled | None]) -> Compiled | None:
    if cache_key not in _compiled:
        if len(_compiled) > 1024:
            _compiled.clear()
        _compiled[cache_key] = make()
    return _compiled[cache_key]


def column(model: type[JobLock], field_name: str) -> str:
    model_field = model._meta.get_field(field_name)
    assert isinstance(model_field, Field)
    return str(model_field.column)


def compile_update(
    alias: str,
    key: tuple[Any, ...],
    build: Callable[[], tuple[JobLockQuerySet, dict[str, Any]]],
    returning: list[str],
    *,
    or_holder: bool = False,
    then_select: Callable[[], Any] | None = None,
) -> Compiled | None:
    """Compile ``queryset.update(**values)`` once per shape; None if it cannot be reused.

    On PostgreSQL the statement returns the ``returning`` columns of the changed row, and
    with ``or_holder`` the current holder's row when it changed nothing, so a lost race
    is decided in one round trip. On MariaDB and MySQL, ``then_select`` (a values_list
    queryset filtered on the name alone) is sent in the same request and its row returned.
    """
    connection = connections[alias]

    def make() -> Compiled | None:
        queryset, values = build()
        query = queryset.query.chain(UpdateQuery)
        assert isinstance(query, UpdateQuery)
        query.add_update_values(values)
        sql, params = query.get_compiler(alias).as_sql()
        wants_rows = bool(returning) and connection.vendor == "postgresql"
        name_again = False
        if wants_rows:
            qn = connection.ops.quote_name
            columns = ", ".join(qn(column(queryset.model, name)) for name in returning)
            sql = f"{sql} RETURNING {columns}"
            if or_holder:
                assert returning == ["token", "acquired_at", "expires_at"]
                table = qn(queryset.model._meta.db_table)
                holder = ", ".join(qn(name) for name in ("host", "pid", "instance"))
                # The holder's row leaves out acquired_at: a losing server never reads it.
                sql = (
                    f"WITH taken AS ({sql}) "
                    f"SELECT true, {columns}, NULL, NULL, NULL FROM taken UNION ALL "
                    f"SELECT false, {qn('token')}, NULL, {qn('expires_at')}, {holder} "
                    f"FROM {table} WHERE {qn('name')} = %s AND NOT EXISTS (SELECT 1 FROM taken)"
                )
                name_again = True
        slots = placeholder_slots(params)
        if slots is None:
            return None
        converters: Converters = {}
        follow = then_select is not None and _multi_statements(alias)
        if follow:
            assert then_select is not None
            select_sql, select_params, converters = _compile_select(alias, then_select)
            if list(select_params) != [NAME]:
                return None
            sql = f"{sql}; {select_sql}"
            name_again = True
        return Compiled(
            sql,
            tuple(params),
            slots,
            wants_rows or follow,
            name_again,
            follow,
            converters,
            _preparable(alias, sql, params, slots, name_again),
        )

    return _cached((alias, connection.vendor, "update", *key), make)


def compile_select(alias: str, key: tuple[Any, ...], build: Callable[[], Any]) -> Compiled | None:
    """Compile the first row of ``build()`` (a values_list queryset) once per shape."""
    connection = connections[alias]

    def make() -> Compiled | None:
        sql, params, converters = _compile_select(alias, build)
        slots = placeholder_slots(params)
        if slots is None:
            return None
        return Compiled(
            sql,
            tuple(params),
            slots,
            True,
            converters=converters,
            prepared=_preparable(alias, sql, params, slots, False),
        )

    return _cached((alias, connection.vendor, "select", *key), make)


def _compile_select(alias: str, build: Callable[[], Any]) -> tuple[str, Any, Converters]:
    compiler = build()[:1].query.get_compiler(alias)
    sql, params = compiler.as_sql()
    fields = [selected[0] for selected in compiler.select[: compiler.col_count]]
    return sql, params, compiler.get_converters(fields)


def placeholder_slots(params: Any) -> dict[Any, int] | None:
    """Where each placeholder sits in a compiled statement's parameters.

    None when the statement cannot be reused by binding: a placeholder appears twice, or
    the name does not appear as itself (it must be bound, never sent as the placeholder).
    """
    slots: dict[Any, int] = {}
    for placeholder in _SLOT_NAMES:
        hits = [i for i, param in enumerate(params) if _same(param, placeholder)]
        if len(hits) > 1:
            return None
        if hits:
            slots[placeholder] = hits[0]
    return slots if NAME in slots else None


def _same(param: Any, placeholder: Any) -> bool:
    return isinstance(param, type(placeholder)) and param == placeholder


def _multi_statements(alias: str) -> bool:
    """Whether two statements may go in one request: mysqlclient allows it unless told not."""
    connection: Any = connections[alias]
    if connection.vendor != "mysql" or connection.Database.__name__ != "MySQLdb":
        return False
    return connection.settings_dict.get("OPTIONS", {}).get("multi_statements", True) is not False


# --- running --------------------------------------------------------------------------


def run_compiled(
    alias: str, compiled: Compiled, **values: Any
) -> tuple[int, list[tuple[Any, ...]]]:
    """Execute a compiled statement; return its row count and any rows it returned.

    It runs on the backend's own cursor (the one Django's cursor wraps; errors are still
    translated into Django's), which saves a good part of what a lock costs beyond the
    SQL. Whenever someone watches the connection (an ``execute_wrapper``, DEBUG's query
    log), it goes through Django's cursor so they see the statement as the ORM built it.
    """
    connection = connections[alias]
    params = compiled.bind(**values)
    if connection.execute_wrappers or connection.queries_logged:
        with connection.cursor() as cursor:
            cursor.execute(compiled.sql, params)
            count, rows = _results(cursor, compiled)
    else:
        connection.ensure_connection()
        with connection.wrap_database_errors:
            cursor = connection.create_cursor()
            try:
                if compiled.prepared is None or not _execute_prepared(
                    connection, cursor, compiled.prepared, params
                ):
                    cursor.execute(compiled.sql, params)
                count, rows = _results(cursor, compiled)
            finally:
                cursor.close()
    if compiled.converters:
        rows = [_convert(row, compiled.converters, connection) for row in rows]
    return count, rows


def _convert(row: tuple[Any, ...], converters: Converters, connection: Any) -> tuple[Any, ...]:
    """Apply the ORM's converters (MySQL's naive datetimes made aware, say) to one row."""
    values = list(row)
    for position, (functions, expression) in converters.items():
        for function in functions:
            values[position] = function(values[position], expression, connection)
    return tuple(values)


def _results(cursor: Any, compiled: Compiled) -> tuple[int, Rows]:
    count = cursor.rowcount
    if compiled.then_select:
        cursor.nextset()
    rows = list(cursor.fetchall()) if compiled.returning else []
    return count, rows


# --- PostgreSQL prepared statements ---------------------------------------------------

_PG_TYPES = {
    "bool": "boolean",
    "str": "text",
    "int": "bigint",
    "Int2": "smallint",
    "Int4": "integer",
    "Int8": "bigint",
    "float": "double precision",
    "timedelta": "interval",
    "datetime": "timestamp with time zone",
}
_PLACEHOLDER = re.compile(r"%%|%s")
# The server does not have the statement (a new session, or a pooler sent us to another
# one), or its result shape changed under it (a migration altered the table).
_MISSING = {"26000", "0A000"}
_ALREADY_THERE = "42P05"


def _preparable(
    alias: str, sql: str, params: Any, slots: dict[Any, int], name_again: bool
) -> Prepared | None:
    """The PREPARE/EXECUTE forms of a PostgreSQL statement, if every parameter has a type.

    The name bound again at the end refers to the name's own parameter. Parameters other
    than the name, token and thread are the same at every call of this compiled
    statement: they are written into its EXECUTE once per session (see ``_execute_sql``).
    """
    if connections[alias].vendor != "postgresql":
        return None
    types = [_PG_TYPES.get(type(param).__name__) for param in params]
    if None in types:
        return None
    numbers = [f"${number}" for number in range(1, len(params) + 1)]
    if name_again:
        numbers.append(numbers[slots[NAME]])
    marks = iter(numbers)
    body = _PLACEHOLDER.sub(lambda m: "%" if m.group() == "%%" else next(marks, "?"), sql)
    if next(marks, None) is not None or "?" in body:
        return None
    text = f"({', '.join(str(t) for t in types)}) AS {body}"
    name = "exclusive_jobs_" + hashlib.sha256(text.encode()).hexdigest()[:40]
    varying = tuple(sorted(slots.values()))
    constants = tuple((i, param) for i, param in enumerate(params) if i not in varying)
    return Prepared(name, f"PREPARE {name} {text}", len(params), varying, constants)


def _execute_sql(connection: Any, prepared: Prepared) -> str:
    """``EXECUTE name(...)`` with this statement's constant parameters as SQL literals.

    Binding a parameter on the client costs more CPU than the statement costs the
    server; the constants (the holder's host, pid and instance, the ttl) are rendered
    once, by the driver, and only the name, token and thread are bound at each call.
    """
    constants = dict(prepared.constants)
    args = []
    for index in range(prepared.arg_count):
        if index in constants:
            literal = connection.ops.compose_sql("%s", [constants[index]])
            args.append(literal.replace("%", "%%"))
        else:
            args.append("%s")
    return f"EXECUTE {prepared.name}({', '.join(args)})"


class _PreparedHere:
    """What one database session has prepared, and how often statements went missing."""

    def __init__(self, raw: Any) -> None:
        self.raw = weakref.ref(raw)
        self.uses: dict[str, int] = {}
        self.ready: set[str] = set()
        self.misses = 0
        self.execute_sql: dict[Prepared, str] = {}


def _session_state(connection: Any) -> _PreparedHere:
    state: _PreparedHere | None = getattr(connection, "_exclusive_jobs_prepared", None)
    if state is None or state.raw() is not connection.connection:
        state = _PreparedHere(connection.connection)
        connection._exclusive_jobs_prepared = state
    return state


def _execute_prepared(connection: Any, cursor: Any, prepared: Prepared, params: list[Any]) -> bool:
    """Run ``prepared`` on ``cursor`` if that is worth it and safe; False to run it plainly.

    Only in autocommit outside any atomic block: there a failed EXECUTE is just an error,
    not an aborted transaction. Not with ``server_side_binding``: psycopg prepares by
    itself there, and an EXECUTE cannot take server-side parameters.
    """
    if (
        not connection.autocommit
        or connection.in_atomic_block
        or connection.settings_dict.get("OPTIONS", {}).get("server_side_binding")
        or not app_settings.PREPARE_STATEMENTS
    ):
        return False
    state = _session_state(connection)
    if state.misses >= MAX_MISSES:
        return False
    name = prepared.name
    if name not in state.ready:
        uses = state.uses[name] = state.uses.get(name, 0) + 1
        if uses < PREPARE_AFTER:
            return False
        try:
            cursor.execute(prepared.prepare_sql)
        except connection.Database.Error as exc:
            if _sqlstate(exc) != _ALREADY_THERE:  # same name, so the same statement
                state.misses = MAX_MISSES  # the server will not prepare: stop asking
                return False
        state.ready.add(name)
    execute_sql = state.execute_sql.get(prepared)
    if execute_sql is None:
        execute_sql = state.execute_sql[prepared] = _execute_sql(connection, prepared)
    try:
        cursor.execute(execute_sql, [params[index] for index in prepared.varying])
    except connection.Database.Error as exc:
        if _sqlstate(exc) not in _MISSING:
            raise
        state.ready.discard(name)
        state.uses[name] = 0
        state.misses += 1
        if _sqlstate(exc) == "0A000":  # the old plan is useless now: drop it
            with suppress(connection.Database.Error):
                cursor.execute(f"DEALLOCATE {name}")
        return False
    return True


def _sqlstate(exc: BaseException) -> str | None:
    code = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    return str(code) if code else None

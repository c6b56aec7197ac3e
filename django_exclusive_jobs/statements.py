"""The lock's hot statements: built by the ORM once, then run with new values each time.

Building a query through the ORM costs more CPU than the indexed statement it sends, and
with ten servers on two cores that CPU is what they queue for. So each hot statement
(take, renew, release, and the read that follows a take where there is no ``RETURNING``)
is compiled once per shape with placeholder values, and every call binds its own. The
SQL still comes from the ORM: ``DatabaseNow``, quoting and interval arithmetic.

Two more savings, each used only where it cannot change what a statement does:

* **PostgreSQL.** A statement run a few times on one connection is prepared under a name
  that is a hash of its text, and executed by that name (see ``pgprepared``).
* **MariaDB and MySQL.** The statement's text is rendered once per session with its
  constant values quoted, and sent without a cursor (see ``mysqlquery``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import Field
from django.db.models.sql import UpdateQuery

from . import mysqlquery, pgprepared
from .pgprepared import Prepared

if TYPE_CHECKING:
    from .models import JobLock, JobLockQuerySet

# Placeholders the ORM compiles into a statement once; each call binds real values.
NAME = "\x00exclusive-jobs-name\x00"
TOKEN = -7_770_000_000_001
THREAD = -7_770_000_000_002
_SLOT_NAMES = {NAME: "name", TOKEN: "token", THREAD: "thread"}

Converters = dict[int, tuple[list[Any], Any]]
Rows = list[tuple[Any, ...]]


@dataclass(frozen=True)
class Compiled:
    """A statement built by the ORM once, with the positions of its varying parameters."""

    sql: str
    params: tuple[Any, ...]
    slots: dict[Any, int]
    returning: bool
    name_again: bool = False  # the name is bound once more at the end
    insert_id: bool = False  # MySQL: the one row returned is (the LAST_INSERT_ID() it set,)
    or_holder: bool = False  # PostgreSQL: (won, *returning), with a row of NULLs when held
    converters: Converters = field(default_factory=dict)
    prepared: Prepared | None = None
    mysql_query: bool = False  # sent by ``mysqlquery`` (mysqlclient's connection)

    @functools.cached_property
    def varying(self) -> tuple[int, ...]:
        """The positions of the name, token and thread among the parameters, in order."""
        return _varying(self.slots)

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
    insert_id: bool = False,
    connection: Any = None,
) -> Compiled | None:
    """Compile ``queryset.update(**values)`` once per shape; None if it cannot be reused.

    On PostgreSQL, and SQLite from 3.35, the statement returns the ``returning`` columns
    of the changed row. On PostgreSQL ``or_holder`` adds a row of NULLs when the row
    exists but it changed nothing, so a lost race is told from a missing row in one round
    trip. With ``insert_id`` (MariaDB and MySQL, whose UPDATE returns no rows) it returns
    the value the statement gave ``LAST_INSERT_ID()``. ``connection`` is
    ``connections[alias]`` when the caller has it already.
    """
    if connection is None:
        connection = connections[alias]

    def make() -> Compiled | None:
        queryset, values = build()
        query = queryset.query.chain(UpdateQuery)
        assert isinstance(query, UpdateQuery)
        query.add_update_values(values)
        sql, params = query.get_compiler(alias).as_sql()
        vendor = connection.vendor
        wants_rows = bool(returning) and (
            vendor == "postgresql"
            or (vendor == "sqlite" and connection.features.can_return_columns_from_insert)
        )
        name_again = False
        holder_row = or_holder and vendor == "postgresql"
        converters: Converters = {}
        if wants_rows and vendor != "postgresql":
            # SQLite returns times as text: convert them as the ORM's own read would.
            model = queryset.model

            def read() -> Any:
                return model._default_manager.filter(name=NAME).values_list(*returning)

            converters = _compile_select(alias, read)[2]
        if wants_rows:
            qn = connection.ops.quote_name
            columns = ", ".join(qn(column(queryset.model, name)) for name in returning)
            sql = f"{sql} RETURNING {columns}"
            if holder_row:
                assert returning == ["token", "acquired_at", "expires_at"]
                table = qn(queryset.model._meta.db_table)
                # A losing server learns only that the row exists: who holds it is read
                # when somebody asks (LockHeld, run_exclusive's skip line).
                sql = (
                    f"WITH taken AS ({sql}) "
                    f"SELECT true, {columns} FROM taken UNION ALL "
                    f"SELECT false, NULL, NULL, NULL "
                    f"FROM {table} WHERE {qn('name')} = %s AND NOT EXISTS (SELECT 1 FROM taken)"
                )
                name_again = True
        slots = placeholder_slots(params)
        if slots is None:
            return None
        return Compiled(
            sql,
            tuple(params),
            slots,
            wants_rows or insert_id,
            name_again,
            insert_id,
            holder_row,
            converters,
            _preparable(vendor, sql, params, slots, name_again),
            mysqlquery.usable(connection),
        )

    return _cached((alias, connection.vendor, "update", *key), make)


def compile_select(
    alias: str, key: tuple[Any, ...], build: Callable[[], Any], connection: Any = None
) -> Compiled | None:
    """Compile the first row of ``build()`` (a values_list queryset) once per shape."""
    if connection is None:
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
            prepared=_preparable(connection.vendor, sql, params, slots, False),
            mysql_query=mysqlquery.usable(connection),
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


def _preparable(
    vendor: str, sql: str, params: Any, slots: dict[Any, int], name_again: bool
) -> Prepared | None:
    return pgprepared.preparable(vendor, sql, params, _varying(slots), slots[NAME], name_again)


def _varying(slots: dict[Any, int]) -> tuple[int, ...]:
    return tuple(sorted(slots.values()))


# --- running --------------------------------------------------------------------------


def run_compiled(
    alias: str, compiled: Compiled, /, connection: Any = None, **values: Any
) -> tuple[int, list[tuple[Any, ...]]]:
    """Execute a compiled statement; return its row count and any rows it returned.

    It runs as a prepared statement on PostgreSQL (``pgprepared``), as one query without a
    cursor on MariaDB and MySQL (``mysqlquery``), on the backend's own cursor elsewhere;
    errors are still translated into Django's. That saves a good part of what a lock
    costs beyond the SQL. Whenever someone watches the connection (an
    ``execute_wrapper``, DEBUG's query log), it goes through Django's cursor so they see
    the statement as the ORM built it. ``connection`` is ``connections[alias]`` when
    the caller has it already.
    """
    if connection is None:
        connection = connections[alias]
    params = compiled.bind(**values)
    if connection.execute_wrappers or connection.queries_logged:
        with connection.cursor() as cursor:
            cursor.execute(compiled.sql, params)
            count, rows = _results(cursor, compiled)
    else:
        connection.ensure_connection()
        with connection.wrap_database_errors:
            done = None
            if compiled.prepared is not None:
                done = pgprepared.run(
                    connection, compiled.prepared, compiled.params, params, compiled.returning
                )
            elif compiled.mysql_query:
                done = mysqlquery.run(
                    connection,
                    compiled.sql,
                    compiled.params,
                    compiled.varying,
                    params,
                    compiled.insert_id,
                )
            if done is None:
                cursor = connection.create_cursor()
                try:
                    cursor.execute(compiled.sql, params)
                    done = _results(cursor, compiled)
                finally:
                    cursor.close()
            count, rows = done
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
    if compiled.insert_id:
        return cursor.rowcount, [(cursor.lastrowid,)]
    rows = list(cursor.fetchall()) if compiled.returning else []
    return cursor.rowcount, rows  # after the rows: SQLite counts a RETURNING's rows then

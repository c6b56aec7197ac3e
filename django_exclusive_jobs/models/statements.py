"""The history's statements that every start makes, sent through Django's cursor.

A start reads the job's pause and its slot's newest run, writes its run row, and at the
end writes how the run ended; it also closes runs abandoned by earlier holders. Written
with the ORM, each of these built and compiled its query anew on every call: 400 to 540
µs of the process's CPU each, against 120 to 300 µs for the same SQL through the cursor
(docs: Performance). Here they are the ORM's own statements, written from the model's
fields: each value is converted as the ORM converts it (``get_db_prep_save``, and
``get_db_prep_value`` for a comparison), and a row read back is a model instance, its
values converted as a queryset converts them (the backend's and the field's converters).
Everything else about runs stays on the ORM.

================  ===================================================================
``first``         ``SELECT`` the model's columns ``WHERE ... ORDER BY ... LIMIT 1``,
                  and whether any row meets other conditions (``EXISTS``), if asked
``first_beside``  the same, and beside it one row of another table (both joined to
                  one row, so each is read without the other): a start's look at its
                  slot's newest run, with the job's operator row
``insert``        ``INSERT`` every column but the primary key; its id from
                  ``RETURNING`` (PostgreSQL, SQLite, MariaDB), else from the cursor
``update``        ``UPDATE ... SET ... WHERE ...``; the number of rows it matched
================  ===================================================================

A value may be :class:`Sql`: text written into the statement as it is, with its own
parameters (the database's clock, ``started_at`` plus a duration).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.db.models import Model

from ..lock.clock import DatabaseNow, now_sql

Where = Sequence[tuple[str, str, Any]]  # (field, operator, value); ("slot", "IS NULL", None)


@dataclass(frozen=True)
class Sql:
    """A value written as SQL text (``%`` doubled) with its own parameters."""

    text: str
    params: tuple[Any, ...] = ()


def first(
    model: type[Model],
    using: str,
    where: Where,
    order: tuple[str, ...] = (),
    *,
    exists: tuple[str, Where] | None = None,
) -> Any:
    """The first row of ``model`` where each ``(field, operator, value)`` holds, in
    ``order`` (``"-slot"``: descending), or None. ``exists``: (name, conditions), an
    attribute ``name`` on the row read: whether any row of ``model`` (the one read
    included) meets those conditions, asked in the same statement."""
    statement = _Statement(model, using)
    columns = statement.columns(model, exists)
    sql = f"SELECT {columns} FROM {statement.table} WHERE {statement.where(where)}"
    sql += statement.order(order) + " LIMIT 1"
    values = statement.fetch(sql)
    return None if values is None else statement.instance(model, values, exists)


def first_beside(
    model: type[Model],
    using: str,
    where: Where,
    order: tuple[str, ...],
    *,
    exists: tuple[str, Where] | None = None,
    beside: tuple[type[Model], Where],
) -> tuple[Any, Any]:
    """:func:`first`, and in the same statement the row of another model (``beside``: the
    model, and conditions that at most one of its rows meets): (the first row or None,
    that row or None); each is read whether or not the other exists."""
    other, conditions = beside
    statement = _Statement(model, using)
    table, other_table = statement.table, statement.quote(other._meta.db_table)
    columns = statement.columns(model, exists, qualified=True)
    columns += ", " + statement.columns(other, qualified=True)
    joined = statement.where(conditions, qualified=other)
    pk = statement.column("pk")
    newest = f"SELECT {pk} FROM {table} WHERE {statement.where(where)}"
    newest += statement.order(order) + " LIMIT 1"
    one = statement.quote("one")
    sql = (
        f"SELECT {columns} FROM (SELECT 1 AS {one}) {one}"
        f" LEFT JOIN {other_table} ON {joined}"
        f" LEFT JOIN {table} ON {table}.{pk} = ({newest})"
    )
    values = statement.fetch(sql)
    assert values is not None  # the one row: always there
    split = len(model._meta.concrete_fields) + (exists is not None)
    return (
        statement.instance(model, values[:split], exists),
        statement.instance(other, values[split:]),
    )


def insert(row: Model, using: str) -> None:
    """Write ``row`` (a new instance, its primary key automatic) and set its id. A field
    given ``DatabaseNow()`` keeps that expression on the instance (read the row again
    for its value), as ``save()`` did before Django 6.0."""
    statement = _Statement(type(row), using)
    meta, connection = row._meta, statement.connection
    fields = [field for field in meta.concrete_fields if not field.primary_key]
    columns = ", ".join(statement.quote(field.column) for field in fields)
    values = ", ".join(statement.value(field, field.pre_save(row, True)) for field in fields)
    sql = f"INSERT INTO {statement.table} ({columns}) VALUES ({values})"
    returning = connection.features.can_return_columns_from_insert
    if returning:
        sql += f" RETURNING {statement.column('pk')}"
    with connection.cursor() as cursor:
        cursor.execute(sql, statement.params)
        if returning:
            row.pk = cursor.fetchone()[0]
        else:
            row.pk = connection.ops.last_insert_id(
                cursor, meta.db_table, statement.field("pk").column
            )
    row._state.adding, row._state.db = False, using


def update(model: type[Model], using: str, values: dict[str, Any], where: Where) -> int:
    """Set ``values`` (field: value) on the rows of ``model`` where each condition holds;
    how many rows matched (as a queryset's ``update()``: Django asks MySQL for the rows
    found, not only those changed)."""
    statement = _Statement(model, using)
    meta = model._meta
    sets = ", ".join(
        f"{statement.column(name)} = {statement.value(meta.get_field(name), value)}"
        for name, value in values.items()
    )
    conditions = statement.where(where)
    sql = f"UPDATE {statement.table} SET {sets} WHERE {conditions}"
    with statement.connection.cursor() as cursor:
        cursor.execute(sql, statement.params)
        return int(cursor.rowcount)


class _Statement:
    """One statement's text being built for ``model``, and its parameters in order."""

    def __init__(self, model: type[Model], using: str) -> None:
        self.meta = model._meta
        self.connection = connections[using]
        self.table = self.quote(self.meta.db_table)
        self.params: list[Any] = []

    def quote(self, name: Any) -> str:
        return str(self.connection.ops.quote_name(name))

    def field(self, name: str, model: type[Model] | None = None) -> Any:
        """The field ``name`` ("pk": the primary key) of ``model``, else of this one."""
        meta = model._meta if model is not None else self.meta
        return meta.pk if name == "pk" else meta.get_field(name)

    def column(self, name: str) -> str:
        return self.quote(self.field(name).column)

    def value(self, field: Any, value: Any) -> str:
        """``%s`` with the value converted for a write, or the text of an SQL value."""
        if isinstance(value, DatabaseNow):
            value = Sql(now_sql(self.connection.vendor))
        if isinstance(value, Sql):
            self.params.extend(value.params)
            return value.text
        if hasattr(value, "resolve_expression"):  # an F(), a Value(): not written here
            raise TypeError(f"rows: {value!r} for {field.name} is not a value or Sql")
        self.params.append(field.get_db_prep_save(value, self.connection))
        return "%s"

    def columns(
        self,
        model: type[Model],
        exists: tuple[str, Where] | None = None,
        *,
        qualified: bool = False,
    ) -> str:
        """Every column of ``model`` (with its table's name: ``qualified``), and the
        ``EXISTS`` asked for, as ``name``."""
        prefix = self.quote(model._meta.db_table) + "." if qualified else ""
        columns = ", ".join(
            self.read(f, prefix + self.quote(f.column)) for f in model._meta.concrete_fields
        )
        if exists is not None:
            attribute, conditions = exists
            found = f"SELECT 1 FROM {self.table} WHERE {self.where(conditions)}"
            columns += f", EXISTS({found}) AS {self.quote(attribute)}"
        return columns

    def read(self, field: Any, column: str) -> str:
        """``column`` as the ORM selects it: a pause's end through its range check
        (``models.PauseEndField``), any other column as it is."""
        from .fields import PauseEndField, in_range_sql

        if isinstance(field, PauseEndField):
            return in_range_sql(self.connection.vendor, column)
        return column

    def order(self, order: tuple[str, ...]) -> str:
        if not order:
            return ""
        sorts = (self.column(key.lstrip("-")) + " DESC" * key.startswith("-") for key in order)
        return " ORDER BY " + ", ".join(sorts)

    def fetch(self, sql: str) -> tuple[Any, ...] | None:
        """The first row ``sql`` reads, as the driver gives it."""
        with self.connection.cursor() as cursor:
            cursor.execute(sql, self.params)
            found: tuple[Any, ...] | None = cursor.fetchone()
            return found

    def instance(
        self, model: type[Model], values: tuple[Any, ...], exists: tuple[str, Where] | None = None
    ) -> Any:
        """The row of ``model`` in ``values`` (its columns, then the ``EXISTS``), each
        value converted as a queryset converts it; None if it has no primary key (no row
        was joined)."""
        meta = model._meta
        fields = meta.concrete_fields
        if values[fields.index(meta.pk)] is None:
            return None
        converted = []
        for field, value in zip(fields, values, strict=False):
            column = field.get_col(meta.db_table)
            for convert in (
                *self.connection.ops.get_db_converters(column),
                *column.get_db_converters(self.connection),
            ):
                value = convert(value, column, self.connection)
            converted.append(value)
        row = model.from_db(self.connection.alias, [f.attname for f in fields], converted)
        if exists is not None:
            setattr(row, exists[0], bool(values[len(fields)]))
        return row

    def where(self, where: Where, *, qualified: type[Model] | None = None) -> str:
        """The conditions as SQL, their values added to the parameters; on the columns
        of the model ``qualified`` (named with its table) if given, else of this one."""
        prefix = self.quote(qualified._meta.db_table) + "." if qualified is not None else ""
        conditions = []
        for name, operator, value in where:
            field = self.field(name, qualified)
            column = prefix + self.quote(field.column)
            if operator == "IS NULL":
                conditions.append(f"{column} IS NULL")
                continue
            if value is None:  # "= NULL" never holds
                raise ValueError(f"rows: compare {name} with (name, 'IS NULL', None)")
            self.params.append(field.get_db_prep_value(value, self.connection))
            conditions.append(f"{column} {operator} %s")
        return " AND ".join(conditions)

"""The history's statements that every start makes, sent through Django's cursor.

A start reads the job's pause and its slot's newest run, writes its run row, and at the
end writes how the run ended; it also closes runs abandoned by earlier holders. Written
with the ORM, each of these built and compiled its query anew on every call: 400 to 540
µs of the process's CPU each, against 120 to 300 µs for the same SQL through the cursor
(docs: Performance). Here they are the ORM's own statements, written from the model's
fields: each value is converted as the ORM converts it (``get_db_prep_save``, and
``get_db_prep_value`` for a comparison), and the row read back is a model instance.
Everything else about runs stays on the ORM.

===========  ========================================================================
``first``    ``SELECT`` the model's columns ``WHERE ... ORDER BY ... LIMIT 1``, and
             whether any row meets other conditions (``EXISTS``), if asked
``insert``   ``INSERT`` every column but the primary key; its id from ``RETURNING``
             (PostgreSQL, SQLite, MariaDB), else from the cursor (MySQL)
``update``   ``UPDATE ... SET ... WHERE ...``; the number of rows it matched
===========  ========================================================================

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
    ``order`` (``"-slot"``: descending), or None (``Model.objects.raw``, which converts
    what it reads as a queryset does). ``exists``: (name, conditions), an attribute
    ``name`` on the row read: whether any row of ``model`` (the one read included) meets
    those conditions, asked in the same statement."""
    statement = _Statement(model, using)
    columns = ", ".join(statement.quote(field.column) for field in model._meta.concrete_fields)
    if exists is not None:
        attribute, conditions = exists
        found = f"SELECT 1 FROM {statement.table} WHERE {statement.where(conditions)}"
        columns += f", EXISTS({found}) AS {statement.quote(attribute)}"
    sql = f"SELECT {columns} FROM {statement.table} WHERE {statement.where(where)}"
    if order:
        sorts = (statement.column(key.lstrip("-")) + " DESC" * key.startswith("-") for key in order)
        sql += " ORDER BY " + ", ".join(sorts)
    rows = model._default_manager.using(using).raw(f"{sql} LIMIT 1", statement.params)
    return next(iter(rows), None)


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

    def field(self, name: str) -> Any:
        return self.meta.pk if name == "pk" else self.meta.get_field(name)

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

    def where(self, where: Where) -> str:
        conditions = []
        for name, operator, value in where:
            if operator == "IS NULL":
                conditions.append(f"{self.column(name)} IS NULL")
                continue
            if value is None:  # "= NULL" never holds
                raise ValueError(f"rows: compare {name} with (name, 'IS NULL', None)")
            self.params.append(self.field(name).get_db_prep_value(value, self.connection))
            conditions.append(f"{self.column(name)} {operator} %s")
        return " AND ".join(conditions)

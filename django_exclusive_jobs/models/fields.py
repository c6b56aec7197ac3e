"""The app's own fields: a job's name, byte-exact on every backend, and a pause's end,
read as none when out of range. Migrations name them ``django_exclusive_jobs.models.X``
(their ``deconstruct`` keeps that path)."""

from __future__ import annotations

from typing import Any

from django.db import models

from ..values import EARLIEST, LATEST


class JobNameField(models.CharField):  # type: ignore[type-arg]
    """A job name: case-sensitive and byte-exact on every backend.

    MySQL/MariaDB compare strings case-insensitively by default, so ``Report`` and
    ``report`` would fight over one row there but not on PostgreSQL or SQLite.
    """

    def db_type(self, connection: Any) -> str | None:
        if connection.vendor == "mysql":
            return f"varchar({self.max_length}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
        return super().db_type(connection)

    def deconstruct(self) -> Any:
        name, _path, args, kwargs = super().deconstruct()
        return name, "django_exclusive_jobs.models.JobNameField", args, kwargs


class PauseEndField(models.DateTimeField):  # type: ignore[type-arg]
    """A pause's end, read through SQL that gives NULL for an end outside
    [``values.EARLIEST``, ``values.LATEST``]: the door (``values.moment``) lets in
    nothing else, but a row written by an older version or by SQL may hold one (on
    PostgreSQL a BC or year-10000 timestamp, which the driver cannot even read; on
    SQLite any text). Such an end reads as none: paused until resumed (the pause is kept,
    which is safer than ending it). Compared in SQL, so no statement is added and the
    driver never sees the value; migration 0012 clears those already there."""

    def select_format(self, compiler: Any, sql: str, params: Any) -> tuple[str, Any]:
        sql, params = super().select_format(compiler, sql, params)
        return in_range_sql(compiler.connection.vendor, sql), params

    def deconstruct(self) -> Any:
        name, _path, args, kwargs = super().deconstruct()
        return name, "django_exclusive_jobs.models.PauseEndField", args, kwargs


def in_range_sql(vendor: str, column: str) -> str:
    """``column`` (a pause's end) as SQL that is NULL when the end is out of range."""
    earliest = EARLIEST.strftime("%Y-%m-%d %H:%M:%S")
    latest = LATEST.strftime("%Y-%m-%d %H:%M:%S")
    if vendor == "sqlite":  # text: datetime() is NULL for text that is no time
        checked = f"datetime({column})"
    elif vendor == "postgresql":
        checked, earliest, latest = column, f"{earliest}+00", f"{latest}+00"
    else:
        checked = column
    return f"CASE WHEN {checked} BETWEEN '{earliest}' AND '{latest}' THEN {column} END"

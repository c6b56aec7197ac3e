"""The scheduler's own statements, one round trip each: its beat and its look.

An idle scheduler sends only these (``run/heartbeat.py``). On PostgreSQL the beat
writes its row and reads the live schedulers and the clock in the same statement (a
data-modifying CTE); the scheduler listens for everything else. Where it polls instead
(MariaDB, SQLite, PgBouncer), a *look* every few seconds reads how many requests of its
jobs wait, their operators' overrides and the run-time schedules as text (a change
shows as other text: then the rows are read) and the clock, and the live schedulers
too (``UNION ALL`` rows); on a beat's turn the beat is the look (an upsert with
``RETURNING``: MariaDB 10.5+, SQLite 3.35+; on PostgreSQL the beat's statement carries
it). Every filter here is compiled from its one definition in the models.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.db.models import QuerySet

from ..lock.clock import now_sql
from .jobs import JobState
from .requests import RunRequest
from .runtime_schedules import RunTimeSchedule
from .schedulers import Scheduler, _remembered

Alive = list[tuple[str, Any, int | None]]  # each live scheduler's instance, jobs, free

# The served jobs' overrides as one text, per vendor (name=override, one per line).
OVERRIDES_TEXT = {
    "postgresql": "STRING_AGG(s.name || '=' || CAST(s.override AS TEXT), CHR(10) ORDER BY s.name)",
    "mysql": "GROUP_CONCAT(s.name, '=', s.override ORDER BY s.name SEPARATOR '\\n')",
    "sqlite": "GROUP_CONCAT(s.name || '=' || s.override, CHAR(10))",
}
# The run-time schedules as one short text that any change alters: how many there are
# and the latest change (an added or changed row is the latest; a deleted one, fewer).
ADDED_TEXT = {
    "postgresql": "COUNT(*) || '@' || COALESCE(CAST(MAX(a.changed_at) AS TEXT), '')",
    "mysql": "CONCAT(COUNT(*), '@', COALESCE(MAX(a.changed_at), ''))",
    "sqlite": "COUNT(*) || '@' || COALESCE(MAX(a.changed_at), '')",
}
# Both in one column: the overrides' text (none: empty), then the schedules'.
JOINED = {
    "postgresql": "COALESCE({0}, '') || CHR(10) || {1}",
    "mysql": "CONCAT(COALESCE({0}, ''), '\\n', {1})",
    "sqlite": "COALESCE({0}, '') || CHAR(10) || {1}",
}


@dataclass(frozen=True)
class Look:
    """What a look read: requests waiting, the overrides' text, the time, the live list."""

    waiting: int
    overrides: str
    at: Any  # the database's time, as the driver read it
    alive: Alive | None = None  # None: not read by this look (a beat's)


def _compiled(queryset: QuerySet[Any]) -> tuple[str, tuple[Any, ...]]:
    sql, params = queryset.query.get_compiler(using=queryset.db).as_sql()
    return sql, tuple(params)


def _quoted(using: str) -> tuple[str, dict[str, str]]:
    qn = connections[using].ops.quote_name
    meta = Scheduler._meta
    return qn(meta.db_table), {f.name: qn(f.column or f.name) for f in meta.concrete_fields}


def beat_and_read(
    using: str, instance: str, free: int | None, names: list[str], *, forget: bool = False
) -> tuple[int, Alive, Look]:
    """PostgreSQL: the beat of ``instance``, the live schedulers and a look for what
    changed for the jobs ``names`` in one statement: how many rows the beat changed (0:
    it has no row yet), each live row's instance, jobs and free as before the beat, and
    the look (without the live list). The look is the listening scheduler's safety net:
    a row written without a NOTIFY (by hand, by SQL) is seen within a beat.
    ``forget``: also delete the forgotten rows."""
    rows = Scheduler.objects.using(using)
    looked, looked_params = _looked_for(using, names)
    now = now_sql("postgresql")
    table, column = _quoted(using)
    alive, alive_params = _compiled(rows.alive().values("instance", "jobs", "free"))
    deleted, old_params = "", ()
    if forget:
        old, old_params = _compiled(rows.exclude(_remembered()).values("pk"))
        deleted = f", gone AS (DELETE FROM {table} WHERE {column['id']} IN ({old}))"
    sql = (
        f"WITH beat AS (UPDATE {table} SET {column['last_beat_at']} = {now}, "
        f"{column['free']} = %s WHERE {column['instance']} = %s RETURNING 1)"
        f"{deleted} "
        f"SELECT (SELECT COUNT(*) FROM beat), "
        f"(SELECT COALESCE(JSON_AGG(alive), '[]') FROM ({alive}) alive), {looked}"
    )
    params = [free, instance, *old_params, *alive_params, *looked_params]
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        changed, found, waiting, overrides, at = cursor.fetchone()
    found = json.loads(found) if isinstance(found, str) else found
    live: Alive = [(r["instance"], r["jobs"], r["free"]) for r in found]
    return changed, live, Look(int(waiting), overrides or "", at)


def _looked_for(using: str, names: list[str]) -> tuple[str, tuple[Any, ...]]:
    """The look's three columns as SQL: waiting requests, the overrides' text (with the
    run-time schedules' after it), now."""
    vendor = connections[using].vendor
    waiting, waiting_params = _compiled(
        RunRequest.objects.using(using).waiting_for(names).order_by().values("id")
    )
    states, states_params = _compiled(
        JobState.objects.using(using).of_jobs(names).order_by("name").values("name", "override")
    )
    added, added_params = _compiled(
        RunTimeSchedule.objects.using(using).order_by().values("changed_at")
    )
    text = JOINED[vendor].format(
        f"(SELECT {OVERRIDES_TEXT[vendor]} FROM ({states}) s)",
        f"(SELECT {ADDED_TEXT[vendor]} FROM ({added}) a)",
    )
    sql = f"(SELECT COUNT(*) FROM ({waiting}) w), {text}, {now_sql(vendor)}"
    return sql, waiting_params + states_params + added_params


def look(using: str, names: list[str]) -> Look:
    """One statement: what waits for these jobs, their overrides, the time, and the
    live schedulers, one row each after the first."""
    looked, params = _looked_for(using, names)
    rows = Scheduler.objects.using(using).alive().values("instance", "jobs", "free")
    live, live_params = _compiled(rows)
    sql = (
        f"SELECT {looked}, NULL, NULL, NULL UNION ALL SELECT NULL, NULL, NULL, a.* FROM ({live}) a"
    )
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params + live_params)
        first, *others = cursor.fetchall()
    jobs = Scheduler._meta.get_field("jobs")
    connection = connections[using]
    # A UNION's column takes a type of both branches: MariaDB returns free as a decimal.
    found = [
        (instance, jobs.from_db_value(raw, None, connection), _integer(free))  # type: ignore[arg-type]
        for _, _, _, instance, raw, free in others
    ]
    return Look(int(first[0]), first[1] or "", first[2], found)


def _integer(value: Any) -> int | None:
    return None if value is None else int(value)


def beat_and_look(using: str, row: dict[str, Any], names: list[str]) -> Look | None:
    """The beat (``row``: the scheduler's row, written if missing, else its beat and
    free) and the look without the live list, in one statement; None where an upsert
    cannot return (MySQL): the caller beats and looks apart."""
    connection = connections[using]
    if not connection.features.can_return_columns_from_insert:
        return None
    table, column = _quoted(using)
    now = now_sql(connection.vendor)
    fields = [f for f in Scheduler._meta.concrete_fields if not f.primary_key]
    names_sql, values, params = [], [], []
    for field in fields:
        names_sql.append(column[field.name])
        if field.name in ("started_at", "last_beat_at"):
            values.append(now)
            continue
        value = row.get(field.name, field.get_default())
        values.append("%s")
        params.append(field.get_db_prep_save(value, connection))
    beat = (column["last_beat_at"], column["free"])
    if connection.vendor == "mysql":
        upsert = "ON DUPLICATE KEY UPDATE " + ", ".join(f"{c} = VALUES({c})" for c in beat)
    else:
        upsert = f"ON CONFLICT ({column['instance']}) DO UPDATE SET " + ", ".join(
            f"{c} = EXCLUDED.{c}" for c in beat
        )
    looked, looked_params = _looked_for(using, names)
    sql = (
        f"INSERT INTO {table} ({', '.join(names_sql)}) VALUES ({', '.join(values)}) "
        f"{upsert} RETURNING {looked}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, *looked_params])
        waiting, overrides, at = cursor.fetchone()
    return Look(int(waiting), overrides or "", at)

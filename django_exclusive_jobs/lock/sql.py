"""The lock protocol: every statement the lock sends, and what each one decides.

All of them run through Django's cursor, so execute wrappers, the query log and database
instrumentation see them. ``now`` is the database's clock (``clock.now_sql``); a lease is
open while ``expires_at > now``. The row of a name is created once and kept for ever so
that its token only grows: free, ahead of its first take, for a declared job
(``prepare_locks``); by the ORM's ``get_or_create`` at the first take of any other name
(``acquire.py``).

=======  ===============================================  =================================
take     UPDATE ... WHERE name AND lease over              a changed row: the lock is ours
read     SELECT ... WHERE name                             who holds it, or no row yet
renew    UPDATE ... WHERE our token, not released, open    extended; no row: we lost it
release  UPDATE ... WHERE our token, not released          freed (kept until min_hold)
check    SELECT ... WHERE our token, not released, open    still ours?
=======  ===============================================  =================================

Taking a lock is one statement on PostgreSQL and SQLite (``UPDATE ... RETURNING``). On
PostgreSQL the same statement returns the holder's row when the take changes nothing, so
a server that skips also needs one round trip; it reads again only when its statement
raced another take and saw the row as it was before. SQLite reads the row after a take
that changed nothing. MySQL and MariaDB have no ``RETURNING``: the row count says who
won, and the read gives the new row or the holder's.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

from django.conf import settings

from ..naming import holder_name
from .clock import now_sql, plus_seconds_sql, to_datetime

COLUMNS = "token, host, pid, instance, thread, acquired_at, expires_at, released_at"


class Identity(NamedTuple):
    """Who takes a lock: this process and thread, as the take writes it into the row."""

    host: str
    pid: int
    instance: str
    thread: int


@dataclass(frozen=True)
class Row:
    """A lock's row as the statements read it."""

    token: int
    host: str
    pid: int | None
    instance: str
    thread: int | None
    acquired_at: dt.datetime | None
    expires_at: dt.datetime | None
    released_at: dt.datetime | None

    @classmethod
    def of(cls, connection: Any, values: Any) -> Row | None:
        if values is None:
            return None
        token, host, pid, instance, thread, *times = values
        acquired_at, expires_at, released_at = (to_datetime(connection, t) for t in times)
        return cls(token, host, pid, instance, thread, acquired_at, expires_at, released_at)

    def taken_by(self, me: Identity) -> bool:
        """Taken by ``me`` (this process and thread) and not released."""
        return (self.instance, self.thread, self.released_at) == (me.instance, me.thread, None)

    @property
    def holder(self) -> str:
        """Who holds (or last held) the lock: ``host:pid:instance``."""
        return holder_name(self.host, self.pid, self.instance)


@functools.lru_cache(maxsize=16)
def _statements(vendor: str, table: str, use_tz: bool) -> dict[str, str]:
    now = now_sql(vendor)
    ttl_from_now = plus_seconds_sql(vendor, now)
    min_hold_from_start = plus_seconds_sql(vendor, "acquired_at")
    greatest = "MAX" if vendor == "sqlite" else "GREATEST"
    returning = vendor != "mysql"
    mine = "name = %s AND token = %s AND released_at IS NULL"
    take = (
        f"UPDATE {table} SET token = token + 1, host = %s, pid = %s, instance = %s, "
        f"thread = %s, acquired_at = {now}, expires_at = {ttl_from_now}, released_at = NULL "
        f"WHERE name = %s AND (expires_at IS NULL OR expires_at <= {now})"
    )
    if vendor == "postgresql":
        # PostgreSQL: the take, or else the holder's row, in one round trip. The second
        # column ("open") is not true when the row we see is the one as it was before
        # another take that our statement waited on: then the holder is read again.
        take = (
            f"WITH taken AS ({take} RETURNING {COLUMNS}) "
            f"SELECT TRUE, TRUE, {COLUMNS} FROM taken UNION ALL "
            f"SELECT FALSE, expires_at > {now}, {COLUMNS} FROM {table} "
            "WHERE name = %s AND NOT EXISTS (SELECT 1 FROM taken)"
        )
    elif returning:
        take += f" RETURNING {COLUMNS}"
    return {
        # Ours if the lease is over (or the row was never held): the row changes.
        "take": take,
        # Who holds the lock now; no row: the name was never taken.
        "read": f"SELECT {COLUMNS} FROM {table} WHERE name = %s",
        # Still ours and still open: extend the lease; no row means we lost it.
        "renew": f"UPDATE {table} SET expires_at = {ttl_from_now} "
        f"WHERE {mine} AND expires_at > {now}" + (" RETURNING expires_at" if returning else ""),
        # Ours: free it, but keep it closed until acquired_at + min_hold.
        "release": f"UPDATE {table} SET released_at = {now}, "
        f"expires_at = {greatest}({now}, {min_hold_from_start}) WHERE {mine}",
        # Ours and open? (a read; nothing changes)
        "check": f"SELECT expires_at FROM {table} WHERE {mine} AND expires_at > {now}",
    }


class Statements:
    """The protocol's statements on one connection (its vendor's SQL)."""

    def __init__(self, connection: Any) -> None:
        from ..models import JobLock  # models: not before apps are ready

        self.connection = connection
        self.returning = connection.vendor != "mysql"
        table = connection.ops.quote_name(JobLock._meta.db_table)
        self.sql = _statements(connection.vendor, table, settings.USE_TZ)

    def take(self, name: str, ttl: float, me: Identity) -> tuple[bool, Row | None]:
        """(True, our row) if we took the lock, else (False, the holder's row or None)."""
        with self.connection.cursor() as cursor:
            if self.connection.vendor == "postgresql":
                return self._take_postgresql(cursor, name, ttl, me)
            cursor.execute(self.sql["take"], [*me, ttl, name])
            if self.returning:  # SQLite: our row, or nothing and a read of the holder's
                ours = Row.of(self.connection, cursor.fetchone())
                return (True, ours) if ours is not None else (False, self._read(cursor, name))
            # MySQL/MariaDB: the row count says whether we took it; the read gives the row,
            # which may already be a later holder's if our lease ended in between.
            taken = cursor.rowcount == 1
            row = self._read(cursor, name)
            return bool(taken and row is not None and row.taken_by(me)), row

    def _take_postgresql(
        self, cursor: Any, name: str, ttl: float, me: Identity
    ) -> tuple[bool, Row | None]:
        cursor.execute(self.sql["take"], [*me, ttl, name, name])
        found = cursor.fetchone()
        if found is None:
            return False, None
        won, open_, *values = found
        if won or open_:
            return bool(won), Row.of(self.connection, values)
        # Our statement waited on another take and saw the row as it was before: read
        # who won.
        return False, self._read(cursor, name)

    def _read(self, cursor: Any, name: str) -> Row | None:
        cursor.execute(self.sql["read"], [name])
        return Row.of(self.connection, cursor.fetchone())

    def read(self, name: str) -> Row | None:
        with self.connection.cursor() as cursor:
            cursor.execute(self.sql["read"], [name])
            return Row.of(self.connection, cursor.fetchone())

    def renew(self, name: str, token: int, ttl: float) -> dt.datetime | None:
        """The new end of the lease, or None when the lease is no longer ours."""
        with self.connection.cursor() as cursor:
            cursor.execute(self.sql["renew"], [ttl, name, token])
            if self.returning:
                found = cursor.fetchone()
                return to_datetime(self.connection, found[0]) if found else None
            if cursor.rowcount != 1:
                return None
            cursor.execute(self.sql["check"], [name, token])
            found = cursor.fetchone()
        return to_datetime(self.connection, found[0]) if found else None

    def release(self, name: str, token: int, min_hold: float) -> bool:
        """True if our row was freed; False if it was no longer ours."""
        with self.connection.cursor() as cursor:
            cursor.execute(self.sql["release"], [min_hold, name, token])
            return bool(cursor.rowcount == 1)

    def check(self, name: str, token: int) -> bool:
        with self.connection.cursor() as cursor:
            cursor.execute(self.sql["check"], [name, token])
            return cursor.fetchone() is not None

"""The database's clock, used for every lease decision.

App servers' clocks may disagree by minutes; the database server has one clock, so every
expiry is written and compared in SQL against it, never against ``timezone.now()``.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from django.conf import settings
from django.db import connections
from django.db.models import (
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    FloatField,
    Func,
    Value,
)
from django.db.models.expressions import Combinable
from django.db.models.functions import Now


def now_sql(vendor: str) -> str:
    """The database's current time as SQL text (``%`` doubled: it is sent with parameters).

    PostgreSQL: the statement's time, not the transaction's. MySQL/MariaDB: UTC when
    ``USE_TZ`` (Django stores UTC; CURRENT_TIMESTAMP is the session's zone). SQLite:
    milliseconds (CURRENT_TIMESTAMP has whole seconds).
    """
    if vendor == "postgresql":
        return "STATEMENT_TIMESTAMP()"
    if vendor == "mysql":
        return "UTC_TIMESTAMP(6)" if settings.USE_TZ else "CURRENT_TIMESTAMP(6)"
    return "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')"


def plus_seconds_sql(vendor: str, time: str) -> str:
    """``time + %s seconds`` as SQL text; the parameter is a float number of seconds."""
    if vendor == "postgresql":
        return f"{time} + MAKE_INTERVAL(secs => %s)"
    if vendor == "mysql":
        return f"{time} + INTERVAL ROUND(%s * 1000000) MICROSECOND"
    if time == now_sql(vendor):
        time = "'NOW'"
    return f"STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', {time}, '+' || %s || ' seconds')"


def to_datetime(connection: Any, value: Any) -> dt.datetime | None:
    """A time read by a plain cursor, as the ORM would return it (aware when USE_TZ)."""
    if value is None:
        return None
    convert = getattr(connection.ops, "convert_datetimefield_value", None)
    if convert is not None:  # SQLite returns text, MySQL naive UTC
        value = convert(value, None, connection)
    return value  # type: ignore[no-any-return]


class DatabaseNow(Now):
    """``Now()`` on the database's clock, for querysets (the same SQL as :func:`now_sql`)."""

    def as_sql(
        self,
        compiler: Any,
        connection: Any,
        function: str | None = None,
        template: str | None = None,
        arg_joiner: str | None = None,
        **extra_context: Any,
    ) -> Any:
        # Percent signs stay doubled: queryset SQL is always sent with parameters.
        return now_sql(connection.vendor), []

    def as_sqlite(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(compiler, connection)

    def as_mysql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(compiler, connection)

    def as_postgresql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(compiler, connection)


def now_plus(delta: dt.timedelta) -> Combinable:
    """``database now + delta`` as a queryset expression."""
    return ExpressionWrapper(
        DatabaseNow() + Value(delta, output_field=DurationField()),
        output_field=DateTimeField(),
    )


class SecondsBetween(Func):
    """``end - start`` in seconds, as a float, for two datetime columns (native SQL on each
    backend: a comparison or a sum over a million rows calls no Python function)."""

    output_field = FloatField()
    arity = 2

    def __init__(self, start: Any, end: Any) -> None:
        super().__init__(start, end)

    def as_sql(
        self,
        compiler: Any,
        connection: Any,
        function: str | None = None,
        template: str | None = None,
        arg_joiner: str | None = None,
        **extra_context: Any,
    ) -> Any:
        start, start_params = compiler.compile(self.source_expressions[0])
        end, end_params = compiler.compile(self.source_expressions[1])
        if connection.vendor == "postgresql":
            sql = f"CAST(EXTRACT(EPOCH FROM ({end} - {start})) AS DOUBLE PRECISION)"
        elif connection.vendor == "mysql":
            sql = f"(TIMESTAMPDIFF(MICROSECOND, {start}, {end}) / 1000000.0)"
        else:
            sql = f"((JULIANDAY({end}) - JULIANDAY({start})) * 86400.0)"
        # The end comes first in the PostgreSQL and SQLite text, the start in MySQL's.
        first_end = connection.vendor != "mysql"
        params = [*end_params, *start_params] if first_end else [*start_params, *end_params]
        return sql, params


def database_now(using: str) -> dt.datetime:
    """Read the database server's current time (one query)."""
    connection = connections[using]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {now_sql(connection.vendor)}", [])
        value = cursor.fetchone()[0]
    return database_time(connection, value)


def database_time(connection: Any, value: Any) -> dt.datetime:
    """The database's time as a statement read it, aware when ``USE_TZ``."""
    now = to_datetime(connection, value)
    assert now is not None
    if settings.USE_TZ and now.tzinfo is None:
        now = now.replace(tzinfo=dt.UTC)
    return now


class DatabaseClock:
    """The database's time, read once and then followed on this machine's monotonic clock.

    For a long-running process that must act at instants of database time (the
    scheduler): one query per :meth:`sync`, none per :meth:`now`. Call :meth:`sync`
    again now and then; the local clock's rate drifts a little, its offset does not
    matter (a server an hour off is as good as one that is right).
    """

    def __init__(self, using: str) -> None:
        self.using = using
        self._base: dt.datetime | None = None  # database time at monotonic() == 0
        self.offset = 0.0  # database time minus this server's wall clock, in seconds
        self.synced_at = float("-inf")  # monotonic time of the last sync

    def sync(self) -> None:
        """Read the database's time (one query) and follow it from here."""
        before = time.monotonic()
        wall = time.time()
        now = database_now(self.using)
        self.observe(now, before, time.monotonic(), wall)

    def observe(self, now: dt.datetime, before: float, after: float, wall: float) -> None:
        """Follow the database's time ``now``, read by a statement sent at ``before``
        and answered at ``after`` (monotonic), ``wall`` being this server's clock at
        ``before``: another statement's read of the time (the scheduler's beat on
        PostgreSQL) serves as a sync."""
        middle = (before + after) / 2
        self._base = now - dt.timedelta(seconds=middle)
        self.offset = now.timestamp() - (wall + (after - before) / 2)
        self.synced_at = after

    def now(self) -> dt.datetime:
        """The database's current time, without a query (after the first :meth:`sync`)."""
        if self._base is None:
            self.sync()
        assert self._base is not None
        return self._base + dt.timedelta(seconds=time.monotonic())

    def seconds_until(self, moment: dt.datetime) -> float:
        """How long until ``moment`` on database time (negative once it has passed)."""
        return (moment - self.now()).total_seconds()

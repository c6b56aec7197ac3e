"""The database's clock, used for every lease decision.

App servers' clocks may disagree by minutes; the database server has one clock, so every
expiry is written and compared in SQL against it, never against ``timezone.now()``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.db import connections
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, Value
from django.db.models.expressions import Combinable
from django.db.models.functions import Now


class DatabaseNow(Now):
    """``Now()`` that is right on every backend this app supports.

    Django's ``Now()`` is ``CURRENT_TIMESTAMP(6)`` on MySQL/MariaDB: the *session* time
    zone, which is local time on most servers. With ``USE_TZ`` Django stores UTC, so
    compare against ``UTC_TIMESTAMP(6)`` instead. On SQLite and PostgreSQL the precise
    forms are spelt out so that older Django versions behave the same.
    """

    def as_postgresql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        # The statement's time, not the transaction's (CURRENT_TIMESTAMP), on every
        # Django version.
        return self.as_sql(compiler, connection, template="STATEMENT_TIMESTAMP()", **extra_context)

    def as_sqlite(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        # Millisecond precision (CURRENT_TIMESTAMP has whole seconds), on every Django
        # version.
        template = "STRFTIME('%%%%Y-%%%%m-%%%%d %%%%H:%%%%M:%%%%f', 'NOW')"
        return self.as_sql(compiler, connection, template=template, **extra_context)

    def as_mysql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        template = "UTC_TIMESTAMP(6)" if settings.USE_TZ else "CURRENT_TIMESTAMP(6)"
        return self.as_sql(compiler, connection, template=template, **extra_context)


def now_plus(delta: dt.timedelta) -> Combinable:
    """``database now + delta`` as an expression."""
    return ExpressionWrapper(
        DatabaseNow() + Value(delta, output_field=DurationField()),
        output_field=DateTimeField(),
    )


def database_now(using: str) -> dt.datetime:
    """Read the database server's current time (one query)."""
    from .models import JobLock

    connection = connections[using]
    compiler = JobLock.objects.using(using).all().query.get_compiler(using)
    sql, params = compiler.compile(DatabaseNow())
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {sql}", params)
        value: dt.datetime = cursor.fetchone()[0]
    if isinstance(value, str):  # SQLite returns text
        value = DateTimeField().to_python(value)
    if settings.USE_TZ and value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    elif not settings.USE_TZ and value.tzinfo is not None:
        value = value.replace(tzinfo=None)
    return value

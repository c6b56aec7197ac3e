"""Running a statement: retry contention and dropped connections, turn the rest into one
clear error.

SQLite answers "database is locked" while another process writes; MySQL and MariaDB may
pick a deadlock victim among racing statements or time out on a row lock. None of these
means "held", so the statement is retried with backoff for up to
``EXCLUSIVE_JOBS["BUSY_TIMEOUT"]``. A dropped connection is reopened a few times.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar

from django.db import DatabaseError, IntegrityError, InterfaceError, OperationalError, connections

from ..conf import app_settings
from ..logs import extra
from .durations import parse_duration
from .errors import JobLockError, LockConfigurationError, LockDatabaseError

logger = logging.getLogger("django_exclusive_jobs")
T = TypeVar("T")

MYSQL_BUSY = {1205, 1213}  # lock wait timeout, deadlock
# Serialization failure, deadlock: a project running PostgreSQL in REPEATABLE READ or
# SERIALIZABLE sees a lost race this way, not as a re-checked UPDATE.
POSTGRES_BUSY = {"40001", "40P01"}
# Can't connect, server gone away, lost connection during query, out of sync.
MYSQL_DROPPED = {2002, 2003, 2006, 2013, 2055}
RECONNECT_DELAYS = (0.2, 0.5, 1.0)


def run_statement(alias: str, operation: Callable[[], T]) -> T:
    """Run ``operation`` (one or a few statements) against ``alias``, retrying within bounds.

    ``IntegrityError`` is an answer, not a failure: it goes to the caller unchanged.
    """
    busy_until: float | None = None  # set at the first busy answer: most calls see none
    delay = 0.005
    reconnects = list(RECONNECT_DELAYS)
    while True:
        try:
            return operation()
        except IntegrityError:
            raise
        except (OperationalError, InterfaceError) as exc:
            if is_busy(exc) and not _transaction_undone(alias, exc):
                if busy_until is None:
                    bound = parse_duration(app_settings.BUSY_TIMEOUT, what="BUSY_TIMEOUT")
                    busy_until = time.monotonic() + bound.total_seconds()
                if time.monotonic() + delay < busy_until:
                    time.sleep(delay * random.uniform(0.5, 1.5))
                    delay = min(delay * 2, 0.25)
                    continue
            if _reconnect(alias, exc, reconnects):
                continue
            raise _explained(alias, exc) from exc
        except DatabaseError as exc:
            # Another refusal (a read-only server after a failover, bad SQL): one clear
            # error that callers already handle, never a raw driver exception.
            raise _explained(alias, exc) from exc


def is_busy(exc: BaseException) -> bool:
    """A contention error the statement can simply be retried after."""
    text = str(exc)
    if "database is locked" in text or "database table is locked" in text:
        return True
    cause = exc.__cause__ or exc
    if getattr(cause, "sqlstate", None) in POSTGRES_BUSY:
        return True
    return error_code(exc) in MYSQL_BUSY


def _transaction_undone(alias: str, exc: BaseException) -> bool:
    """Inside a transaction, a busy answer that rolled the transaction back (any error on
    PostgreSQL, a deadlock on MySQL and MariaDB): not retried. Django refuses any further
    statement in the block, so a retry would only wait out the backoff and then report
    that refusal; the caller gets the real reason at once. (A job's first claim runs in
    such a block: ``history._under_lease``.) A row lock's wait timeout and SQLite's
    "database is locked" undo only the statement, which may be retried."""
    connection = connections[alias]
    if not connection.in_atomic_block:
        return False
    return connection.vendor == "postgresql" or error_code(exc) == 1213


def error_code(exc: BaseException) -> Any:
    """The driver's error number (MySQL's come first in the exception's args), if any."""
    args: tuple[Any, ...] = getattr(exc.__cause__ or exc, "args", ())
    return args[0] if args else None


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _reconnect(alias: str, exc: BaseException, delays: list[float]) -> bool:
    """Close a broken connection; True if the statement should be tried on a new one."""
    connection = connections[alias]
    dropped = _connection_dropped(alias, exc)
    if not dropped:
        connection.close_if_unusable_or_obsolete()
        return False
    with suppress(DatabaseError):
        connection.close()
    if not delays or connection.in_atomic_block:
        return False
    pause = delays.pop(0)
    logger.info(
        "connection to database %r dropped, reconnecting in %gs: %s",
        alias,
        pause,
        one_line(exc),
        extra=extra("database", status="reconnecting"),
    )
    time.sleep(pause)
    return True


def _connection_dropped(alias: str, exc: BaseException) -> bool:
    """Whether ``exc`` means the connection is gone (not a deadlock, timeout, bad SQL)."""
    if isinstance(exc, InterfaceError):
        return True
    connection = connections[alias]
    raw = connection.connection
    if raw is None:  # it could not even connect
        return True
    if connection.vendor == "postgresql":
        return bool(getattr(raw, "closed", False) or getattr(raw, "broken", False))
    if connection.vendor == "mysql":
        return not getattr(raw, "open", True) or error_code(exc) in MYSQL_DROPPED
    return False  # SQLite is a file: there is no connection to lose


def _explained(alias: str, exc: BaseException) -> JobLockError:
    """The error to raise for a statement whose connection failed for good."""
    if table_missing(alias):
        return _table_missing_error(alias)
    if migrations_missing(alias):  # a column of a newer version, say
        return LockConfigurationError(
            f"Database {alias!r} lacks migrations of django_exclusive_jobs: run "
            f"'manage.py migrate django_exclusive_jobs'. ({one_line(exc)})"
        )
    return LockDatabaseError(
        f"Database {alias!r} did not answer the lock statement: {one_line(exc)}"
    )


def _table_missing_error(alias: str) -> LockConfigurationError:
    return LockConfigurationError(
        f"The lock table does not exist on database {alias!r}: "
        "run 'manage.py migrate django_exclusive_jobs'."
    )


def migrations_missing(alias: str) -> bool:
    """Whether a migration of this app is not applied on ``alias`` (the error path only)."""
    from django.db.migrations.loader import MigrationLoader

    try:
        loader = MigrationLoader(connections[alias], ignore_no_migrations=True)
    except DatabaseError:
        return False
    ours = {key for key in loader.disk_migrations if key[0] == "django_exclusive_jobs"}
    return not ours <= set(loader.applied_migrations)


def table_missing(alias: str) -> bool:
    """Whether one of this app's tables is missing (its migrations are not all applied)."""
    from django.apps import apps

    try:
        with connections[alias].cursor() as cursor:
            tables = connections[alias].introspection.table_names(cursor)
    except DatabaseError:
        return False
    models = apps.get_app_config("django_exclusive_jobs").get_models()
    return any(model._meta.db_table not in tables for model in models)

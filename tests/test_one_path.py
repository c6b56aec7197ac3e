"""One SQL path: every statement the lock sends goes through Django's cursor, so execute
wrappers and the query log see it, and the normal path leaves the database's log clean."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from django_exclusive_jobs import LockHeld, exclusive_job, try_acquire
from django_exclusive_jobs.lock.acquire import acquire_or_raise
from django_exclusive_jobs.lock.clock import now_sql, plus_seconds_sql
from django_exclusive_jobs.models import JobLock, JobRun, RunStatus

from .helpers import log_lines_since, other_holder, postgres_log, race_slots

TABLE = JobLock._meta.db_table


@contextmanager
def statements_seen(alias: str) -> Iterator[list[str]]:
    """The SQL of every statement ``alias`` runs inside, as an execute wrapper sees it."""
    seen: list[str] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    with connections[alias].execute_wrapper(wrapper):
        yield seen


def lock_statements(seen: list[str]) -> list[str]:
    return [sql for sql in seen if TABLE in sql]


def sent(queries: list[dict[str, str]]) -> list[str]:
    """The query log without transaction control (Django logs COMMIT; no cursor sends it)."""
    control = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE SAVEPOINT")
    return [q["sql"] for q in queries if not q["sql"].upper().startswith(control)]


def test_execute_wrapper_sees_every_statement_of_a_take_and_a_release(alias: str) -> None:
    vendor = connections[alias].vendor
    first = try_acquire("visible", using=alias, ttl=60)  # the row is created here
    assert first is not None
    first.release()

    with statements_seen(alias) as take:
        lock = try_acquire("visible", using=alias, ttl=60)
    assert lock is not None
    # One UPDATE ... RETURNING decides; MySQL reads its new row back (no RETURNING).
    assert len(take) == (2 if vendor == "mysql" else 1), take
    assert take[0].lstrip().upper().startswith("WITH" if vendor == "postgresql" else "UPDATE")

    with statements_seen(alias) as renew:
        lock.renew()
        lock.ensure_held()
    assert len(lock_statements(renew)) == len(renew) >= 2

    with statements_seen(alias) as release:
        assert lock.release()
    assert len(release) == 1
    assert release[0].lstrip().upper().startswith("UPDATE")


def test_a_skipping_server_learns_who_holds_the_lock_in_one_round_trip_on_postgres(
    alias: str,
) -> None:
    with other_holder(alias) as other:
        assert other.try_acquire("visible-held", ttl=60) is not None
        with statements_seen(alias) as seen, pytest.raises(LockHeld) as held:
            acquire_or_raise("visible-held", using=alias, ttl=60)
        assert held.value.holder == other.holder
    # PostgreSQL's take returns the holder's row; elsewhere the take changes nothing and
    # a read says who holds the lock.
    assert len(seen) == (1 if connections[alias].vendor == "postgresql" else 2), seen
    assert all(TABLE in sql for sql in seen)


def test_a_take_that_raced_another_reports_the_winner_not_the_old_row(alias: str) -> None:
    """A take that waited on another take's row lock: on PostgreSQL it sees the row as it
    was before (its snapshot) and must read again to name the winner."""
    import threading

    from django.db import connections as all_connections

    first = try_acquire("raced", using=alias, ttl=60)
    assert first is not None
    first.release()
    winner = all_connections.create_connection(alias)
    try:
        winner.set_autocommit(False)
        with winner.cursor() as cursor:  # another server's take, not yet committed
            later = plus_seconds_sql(winner.vendor, now_sql(winner.vendor))
            cursor.execute(
                f"UPDATE {TABLE} SET token = token + 1, host = %s, pid = 1, instance = %s, "
                f"released_at = NULL, expires_at = {later} WHERE name = %s",
                ["winner", "winnerinstance", 60, "raced"],
            )
        outcome: dict[str, Any] = {}

        def loser() -> None:
            try:
                acquire_or_raise("raced", using=alias, ttl=60)
                outcome["won"] = True
            except LockHeld as held:
                outcome["holder"] = held.holder
            finally:
                connections[alias].close()

        thread = threading.Thread(target=loser)
        thread.start()
        time.sleep(0.5)  # the loser's take now waits on the winner's row lock
        assert thread.is_alive()
        winner.commit()
        thread.join(30)
    finally:
        winner.close()
    assert outcome == {"holder": "winner:1:winnerin"}


def test_debug_query_log_shows_the_same_statements_as_production(alias: str) -> None:
    """DEBUG runs no other path: the query log holds what the execute wrapper saw."""
    warm = try_acquire("visible-debug", using=alias, ttl=60)
    assert warm is not None
    warm.release()
    with statements_seen(alias) as seen, CaptureQueriesContext(connections[alias]) as logged:
        lock = try_acquire("visible-debug", using=alias, ttl=60)
        assert lock is not None
        lock.release()
    assert len(sent(logged.captured_queries)) == len(seen) == len(lock_statements(seen)) > 0


def test_a_job_run_is_all_visible(alias: str) -> None:
    """Lock, history and release of a scheduled job: nothing bypasses the cursor."""

    @exclusive_job("visible-job", every="1h", using=alias, ttl=60)
    def job() -> str:
        return "done"

    with statements_seen(alias) as seen, CaptureQueriesContext(connections[alias]) as logged:
        assert job() == "done"
    control = ("BEGIN", "SAVEPOINT", "RELEASE SAVEPOINT")
    assert len(sent(logged.captured_queries)) == len([s for s in seen if not s.startswith(control)])
    assert JobRun.objects.using(alias).get(name="visible-job").status == RunStatus.SUCCEEDED


# --- the PostgreSQL server's own log ------------------------------------------------------


@pytest.mark.slow
def test_postgres_server_log_has_no_error_from_a_ten_process_race_over_several_slots(
    django_db_setup: None, django_db_blocker: Any
) -> None:
    alias = "postgres"
    if alias not in connections.settings:
        pytest.skip("PostgreSQL is not configured")
    with django_db_blocker.unblock():
        race_and_read_the_log(alias)


def race_and_read_the_log(alias: str) -> None:
    path = postgres_log()
    if path is None:  # pragma: no cover - depends on the machine
        if os.environ.get("CI"):
            pytest.fail("CI must be able to read the PostgreSQL server log")
        pytest.skip("the PostgreSQL server log is not readable here")
    database = connections[alias].settings_dict["NAME"]
    from .conftest import clean_tables

    clean_tables(alias)
    # The one allowed error: the first creation of a name's row may race. Create it now.
    warm = try_acquire("log-race", using=alias, ttl=60)
    assert warm is not None
    warm.release()
    start = path.stat().st_size

    # The log is really read: a failing statement of ours shows up in it.
    marker = f"canary_{os.getpid()}_{int(time.time())}"
    with pytest.raises(Exception, match="division by zero"), connections[alias].cursor() as c:
        c.execute(f"SELECT 1 / 0 AS {marker}")
    try:
        # Every 3 s, as test_slots: starts spread to 1 s after each trigger then need a
        # whole second of delay to fall into the next slot's early allowance (a third of
        # the interval); every 2 s needed a third of a second, which a loaded CI machine
        # gave one process (its trigger-0 call ran slot 1: Counter({0: 2, 2, 3, 4})).
        ran, _first = race_slots(alias, "log-race", processes=10, every=3.0, triggers=5)
    finally:
        clean_tables(alias)
    assert ran == Counter(range(5))  # every slot ran once, and only once

    time.sleep(0.5)  # the server writes its log asynchronously
    lines = log_lines_since(path, start, database)
    assert any(marker in line for line in lines), "the canary error was not found in the log"
    errors = [line for line in lines if " ERROR: " in line and marker not in line]
    errors = [line for line in errors if "division by zero" not in line]
    assert errors == [], "\n".join(errors)

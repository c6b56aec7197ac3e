"""The lock's statements: prepared on PostgreSQL, one request per take on MariaDB.

These are speed-ups, so each test checks two things: that the faster path is really
taken (the server's own list of prepared statements, the number of requests sent), and
that every way it can go wrong (a statement gone missing, a pooler that keeps losing
them, a transaction, a table altered under a prepared plan) still gives the right lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections, transaction
from django.test import override_settings

from django_exclusive_jobs import statements, try_acquire
from django_exclusive_jobs.statements import MAX_MISSES, PREPARE_AFTER

from .helpers import other_holder, row

# Each path exists on one backend only; the alias fixture skips it if that server is down.
on_postgresql = pytest.mark.parametrize("alias", ["postgresql"], indirect=True)
on_mysql = pytest.mark.parametrize("alias", ["mysql"], indirect=True)


@pytest.fixture
def pg(alias: str) -> str:
    return alias


@pytest.fixture
def mysql(alias: str) -> str:
    return alias


def prepared_here(alias: str) -> set[str]:
    """The lock's prepared statements in this connection's server session."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT name FROM pg_prepared_statements WHERE name LIKE 'exclusive_jobs_%%'"
        )
        return {name for (name,) in cursor.fetchall()}


def forget_all(alias: str) -> None:
    """What a pooler does by sending us to another server session: nothing is prepared."""
    with connections[alias].cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")


def cycle(alias: str, name: str = "prep", times: int = 1) -> list[int]:
    tokens = []
    for _ in range(times):
        lock = try_acquire(name, ttl=60, using=alias)
        assert lock is not None
        tokens.append(lock.token)
        assert lock.release()
    return tokens


@on_postgresql
def test_statements_are_prepared_after_a_few_uses(pg: str) -> None:
    assert cycle(pg, times=PREPARE_AFTER - 1) == [1, 2]
    assert prepared_here(pg) == set()  # a process that runs a job once never prepares
    assert cycle(pg, times=3) == [3, 4, 5]
    assert len(prepared_here(pg)) == 2  # take and release
    assert row(pg, "prep").token == 5 and row(pg, "prep").released_at is not None


@on_postgresql
def test_the_same_statement_gets_the_same_name_in_every_process(pg: str) -> None:
    cycle(pg, times=PREPARE_AFTER + 1)
    mine = prepared_here(pg)
    with other_holder(pg) as other:
        for _ in range(PREPARE_AFTER + 1):
            assert other.try_acquire("prep-other", ttl=60)
            assert other.release("prep-other")
        assert other.call("prepared_statements", pg) == sorted(mine)


@on_postgresql
def test_a_setting_turns_preparing_off(pg: str) -> None:
    with override_settings(EXCLUSIVE_JOBS={"PREPARE_STATEMENTS": False}):
        assert cycle(pg, times=PREPARE_AFTER + 2) == [1, 2, 3, 4, 5]
    assert prepared_here(pg) == set()


@on_postgresql
def test_a_statement_gone_missing_runs_plainly_and_is_prepared_again(pg: str) -> None:
    cycle(pg, times=PREPARE_AFTER)
    assert len(prepared_here(pg)) == 2
    forget_all(pg)
    assert cycle(pg) == [PREPARE_AFTER + 1]  # EXECUTE fails, the plain statement runs
    assert prepared_here(pg) == set()
    assert cycle(pg, times=PREPARE_AFTER) == [PREPARE_AFTER + 2 + n for n in range(3)]
    assert len(prepared_here(pg)) == 2


@on_postgresql
def test_a_session_that_keeps_losing_them_stops_preparing(pg: str) -> None:
    expected = 0
    for _ in range(MAX_MISSES):
        expected += PREPARE_AFTER + 1
        tokens = cycle(pg, times=PREPARE_AFTER + 1)
        assert tokens[-1] == expected
        forget_all(pg)
    for _ in range(MAX_MISSES):  # each statement misses once more, then gives up here
        cycle(pg, times=PREPARE_AFTER + 1)
        forget_all(pg)
    assert cycle(pg, times=3 * PREPARE_AFTER)[-1] == row(pg, "prep").token
    assert prepared_here(pg) == set()


@on_postgresql
def test_a_statement_the_server_already_has_is_used(pg: str) -> None:
    cycle(pg, times=PREPARE_AFTER)
    names = prepared_here(pg)
    # This process forgets what it prepared; the server session still has it (as when
    # a pooler hands us a session another client prepared it on).
    delattr(connections[pg], "_exclusive_jobs_prepared")
    assert cycle(pg, times=PREPARE_AFTER + 1) == [PREPARE_AFTER + 1 + n for n in range(4)]
    assert prepared_here(pg) == names
    assert statements._session_state(connections[pg]).misses == 0


@on_postgresql
def test_nothing_is_prepared_inside_a_transaction(pg: str) -> None:
    for _ in range(PREPARE_AFTER + 2):
        lock = try_acquire("prep", ttl=60, using=pg)
        assert lock is not None
        with transaction.atomic(using=pg):
            assert lock.release()
    prepared = prepared_here(pg)
    assert len(prepared) == 1  # the take, made outside; never the release
    assert row(pg, "prep").released_at is not None


@on_postgresql
def test_a_table_altered_under_a_prepared_take_still_decides(pg: str) -> None:
    cycle(pg, times=PREPARE_AFTER)
    held = try_acquire("prep-held", ttl=60, using=pg)
    assert held is not None
    with other_holder(pg) as other:
        for _ in range(PREPARE_AFTER):
            assert other.try_acquire("prep-held", ttl=60) is None
    table = "django_exclusive_jobs_joblock"
    with connections[pg].cursor() as cursor:
        # The take returns pid: a new type changes its result and voids the plan.
        cursor.execute(f"ALTER TABLE {table} ALTER COLUMN pid TYPE bigint")
    try:
        lock = try_acquire("prep", ttl=60, using=pg)
        assert lock is not None and lock.token == PREPARE_AFTER + 1
        assert lock.release()
        assert statements._session_state(connections[pg]).misses == 1
    finally:
        held.release()
        with connections[pg].cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table} ALTER COLUMN pid TYPE integer")


@pytest.fixture
def counted(mysql: str) -> Iterator[list[str]]:
    sent: list[str] = []

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)
        return execute(sql, params, many, context)

    cycle(mysql)  # compile outside the count
    with connections[mysql].execute_wrapper(count):
        yield sent


@on_mysql
def test_a_take_on_mariadb_is_one_request(mysql: str, counted: list[str]) -> None:
    lock = try_acquire("prep", ttl=60, using=mysql)
    assert lock is not None and lock.token == 2
    assert len(counted) == 1
    with other_holder(mysql) as other:
        assert other.try_acquire("prep", ttl=60) is None
    assert try_acquire("prep-missing-row", ttl=60, using=mysql) is not None
    lock.release()


@on_mysql
def test_without_multi_statements_a_take_reads_its_row_after(mysql: str) -> None:
    options = connections[mysql].settings_dict["OPTIONS"]
    connections[mysql].close()
    statements._compiled.clear()
    options["multi_statements"] = False
    try:
        sent: list[str] = []

        def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            sent.append(sql)
            return execute(sql, params, many, context)

        assert cycle(mysql) == [1]
        with connections[mysql].execute_wrapper(count):
            lock = try_acquire("prep", ttl=60, using=mysql)
            assert lock is not None and lock.token == 2
        assert len(sent) == 2 and ";" not in sent[0]
        with other_holder(mysql) as other:
            assert other.try_acquire("prep", ttl=60) is None
        lock.release()
    finally:
        del options["multi_statements"]
        connections[mysql].close()
        statements._compiled.clear()


@on_postgresql
def test_statements_that_differ_in_constants_share_one_prepared_form(pg: str) -> None:
    leases = []
    for ttl in (60, 120, 60, 120, 60, 120, 60, 120):
        lock = try_acquire("prep", ttl=ttl, using=pg)
        assert lock is not None
        lease = row(pg, "prep").expires_at - row(pg, "prep").acquired_at
        leases.append(lease.total_seconds())
        assert lock.release()
    assert leases == [60, 120] * 4  # each call kept its own ttl once prepared
    assert len(prepared_here(pg)) == 2  # one take, one release, for both ttls

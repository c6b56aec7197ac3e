"""The lock's statements: prepared on PostgreSQL and MariaDB, one request per take.

These are speed-ups, so each test checks two things: that the faster path is really
taken (the server's own list of prepared statements, the number of requests sent), and
that every way it can go wrong (a statement gone missing, a pooler that keeps losing
them, a transaction, a table altered under a prepared plan) still gives the right lock.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections, transaction
from django.test import override_settings

from django_exclusive_jobs import LockHeld, mysqlquery, pgprepared, try_acquire
from django_exclusive_jobs.locks import acquire_or_raise, identity
from django_exclusive_jobs.pgprepared import MAX_MISSES, PREPARE_AFTER

from .helpers import expire_now, other_holder, row

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
    assert pgprepared.session(connections[pg]).misses == 0


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
        # The take returns acquired_at: a new type changes its result and voids the plan.
        cursor.execute(f"ALTER TABLE {table} ALTER COLUMN acquired_at TYPE timestamp")
    try:
        lock = try_acquire("prep", ttl=60, using=pg)
        assert lock is not None and lock.token == PREPARE_AFTER + 1
        assert lock.release()
        assert pgprepared.session(connections[pg]).misses == 1
    finally:
        held.release()
        with connections[pg].cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table} ALTER COLUMN acquired_at TYPE timestamptz")


@pytest.fixture
def counted(mysql: str) -> Iterator[list[str]]:
    sent: list[str] = []

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)
        return execute(sql, params, many, context)

    cycle(mysql)  # the row exists now; compile outside the count
    with connections[mysql].execute_wrapper(count):
        yield sent


@on_mysql
def test_a_take_on_mariadb_is_one_statement(mysql: str, counted: list[str]) -> None:
    lock = try_acquire("prep", ttl=60, using=mysql)
    assert lock is not None and lock.token == 2
    assert len(counted) == 1 and ";" not in counted[0]
    # The take did not read its times: the first use reads them from the row, once.
    acquired_at, expires_at = lock.acquired_at, lock.expires_at
    assert (lock.acquired_at, lock.expires_at) == (acquired_at, expires_at)
    assert len(counted) == 2
    saved = row(mysql, "prep")
    assert (acquired_at, expires_at) == (saved.acquired_at, saved.expires_at)
    assert saved.expires_at - saved.acquired_at == dt.timedelta(seconds=60)
    with other_holder(mysql) as other:
        assert other.try_acquire("prep", ttl=60) is None
        assert row(mysql, "prep").token == 2 and row(mysql, "prep").instance == identity.instance
    assert lock.release()


@on_mysql
def test_a_lost_take_on_mariadb_names_the_holder_only_when_asked(mysql: str) -> None:
    with other_holder(mysql) as other:
        assert other.try_acquire("prep", ttl=60) == 1
        sent: list[str] = []

        def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            sent.append(sql)
            return execute(sql, params, many, context)

        try_acquire("prep", ttl=60, using=mysql)  # compile outside the count
        with connections[mysql].execute_wrapper(count):
            assert try_acquire("prep", ttl=60, using=mysql) is None
            assert len(sent) == 1
            with pytest.raises(LockHeld) as held:
                acquire_or_raise("prep", ttl=60, using=mysql)
            assert len(sent) == 3  # the take, then the read of who holds it
        assert held.value.owner == other.owner
        assert held.value.expires_at == row(mysql, "prep").expires_at
        assert row(mysql, "prep").token == 1


@on_mysql
def test_without_found_rows_a_held_lock_is_still_held(mysql: str) -> None:
    """A project that sets its own client_flag: rows changed are counted, not matched."""
    options = connections[mysql].settings_dict["OPTIONS"]
    connections[mysql].close()
    options["client_flag"] = 0
    try:
        assert cycle(mysql) == [1]  # creates the row, then takes it over
        assert cycle(mysql) == [2]
        with other_holder(mysql) as other:
            assert other.try_acquire("prep", ttl=60) == 3
            assert try_acquire("prep", ttl=60, using=mysql) is None
            with pytest.raises(LockHeld):
                acquire_or_raise("prep", ttl=60, using=mysql)
            expire_now(mysql, "prep")
            lock = try_acquire("prep", ttl=60, using=mysql)
            assert lock is not None and lock.token == 4
            assert lock.release()
    finally:
        del options["client_flag"]
        connections[mysql].close()


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


@on_postgresql
def test_times_are_read_as_django_reads_them_after_a_time_zone_change(pg: str) -> None:
    cycle(pg, times=PREPARE_AFTER + 1)  # the take and release are prepared now
    with override_settings(USE_TZ=False):
        lock = try_acquire("prep", ttl=60, using=pg)
        assert lock is not None and lock.acquired_at is not None
        assert lock.acquired_at.tzinfo is None
        assert lock.acquired_at == row(pg, "prep").acquired_at
        assert lock.release()
    lock = try_acquire("prep", ttl=60, using=pg)
    assert lock is not None and lock.acquired_at is not None
    assert lock.acquired_at.tzinfo is not None
    assert lock.acquired_at == row(pg, "prep").acquired_at
    assert lock.release()
    assert len(prepared_here(pg)) == 2


@on_postgresql
def test_a_prepared_statement_that_fails_raises_the_servers_error(pg: str) -> None:
    import psycopg

    from django_exclusive_jobs import LockDatabaseError

    cycle(pg, times=PREPARE_AFTER + 1)
    assert len(prepared_here(pg)) == 2
    settings = connections[pg].settings_dict
    with psycopg.connect(
        host=settings["HOST"], port=settings["PORT"], user=settings["USER"], dbname=settings["NAME"]
    ) as blocker:
        # Another transaction holds the row, so the take waits until the timeout ends it.
        blocker.execute(
            "SELECT 1 FROM django_exclusive_jobs_joblock WHERE name = 'prep' FOR UPDATE"
        )
        with connections[pg].cursor() as cursor:
            cursor.execute("SET statement_timeout = 200")
        with pytest.raises(LockDatabaseError, match="statement timeout"):
            try_acquire("prep", ttl=60, using=pg)
        blocker.rollback()
    with connections[pg].cursor() as cursor:
        cursor.execute("RESET statement_timeout")
    # Django closed the connection after the error (CONN_MAX_AGE 0); the next one
    # prepares again.
    assert cycle(pg, times=PREPARE_AFTER) == [PREPARE_AFTER + 2 + n for n in range(3)]
    assert len(prepared_here(pg)) == 2
    assert pgprepared.session(connections[pg]).misses == 0


# Quotes, a backslash, percent signs and non-ASCII: what the driver must quote for us.
AWKWARD = 'it\'s a \\ "quoted" %s %% ; ünïcödé ✓ name'


def test_a_name_that_needs_quoting_takes_and_releases(alias: str) -> None:
    with other_holder(alias) as other:
        for _ in range(PREPARE_AFTER + 2):  # plain, then prepared on PostgreSQL
            lock = try_acquire(AWKWARD, ttl=60, using=alias)
            assert lock is not None
            assert row(alias, AWKWARD).token == lock.token
            assert other.try_acquire(AWKWARD, ttl=60) is None
            assert lock.release()
            assert row(alias, AWKWARD).released_at is not None
    assert row(alias, AWKWARD).token == PREPARE_AFTER + 2


@on_mysql
def test_lock_statements_on_mariadb_need_no_cursor(
    mysql: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cycle(mysql)
    connection = connections[mysql]
    made: list[object] = []
    create_cursor = connection.create_cursor

    def counted_cursor(*args: Any) -> Any:
        made.append(args)
        return create_cursor(*args)

    monkeypatch.setattr(connection, "create_cursor", counted_cursor)
    assert cycle(mysql, times=3) == [2, 3, 4]
    assert made == []
    with other_holder(mysql) as other:
        held = try_acquire("prep", ttl=60, using=mysql)
        assert held is not None
        assert other.try_acquire("prep", ttl=60) is None
        assert held.release()
    assert made == []


on_sqlite = pytest.mark.parametrize("alias", ["sqlite"], indirect=True)


@on_sqlite
def test_a_take_on_sqlite_returns_its_row(alias: str) -> None:
    if not connections[alias].features.can_return_columns_from_insert:
        pytest.skip("SQLite before 3.35 has no RETURNING")
    cycle(alias)  # the row exists now
    sent: list[str] = []

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)
        return execute(sql, params, many, context)

    with connections[alias].execute_wrapper(count):
        lock = try_acquire("prep", ttl=60, using=alias)
        assert lock is not None and lock.token == 2
        assert len(sent) == 1 and "RETURNING" in sent[0]
        lock.renew()
        assert len(sent) == 2 and "RETURNING" in sent[1]
    saved = row(alias, "prep")
    assert (lock.acquired_at, lock.expires_at) == (saved.acquired_at, saved.expires_at)
    assert lock.acquired_at is not None and lock.acquired_at.tzinfo is not None
    with other_holder(alias) as other:
        assert other.try_acquire("prep", ttl=60) is None
    assert lock.release()


def _blocker(alias: str) -> Any:
    """A second MariaDB connection of our own, in a transaction, to hold row locks."""
    import MySQLdb

    settings = connections[alias].settings_dict
    blocker = MySQLdb.connect(
        host=settings["HOST"],
        port=int(settings["PORT"]),
        user=settings["USER"],
        password=settings["PASSWORD"],
        database=settings["NAME"],
    )
    blocker.autocommit(False)
    return blocker


@on_mysql
def test_a_lock_wait_timeout_is_retried_on_the_same_connection(
    mysql: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A server error leaves the connection in step: it is contention, not an outage."""
    import logging

    from django_exclusive_jobs import LockDatabaseError

    cycle(mysql)  # compiled and rendered: the next take goes without a cursor
    blocker = _blocker(mysql)
    try:
        blocker.cursor().execute(
            "SELECT 1 FROM django_exclusive_jobs_joblock WHERE name = 'prep' FOR UPDATE"
        )
        with connections[mysql].cursor() as cursor:
            cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
        with (
            override_settings(EXCLUSIVE_JOBS={"SQLITE_BUSY_TIMEOUT": "1.5s"}),
            caplog.at_level(logging.INFO, logger="django_exclusive_jobs"),
            pytest.raises(LockDatabaseError, match="Lock wait timeout"),
        ):
            try_acquire("prep", ttl=60, using=mysql)
        assert "reconnecting" not in caplog.text  # busy retries, on the same connection
    finally:
        blocker.rollback()
        blocker.close()
    assert cycle(mysql) == [2]


@on_mysql
def test_a_missing_table_on_the_fast_path_says_to_migrate(mysql: str) -> None:
    from django_exclusive_jobs import LockConfigurationError

    cycle(mysql)
    table = "django_exclusive_jobs_joblock"
    with connections[mysql].cursor() as cursor:
        cursor.execute(f"RENAME TABLE {table} TO {table}_away")
    try:
        with pytest.raises(LockConfigurationError, match="migrate"):
            try_acquire("prep", ttl=60, using=mysql)
    finally:
        with connections[mysql].cursor() as cursor:
            cursor.execute(f"RENAME TABLE {table}_away TO {table}")
    assert cycle(mysql) == [2]


@on_mysql
def test_the_three_answers_of_a_take_on_the_fast_path(
    mysql: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No execute_wrapper here: the statements go through mysqlquery.run, counted."""
    from django_exclusive_jobs import mysqlquery

    sent: list[str] = []
    run = mysqlquery.run

    def counted(connection: Any, sql: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(sql)
        return run(connection, sql, *args, **kwargs)

    monkeypatch.setattr(mysqlquery, "run", counted)
    lock = try_acquire("prep", ttl=60, using=mysql)  # no row: the take, then get_or_create
    assert lock is not None and lock.token == 1 and len(sent) == 1
    assert lock.release()
    sent.clear()
    lock = try_acquire("prep", ttl=60, using=mysql)  # taken: one statement
    assert lock is not None and lock.token == 2 and len(sent) == 1
    with other_holder(mysql) as other:
        assert other.try_acquire("prep", ttl=60) is None
    sent.clear()
    held = threading_other_try(mysql)  # held: one statement, from another thread
    assert held is None and len(sent) == 1
    assert lock.release()


def threading_other_try(alias: str) -> Any:
    """try_acquire from a second thread of this process (its own connection, not reentrant)."""
    import threading

    from django.db import connections as all_connections

    found: list[Any] = []

    def attempt() -> None:
        try:
            found.append(try_acquire("prep", ttl=60, using=alias))
        finally:
            all_connections.close_all()

    thread = threading.Thread(target=attempt)
    thread.start()
    thread.join(30)
    return found[0]


@on_mysql
def test_a_scheduled_run_whose_lock_was_taken_over_before_its_slot_is_lost(mysql: str) -> None:
    """Its slot comes from acquired_at, read from the row; a new holder's row has none."""
    from django_exclusive_jobs import LockLost
    from django_exclusive_jobs.runner import JobRunner
    from django_exclusive_jobs.schedules import Every

    cycle(mysql)  # the row exists, so the next take is the UPDATE: times not read yet
    lock = try_acquire("prep", ttl=60, using=mysql)
    assert lock is not None and lock.token == 2
    expire_now(mysql, "prep")
    with other_holder(mysql) as other:
        assert other.try_acquire("prep", ttl=60) == 3
        runner = JobRunner("prep", using=mysql, schedule=Every(dt.timedelta(minutes=5)))
        with pytest.raises(LockLost):
            runner._claim_run(lock)
        assert runner.slot is None
    from django_exclusive_jobs.models import JobRun

    assert not JobRun.objects.using(mysql).filter(name="prep").exists()


# --- MariaDB: PREPARE ... FROM, then EXECUTE ------------------------------------------


def mysql_counters(alias: str) -> tuple[int, int]:
    """This session's (PREPAREs, EXECUTEs) so far, as the server counts them."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SHOW SESSION STATUS WHERE Variable_name IN ('Com_stmt_prepare', 'Com_stmt_execute')"
        )
        found = dict(cursor.fetchall())
    return int(found["Com_stmt_prepare"]), int(found["Com_stmt_execute"])


def mysql_prepared_names(alias: str) -> list[bytes]:
    state = mysqlquery._Session.of(connections[alias])
    return [t.prepared.split()[1] for t in state.templates.values() if t.prepared]


def mysql_forget_all(alias: str) -> None:
    """What a proxy that moved us to another server session would do."""
    for name in mysql_prepared_names(alias):
        with connections[alias].cursor() as cursor:
            cursor.execute(f"DEALLOCATE PREPARE {name.decode()}")


@on_mysql
def test_statements_are_prepared_on_mariadb_after_a_few_uses(mysql: str) -> None:
    before = mysql_counters(mysql)
    assert cycle(mysql, times=mysqlquery.PREPARE_AFTER - 1) == [1, 2]
    assert mysql_counters(mysql) == before  # a process that runs a job once never prepares
    assert cycle(mysql, times=3) == [3, 4, 5]
    prepares, executes = mysql_counters(mysql)
    assert prepares - before[0] == 2  # take and release
    assert executes - before[1] == 6  # every take and release from the third on
    assert len(mysql_prepared_names(mysql)) == 2
    saved = row(mysql, "prep")
    assert saved.token == 5 and saved.released_at is not None
    with other_holder(mysql) as other:  # a prepared take that loses, then one that wins
        assert other.try_acquire("prep", ttl=60)
        assert try_acquire("prep", ttl=60, using=mysql) is None
        with pytest.raises(LockHeld):
            acquire_or_raise("prep", ttl=60, using=mysql)
        assert other.release("prep")
    lock = try_acquire("prep", ttl=60, using=mysql)
    assert lock is not None and lock.token == 7
    assert lock.acquired_at == row(mysql, "prep").acquired_at
    assert lock.release()


@on_mysql
def test_a_setting_turns_preparing_off_on_mariadb(mysql: str) -> None:
    before = mysql_counters(mysql)
    with override_settings(EXCLUSIVE_JOBS={"PREPARE_STATEMENTS": False}):
        assert cycle(mysql, times=mysqlquery.PREPARE_AFTER + 2) == [1, 2, 3, 4, 5]
    assert mysql_counters(mysql) == before


@on_mysql
def test_a_statement_gone_missing_on_mariadb_runs_as_text_and_is_prepared_again(
    mysql: str,
) -> None:
    after = mysqlquery.PREPARE_AFTER
    cycle(mysql, times=after)
    assert len(mysql_prepared_names(mysql)) == 2
    mysql_forget_all(mysql)
    assert cycle(mysql) == [after + 1]  # EXECUTE fails, the text runs
    assert mysql_prepared_names(mysql) == []
    assert cycle(mysql, times=after) == [after + 2 + n for n in range(after)]
    assert len(mysql_prepared_names(mysql)) == 2
    for _ in range(mysqlquery.MAX_MISSES):
        mysql_forget_all(mysql)
        cycle(mysql, times=after + 1)
    assert mysql_prepared_names(mysql) == []  # this session keeps losing them: no more
    assert cycle(mysql, times=after + 1)[-1] == row(mysql, "prep").token
    assert mysql_prepared_names(mysql) == []


@on_mysql
def test_a_server_that_refuses_to_prepare_still_decides(mysql: str) -> None:
    with connections[mysql].cursor() as cursor:
        cursor.execute("SELECT @@GLOBAL.max_prepared_stmt_count")
        (limit,) = cursor.fetchone()
        cursor.execute("SET GLOBAL max_prepared_stmt_count = 0")
    try:
        tokens = cycle(mysql, times=mysqlquery.PREPARE_AFTER + 2)
    finally:
        with connections[mysql].cursor() as cursor:
            cursor.execute(f"SET GLOBAL max_prepared_stmt_count = {int(limit)}")
    assert tokens == [1, 2, 3, 4, 5]
    assert mysql_prepared_names(mysql) == []
    assert mysqlquery._Session.of(connections[mysql]).misses >= 2  # take and release refused
    assert cycle(mysql, times=mysqlquery.PREPARE_AFTER)[-1] == 8  # allowed again: prepared
    assert mysql_prepared_names(mysql) != []

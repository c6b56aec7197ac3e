"""A statement that committed just before its connection died, then retried.

The lock engine retries a statement on a fresh connection when the connection drops.
If the first try had already committed on the server, the retry meets the lock engine's
own work: it must recognise it as its own, not as another server's. Each test lets one
statement run, then closes the connection under it and raises, as a server restart
between the commit and the reply would. SQLite is a file: there is no connection to lose.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import OperationalError, connections

from django_exclusive_jobs import exclusive_job, try_acquire
from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.lock.lock import process
from django_exclusive_jobs.models import JobLock, JobRun, RunStatus
from django_exclusive_jobs.run.schedules import Every

from .helpers import expire_now, row


@pytest.fixture
def server_alias(alias: str) -> str:
    if connections[alias].vendor == "sqlite":
        pytest.skip("SQLite is a file, not a server: there is no connection to lose")
    return alias


@contextmanager
def connection_dies_after(alias: str, matches: Callable[[str], bool]) -> Iterator[list[str]]:
    """The first statement ``matches`` accepts runs and commits; then the connection dies."""
    connection = connections[alias]
    fired: list[str] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if not fired and matches(sql):
            fired.append(sql)
            connection.connection.close()  # the reply never arrives
            raise OperationalError("server closed the connection unexpectedly")
        return result

    with connection.execute_wrapper(wrapper):
        yield fired


def is_take(sql: str) -> bool:
    head = sql.lstrip().upper()
    return head.startswith(("WITH", "UPDATE")) and "ACQUIRED_AT" in head and "HOST" in head


def is_release(sql: str) -> bool:
    head = sql.lstrip().upper()
    return head.startswith("UPDATE") and "RELEASED_AT" in head and "HOST" not in head


def is_run_insert(sql: str) -> bool:
    head = sql.lstrip().upper()
    return head.startswith("INSERT") and "JOBRUN" in head


def test_retried_takeover_that_committed_is_our_lock_not_someone_elses(
    server_alias: str,
) -> None:
    alias = server_alias
    first = try_acquire("retried-take", using=alias, ttl=30)
    assert first is not None and first.release()  # the row exists: takeover, not create

    with connection_dies_after(alias, is_take) as fired:
        lock = try_acquire("retried-take", using=alias, ttl=30)
    assert fired, "the takeover statement never ran"
    assert lock is not None, "our own committed takeover was taken for another holder"
    assert lock.token == first.token + 1  # taken once, not twice
    saved = row(alias, "retried-take")
    assert (saved.token, saved.instance, saved.released_at) == (lock.token, process.instance, None)
    assert lock.release()


def test_retried_release_that_committed_is_a_release_not_a_lost_lock(server_alias: str) -> None:
    alias = server_alias
    lock = try_acquire("retried-release", using=alias, ttl=30)
    assert lock is not None
    with connection_dies_after(alias, is_release) as fired:
        released = lock.release()
    assert fired, "the release statement never ran"
    assert released is True
    assert not lock.lost
    assert row(alias, "retried-release").released_at is not None


def test_retried_run_row_that_committed_is_our_run_not_a_taken_slot(server_alias: str) -> None:
    alias = server_alias
    calls: list[int] = []

    @exclusive_job("retried-run", using=alias, every="1h")
    def job() -> None:
        calls.append(1)

    # The job has run before: a job's first claim is one transaction (history._under_lease),
    # where an insert is not committed before the connection could die.
    hour = dt.timedelta(hours=1)
    before = Every(period=hour).slot_at(database_now(alias)) - hour
    JobRun.objects.using(alias).create(
        name="retried-run", slot=before, status=RunStatus.SUCCEEDED, started_at=before
    )
    with connection_dies_after(alias, is_run_insert) as fired:
        job()
    assert fired, "the run row was never inserted"
    assert calls == [1], "the slot our own run row claimed was skipped"
    runs = list(JobRun.objects.using(alias).filter(name="retried-run").exclude(slot=before))
    assert [(run.status, run.token) for run in runs] == [(RunStatus.SUCCEEDED, 1)]


def test_deadlock_or_timeout_is_not_retried_as_a_dropped_connection(server_alias: str) -> None:
    """Only a connection that is really gone earns the reconnect retries."""
    alias = server_alias
    connection = connections[alias]
    statements: list[str] = []

    def fail_without_dropping(execute: Any, sql: str, params: Any, many: bool, ctx: Any) -> Any:
        if is_take(sql):
            statements.append(sql)
            raise OperationalError("canceling statement due to statement timeout")
        return execute(sql, params, many, ctx)

    first = try_acquire("not-dropped", using=alias, ttl=30)
    assert first is not None and first.release()
    with (
        connection.execute_wrapper(fail_without_dropping),
        pytest.raises(Exception, match="timeout"),
    ):
        try_acquire("not-dropped", using=alias, ttl=30)
    assert len(statements) == 1  # tried once: the error was an answer, not a lost connection


def test_late_end_of_an_old_run_does_not_overwrite_the_retry_of_its_slot(alias: str) -> None:
    """A paused holder wakes after another server retried its slot: history stays true."""
    name = "late-end"
    calls: list[str] = []

    @exclusive_job(name, using=alias, every="1h", retries=1, retry_backoff=0, keepalive=False)
    def job() -> None:
        if calls:
            calls.append("second server")
            return
        calls.append("first server")
        # The first server "pauses" past its lease; another server takes over, marks
        # the first run lost and retries the slot, all before the first one wakes.
        expire_now(alias, name)
        other = threading.Thread(target=job_on_another_server)
        other.start()
        other.join(60)

    def job_on_another_server() -> None:
        try:
            job()
        finally:
            connections.close_all()

    job()  # the first server's run ends after the second's: its lock was lost
    assert calls == ["first server", "second server"]
    first, run = JobRun.objects.using(alias).filter(name=name).order_by("attempt")
    assert (first.status, first.token, first.attempt) == (RunStatus.LOST, 1, 1)
    assert (run.status, run.token, run.attempt) == (RunStatus.SUCCEEDED, 2, 2)
    assert JobLock.objects.using(alias).get(name=name).token == 2


def test_a_deadlock_inside_a_transaction_is_not_retried_alone(alias: str) -> None:
    """MariaDB rolls back the whole transaction of a deadlock's victim, and Django
    refuses any further statement in the block: the deadlock is not retried, and the
    caller learns it was a deadlock (not, after the backoff, that Django refused)."""
    import time

    from django.db import transaction

    from django_exclusive_jobs.lock.errors import LockDatabaseError
    from django_exclusive_jobs.lock.retry import run_statement

    if connections[alias].vendor != "mysql":
        pytest.skip("a deadlock that rolls back only its victim's transaction: MariaDB")
    locks = JobLock.objects.using(alias)
    for name in ["dl-a", "dl-b", *(f"dl-heavy-{n}" for n in range(20))]:
        locks.get_or_create(name=name)
    holds_b = threading.Event()

    def other() -> None:  # the larger transaction: InnoDB picks the smaller as the victim
        try:
            with transaction.atomic(using=alias):
                locks.filter(name__startswith="dl-heavy").update(host="heavy")
                locks.filter(name="dl-b").update(host="other")
                holds_b.set()
                locks.filter(name="dl-a").update(host="other")  # waits for us
        finally:
            connections[alias].close()

    def ours() -> None:
        with transaction.atomic(using=alias):
            locks.filter(name="dl-a").update(host="us")
            waiting.start()
            assert holds_b.wait(30)
            time.sleep(0.5)  # the other transaction now waits for dl-a
            run_statement(alias, lambda: locks.filter(name="dl-b").update(host="us"))

    waiting = threading.Thread(target=other)
    with pytest.raises(LockDatabaseError, match="Deadlock"):
        ours()
    waiting.join(30)
    assert locks.get(name="dl-b").host == "other"  # ours was undone, and not redone

"""First use of a job's lock: its row is made ahead (after ``migrate``, at the scheduler's
start), so servers starting together only race in the ``take`` and the database reports
no duplicate key."""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps as global_apps
from django.apps.registry import Apps
from django.core.management import call_command
from django.db import connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_exclusive_jobs import try_acquire
from django_exclusive_jobs.health import overview
from django_exclusive_jobs.lock.acquire import prepare_locks
from django_exclusive_jobs.management import prepare_job_locks
from django_exclusive_jobs.models import JobLock, JobRun, LockState
from django_exclusive_jobs.run.registry import all_jobs

from . import _workers
from .helpers import (
    SPAWN,
    log_lines_since,
    other_holder,
    postgres_log,
    row,
    started_workers,
)

RACERS = 6  # the machine has two cores: more would mostly wait for a CPU
DUPLICATE_KEY = "duplicate key value violates unique constraint"


def past_runs(alias: str, name: str, tokens: list[int]) -> None:
    """Run history of ``name`` with these tokens, as if its lock row had been deleted."""
    now = timezone.now()
    JobRun.objects.using(alias).bulk_create(
        JobRun(name=name, token=token, started_at=now - dt.timedelta(hours=token), slot=None)
        for token in tokens
    )


def race_first_take(alias: str, prefix: str) -> Counter[int]:
    """``RACERS`` OS processes take ``{prefix}-0`` at one instant (a barrier); each
    winner releases after all have decided. How many won."""
    barrier = SPAWN.Barrier(RACERS)
    results = SPAWN.Queue()
    workers = [
        SPAWN.Process(target=_workers.race, args=(alias, prefix, 1, barrier, results, n))
        for n in range(RACERS)
    ]
    winners: Counter[int] = Counter()
    with started_workers(workers):
        for _ in workers:
            _worker, won, error = results.get(timeout=180)
            assert error is None, error
            winners.update(won)
    return winners


# --- prepare_locks ------------------------------------------------------------------------


def test_prepared_row_is_free_and_its_first_take_continues_the_token(alias: str) -> None:
    past_runs(alias, "resumed", [3, 41, 7])
    assert prepare_locks(["resumed", "brand-new"], using=alias) == 2

    for name, token in (("resumed", 41), ("brand-new", 0)):
        prepared = JobLock.objects.using(alias).with_state().get(name=name)
        assert prepared.state == LockState.FREE  # type: ignore[attr-defined]
        assert (prepared.token, prepared.holder, prepared.host, prepared.pid) == (
            token,
            "",
            "",
            None,
        )
        assert (prepared.acquired_at, prepared.expires_at, prepared.released_at) == (None,) * 3
        lock = try_acquire(name, using=alias, ttl=60)
        assert lock is not None
        assert lock.token == token + 1  # what the first take of a row-less name gives
        lock.release()


def test_preparing_again_is_one_select_and_no_insert(alias: str) -> None:
    names = ["again-a", "again-b"]
    with CaptureQueriesContext(connections[alias]) as first:
        assert prepare_locks(names, using=alias) == 2
    inserts = [q["sql"] for q in first.captured_queries if q["sql"].startswith("INSERT")]
    assert len(inserts) == 1  # one insert for every missing name

    with CaptureQueriesContext(connections[alias]) as second:
        assert prepare_locks(names, using=alias) == 0
    [query] = second.captured_queries
    assert query["sql"].startswith("SELECT")


def test_preparing_leaves_existing_rows_alone(alias: str) -> None:
    with other_holder(alias) as other:
        assert other.try_acquire("busy", ttl=600) == 1
        with CaptureQueriesContext(connections[alias]) as seen:
            assert prepare_locks(["busy", "idle"], using=alias) == 1
        inserted = [q["sql"] for q in seen.captured_queries if q["sql"].startswith("INSERT")]
        assert len(inserted) == 1
        busy = JobLock.objects.using(alias).with_state().get(name="busy")
        assert (busy.state, busy.token, busy.holder) == (LockState.HELD, 1, other.holder)  # type: ignore[attr-defined]
        assert row(alias, "idle").token == 0


def test_prepared_rows_are_shown_as_free_not_held_or_stale(alias: str) -> None:
    declared = [job.name for job in all_jobs()]
    before = {job.name: (job.badge, job.problems) for job in overview(alias).jobs}
    prepare_locks(declared, using=alias)

    locks = JobLock.objects.using(alias)
    assert locks.count() == len(declared)
    assert locks.free().count() == locks.not_held().count() == len(declared)
    assert not locks.held().exists()
    assert not locks.stale().exists()
    assert not locks.closed().exists()
    assert locks.force_release() == 0  # nothing to free
    after = {job.name: (job.badge, job.problems) for job in overview(alias).jobs}
    assert after == before  # "never ran" stays "never ran"; no stale lock is reported


# --- servers starting together ------------------------------------------------------------


@pytest.mark.parametrize("history", [[], [5, 9]], ids=["new-job", "with-history"])
def test_processes_racing_a_prepared_first_take_have_one_winner(
    alias: str, history: list[int]
) -> None:
    name = "first-race-0"
    past_runs(alias, name, history)
    prepare_locks([name], using=alias)

    assert race_first_take(alias, "first-race") == Counter({0: 1})
    assert row(alias, name).token == max(history, default=0) + 1


def server_log() -> Path:
    path = postgres_log()
    if path is None:  # pragma: no cover - depends on the machine
        if os.environ.get("CI"):
            pytest.fail("CI must be able to read the PostgreSQL server log")
        pytest.skip("the PostgreSQL server log is not readable here")
    return path


def log_after(alias: str, path: Path, start: int) -> list[str]:
    """The log's lines about our database since ``start``, up to a canary error sent now.

    Each server process writes its errors before it answers, so once the canary is in the
    file every error of the statements before it is too.
    """
    database = connections[alias].settings_dict["NAME"]
    marker = f"canary_{os.getpid()}_{time.monotonic_ns()}"
    with pytest.raises(Exception, match="division by zero"), connections[alias].cursor() as c:
        c.execute(f"SELECT 1 / 0 AS {marker}")
    deadline = time.monotonic() + 10
    while True:
        lines = log_lines_since(path, start, database)
        if any(marker in line for line in lines):
            return [line for line in lines if marker not in line and "division by zero" not in line]
        assert time.monotonic() < deadline, "the canary error never reached the server log"
        time.sleep(0.05)


def test_postgres_log_has_no_error_when_processes_race_a_prepared_first_take(
    postgres: str,
) -> None:
    path = server_log()
    prepare_locks(["quiet-0"], using=postgres)
    start = path.stat().st_size

    assert race_first_take(postgres, "quiet") == Counter({0: 1})

    errors = [line for line in log_after(postgres, path, start) if " ERROR: " in line]
    assert errors == [], "\n".join(errors)


def test_postgres_log_shows_the_duplicate_key_of_a_create_race_without_a_prepared_row(
    postgres: str,
) -> None:
    """The counterpart, so the test above can fail: a name nobody prepared, and another
    server's insert still open when ours is sent. The ``get_or_create`` path stays for names
    made on the fly; it decides right, but the database logs the lost insert."""
    path = server_log()
    start = path.stat().st_size
    table = connections[postgres].ops.quote_name(JobLock._meta.db_table)
    first = connections.create_connection(postgres)  # another server, mid-insert
    answers: list[int | None] = []
    try:
        first.set_autocommit(False)
        with first.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} (name, token, host, instance) VALUES (%s, 0, '', '')",
                ["unprepared"],
            )
        with other_holder(postgres) as other:
            taker = threading.Thread(
                target=lambda: answers.append(other.try_acquire("unprepared", ttl=60))
            )
            taker.start()
            try:
                wait_until_an_insert_waits(postgres)
            finally:
                first.commit()
                taker.join(60)
    finally:
        first.close()

    assert answers == [None]  # it lost to the first insert, and said so
    errors = [line for line in log_after(postgres, path, start) if " ERROR: " in line]
    assert len(errors) == 1
    assert DUPLICATE_KEY in errors[0]


def wait_until_an_insert_waits(alias: str) -> None:
    """Until a session of our database waits on a row lock (the other insert), at most 30s."""
    deadline = time.monotonic() + 30
    with connections[alias].cursor() as cursor:
        while True:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE 'INSERT%%'"
            )
            if cursor.fetchone()[0]:
                return
            assert time.monotonic() < deadline, "the other server's insert never waited"
            time.sleep(0.02)


# --- migrate ------------------------------------------------------------------------------


def test_migrate_makes_a_free_row_for_every_declared_job(alias: str) -> None:
    declared = {job.name for job in all_jobs()}
    assert {"quick", "tick", "enqueue_tick"} <= declared  # tests/testapp/jobs.py

    call_command("migrate", database=alias, verbosity=0)

    prepared = JobLock.objects.using(alias).with_state()
    assert {lock.name for lock in prepared} == declared
    assert {lock.state for lock in prepared} == {LockState.FREE}  # type: ignore[attr-defined]


class NoLocksHere:
    """A router that keeps the app's tables off every database."""

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        return False if app_label == "django_exclusive_jobs" else None


def test_migrate_makes_no_row_where_the_router_keeps_the_lock_table_off(alias: str) -> None:
    app_config = global_apps.get_app_config("django_exclusive_jobs")
    with override_settings(DATABASE_ROUTERS=[NoLocksHere()]):
        prepare_job_locks(app_config, using=alias)
    assert not JobLock.objects.using(alias).exists()


def test_migrate_makes_no_row_before_the_app_is_migrated(alias: str) -> None:
    app_config = global_apps.get_app_config("django_exclusive_jobs")
    unmigrated = Apps(installed_apps=[])  # the state of a migrate that left our app out
    with CaptureQueriesContext(connections[alias]) as seen:
        prepare_job_locks(app_config, using=alias, apps=unmigrated)
    assert seen.captured_queries == []

"""The history's per-start statements through the cursor (``run/rows.py``), per backend:
they write and read what the ORM would."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from django_exclusive_jobs.lock.clock import DatabaseNow, database_now, plus_seconds_sql
from django_exclusive_jobs.models import JobRun, JobState, RunStatus
from django_exclusive_jobs.models import statements as rows

SLOT = dt.datetime(2026, 3, 29, 1, 30, tzinfo=dt.UTC)


def new_run(alias: str, slot: dt.datetime | None = SLOT, attempt: int = 1) -> JobRun:
    run = JobRun(
        name="rows",
        slot=slot,
        attempt=attempt,
        status=RunStatus.RUNNING,
        host="h",
        pid=7,
        instance="i",
        token=3,
        started_at=DatabaseNow(),
        kwargs={"when": "tomorrow", "n": [1, 2]},
    )
    rows.insert(run, alias)
    return run


def test_insert_writes_every_column_and_sets_the_id(alias: str) -> None:
    before = database_now(alias)
    first, second = new_run(alias), new_run(alias, attempt=2)
    assert isinstance(first.pk, int) and second.pk == first.pk + 1
    assert not first._state.adding and first._state.db == alias
    stored = JobRun.objects.using(alias).get(pk=first.pk)
    assert (stored.name, stored.slot, stored.attempt, stored.status) == ("rows", SLOT, 1, "running")
    assert (stored.host, stored.pid, stored.instance, stored.token) == ("h", 7, "i", 3)
    assert stored.kwargs == {"when": "tomorrow", "n": [1, 2]}
    assert (stored.error, stored.error_type, stored.requested_by) == ("", "", "")
    assert stored.finished_at is None and stored.retry_at is None and stored.duration is None
    assert stored.backfill is False
    # started_at is the database's clock, not this process's.
    assert before - dt.timedelta(seconds=1) <= stored.started_at <= database_now(alias)


def test_update_changes_only_the_rows_where_every_condition_holds(alias: str) -> None:
    run, other, slotless = new_run(alias), new_run(alias, attempt=2), new_run(alias, slot=None)
    retry_at = SLOT + dt.timedelta(minutes=5)
    values = {"status": RunStatus.FAILED, "finished_at": DatabaseNow(), "retry_at": retry_at}
    mine = [("pk", "=", run.pk), ("token", "=", 3), ("status", "=", RunStatus.RUNNING)]
    assert rows.update(JobRun, alias, values, mine) == 1
    assert rows.update(JobRun, alias, values, mine) == 0  # no longer running
    stored = JobRun.objects.using(alias).get(pk=run.pk)
    assert (stored.status, stored.retry_at) == ("failed", retry_at)
    assert stored.finished_at is not None and stored.finished_at >= stored.started_at
    assert JobRun.objects.using(alias).get(pk=other.pk).status == "running"
    older = [("name", "=", "rows"), ("token", "<", 4), ("slot", "IS NULL", None)]
    assert rows.update(JobRun, alias, {"status": RunStatus.LOST}, older) == 1
    assert JobRun.objects.using(alias).get(pk=slotless.pk).status == "lost"
    assert JobRun.objects.using(alias).get(pk=other.pk).status == "running"


def test_an_end_written_later_is_the_start_plus_the_duration(alias: str) -> None:
    """What a scheduler writes once the database answers again, for a run whose end
    could not be written: ``started_at + duration`` on the database's side."""
    run = new_run(alias)
    connection = connections[alias]
    started_at = connection.ops.quote_name("started_at")
    ended = rows.Sql(plus_seconds_sql(connection.vendor, started_at), (2.5,))
    values = {"finished_at": ended, "duration": 2.5, "status": RunStatus.SUCCEEDED}
    assert rows.update(JobRun, alias, values, [("pk", "=", run.pk)]) == 1
    stored = JobRun.objects.using(alias).get(pk=run.pk)
    assert stored.finished_at - stored.started_at == dt.timedelta(seconds=2.5)


def test_first_reads_a_model_instance_in_order_or_none(alias: str) -> None:
    for minutes in (0, 30, 60):
        new_run(alias, slot=SLOT + dt.timedelta(minutes=minutes))
    new_run(alias, slot=SLOT + dt.timedelta(minutes=30), attempt=2)
    where = [("name", "=", "rows"), ("slot", "<=", SLOT + dt.timedelta(minutes=45))]
    found = rows.first(JobRun, alias, where, ("-slot", "-attempt"))
    assert isinstance(found, JobRun)
    assert (found.slot, found.attempt) == (SLOT + dt.timedelta(minutes=30), 2)
    assert found.kwargs == {"when": "tomorrow", "n": [1, 2]}
    oldest = rows.first(JobRun, alias, [("name", "=", "rows")], ("slot", "attempt"))
    assert (oldest.slot, oldest.attempt) == (SLOT, 1)
    assert rows.first(JobRun, alias, [("name", "=", "none")]) is None
    assert rows.first(JobState, alias, [("name", "=", "rows")]) is None


def test_first_also_tells_whether_other_rows_exist_in_the_same_statement(alias: str) -> None:
    """``exists``: an attribute on the row read, true or false on every backend, with
    the parameters of both conditions in their places."""
    new_run(alias, slot=SLOT)  # running, token 3
    new_run(alias, slot=SLOT + dt.timedelta(minutes=30))
    JobRun.objects.using(alias).filter(slot=SLOT + dt.timedelta(minutes=30)).update(
        status=RunStatus.SUCCEEDED
    )
    where = [("name", "=", "rows"), ("slot", "<=", SLOT + dt.timedelta(hours=1))]
    order = ("-slot", "-attempt")
    for token, expected in ((3, False), (4, True)):  # the older run: running, token 3
        older = [("name", "=", "rows"), ("status", "=", RunStatus.RUNNING), ("token", "<", token)]
        with CaptureQueriesContext(connections[alias]) as seen:
            found = rows.first(JobRun, alias, where, order, exists=("older", older))
        assert len(seen.captured_queries) == 1
        assert found.slot == SLOT + dt.timedelta(minutes=30)
        assert bool(found.older) is expected and found.older in (True, False, 0, 1)


def test_first_beside_reads_a_row_of_another_table_each_without_the_other(alias: str) -> None:
    """``first_beside``: the first row and another table's row in one statement, each
    read whether or not the other exists, with their values converted as a queryset's
    (JSON, booleans, aware datetimes), and the ``EXISTS`` after the first's columns."""
    where = [("name", "=", "rows"), ("slot", "<=", SLOT + dt.timedelta(hours=1))]
    order = ("-slot", "-attempt")
    running = [("name", "=", "rows"), ("status", "=", RunStatus.RUNNING)]
    beside = (JobState, [("name", "=", "rows")])

    def read() -> tuple[JobRun | None, JobState | None]:
        with CaptureQueriesContext(connections[alias]) as seen:
            found = rows.first_beside(
                JobRun, alias, where, order, exists=("on", running), beside=beside
            )
        assert len(seen.captured_queries) == 1
        return found  # type: ignore[no-any-return]

    assert read() == (None, None)
    new_run(alias, slot=SLOT)
    run, state = read()
    assert state is None and isinstance(run, JobRun) and run.on is True
    assert (run.slot, run.kwargs, run.backfill) == (SLOT, {"when": "tomorrow", "n": [1, 2]}, False)
    assert values(run) == values(JobRun.objects.using(alias).get(pk=run.pk))
    assert run._state.db == alias
    JobState.objects.using(alias).create(
        name="rows", paused=True, paused_at=SLOT, override={"kwargs": {"n": 2}}
    )
    JobRun.objects.using(alias).update(status=RunStatus.SUCCEEDED)
    run, state = read()
    assert run is not None and run.on is False and run.status == RunStatus.SUCCEEDED
    assert isinstance(state, JobState) and state.pk is not None
    assert (state.paused, state.paused_at, state.override) == (True, SLOT, {"kwargs": {"n": 2}})
    assert state.paused is True and state.paused_until is None and state.code == {}
    JobRun.objects.using(alias).all().delete()
    run, state = read()
    assert run is None and values(state) == values(JobState.objects.using(alias).get(name="rows"))


def values(row: object) -> dict[str, object]:
    """Every field's value, as read (each converted: aware datetimes, JSON, booleans)."""
    fields = row._meta.concrete_fields  # type: ignore[attr-defined]
    return {field.attname: getattr(row, field.attname) for field in fields}


def test_insert_without_returning_takes_the_id_from_the_cursor(
    alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MySQL 8 has no ``INSERT ... RETURNING``: the id comes from the cursor
    (``last_insert_id``), as the ORM takes it there. Each backend here answers both ways."""
    if connections[alias].vendor == "postgresql":
        pytest.skip("PostgreSQL always has RETURNING; its cursor has no lastrowid")
    features = connections[alias].features
    monkeypatch.setattr(features, "can_return_columns_from_insert", False)
    first, second = new_run(alias), new_run(alias, attempt=2)
    assert isinstance(first.pk, int) and second.pk == first.pk + 1
    assert JobRun.objects.using(alias).get(pk=second.pk).attempt == 2


def test_what_the_orm_would_write_otherwise_is_refused(alias: str) -> None:
    """``= None`` (never true in SQL: the ORM writes IS NULL) and expressions other than
    the database's clock or ``Sql`` are refused, not sent."""
    from django.db.models import F

    run = new_run(alias)
    with pytest.raises(ValueError, match="IS NULL"):
        rows.update(JobRun, alias, {"status": RunStatus.LOST}, [("slot", "=", None)])
    with pytest.raises(TypeError, match="not a value or Sql"):
        rows.update(JobRun, alias, {"finished_at": F("started_at")}, [("pk", "=", run.pk)])
    assert JobRun.objects.using(alias).get(pk=run.pk).status == "running"

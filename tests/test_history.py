"""Run history, once-per-slot, retries, pruning and stale and running-long locks, per backend."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest
from django.core.management import call_command
from django.db import connections

from django_exclusive_jobs import LockLost, exclusive_job, force_release, try_acquire
from django_exclusive_jobs.lock.clock import database_now, now_plus
from django_exclusive_jobs.models import JobLock, JobRun, RunStatus
from django_exclusive_jobs.run.pruning import prune_runs

from .helpers import expire_now, other_holder
from .test_one_path import statements_seen


def test_every_run_is_recorded_with_holder_token_and_duration(alias: str) -> None:
    @exclusive_job("hist-plain", using=alias)
    def job() -> None:
        return None

    job()
    job()
    runs = list(JobRun.objects.using(alias).filter(name="hist-plain").order_by("started_at"))
    assert [run.status for run in runs] == [RunStatus.SUCCEEDED] * 2
    assert [run.token for run in runs] == [1, 2]
    assert all(run.slot is None for run in runs)
    assert all(run.finished_at is not None and run.finished_at >= run.started_at for run in runs)
    assert all(run.duration is not None and run.duration >= 0 for run in runs)
    assert runs[0].holder and runs[0].pid


def test_failure_is_recorded_with_type_and_traceback(alias: str) -> None:
    @exclusive_job("hist-fail", using=alias)
    def job() -> None:
        raise ValueError("bad <b>input</b>")

    with pytest.raises(ValueError, match="bad"):
        job()
    run = JobRun.objects.using(alias).get(name="hist-fail")
    assert run.status == RunStatus.FAILED
    assert run.error_type == "ValueError"
    assert "Traceback (most recent call last)" in run.error
    assert "bad <b>input</b>" in run.error


def test_huge_traceback_is_bounded(alias: str) -> None:
    @exclusive_job("hist-huge", using=alias)
    def job() -> None:
        raise RuntimeError("x" * 100_000)

    with pytest.raises(RuntimeError, match="xxx"):
        job()
    run = JobRun.objects.using(alias).get(name="hist-huge")
    assert len(run.error) < 17_000
    assert "characters cut" in run.error


def test_second_start_in_the_same_slot_skips_after_the_first_released(alias: str) -> None:
    ran: list[int] = []

    @exclusive_job("hist-slot", using=alias, every="1h")
    def job() -> None:
        ran.append(1)

    job()
    assert JobLock.objects.using(alias).free().filter(name="hist-slot").exists()
    job()  # a late server: the lock is free, the slot is not
    assert ran == [1]
    runs = JobRun.objects.using(alias).filter(name="hist-slot")
    assert runs.count() == 1
    slot = runs.get().slot
    assert slot is not None
    assert slot.minute == slot.second == slot.microsecond == 0


def flaky_body(calls: list[int]) -> object:
    """A job body that fails on its first call only."""

    def body() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first try fails")

    return body


def test_failed_slot_is_not_rerun(alias: str) -> None:
    calls: list[int] = []
    job = exclusive_job("hist-no-retry", using=alias, every="1h")(flaky_body(calls))
    with pytest.raises(RuntimeError, match="first try"):
        job()
    assert job() is None  # skipped: the slot has a (failed) run
    assert len(calls) == 1
    assert JobRun.objects.using(alias).get(name="hist-no-retry").status == RunStatus.FAILED


def test_retries_rerun_a_failed_slot_as_a_second_attempt_until_it_succeeds(alias: str) -> None:
    calls: list[int] = []
    job = exclusive_job("hist-retry", using=alias, every="1h", retries=2, retry_backoff=0)(
        flaky_body(calls)
    )
    with pytest.raises(RuntimeError, match="first try"):
        job()
    job()
    assert len(calls) == 2
    first, run = JobRun.objects.using(alias).filter(name="hist-retry").order_by("attempt")
    assert (first.status, first.attempt, first.slot) == (RunStatus.FAILED, 1, run.slot)
    assert first.retry_at is not None
    assert (run.status, run.attempt, run.error, run.retry_at) == (RunStatus.SUCCEEDED, 2, "", None)
    job()  # a succeeded slot is never retried, even with attempts left
    assert len(calls) == 2


def test_run_whose_lock_was_cleared_mid_run_is_recorded_lost_and_can_be_retried(
    alias: str,
) -> None:
    calls: list[int] = []

    @exclusive_job("hist-cleared", using=alias, every="1h", retries=1, retry_backoff=0)
    def job() -> None:
        calls.append(1)
        if len(calls) == 1:
            force_release("hist-cleared", using=alias)  # an operator clears it mid-run

    job()
    run = JobRun.objects.using(alias).get(name="hist-cleared")
    assert run.status == RunStatus.LOST  # not "succeeded": it did not run exclusively
    job()  # retries also rerun a slot whose run lost its lock
    assert len(calls) == 2
    retried = JobRun.objects.using(alias).get(name="hist-cleared", attempt=2)
    assert (retried.slot, retried.status) == (run.slot, RunStatus.SUCCEEDED)


@pytest.mark.parametrize(
    ("keepalive", "starts"), [(False, False), (True, True)], ids=["no-keepalive", "keepalive"]
)
def test_job_whose_set_up_outlasted_its_lease_does_not_start(
    alias: str, keepalive: bool, starts: bool
) -> None:
    """Writing the run row stalled past the lease: another server may hold it by now.
    With keep-alive (on from the moment the lock is taken) the lease outlives the stall."""
    import contextlib
    import time

    from django.db import connections

    calls: list[int] = []

    @exclusive_job(f"hist-slow-start-{keepalive}", using=alias, ttl=0.5, keepalive=keepalive)
    def job() -> None:
        calls.append(1)

    def stall_run_row(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if sql.lstrip().upper().startswith("INSERT") and "JOBRUN" in sql.upper():
            time.sleep(0.7)
        return execute(sql, params, many, context)

    refused = pytest.raises(LockLost, match="the lease ran out before the job started")
    with (
        connections[alias].execute_wrapper(stall_run_row),
        contextlib.nullcontext() if starts else refused,
    ):
        job()
    run = JobRun.objects.using(alias).get(name=f"hist-slow-start-{keepalive}")
    if starts:
        assert (calls, run.status) == ([1], RunStatus.SUCCEEDED)
    else:
        assert calls == []
        assert (run.status, run.error_type) == (RunStatus.LOST, "LockLost")


def looks_at_the_history(sql: str) -> bool:
    """A claim's look at the job's newest run row (history.claim, history._in_turn)."""
    upper = sql.upper()
    select = upper.lstrip().startswith("SELECT")
    return select and "JOBRUN" in upper and "DESC" in upper and "LIMIT" in upper


def test_a_first_claim_stalled_past_its_lease_leaves_no_slot_without_a_row(alias: str) -> None:
    """The job's first claim looks (no row yet) and stalls past its lease before it writes;
    meanwhile another server runs a slot two later as the job's first run. The stalled
    claim must write nothing: its row would leave the slot between without one (the
    first-run gap the protocol's model found, docs/model.md)."""
    import time

    from django.db import connections

    name = "hist-first-gap"
    options = {"every": "1s", "ttl": 0.5, "keepalive": False}
    calls: list[int] = []

    @exclusive_job(name, using=alias, **options)
    def job() -> None:
        calls.append(1)

    looked: list[str] = []
    stalled: list[float] = []

    def stall_after_the_look(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        # Before the statement after the claim's look (once its row is read: on SQLite
        # a statement not read to its end would keep the other server from writing).
        if looked and not stalled:
            stalled.append(time.monotonic())
            time.sleep(2.2)  # past the lease, and into the slot two after ours
            with other_holder(alias) as other:
                other.call("run_job", alias, name, options)
        if looks_at_the_history(sql):
            looked.append(sql)
        return execute(sql, params, many, context)

    with connections[alias].execute_wrapper(stall_after_the_look), pytest.raises(LockLost):
        job()
    assert stalled and calls == []
    rows = list(JobRun.objects.using(alias).filter(name=name).order_by("slot"))
    assert [run.status for run in rows if run.status == RunStatus.SUCCEEDED] == [
        RunStatus.SUCCEEDED
    ]
    slots = [run.slot for run in rows]
    first = slots[0]
    assert slots == [first + dt.timedelta(seconds=n) for n in range(len(slots))], (
        "a slot between the job's first row and its last has no row"
    )


def test_first_claims_of_two_slots_under_allow_all_take_turns(alias: str) -> None:
    """Under overlap="allow_all" each slot has a lock of its own, so holding the lease
    puts nothing in turn: a first claim that looked (no row yet) and stalled while a
    later slot's first claim ran must find that run and write nothing, or the slot
    between would be left without a row (found by the protocol's model, docs/model.md)."""
    import time

    from django.db import connections

    name = "hist-first-slots"
    options = {"every": "1s", "ttl": 30, "keepalive": False, "overlap": "allow_all"}
    calls: list[int] = []

    @exclusive_job(name, using=alias, **options)
    def job() -> None:
        calls.append(1)

    stalled: list[float] = []

    def stall_after_the_look(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        result = execute(sql, params, many, context)
        if looks_at_the_history(sql) and not stalled:  # the claim's look
            stalled.append(time.monotonic())
            time.sleep(2.2)  # into the slot two after ours: its own lock is free
            with other_holder(alias) as other:
                other.call("run_job", alias, name, options)
        return result

    with connections[alias].execute_wrapper(stall_after_the_look):
        job()
    assert stalled and calls == []  # our slot is older than the job's first run
    rows = list(JobRun.objects.using(alias).filter(name=name).order_by("slot"))
    assert [run.status for run in rows] == [RunStatus.SUCCEEDED]  # the other's run, alone
    lock = JobLock.objects.using(alias).filter(name__startswith=f"{name}@")
    assert not [row.name for row in lock if row.released_at is None]  # ours was released


def test_first_claims_of_two_slots_under_allow_all_wait_for_each_other(alias: str) -> None:
    """Two first claims of an allow_all job inside their transactions at once: the later
    slot's waits on the job's own lock row until ours commits, then finds our row and
    records the slot between missed (without the row lock it would find no row, and its
    run and ours would leave that slot without one)."""
    import threading
    import time

    from django.db import connections

    name = "hist-first-slots-at-once"
    options = {"every": "1s", "ttl": 30, "keepalive": False, "overlap": "allow_all"}
    calls: list[int] = []

    @exclusive_job(name, using=alias, **options)
    def job() -> None:
        calls.append(1)

    def the_other_server() -> None:
        with other_holder(alias) as other:
            other.call("run_job", alias, name, options)

    other = threading.Thread(target=the_other_server)
    looks: list[float] = []

    def stall_in_turn(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        result = execute(sql, params, many, context)
        if looks_at_the_history(sql):
            looks.append(time.monotonic())
            if len(looks) == 2:  # the look again, in turn: our transaction is open
                time.sleep(2.2)  # into a later slot, whose lock is free
                other.start()
                time.sleep(1.5)  # its first claim comes, and waits for our commit
        return result

    with connections[alias].execute_wrapper(stall_in_turn):
        job()
    other.join(timeout=60)
    assert len(looks) == 2 and calls == [1]
    rows = list(JobRun.objects.using(alias).filter(name=name).order_by("slot"))
    statuses = [run.status for run in rows]
    assert statuses[0] == statuses[-1] == RunStatus.SUCCEEDED  # ours, then the other's
    assert set(statuses[1:-1]) == {RunStatus.MISSED}  # the slots between: recorded
    slots = [run.slot for run in rows]
    assert slots == [slots[0] + dt.timedelta(seconds=n) for n in range(len(slots))]


def overran(
    alias: str, name: str, *, days_ago: int, lasted: float
) -> tuple[dt.datetime, dt.datetime]:
    """A daily job's run ``days_ago`` slots back that lasted ``lasted`` days (its end
    recorded); that slot, and today's."""
    from django_exclusive_jobs.lock.clock import database_now
    from django_exclusive_jobs.run.schedules import Every

    day = dt.timedelta(days=1)
    current = Every(period=day).slot_at(database_now(alias))
    ran = current - days_ago * day
    JobRun.objects.using(alias).create(
        name=name,
        slot=ran,
        status=RunStatus.SUCCEEDED,
        token=1,
        started_at=ran,
        finished_at=ran + lasted * day,
        duration=lasted * day.total_seconds(),
    )
    return ran, current


def test_a_claim_that_fails_between_its_writes_leaves_none_of_its_rows(alias: str) -> None:
    """A claim that records a slot missed and an older one skipped writes them (and its
    run) together: failing between them leaves none, not the newer slot's row without
    the older's (the next claim looks only after the newest row, so the older slot
    would never get one; found by the protocol's model with four slots)."""
    from django.db import connections

    name = "hist-writes-together"
    calls: list[int] = []

    @exclusive_job(name, using=alias, every="1d", overlap="skip")
    def job() -> None:
        calls.append(1)

    # The run of the slot three days ago lasted a day and a half: the next slot came
    # during it (skipped), the one after did not (missed), and today's runs.
    ran, current = overran(alias, name, days_ago=3, lasted=1.5)
    day = dt.timedelta(days=1)

    def fail_the_skipped_rows(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if sql.lstrip().upper().startswith("INSERT") and RunStatus.SKIPPED in list(params or []):
            raise RuntimeError("the server died here")
        return execute(sql, params, many, context)

    with connections[alias].execute_wrapper(fail_the_skipped_rows), pytest.raises(RuntimeError):
        job()
    assert calls == []
    rows = JobRun.objects.using(alias).filter(name=name)
    assert sorted(rows.values_list("slot", flat=True)) == [ran], "a claim's rows came apart"
    # The next start writes them all.
    job()
    assert calls == [1]
    assert sorted(rows.values_list("slot", "status")) == [
        (ran, RunStatus.SUCCEEDED),
        (current - 2 * day, RunStatus.SKIPPED),
        (current - day, RunStatus.MISSED),
        (current, RunStatus.SUCCEEDED),
    ]


def test_buffer_all_leaves_no_buffered_slot_behind_a_newer_missed_one(alias: str) -> None:
    """Under buffer_all, the start after an overlong run runs the oldest slot that came
    during it and leaves the others to the starts after it, with no row; when it records
    a slot missed (no server was up after the run), none may be left older than that
    row: the next start looks after the newest row and would never find it. They are
    skipped (found by the protocol's model; the starts are direct calls, one claim each)."""
    name = "hist-buffer-all"
    calls: list[int] = []

    @exclusive_job(name, using=alias, every="1d", overlap="buffer_all")
    def job() -> None:
        calls.append(1)

    # The run of the slot four days ago lasted two and a half days: the next two slots
    # came during it, yesterday's after it (no server up), and today's is due.
    ran, current = overran(alias, name, days_ago=4, lasted=2.5)
    day = dt.timedelta(days=1)
    for _ in range(3):
        job()
    rows = JobRun.objects.using(alias).filter(name=name).order_by("slot")
    assert list(rows.values_list("slot", "status")) == [
        (ran, RunStatus.SUCCEEDED),
        (ran + day, RunStatus.SUCCEEDED),  # the oldest that came during the run
        (ran + 2 * day, RunStatus.SKIPPED),  # came during it too; not left behind yesterday
        (ran + 3 * day, RunStatus.MISSED),  # no server up: catch_up="latest"
        (current, RunStatus.SUCCEEDED),
    ]
    assert calls == [1, 1]  # the third start found today's slot done


def test_next_holder_marks_a_crashed_servers_run_lost(alias: str) -> None:
    with other_holder(alias) as other:
        dead_token = other.try_acquire("hist-crash", ttl=30)
    # That server died mid-run: its lock row and its 'running' run row stay behind.
    JobRun.objects.using(alias).create(
        name="hist-crash",
        status=RunStatus.RUNNING,
        token=dead_token,
        started_at=now_plus(dt.timedelta(0)),
        host="dead-server",
    )
    expire_now(alias, "hist-crash")  # and its lease ran out

    @exclusive_job("hist-crash", using=alias)
    def job() -> None:
        return None

    job()
    runs = {run.token: run for run in JobRun.objects.using(alias).filter(name="hist-crash")}
    assert set(runs) == {dead_token, dead_token + 1}
    dead = runs[dead_token]
    assert (dead.status, dead.error_type) == (RunStatus.LOST, "LockLost")
    assert dead.finished_at is not None
    assert f"taken over by token {dead_token + 1}" in dead.error
    assert runs[dead_token + 1].status == RunStatus.SUCCEEDED


def on_jobrun(statements: list[str], verb: str) -> list[str]:
    return [s for s in statements if s.lstrip().upper().startswith(verb) and "JOBRUN" in s.upper()]


def test_a_start_of_its_slot_asks_after_abandoned_runs_in_its_look(alias: str) -> None:
    """A start of a slot that follows a run that ended (the usual start) closes no
    abandoned run: its one look at the history asks whether there is any, so it sends
    no UPDATE but the run's end."""
    name = "hist-one-look"
    job, first = ran_once(alias, name)  # the job's first run: no row before it
    wait_for_the_next_second(alias, first.slot)
    with statements_seen(alias) as statements:
        job()
    assert len(on_jobrun(statements, "SELECT")) == 1  # the look, with its EXISTS
    assert "EXISTS" in on_jobrun(statements, "SELECT")[0].upper()
    assert len(on_jobrun(statements, "UPDATE")) == 1  # the end; no closing of runs
    runs = JobRun.objects.using(alias).filter(name=name).exclude(status=RunStatus.MISSED)
    assert [run.status for run in runs] == [RunStatus.SUCCEEDED] * 2  # a late start: missed


def test_a_start_of_its_slot_closes_a_crashed_servers_run_of_an_earlier_slot(
    alias: str,
) -> None:
    """A server died while it ran the previous slot (its row still 'running', its
    lease over): the next slot's start finds it in its look, marks it lost, and runs."""
    name = "hist-crash-slot"
    job, run = ran_once(alias, name)
    JobRun.objects.using(alias).filter(pk=run.pk).update(
        status=RunStatus.RUNNING, finished_at=None, duration=None
    )  # as a server that died in its run leaves it
    expire_now(alias, name)
    wait_for_the_next_second(alias, run.slot)
    with statements_seen(alias) as statements:
        job()
    assert len(on_jobrun(statements, "SELECT")) == 2  # the look, again once closed
    runs = JobRun.objects.using(alias).filter(name=name).exclude(status=RunStatus.MISSED)
    assert [(r.status, r.error_type) for r in runs.order_by("slot")] == [
        (RunStatus.LOST, "LockLost"),
        (RunStatus.SUCCEEDED, ""),
    ]
    assert f"taken over by token {run.token + 1}" in runs.order_by("slot")[0].error


def test_a_start_of_its_slot_closes_a_crashed_servers_run_now_run(alias: str) -> None:
    """A Run now run (no slot) left running by a server that died, while the slot
    before ran to its end: the next slot's start finds it (its look asks after every
    run of the job, not only those of its slots) and marks it lost."""
    name = "hist-crash-run-now"
    job, ran = ran_once(alias, name)
    with other_holder(alias) as other:
        dead_token = other.try_acquire(name, ttl=30)
    JobRun.objects.using(alias).create(
        name=name,
        status=RunStatus.RUNNING,
        token=dead_token,
        started_at=now_plus(dt.timedelta(0)),
        host="dead-server",
        requested_by="someone",
    )
    expire_now(alias, name)
    wait_for_the_next_second(alias, ran.slot)
    job()
    dead = JobRun.objects.using(alias).get(name=name, token=dead_token)
    assert (dead.slot, dead.status, dead.error_type) == (None, RunStatus.LOST, "LockLost")
    latest = JobRun.objects.using(alias).exclude(slot=None).order_by("-slot").first()
    assert latest is not None and latest.slot > ran.slot
    assert (latest.status, latest.token) == (RunStatus.SUCCEEDED, dead_token + 1)


def test_a_won_run_of_its_slot_is_five_statements(alias: str) -> None:
    """A start of its slot that wins: the take, one look at the history that reads the
    job's operator row too, its run's row, the release and the end. MariaDB reads its
    take back (six)."""
    name = "hist-five"
    job, first = ran_once(alias, name)
    wait_for_the_next_second(alias, first.slot)
    with statements_seen(alias) as statements:
        job()
    missed = JobRun.objects.using(alias).filter(name=name, status=RunStatus.MISSED).exists()
    take = 2 if connections[alias].vendor == "mysql" else 1
    assert len(statements) == take + 4 + missed, statements  # a late start: one more
    [looked] = [s for s in statements if "JOBSTATE" in s.upper()]
    assert looked in on_jobrun(statements, "SELECT")  # one statement reads both
    runs = JobRun.objects.using(alias).filter(name=name).exclude(status=RunStatus.MISSED)
    assert [run.status for run in runs] == [RunStatus.SUCCEEDED] * 2


def test_a_run_after_its_slot_has_the_start_look_again(alias: str) -> None:
    """The look made with the operator row is bounded by the start's time, not by the
    slot (an override may move it): a run of a slot between the two, left by a schedule
    that was replaced, is not the newest run of the slot's history. The start looks
    again up to its slot, finds the run of the slot before, and runs its own."""
    name = "hist-look-again"

    @exclusive_job(name, every="1h", using=alias)
    def hourly() -> None:
        return None

    now = database_now(alias)
    hour = now.replace(minute=0, second=0, microsecond=0)
    if now - hour < dt.timedelta(seconds=2):  # no second between the slot and now yet
        wait_for_the_next_second(alias, hour + dt.timedelta(seconds=1))
        now = database_now(alias)
    for slot in (hour - dt.timedelta(hours=1), now - dt.timedelta(seconds=1)):
        JobRun.objects.using(alias).create(
            name=name, slot=slot, status=RunStatus.SUCCEEDED, started_at=slot
        )
    with statements_seen(alias) as statements:
        hourly()
    looks = [s for s in statements if looks_at_the_history(s)]
    assert len(looks) == 2 and "JOBSTATE" in looks[0].upper()  # then up to the slot
    ran = JobRun.objects.using(alias).get(name=name, slot=hour)
    assert ran.status == RunStatus.SUCCEEDED and ran.token is not None


def test_an_early_start_finds_its_coming_slots_run_in_its_look(alias: str) -> None:
    """A start a little before its slot (a cron line within the early allowance) serves
    the coming slot; its look, made before the override is known, reaches up to the
    start's time plus the slot tolerance, so a run another server already made of that
    slot is found there: the start skips without trying to write the slot again (an
    INSERT that would fail on the unique slot, an error in the database's log)."""
    import time

    name = "hist-early"

    @exclusive_job(name, every="3s", using=alias)  # early allowance: a third, 1 s
    def job() -> None:
        return None

    now = database_now(alias)
    coming = now.replace(microsecond=0) + dt.timedelta(seconds=3 - now.second % 3)
    time.sleep(max(0.0, (coming - now).total_seconds() - 0.7))  # 0.7 s before it
    JobRun.objects.using(alias).create(
        name=name, slot=coming, status=RunStatus.SUCCEEDED, started_at=coming
    )  # run early by another server
    with statements_seen(alias) as statements:
        job()
    assert on_jobrun(statements, "INSERT") == []
    assert [run.slot for run in JobRun.objects.using(alias).filter(name=name)] == [coming]


def ran_once(alias: str, name: str) -> tuple[Callable[[], None], JobRun]:
    """A job due every second, run once: the job, and its run."""

    @exclusive_job(name, every="1s", using=alias, ttl=30)
    def job() -> None:
        return None

    job()
    return job, JobRun.objects.using(alias).get(name=name)


def wait_for_the_next_second(alias: str, slot: dt.datetime | None) -> None:
    """Sleep until the database's clock is past ``slot``'s second."""
    import time

    from django_exclusive_jobs.lock.clock import database_now

    assert slot is not None
    while database_now(alias).replace(microsecond=0) <= slot:
        time.sleep(0.05)


def test_token_survives_a_hand_deleted_lock_row(alias: str) -> None:
    @exclusive_job("hist-token", using=alias)
    def job() -> None:
        return None

    job()
    job()
    JobLock.objects.using(alias).filter(name="hist-token").delete()
    lock = try_acquire("hist-token", using=alias, ttl=30)
    assert lock is not None
    assert lock.token == 3
    lock.release()


def make_run(alias: str, name: str, status: str, *, days_ago: float, slot: bool = False) -> JobRun:
    moment = now_plus(-dt.timedelta(days=days_ago))
    run = JobRun.objects.using(alias).create(
        name=name,
        status=status,
        started_at=moment,
        finished_at=None if status == RunStatus.RUNNING else moment,
        slot=dt.datetime(2020, 1, 1, tzinfo=dt.UTC) + dt.timedelta(days=days_ago) if slot else None,
    )
    return JobRun.objects.using(alias).get(pk=run.pk)


def test_pruning_keeps_running_last_and_latest_slot_runs(alias: str) -> None:
    old_running = make_run(alias, "a", RunStatus.RUNNING, days_ago=90)
    a_old = make_run(alias, "a", RunStatus.SUCCEEDED, days_ago=60)
    a_last = make_run(alias, "a", RunStatus.FAILED, days_ago=40)
    b_slot_latest = make_run(alias, "b", RunStatus.SUCCEEDED, days_ago=50, slot=True)
    b_slot_old = make_run(alias, "b", RunStatus.SUCCEEDED, days_ago=45, slot=False)
    b_unslotted_last = make_run(alias, "b", RunStatus.SUCCEEDED, days_ago=35)
    c_recent = make_run(alias, "c", RunStatus.SUCCEEDED, days_ago=1)
    c_recent_2 = make_run(alias, "c", RunStatus.SUCCEEDED, days_ago=0.5)

    assert prune_runs(dt.timedelta(days=30), using=alias, dry_run=True) == 2
    call_command("prune_job_runs", "--older-than", "30d", "--database", alias, verbosity=0)
    left = set(JobRun.objects.using(alias).values_list("id", flat=True))
    assert left == {
        old_running.pk,
        a_last.pk,
        b_slot_latest.pk,
        b_unslotted_last.pk,
        c_recent.pk,
        c_recent_2.pk,
    }
    assert a_old.pk not in left
    assert b_slot_old.pk not in left


def test_prune_default_age_comes_from_keep_runs(alias: str, settings: object) -> None:
    make_run(alias, "d", RunStatus.SUCCEEDED, days_ago=10)
    make_run(alias, "d", RunStatus.SUCCEEDED, days_ago=5)
    settings.EXCLUSIVE_JOBS = {"KEEP_RUNS": "7d"}  # type: ignore[attr-defined]
    call_command("prune_job_runs", "--database", alias, verbosity=0)
    assert JobRun.objects.using(alias).count() == 1


def test_stale_and_running_long_locks(alias: str) -> None:
    for _ in range(5):
        JobRun.objects.using(alias).create(
            name="slowish",
            status=RunStatus.SUCCEEDED,
            started_at=now_plus(-dt.timedelta(hours=1)),
            duration=1.0,
        )
    lock = try_acquire("slowish", using=alias, ttl=60)
    assert lock is not None
    JobRun.objects.using(alias).create(
        name="slowish",
        status=RunStatus.RUNNING,
        token=lock.token,
        started_at=now_plus(-dt.timedelta(seconds=10)),
    )
    assert list(JobLock.objects.using(alias).running_long().values_list("name", flat=True)) == [
        "slowish"
    ]
    assert not JobLock.objects.using(alias).running_long(factor=20).exists()
    assert not JobLock.objects.using(alias).stale().exists()
    expire_now(alias, "slowish")
    assert list(JobLock.objects.using(alias).stale().values_list("name", flat=True)) == ["slowish"]
    assert not JobLock.objects.using(alias).running_long().exists()  # expired: stale, not held

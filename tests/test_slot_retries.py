"""``retries=N``: a slot whose run did not succeed is run again, one attempt per row.

Direct calls exercise the claim on each backend (a direct call never waits for a retry:
each call is one start); real ``run_exclusive`` and ``exclusive_scheduler`` processes
exercise the waiting. Time passing is a test moving ``retry_at`` into the past, as
``expire_now`` does for leases: no pass/fail depends on how fast anything ran.
"""

from __future__ import annotations

import datetime as dt
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from django_exclusive_jobs import exclusive_job, try_acquire
from django_exclusive_jobs.health import Health, overview
from django_exclusive_jobs.lock.clock import database_now, now_plus
from django_exclusive_jobs.lock.errors import LockConfigurationError
from django_exclusive_jobs.models import JobRun, RunStatus
from django_exclusive_jobs.run.retries import MAX_DELAY, Retries
from django_exclusive_jobs.run.runner import Run
from django_exclusive_jobs.run.schedules import make_schedule
from django_exclusive_jobs.signals import job_finished

from .helpers import expire_now, reaped
from .test_command import argv, command_env, launch, manage, marker, wait_for

__all__ = ["marker"]  # fixture

# Slots a week apart (from 1970-01-01, a Thursday 00:00 UTC): a retry ten minutes after a
# failure stays in the failed slot unless the test runs in the last ten minutes of one.
WEEK = "7d"


def attempts(alias: str, name: str) -> list[JobRun]:
    return list(JobRun.objects.using(alias).filter(name=name).order_by("slot", "attempt"))


def always_fails(calls: list[int]) -> Callable[[], None]:
    def body() -> None:
        calls.append(1)
        raise RuntimeError(f"attempt {len(calls)} fails")

    return body


def retry_is_due_now(alias: str, name: str) -> None:
    """Let the backoff pass: the newest attempt's retry_at moves into the past."""
    newest = attempts(alias, name)[-1]
    assert newest.retry_at is not None
    JobRun.objects.using(alias).filter(pk=newest.pk).update(
        retry_at=now_plus(-dt.timedelta(seconds=1))
    )


@pytest.fixture
def finished() -> Iterator[list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []

    def receiver(sender: str, **kwargs: Any) -> None:
        sent.append(kwargs)

    job_finished.connect(receiver, dispatch_uid="test_slot_retries")
    yield sent
    job_finished.disconnect(dispatch_uid="test_slot_retries")


# --- the policy --------------------------------------------------------------------------


def test_backoff_doubles_per_attempt_up_to_an_hour_and_never_reaches_the_next_slot() -> None:
    hourly = make_schedule(every="1h")
    retries = Retries(9, dt.timedelta(seconds=30), hourly)
    assert [retries.delay(n).total_seconds() for n in (1, 2, 3)] == [30, 60, 120]
    assert retries.delay(9) == MAX_DELAY
    slot = dt.datetime(2026, 1, 1, 10, tzinfo=dt.UTC)
    assert retries.retry_at(slot, 1, slot) == slot + dt.timedelta(seconds=30)
    # 10:59:45 + 30 s is in the next slot: the newer slot wins, this attempt is the last.
    assert retries.retry_at(slot, 1, slot + dt.timedelta(minutes=59, seconds=45)) is None
    assert retries.retry_at(slot, 10, slot) is None  # no attempts left
    assert retries.retry_at(None, 1, slot) is None  # a run outside the schedule
    # A cron line that started the slot 20 s early (its tolerance) and failed at once:
    # the retry waits for the slot, else the retry's start would serve the slot before.
    early = slot - dt.timedelta(seconds=20)
    assert Retries(2, dt.timedelta(0), hourly).retry_at(slot, 1, early) == slot
    assert retries.retry_at(slot, 1, early) == slot + dt.timedelta(seconds=10)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"retries": -1}, "retries must be from 0 to 100, got -1."),
        ({"retries": True}, "retries must be a whole number, got True."),
        ({"retries": 1, "retry_backoff": -5}, "retry_backoff must not be negative, got -5s."),
        ({"retry_backoff": "1m"}, "retry_backoff only applies with retries=N (N >= 1)."),
        ({"retries": 1, "every": None}, "retries only applies with every= or cron=."),
        ({"retry_failed": True}, "retry_failed= was replaced by retries=N"),
    ],
)
def test_bad_retry_arguments_are_one_clear_error(kwargs: dict[str, Any], message: str) -> None:
    arguments = {"every": "1h", **kwargs}
    with pytest.raises(LockConfigurationError) as caught:
        exclusive_job("bad-retries", **arguments)
    assert str(caught.value).startswith(message)


# --- the claim, on each backend ------------------------------------------------------------


def test_each_attempt_is_a_row_with_its_number_and_the_last_has_no_retry_at(
    alias: str, finished: list[dict[str, Any]]
) -> None:
    calls: list[int] = []
    job = exclusive_job("retry-rows", using=alias, every="1h", retries=2, retry_backoff=0)(
        always_fails(calls)
    )
    for attempt in (1, 2, 3):
        with pytest.raises(RuntimeError, match=f"attempt {attempt} fails"):
            job()
    assert job() is None  # the slot's last attempt failed: it is done
    assert len(calls) == 3
    rows = attempts(alias, "retry-rows")
    assert [(run.attempt, run.status) for run in rows] == [(n, RunStatus.FAILED) for n in (1, 2, 3)]
    assert len({run.slot for run in rows}) == 1
    assert [run.retry_at is not None for run in rows] == [True, True, False]
    assert [(sent["attempt"], sent["final"]) for sent in finished] == [
        (1, False),
        (2, False),
        (3, True),
    ]


def test_a_retry_waits_for_retry_at_on_the_database_clock(alias: str) -> None:
    calls: list[int] = []
    job = exclusive_job("retry-wait", using=alias, every=WEEK, retries=1, retry_backoff="10m")(
        always_fails(calls)
    )
    with pytest.raises(RuntimeError):
        job()
    [first] = attempts(alias, "retry-wait")
    assert first.retry_at is not None and first.finished_at is not None
    assert first.retry_at - first.finished_at > dt.timedelta(minutes=9)
    early = Run(job.job).call()  # type: ignore[attr-defined]
    assert early.status == RunStatus.SKIPPED and early.retry_at == first.retry_at
    assert len(calls) == 1
    retry_is_due_now(alias, "retry-wait")
    with pytest.raises(RuntimeError, match="attempt 2 fails"):
        job()
    assert [(run.attempt, run.retry_at is None) for run in attempts(alias, "retry-wait")] == [
        (1, False),
        (2, True),
    ]


def test_a_crashed_run_is_marked_lost_with_a_retry_and_the_next_holder_retries_it(
    alias: str,
) -> None:
    name = "retry-crash"
    calls: list[int] = []

    @exclusive_job(name, using=alias, every=WEEK, retries=1, retry_backoff=0)
    def job() -> None:
        calls.append(1)

    # A server took the lock, started the slot's run, and died: its lease runs out.
    crashed = try_acquire(name, using=alias, ttl=30)
    assert crashed is not None and crashed.acquired_at is not None
    slot = job.job.schedule.slot_at(database_now(alias))  # type: ignore[attr-defined]
    JobRun.objects.using(alias).create(
        name=name,
        slot=slot,
        status=RunStatus.RUNNING,
        host="dead",
        instance="dead",
        token=crashed.token,
        started_at=crashed.acquired_at,
    )
    expire_now(alias, name)
    job()  # the next holder marks it lost, with its retry due now, and retries it
    assert calls == [1]
    lost, retried = attempts(alias, name)
    assert (lost.attempt, lost.status, lost.retry_at is not None) == (1, RunStatus.LOST, True)
    assert (retried.slot, retried.attempt, retried.status) == (slot, 2, RunStatus.SUCCEEDED)


def test_a_newer_slot_wins_over_an_older_slots_pending_retry(alias: str) -> None:
    name = "retry-newer"
    calls: list[int] = []
    job = exclusive_job(name, using=alias, every=WEEK, retries=2, retry_backoff=0)(
        lambda: calls.append(1)
    )
    current = job.job.schedule.slot_at(database_now(alias))  # type: ignore[attr-defined]
    older = current - dt.timedelta(days=7)
    JobRun.objects.using(alias).create(
        name=name,
        slot=older,
        status=RunStatus.FAILED,
        attempt=1,
        started_at=older,
        finished_at=older,
        retry_at=older + dt.timedelta(minutes=1),  # nobody came to retry it in time
    )
    job()
    assert calls == [1]  # the current slot ran once; the older slot was not run again
    given_up, ran = attempts(alias, name)
    assert (given_up.slot, given_up.attempt, given_up.retry_at) == (older, 1, None)
    assert (ran.slot, ran.attempt, ran.status) == (current, 1, RunStatus.SUCCEEDED)


def test_failing_is_reported_only_after_the_last_attempt(alias: str) -> None:
    name = "retry-health"
    job = exclusive_job(name, using=alias, every="1h", retries=1, retry_backoff=0)(always_fails([]))

    def health() -> Any:
        [found] = [each for each in overview(alias).jobs if each.name == name]
        return found

    with pytest.raises(RuntimeError):
        job()
    assert health().badge != Health.FAILING
    assert not [line for line in health().problems if line.startswith("failing")]
    with pytest.raises(RuntimeError):
        job()
    assert health().badge == Health.FAILING


# --- run_exclusive and the scheduler, as real processes ----------------------------------


def test_run_exclusive_retries_in_process_and_exits_with_the_last_attempts_code(
    alias: str, marker: Path
) -> None:
    env = command_env(marker, TICK_EVERY="1h")
    done = manage(alias, "flaky_retry", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "attempt 1 of 3 failed; retry at" in done.stdout + done.stderr
    rows = attempts(alias, "flaky_retry")
    assert [(run.attempt, run.status) for run in rows] == [
        (1, RunStatus.FAILED),
        (2, RunStatus.SUCCEEDED),
    ]
    failed = manage(
        alias, "crash", "--every", "1h", "--retries", "1", "--retry-backoff",
        "0", env=command_env(marker, CRASH="raise"),
    )  # fmt: skip
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert [run.attempt for run in attempts(alias, "crash")] == [1, 2]
    assert marker.read_text().count("crash-raise") == 2


def test_sigterm_while_run_exclusive_waits_for_a_retry_stops_it(alias: str, marker: Path) -> None:
    env = command_env(marker, CRASH="raise")
    command = [*argv(alias, "crash")]
    command += ["--every", WEEK, "--retries", "1", "--retry-backoff", "10m"]
    with reaped() as started:
        process = launch(started, command, env)
        wait_for(lambda: any(run.retry_at for run in attempts(alias, "crash")), timeout=60)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 128 + signal.SIGTERM, out + err
    [run] = attempts(alias, "crash")  # the retry never started
    assert run.retry_at is not None


def test_scheduler_retries_a_failed_slot_and_the_job_is_not_failing(
    alias: str, marker: Path
) -> None:
    env = command_env(marker, TICK_EVERY="3s")
    command = [sys.executable, "-m", "django", "exclusive_scheduler", "--database", alias]
    with reaped() as started:
        process = launch(started, [*command, "--jobs", "flaky_retry"], env)
        wait_for(lambda: any(run.attempt == 2 for run in attempts(alias, "flaky_retry")), 60)
        wait_for(lambda: attempts(alias, "flaky_retry")[1].status != RunStatus.RUNNING, 60)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=40)
    assert process.returncode == 0, out + err
    first, second, *_ = attempts(alias, "flaky_retry")
    assert (first.attempt, first.status, first.retry_at is not None) == (1, "failed", True)
    assert (second.slot, second.attempt, second.status) == (first.slot, 2, "succeeded")
    [health] = [job for job in overview(alias).jobs if job.name == "flaky_retry"]
    assert health.badge != Health.FAILING
    assert "attempt 1 of 3 failed; retry at" in out + err

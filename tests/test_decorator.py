"""`@exclusive_job`: the decorator, its registry and its signals."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from django_exclusive_jobs import LockConfigurationError, LockHeld, exclusive_job
from django_exclusive_jobs.run.registry import get_job
from django_exclusive_jobs.signals import job_finished, job_skipped, job_started

from .helpers import other_holder


@pytest.fixture
def events() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    seen: list[tuple[str, dict[str, Any]]] = []

    def receiver(signal: Any, sender: Any, **kwargs: Any) -> None:
        seen.append((sender, {"signal": signal, **kwargs}))

    for signal in (job_started, job_skipped, job_finished):
        signal.connect(receiver)
    yield seen
    for signal in (job_started, job_skipped, job_finished):
        signal.disconnect(receiver)


def test_default_name_is_module_and_qualname(alias: str) -> None:
    @exclusive_job(using=alias)
    def nightly() -> str:
        return "done"

    expected = f"{__name__}.test_default_name_is_module_and_qualname.<locals>.nightly"
    assert nightly.job.name == expected  # type: ignore[attr-defined]
    assert get_job(expected) is not None
    assert nightly() == "done"


def test_bare_decorator_without_parentheses() -> None:
    @exclusive_job
    def bare() -> None:
        return None

    assert bare.job.name.endswith(".bare")  # type: ignore[attr-defined]


def test_held_elsewhere_returns_none_and_sends_job_skipped(
    alias: str, events: list[tuple[str, dict[str, Any]]]
) -> None:
    ran: list[int] = []

    @exclusive_job("deco-held", using=alias)
    def job() -> int:
        ran.append(1)
        return 1

    with other_holder(alias) as other:
        other.try_acquire("deco-held", ttl=60)
        assert job() is None
    assert ran == []
    assert [(name, data["signal"]) for name, data in events] == [("deco-held", job_skipped)]
    assert events[0][1]["holder"] == other.holder


def test_on_held_raise(alias: str) -> None:
    @exclusive_job("deco-raise", using=alias, on_held="raise")
    def job() -> None:
        pytest.fail("must not run")

    with other_holder(alias) as other:
        other.try_acquire("deco-raise", ttl=60)
        with pytest.raises(LockHeld) as info:
            job()
    assert info.value.holder == other.holder


def test_job_exception_propagates_and_is_reported(
    alias: str, events: list[tuple[str, dict[str, Any]]]
) -> None:
    @exclusive_job("deco-fail", using=alias)
    def job() -> None:
        raise KeyError("missing")

    with pytest.raises(KeyError):
        job()
    finished = [data for _name, data in events if data["signal"] is job_finished]
    assert finished[0]["status"] == "failed"
    assert isinstance(finished[0]["exception"], KeyError)
    assert finished[0]["duration"] >= 0


def test_started_and_finished_signals_carry_the_lock(
    alias: str, events: list[tuple[str, dict[str, Any]]]
) -> None:
    @exclusive_job("deco-ok", using=alias)
    def job(x: int, *, y: int) -> int:
        return x + y

    assert job(1, y=2) == 3
    kinds = [data["signal"] for _name, data in events]
    assert kinds == [job_started, job_finished]
    assert events[0][1]["lock"].token == 1
    assert events[1][1]["status"] == "succeeded"


@pytest.fixture
def sync_thread_connections() -> Iterator[None]:
    """Close what Django's shared sync thread opened, so test databases can be dropped."""
    yield
    asyncio.run(sync_to_async(connections.close_all, thread_sensitive=True)())


@pytest.mark.usefixtures("sync_thread_connections")
def test_async_job_runs_under_the_lock(alias: str) -> None:
    @exclusive_job("deco-async", using=alias)
    async def job() -> str:
        await asyncio.sleep(0)
        return "async done"

    assert asyncio.run(job()) == "async done"
    with other_holder(alias) as other:
        assert other.try_acquire("deco-async", ttl=60) == 2


@pytest.mark.usefixtures("sync_thread_connections")
def test_async_job_skips_when_held(alias: str) -> None:
    @exclusive_job("deco-async-held", using=alias)
    async def job() -> str:
        return "ran"

    with other_holder(alias) as other:
        other.try_acquire("deco-async-held", ttl=60)
        assert asyncio.run(job()) is None


def test_two_jobs_with_one_name_is_a_clear_error() -> None:
    @exclusive_job("deco-dup")
    def first() -> None:
        return None

    with pytest.raises(ImproperlyConfigured, match="Two jobs are named 'deco-dup'"):

        @exclusive_job("deco-dup")
        def second() -> None:
            return None


@pytest.mark.parametrize(
    "kwargs",
    [{"ttl": 0}, {"ttl": 10, "min_hold": 11}, {"on_held": "wait"}],
)
def test_bad_decorator_arguments_fail_at_import(kwargs: dict[str, Any]) -> None:
    with pytest.raises(LockConfigurationError):
        exclusive_job("deco-bad", **kwargs)


def test_bad_name_fails_at_decoration() -> None:
    with pytest.raises(LockConfigurationError, match="control character"):

        @exclusive_job("bad\nname")
        def job() -> None:
            return None


def keepalive_running() -> bool:
    """Whether the lock this thread holds has its keep-alive (its threads start when the
    first renewal is due: test_lock_engine)."""
    from django_exclusive_jobs.lock.lock import held_here

    return any(lock._keepalive is not None for lock in held_here().values())


@pytest.mark.parametrize(
    ("setting", "argument", "expected"),
    [(True, None, True), (False, None, False), (False, True, True), (True, False, False)],
    ids=["setting-on", "setting-off", "argument-wins-on", "argument-wins-off"],
)
def test_keepalive_follows_the_setting_unless_the_job_says(
    alias: str, setting: bool, argument: bool | None, expected: bool
) -> None:
    from django.test import override_settings

    @exclusive_job(f"keepalive-{setting}-{argument}", using=alias, keepalive=argument)
    def job() -> bool:
        return keepalive_running()

    with override_settings(EXCLUSIVE_JOBS={"KEEPALIVE": setting}):
        assert job() is expected


def test_async_calls_sharing_one_sync_thread_run_the_job_once(alias: str) -> None:
    """Every async call takes its lock in Django's one sync thread: the second and third
    must skip like any other server, not re-enter the first call's lock."""
    started = 0

    @exclusive_job("async-once", using=alias, ttl=60)
    async def job() -> str:
        nonlocal started
        started += 1
        await asyncio.sleep(0.3)
        return "ran"

    async def three() -> list[Any]:
        return list(await asyncio.gather(job(), job(), job()))

    try:
        results = asyncio.run(three())
    finally:
        asyncio.run(sync_to_async(connections.close_all, thread_sensitive=True)())
    assert started == 1
    assert sorted(results, key=str) == [None, None, "ran"]


def test_a_job_that_calls_itself_skips_the_inner_call(alias: str) -> None:
    calls: list[Any] = []

    @exclusive_job("self-calling", using=alias, ttl=60)
    def job(depth: int) -> str:
        calls.append(depth)
        if depth == 0:
            assert job(1) is None  # the job is running: the inner call skips
        return "done"

    assert job(0) == "done"
    assert calls == [0]


def test_a_failing_job_started_receiver_does_not_leave_the_lock_held(alias: str) -> None:
    from django_exclusive_jobs.models import JobLock, JobRun

    def broken(**kwargs: Any) -> None:
        raise RuntimeError("metrics backend down")

    @exclusive_job("receiver-fails", using=alias, ttl=60)
    def job() -> None:
        raise AssertionError("the job must not start")

    job_started.connect(broken)
    try:
        with pytest.raises(RuntimeError, match="metrics backend down"):
            job()
    finally:
        job_started.disconnect(broken)
    assert JobLock.objects.using(alias).free().filter(name="receiver-fails").exists()
    run = JobRun.objects.using(alias).get(name="receiver-fails")
    assert run.status == "failed"

"""An idle scheduler on PostgreSQL listens instead of polling (run/listening.py): it
sends one statement per beat (the beat, the live schedulers and the clock) and reads the
requests and the operators' rows only when a NOTIFY says something was written. Where
it cannot listen it polls, as before. The scheduler runs in this process (``run_for``);
another thread plays the operator, on its own connection."""

from __future__ import annotations

import datetime as dt
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings

from django_exclusive_jobs.models import JobRun
from django_exclusive_jobs.models import Scheduler as SchedulerRow
from django_exclusive_jobs.run import control, overrides
from django_exclusive_jobs.run import scheduler as scheduler_module
from django_exclusive_jobs.run.listening import Listener, can_listen
from django_exclusive_jobs.run.registry import get_job
from django_exclusive_jobs.run.scheduler import Scheduler

from .test_command import wait_for


@contextmanager
def counted(alias: str) -> Iterator[Counter[str]]:
    """The statements this thread sends to ``alias``, by the table they name."""
    seen: Counter[str] = Counter()

    def count(execute: Callable[..., Any], sql: str, *args: Any) -> Any:
        lowered = sql.lower()
        for table in ("runrequest", "jobstate", "_scheduler"):
            if table in lowered:
                seen[table] += 1
        seen["all"] += 1
        return execute(sql, *args)

    with connections[alias].execute_wrapper(count):
        yield seen


def quick_scheduler(alias: str, run_for: float, **options: Any) -> Scheduler:
    job = get_job("quick")
    assert job is not None
    return Scheduler([], on_request=[job.but(using=alias)], using=alias, run_for=run_for, **options)


def fast_beats(monkeypatch: pytest.MonkeyPatch, beat: float, poll: float) -> None:
    monkeypatch.setattr(SchedulerRow, "BEAT", dt.timedelta(seconds=beat))
    monkeypatch.setattr(scheduler_module, "REQUEST_POLL", poll)


def test_an_idle_scheduler_sends_its_beats_and_polls_only_where_it_cannot_listen(
    alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3 s with a beat every 0.5 s and a poll every 0.25 s (as 60 s with 10 s and 5 s)."""
    fast_beats(monkeypatch, beat=0.5, poll=0.25)
    served = quick_scheduler(alias, run_for=3)
    with counted(alias) as seen:
        assert served.run() == 0
    if connections[alias].vendor == "postgresql":
        assert served.listener.listening
        # Start-up reads the requests once; then only the beats (one statement each,
        # with the live schedulers and the clock) and the stop.
        assert seen["runrequest"] == 1, seen
        assert seen["jobstate"] == 2, seen  # at start, and that first poll
        assert 5 <= seen["_scheduler"] <= 9, seen
    else:
        assert not served.listener.wanted
        assert seen["runrequest"] >= 8, seen  # a poll every 0.25 s
        assert seen["_scheduler"] >= 10, seen  # each beat: an UPDATE and the live list


def operator(do: Callable[[], object], when: Callable[[], bool]) -> threading.Thread:
    """``do`` from another thread (another connection), once ``when`` holds."""

    def act() -> None:
        try:
            wait_for(when, timeout=30)
            do()
        finally:
            connections.close_all()  # this thread's

    thread = threading.Thread(target=act, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def postgres_alias(alias: str) -> str:
    if connections[alias].vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; elsewhere the scheduler polls")
    return alias


def asleep(served: Scheduler) -> Callable[[], bool]:
    """It listens, and has read what waited: the next read is at a NOTIFY."""
    return lambda: served.listener.listening and served.next_poll == float("inf")


def test_a_run_asked_for_now_starts_at_the_notify_not_at_a_poll(
    postgres_alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The poll would come after a minute: the run starts within the scheduler's 30 s
    only if the NOTIFY woke it."""
    alias = postgres_alias
    fast_beats(monkeypatch, beat=10, poll=60)
    served = quick_scheduler(alias, run_for=30, max_runs=1)
    ask = operator(lambda: control.request_run("quick", by="ops", using=alias), asleep(served))
    assert served.run() == 0
    ask.join(timeout=5)
    assert served.ended_runs == 1
    [run] = JobRun.objects.using(alias).filter(name="quick")
    assert (run.status, run.requested_by) == ("succeeded", "ops")


def test_an_override_is_followed_at_its_notify(
    postgres_alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    alias = postgres_alias
    fast_beats(monkeypatch, beat=10, poll=60)
    served = quick_scheduler(alias, run_for=30)
    job = get_job("quick")
    assert job is not None

    def change() -> None:
        overrides.override(job, {"timeout": 5.0}, reason="slow disk", by="ops", using=alias)
        wait_for(lambda: served.served.applied.get("quick") == {"timeout": 5.0}, timeout=20)
        served.stop()

    change_it = operator(change, asleep(served))
    assert served.run() == 0
    change_it.join(timeout=5)
    assert served.served.applied.get("quick") == {"timeout": 5.0}
    assert served.stops == 1  # stopped by the operator's thread, not by run_for


def test_a_scheduler_whose_connection_was_cut_listens_again(
    postgres_alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its backend is terminated while it listens: it notices (no busy loop, no crash),
    reconnects at its next beat, listens again and reads what came meanwhile."""
    alias = postgres_alias
    fast_beats(monkeypatch, beat=1, poll=60)
    served = quick_scheduler(alias, run_for=40, max_runs=1)

    def cut_then_ask() -> None:
        pid = served.listener._on.info.backend_pid  # type: ignore[union-attr]
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        control.request_run("quick", by="ops", using=alias)

    cut = operator(cut_then_ask, asleep(served))
    assert served.run() == 0
    cut.join(timeout=5)
    assert served.ended_runs == 1
    assert served.listener.listening


def test_it_polls_behind_pgbouncer_in_transaction_mode_or_when_told(
    postgres_alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``DISABLE_SERVER_SIDE_CURSORS`` is Django's setting for PgBouncer in transaction
    mode, where a LISTEN stays on whichever server connection the transaction had."""
    alias = postgres_alias
    assert can_listen(alias)
    monkeypatch.setitem(connections[alias].settings_dict, "DISABLE_SERVER_SIDE_CURSORS", True)
    assert not can_listen(alias) and not Listener(alias).wanted
    monkeypatch.delitem(connections[alias].settings_dict, "DISABLE_SERVER_SIDE_CURSORS")
    with override_settings(EXCLUSIVE_JOBS={"LISTEN": False}):
        assert not can_listen(alias)

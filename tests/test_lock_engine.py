"""The lock engine's promises, on every backend (the `alias` fixture)."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext

from django_exclusive_jobs import (
    LockConfigurationError,
    LockHeld,
    LockLost,
    exclusive_lock,
    force_release,
    try_acquire,
)
from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.lock.lock import process
from django_exclusive_jobs.models import JobLock, LockState
from django_exclusive_jobs.signals import lock_lost

from .helpers import OtherServer, expire_now, other_holder, row
from .test_command import wait_for


def test_first_acquire_creates_row_and_token_one(alias: str) -> None:
    lock = try_acquire("report", using=alias, ttl=30)
    assert lock is not None
    assert lock.held
    assert lock.token == 1
    assert lock.holder == process.holder()
    saved = row(alias, "report")
    assert (saved.host, saved.pid, saved.instance) == (
        process.host,
        process.pid,
        process.instance,
    )
    assert saved.expires_at is not None and saved.acquired_at is not None
    assert (
        dt.timedelta(seconds=29) < saved.expires_at - saved.acquired_at <= dt.timedelta(seconds=31)
    )
    assert lock.release() is True
    assert not lock.held


def test_second_holder_skips_while_lease_open(alias: str) -> None:
    lock = try_acquire("report", using=alias, ttl=30)
    assert lock is not None
    with other_holder(alias) as other:
        assert other.try_acquire("report", ttl=30) is None
    assert lock.release()


def test_released_lock_is_taken_with_next_token(alias: str) -> None:
    first = try_acquire("report", using=alias, ttl=30)
    assert first is not None and first.release()
    with other_holder(alias) as other:
        token = other.try_acquire("report", ttl=30)
    assert token == first.token + 1


def test_takeover_after_expiry_but_not_before(alias: str) -> None:
    lock = try_acquire("report", using=alias, ttl=30)
    assert lock is not None
    with other_holder(alias) as other:
        assert other.try_acquire("report", ttl=30) is None
        expire_now(alias, "report")
        assert other.try_acquire("report", ttl=30) == lock.token + 1
    with pytest.raises(LockLost):
        lock.ensure_held()
    with pytest.raises(LockLost):
        lock.renew()
    assert not lock.held
    assert lock.release() is False  # never frees the new holder's lock
    assert JobLock.objects.using(alias).held().filter(name="report").count() == 1


def taken_once_free(other: OtherServer, name: str) -> int | None:
    """The token the other server gets by trying to take ``name`` until it succeeds."""
    taken: list[int | None] = []
    wait_for(lambda: taken.append(other.try_acquire(name, ttl=30)) or taken[-1], 10)
    return taken[-1]


def test_real_lease_expiry_frees_the_lock(alias: str) -> None:
    # The other server is up before the lease begins (its start-up took over a second on
    # a loaded machine); its take is judged on the database's clock.
    with other_holder(alias) as other:
        lock = try_acquire("short", using=alias, ttl=2)
        assert lock is not None
        assert other.try_acquire("short", ttl=30) is None
        assert taken_once_free(other, "short") == lock.token + 1
        assert row(alias, "short").acquired_at >= lock.expires_at


def test_reentrant_acquire_extends_and_keeps_token(alias: str) -> None:
    outer = try_acquire("report", using=alias, ttl=30)
    assert outer is not None
    before = row(alias, "report").expires_at
    time.sleep(0.05)
    inner = try_acquire("report", using=alias, ttl=30)
    assert inner is not None and inner.reentrant
    assert inner.token == outer.token
    assert row(alias, "report").expires_at > before
    assert inner.release()
    # the inner release must not free the outer holder's lock
    with other_holder(alias) as other:
        assert other.try_acquire("report", ttl=30) is None
    assert outer.release()


def test_other_thread_of_same_process_is_another_holder(alias: str) -> None:
    lock = try_acquire("report", using=alias, ttl=30)
    assert lock is not None
    seen: list[object] = []

    def other_thread() -> None:
        try:
            seen.append(try_acquire("report", using=alias, ttl=30))
        finally:
            connections.close_all()

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join(30)
    assert seen == [None]
    lock.release()


def test_token_never_reused_across_release_takeover_and_clear(alias: str) -> None:
    tokens = []
    lock = try_acquire("fence", using=alias, ttl=30)
    assert lock is not None
    tokens.append(lock.token)
    lock.release()
    lock = try_acquire("fence", using=alias, ttl=30)  # after release
    assert lock is not None
    tokens.append(lock.token)
    expire_now(alias, "fence")
    with other_holder(alias) as other:  # takeover
        tokens.append(other.try_acquire("fence", ttl=30))
    assert force_release("fence", using=alias)  # manual clear
    lock = try_acquire("fence", using=alias, ttl=30)
    assert lock is not None
    tokens.append(lock.token)
    lock.release()
    assert tokens == sorted(set(tokens)) and len(tokens) == 4
    assert tokens == list(range(tokens[0], tokens[0] + 4))


def test_manual_clear_makes_holder_lose(alias: str) -> None:
    lost: list[str] = []

    def receiver(sender: object, lock: object, reason: str, **kwargs: object) -> None:
        lost.append(reason)

    lock_lost.connect(receiver)
    try:
        lock = try_acquire("report", using=alias, ttl=30)
        assert lock is not None
        assert force_release("report", using=alias)
        with pytest.raises(LockLost):
            lock.renew()
        assert not lock.held
        assert len(lost) == 1
        with pytest.raises(LockLost):
            lock.ensure_held()
    finally:
        lock_lost.disconnect(receiver)


def test_row_deleted_by_hand_breaks_nothing(alias: str) -> None:
    lock = try_acquire("report", using=alias, ttl=30)
    assert lock is not None
    JobLock.objects.using(alias).filter(name="report").delete()
    assert lock.release() is False
    again = try_acquire("report", using=alias, ttl=30)
    assert again is not None and again.release()


def test_renew_extends_on_database_time(alias: str) -> None:
    lock = try_acquire("report", using=alias, ttl=2)
    assert lock is not None
    first = row(alias, "report").expires_at
    time.sleep(0.1)
    lock.renew()
    assert row(alias, "report").expires_at > first
    assert lock.expires_at == row(alias, "report").expires_at
    lock.ensure_held()
    lock.release()


def test_min_hold_keeps_lock_closed_after_release(alias: str) -> None:
    # The other server is up before the hold begins (its start-up took over a second on
    # a loaded machine); a 3-s hold leaves room for a slow step; the take that ends it is
    # judged on the database's clock.
    with other_holder(alias) as other:
        lock = try_acquire("report", using=alias, ttl=30, min_hold=3)
        assert lock is not None
        assert lock.release()
        saved = row(alias, "report")
        assert saved.released_at is not None
        assert saved.expires_at - saved.acquired_at >= dt.timedelta(seconds=2.99)
        state = JobLock.objects.using(alias).with_state().get(name="report").state
        assert state == LockState.COOLDOWN
        assert other.try_acquire("report", ttl=30) is None
        assert taken_once_free(other, "report") == lock.token + 1
        assert row(alias, "report").acquired_at >= saved.expires_at


def test_release_without_min_hold_frees_at_once(alias: str) -> None:
    lock = try_acquire("report", using=alias, ttl=30)
    assert lock is not None and lock.release()
    assert JobLock.objects.using(alias).free().filter(name="report").exists()
    with other_holder(alias) as other:
        assert other.try_acquire("report", ttl=30) == lock.token + 1


def test_wait_acquires_once_holder_releases(alias: str) -> None:
    with other_holder(alias) as other:
        assert other.try_acquire("report", ttl=30) == 1
        timer = threading.Timer(0.4, other.release)
        timer.start()
        started = time.monotonic()
        lock = try_acquire("report", using=alias, ttl=30, wait=10)
        timer.join()
    assert lock is not None and lock.token == 2
    assert 0.3 < time.monotonic() - started < 10
    lock.release()


def test_wait_gives_up_after_its_time(alias: str) -> None:
    with other_holder(alias) as other:
        assert other.try_acquire("report", ttl=30) == 1
        started = time.monotonic()
        assert try_acquire("report", using=alias, ttl=30, wait=0.3) is None
        assert time.monotonic() - started >= 0.3


def test_context_manager_raises_lock_held_with_holder(alias: str) -> None:
    with other_holder(alias) as other:
        other.try_acquire("report", ttl=30)
        with pytest.raises(LockHeld) as info, exclusive_lock("report", using=alias):
            pytest.fail("must not run")
    assert info.value.holder == other.holder
    assert info.value.expires_at is not None


def test_context_manager_releases_on_exception(alias: str) -> None:
    with pytest.raises(ZeroDivisionError), exclusive_lock("report", using=alias, ttl=30):
        1 / 0  # noqa: B018
    assert JobLock.objects.using(alias).free().filter(name="report").exists()


def test_context_manager_is_a_decorator_with_fresh_lock_per_call(alias: str) -> None:
    tokens: list[int] = []

    @exclusive_lock("decorated", using=alias, ttl=30)
    def job() -> None:
        tokens.append(row(alias, "decorated").token)

    job()
    job()
    assert tokens == [1, 2]


def test_keepalive_keeps_lock_for_three_times_the_ttl(alias: str) -> None:
    with exclusive_lock("long", using=alias, ttl=0.6) as lock, other_holder(alias) as other:
        deadline = time.monotonic() + 1.8
        while time.monotonic() < deadline:
            assert other.try_acquire("long", ttl=30) is None
            time.sleep(0.1)
        lock.ensure_held()
        assert lock.held
    assert lock._keepalive is None


def test_a_short_hold_starts_no_keepalive_thread(alias: str) -> None:
    """The keep-alive's threads start when its first renewal (or its watchdog) is due: a
    lock released before ttl/3 cost no thread; one held past it is renewed by them."""

    def threads(name: str) -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.endswith(f":{name}")]

    with exclusive_lock("short", using=alias, ttl=60) as lock:
        assert lock._keepalive is not None  # armed
        assert threads("short") == []
    with exclusive_lock("longer", using=alias, ttl=0.6) as lock:
        first = lock.expires_at
        wait_for(lambda: lock.expires_at != first, timeout=5)  # a renewal came
        assert sorted(threads("longer")) == [
            "exclusive-jobs-keepalive:longer",
            "exclusive-jobs-watchdog:longer",
        ]
    assert threads("longer") == []  # released: both stopped


def test_released_locks_do_not_pile_up_waiting_for_their_keepalive(alias: str) -> None:
    """A lock released before its first renewal leaves no keep-alive behind for long:
    the waker drops those of stopped keep-alives as its waits grow."""
    from django_exclusive_jobs.lock import keepalive

    for number in range(200):
        with exclusive_lock(f"many-{number % 4}", using=alias, ttl=600):
            pass
    waiting = [due for due in keepalive._waker._due if due[2].lock.name.startswith("many-")]
    assert len(waiting) <= 128, len(waiting)


def test_keepalive_reports_takeover_as_lost(alias: str) -> None:
    lost = threading.Event()

    def receiver(sender: object, lock: object, reason: str, **kwargs: object) -> None:
        lost.set()

    lock_lost.connect(receiver)
    try:
        with exclusive_lock("taken", using=alias, ttl=0.9) as lock:
            expire_now(alias, "taken")
            with other_holder(alias) as other:
                assert other.try_acquire("taken", ttl=30) == lock.token + 1
            assert lost.wait(5)
            assert not lock.held
            with pytest.raises(LockLost):
                lock.ensure_held()
    finally:
        lock_lost.disconnect(receiver)


def test_watchdog_gives_up_a_lock_whose_renewals_never_come_back(alias: str) -> None:
    """A renewal stuck on a silent database must not keep the job going past its lease."""
    from django_exclusive_jobs.lock.keepalive import KeepAlive

    reasons: list[str] = []

    def receiver(sender: object, lock: object, reason: str, **kwargs: object) -> None:
        reasons.append(reason)

    lock = try_acquire("silent", using=alias, ttl=1)
    assert lock is not None
    keepalive = KeepAlive(lock, interval=3600)  # renewals that never happen in time
    lock_lost.connect(receiver)
    try:
        keepalive.start()
        deadline = time.monotonic() + 10
        # Until lock_lost has been sent: the lock is marked lost (and logged) first.
        while not (lock.lost and reasons) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lock.lost, "the watchdog never gave the lock up"
        assert not lock.held
        assert reasons == [lock.lost_reason]
        assert "could not renew before the lease ran out: no renewal got through" in reasons[0]
        with pytest.raises(LockLost):
            lock.renew()
    finally:
        keepalive.stop()
        lock_lost.disconnect(receiver)
    assert not keepalive.is_alive()


def test_renewal_that_lands_after_the_lock_was_given_up_keeps_others_out_until_release(
    alias: str,
) -> None:
    """The job was told to stop; until it has (release), nobody else may start."""
    lock = try_acquire("late", using=alias, ttl=60)
    assert lock is not None

    def give_up_while_in_flight(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        lock._mark_lost("the watchdog gave up")  # as if it fired during the renewal
        return execute(sql, params, many, context)

    with (
        connections[alias].execute_wrapper(give_up_while_in_flight),
        pytest.raises(LockLost, match="the watchdog gave up"),
    ):
        lock.renew()
    saved = row(alias, "late")
    assert (saved.token, saved.released_at) == (lock.token, None)
    with other_holder(alias) as other:
        assert other.try_acquire("late", ttl=30) is None  # the late lease still holds
        assert lock.release() is False  # the job has stopped: a lost lock's release...
        assert row(alias, "late").released_at is not None  # ...hands the lease back
        assert other.try_acquire("late", ttl=30) == lock.token + 1


def test_lock_inside_atomic_block_is_refused(alias: str) -> None:
    with (
        transaction.atomic(using=alias),
        pytest.raises(LockConfigurationError, match="transaction"),
    ):
        try_acquire("report", using=alias)


def test_unicode_and_case_sensitive_names(alias: str) -> None:
    upper = try_acquire("Bericht-Übersicht-📈", using=alias, ttl=30)
    lower = try_acquire("bericht-übersicht-📈", using=alias, ttl=30)
    assert upper is not None and lower is not None
    assert row(alias, "Bericht-Übersicht-📈").name == "Bericht-Übersicht-📈"
    upper.release()
    lower.release()


def test_database_now_is_the_servers_clock(alias: str) -> None:
    now = database_now(alias)
    assert now.tzinfo is not None
    assert abs((now - dt.datetime.now(dt.UTC)).total_seconds()) < 5


BAD_INPUT = [
    pytest.param({"name": ""}, "empty", id="empty-name"),
    pytest.param({"name": "x" * 256}, "256 characters", id="long-name"),
    pytest.param({"name": "a\nb"}, "control character", id="newline"),
    pytest.param({"name": "a\x00b"}, "control character", id="nul"),
    pytest.param({"name": " padded"}, "white space", id="leading-space"),
    pytest.param({"name": 42}, "string", id="int-name"),
    pytest.param({"name": None}, "string", id="none-name"),
    pytest.param({"name": "ok", "ttl": 0}, "ttl must be positive", id="ttl-zero"),
    pytest.param({"name": "ok", "ttl": -5}, "ttl must be positive", id="ttl-negative"),
    pytest.param({"name": "ok", "ttl": "soon"}, "not a duration", id="ttl-text"),
    pytest.param({"name": "ok", "ttl": float("nan")}, "finite", id="ttl-nan"),
    pytest.param({"name": "ok", "min_hold": -1}, "negative", id="min-hold-negative"),
    pytest.param(
        {"name": "ok", "ttl": 10, "min_hold": 11}, "longer than ttl", id="min-hold-gt-ttl"
    ),
    pytest.param({"name": "ok", "wait": -1}, "negative", id="wait-negative"),
    pytest.param({"name": "ok", "using": "nope"}, "Unknown database alias", id="unknown-alias"),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD_INPUT)
def test_bad_input_is_refused_before_any_sql(alias: str, kwargs: dict, message: str) -> None:
    kwargs = {"using": alias, **kwargs}
    with (
        CaptureQueriesContext(connections[alias]) as queries,
        pytest.raises(LockConfigurationError, match=message) as info,
    ):
        try_acquire(**kwargs)
    assert "\n" not in str(info.value)
    assert len(queries) == 0
    assert not JobLock.objects.using(alias).exists()

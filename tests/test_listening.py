"""An idle scheduler on PostgreSQL listens instead of polling (run/listening.py): it
sends one statement per beat (the beat, the live schedulers and the clock) and reads the
requests and the operators' rows only when a NOTIFY says something was written. Where
it cannot listen it polls, as before. The scheduler runs in this process (``run_for``);
another thread plays the operator, on its own connection."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings
from django.utils.timezone import now

from django_exclusive_jobs.models import JobRun
from django_exclusive_jobs.models import Scheduler as SchedulerRow
from django_exclusive_jobs.run import control, overrides
from django_exclusive_jobs.run import scheduler as scheduler_module
from django_exclusive_jobs.run.listening import Listener, can_listen
from django_exclusive_jobs.run.registry import get_job
from django_exclusive_jobs.run.scheduler import Scheduler

from .helpers import reaped
from .test_command import marker, wait_for
from .test_scheduler import scheduler_env, start_scheduler, stop

__all__ = ["marker"]  # a fixture


@contextmanager
def counted(alias: str, since: Callable[[], bool]) -> Iterator[Counter[str]]:
    """The statements this thread sends to ``alias`` once ``since()`` holds, by the
    tables they name."""
    seen: Counter[str] = Counter()

    def count(execute: Callable[..., Any], sql: str, *args: Any) -> Any:
        if since():
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


@pytest.fixture
def postgres_alias(alias: str) -> str:
    if connections[alias].vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; elsewhere the scheduler polls")
    return alias


def fast_beats(monkeypatch: pytest.MonkeyPatch, beat: float, poll: float) -> None:
    monkeypatch.setattr(SchedulerRow, "BEAT", dt.timedelta(seconds=beat))
    monkeypatch.setattr(scheduler_module, "REQUEST_POLL", poll)


def assert_looks(seen: Counter[str], seconds: float, poll: float) -> None:
    """A look every ``poll`` seconds, each one statement (every other one is the beat):
    the requests waiting, the overrides' text, the clock, the live schedulers. The
    overrides are read once (their text never changes here); nothing else but the stop."""
    assert seen["runrequest"] >= 0.66 * seconds / poll, seen
    assert seen["all"] - seen["runrequest"] <= 3, seen  # the overrides, the stop
    assert seen["all"] <= seconds / poll + 4, seen


def test_an_idle_scheduler_sends_one_statement_a_beat_or_a_look(
    alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3 s with a beat every 0.5 s and a poll every 0.25 s (as 60 s with 10 s and 5 s),
    counted from its start (after its first reads)."""
    fast_beats(monkeypatch, beat=0.5, poll=0.25)
    served = quick_scheduler(alias, run_for=3)
    with counted(alias, since=lambda: served.began) as seen:
        assert served.run() == 0
    if connections[alias].vendor == "postgresql":
        assert served.listener.listening
        # Its first read of the run-time schedules, the overrides and the requests;
        # then only the beats, each one statement with the live schedulers, the clock
        # and a look for what no NOTIFY told of (it found nothing: no read followed);
        # the stop.
        assert seen["all"] - seen["_scheduler"] == 3, seen
        assert 5 <= seen["_scheduler"] <= 3 / 0.5 + 2, seen
    else:
        assert not served.listener.wanted
        assert_looks(seen, 3, 0.25)


def test_a_scheduler_told_not_to_listen_looks_on_postgresql_as_elsewhere(
    postgres_alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PgBouncer in transaction mode: a look every poll, every other one carried by the
    beat's statement, as on SQLite."""
    fast_beats(monkeypatch, beat=0.5, poll=0.25)
    with override_settings(EXCLUSIVE_JOBS={"LISTEN": False}):
        served = quick_scheduler(postgres_alias, run_for=3)
        with counted(postgres_alias, since=lambda: served.began) as seen:
            assert served.run() == 0
    assert not served.listener.wanted
    assert_looks(seen, 3, 0.25)


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


def asleep(served: Scheduler) -> Callable[[], bool]:
    """It listens, and has read what waited: the next read is at a NOTIFY."""
    return lambda: served.listener.listening and served.next_poll == float("inf")


def told(alias: str, listen: bool) -> bool:
    """``EXCLUSIVE_JOBS["LISTEN"]`` for this test; listening needs PostgreSQL."""
    if listen and connections[alias].vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; elsewhere the scheduler polls")
    return listen


def ready(served: Scheduler, listen: bool) -> Callable[[], bool]:
    """Listening: it listens, and has read what waited (the next read is at a NOTIFY).
    Polling: it has looked once."""
    if listen:
        return lambda: served.listener.listening and served.next_poll == float("inf")
    return lambda: served.overrides_seen is not None


@pytest.mark.parametrize("listen", [True, False], ids=["listening", "polling"])
def test_a_run_asked_for_now_starts_at_its_notify_or_at_the_next_look(
    alias: str, listen: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listening, the poll would come after a minute: the run starts within the
    scheduler's 30 s only if the NOTIFY woke it. Polling: at the next look (0.5 s)."""
    fast_beats(monkeypatch, beat=10, poll=60 if told(alias, listen) else 0.5)
    with override_settings(EXCLUSIVE_JOBS={"LISTEN": listen}):
        served = quick_scheduler(alias, run_for=30, max_runs=1)
        ask = control.request_run
        asking = operator(lambda: ask("quick", by="ops", using=alias), ready(served, listen))
        assert served.run() == 0
    asking.join(timeout=5)
    assert served.ended_runs == 1
    [run] = JobRun.objects.using(alias).filter(name="quick")
    assert (run.status, run.requested_by) == ("succeeded", "ops")


@pytest.mark.parametrize("listen", [True, False], ids=["listening", "polling"])
def test_an_override_is_followed_at_its_notify_or_at_the_next_look(
    alias: str, listen: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Then back to the code, followed too: the look sees the overrides' text change."""
    fast_beats(monkeypatch, beat=10, poll=60 if told(alias, listen) else 0.5)
    job = get_job("quick")
    assert job is not None

    def change() -> None:
        overrides.override(job, {"timeout": 5.0}, reason="slow disk", by="ops", using=alias)
        wait_for(lambda: served.served.applied.get("quick") == {"timeout": 5.0}, timeout=20)
        overrides.back_to_code(job, reason="disk replaced", by="ops", using=alias)
        wait_for(lambda: served.served.applied.get("quick") == {}, timeout=20)
        served.stop()

    with override_settings(EXCLUSIVE_JOBS={"LISTEN": listen}):
        served = quick_scheduler(alias, run_for=30)
        changing = operator(change, ready(served, listen))
        assert served.run() == 0
    changing.join(timeout=5)
    assert served.served.applied.get("quick") == {}
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

    cut = operator(cut_then_ask, ready(served, listen=True))
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


def test_a_beat_that_looks_writes_its_row_if_missing_and_its_beat_if_not(alias: str) -> None:
    """The beat's upsert (models/beats.py) on its own: the row the first time, with what
    the ORM would write; then only the beat and the free capacity."""
    from django_exclusive_jobs.models import RunRequest, beats

    row = {"instance": "i-1", "host": "web-1", "pid": 42, "version": "1", "jobs": ["quick"]}
    RunRequest.objects.using(alias).create(name="quick", requested_by="ops", requested_at=now())
    first = beats.beat_and_look(alias, {**row, "free": 3}, ["quick", "digest"])
    if first is None:
        pytest.skip("an upsert cannot return here (MySQL): the beat is written apart")
    [written] = SchedulerRow.objects.using(alias).all()
    assert (written.host, written.pid, written.jobs, written.free) == ("web-1", 42, ["quick"], 3)
    assert written.stopped_at is None and written.acknowledged_by == ""
    # No override, then no run-time schedule (none, no change): "COUNT@LATEST".
    assert (first.waiting, first.overrides) == (1, "\n0@")
    second = beats.beat_and_look(alias, {**row, "free": 1}, ["quick"])
    assert second is not None and second.waiting == 1
    [beaten] = SchedulerRow.objects.using(alias).all()
    assert beaten.free == 1 and beaten.started_at == written.started_at
    assert beaten.last_beat_at >= written.last_beat_at


# --- behind a real PgBouncer in transaction mode ------------------------------------------

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


@pytest.fixture
def pgbouncer() -> Iterator[tuple[int, Path]]:
    """PgBouncer on a free port, transaction pooling, in front of the test server: its
    port and its log."""
    assert os.path.exists(PGBOUNCER), "pgbouncer is missing (scripts/test.sh installs it)"
    home = Path(tempfile.mkdtemp(prefix="pgbouncer-"))  # not under pytest's 0700 root
    home.chmod(0o777)  # it drops root for the postgres user
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = home / "pgbouncer.log"
    (home / "pgbouncer.ini").write_text(
        "[databases]\n* = host=127.0.0.1 port=5432 user=postgres\n"
        f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n"
        "auth_type = any\npool_mode = transaction\n"
        f"unix_socket_dir =\nlogfile = {log}\npidfile = {home / 'pgbouncer.pid'}\n"
    )
    process = subprocess.Popen([PGBOUNCER, "-u", "postgres", str(home / "pgbouncer.ini")])
    try:

        def listening() -> bool:
            with socket.socket() as client:
                return client.connect_ex(("127.0.0.1", port)) == 0

        wait_for(listening, timeout=30)
        yield port, log
    finally:
        process.terminate()
        process.wait(timeout=30)
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.slow
def test_behind_pgbouncer_a_scheduler_looks_for_what_is_asked_and_runs_it(
    postgres_alias: str, marker: Path, pgbouncer: tuple[int, Path]
) -> None:
    """A real ``exclusive_scheduler`` whose database goes through PgBouncer in
    transaction mode, with ``DISABLE_SERVER_SIDE_CURSORS`` (the documented settings): it
    does not listen (a LISTEN would stay on one of PgBouncer's server connections), it
    looks; a run asked for now (by an operator connected directly) runs within its look."""
    alias = postgres_alias
    port, log = pgbouncer
    env = scheduler_env(marker, CI="1", EXCLUSIVE_JOBS_TEST_PGBOUNCER_PORT=str(port))
    with reaped() as started:
        server = start_scheduler(started, alias, "--jobs", "digest", env=env)
        wait_for(lambda: SchedulerRow.objects.using(alias).alive().exists(), timeout=60)
        control.request_run("digest", by="ops", using=alias)
        done = JobRun.objects.using(alias).filter(name="digest", requested_by="ops")
        wait_for(done.filter(status="succeeded").exists, timeout=30)
        out, err = stop(server)
    [run] = done
    assert run.pid == server.pid, out + err
    [row] = SchedulerRow.objects.using(alias).all()
    assert row.stopped_at is not None
    database = connections[alias].settings_dict["NAME"]
    assert f"db={database}" in log.read_text(), "the scheduler did not go through PgBouncer"


def test_a_listening_scheduler_follows_a_row_written_without_a_notify_within_a_beat(
    postgres_alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An override written straight into the table (by SQL, an older version): no
    NOTIFY, but the beat's look sees the overrides' text change; the poll is at 60 s."""
    from django_exclusive_jobs.models import JobState

    alias = postgres_alias
    fast_beats(monkeypatch, beat=0.5, poll=60)
    served = quick_scheduler(alias, run_for=30)

    def write_by_hand() -> None:
        JobState.objects.using(alias).create(name="quick", override={"timeout": 7.0})
        wait_for(lambda: served.served.applied.get("quick") == {"timeout": 7.0}, timeout=20)
        served.stop()

    writing = operator(write_by_hand, ready(served, listen=True))
    assert served.run() == 0
    writing.join(timeout=5)
    assert served.served.applied.get("quick") == {"timeout": 7.0}
    assert served.stops == 1

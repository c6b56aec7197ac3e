"""Faults: a holder killed, paused or cut off from its database, and SQLite under load.

Outages are made with a TCP proxy in this process (``benchmarks/proxy.py``) that sits
between a worker and its database server and can be cut and restored; the servers
themselves are never touched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from django.conf import settings
from django.db import connections

from benchmarks.proxy import TcpProxy
from django_exclusive_jobs import try_acquire
from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.lock.lock import Lock
from django_exclusive_jobs.models import JobLock, JobRun, LockState, RunStatus

from . import _fault_workers
from .helpers import SPAWN, reaped, row
from .test_command import command_env, manage, runs, start, wait_for

# --- a TCP proxy the test can cut (benchmarks/proxy.py) ---------------------------------


@pytest.fixture
def server_alias(alias: str) -> str:
    if connections[alias].vendor == "sqlite":
        pytest.skip("SQLite is a file, not a server: there is no connection to cut")
    return alias


@pytest.fixture
def proxy(server_alias: str) -> Iterator[TcpProxy]:
    config = settings.DATABASES[server_alias]
    upstream = (str(config.get("HOST") or "127.0.0.1"), int(str(config["PORT"])))
    tcp = TcpProxy(upstream)
    try:
        yield tcp
    finally:
        tcp.stop()


def proxied_env(alias: str, port: int, *, query: str = "", **extra: str) -> dict[str, str]:
    """Environment for `manage.py` whose ``alias`` goes through the proxy on ``port``.

    CI=1 keeps tests/settings.py from dropping the alias when the proxy refuses its
    reachability probe; the test database's name still comes from the parent.
    """
    env = command_env(CI="1", **extra)
    if alias == "postgres":
        env["TEST_POSTGRES_URL"] = f"postgres://postgres@127.0.0.1:{port}/unused{query}"
    else:
        env["TEST_MYSQL_URL"] = f"mysql://root@127.0.0.1:{port}/unused{query}"
    return env


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    with reaped() as started:
        yield started


def kill_if_alive(pid: int) -> None:
    """Kill a child program its run_exclusive may have left behind (own session)."""
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "marker.txt"


def lease_passed(alias: str, name: str, timeout: float = 30) -> JobLock:
    """Wait until the database's clock is past the lease of ``name``; return its row."""
    held = row(alias, name)
    assert held.expires_at is not None
    deadline = time.monotonic() + timeout
    while database_now(alias) < held.expires_at:
        assert time.monotonic() < deadline, f"lease of {name} did not end in {timeout}s"
        time.sleep(0.05)
    return held


def finish_worker(process: Any) -> None:
    process.join(30)
    if process.is_alive():
        process.kill()
        process.join(10)


# --- kill -9 --------------------------------------------------------------------------


def test_killed_holder_keeps_others_out_until_its_lease_ends_then_next_run_gets_next_token(
    alias: str, marker: Path, processes: list[subprocess.Popen[str]]
) -> None:
    # A lease long enough for the next process to start and try within it on a loaded
    # machine (with 3 s, one under CI's load started after the lease had ended).
    holder = start(processes, alias, "slow", "--ttl", "10", env=command_env(marker))
    wait_for(lambda: runs(marker, "slow-start") == 1)
    holder.kill()
    holder.communicate(timeout=30)
    assert holder.returncode == -signal.SIGKILL

    killed = row(alias, "slow")
    assert (killed.token, killed.released_at) == (1, None)
    lease_end = killed.expires_at
    assert lease_end is not None
    quick = command_env(marker, JOB_SECONDS="0")

    blocked = manage(alias, "slow", env=quick)
    assert blocked.returncode == 0, blocked.stderr
    assert blocked.stdout.startswith("skipped slow: held by"), blocked.stdout
    assert f"until {lease_end.isoformat(timespec='seconds')}" in blocked.stdout

    # Read-only, on the database's clock: held up to the lease end, stale from then on.
    deadline = time.monotonic() + 30
    while True:
        before = database_now(alias)
        state = JobLock.objects.using(alias).with_state().get(name="slow").state
        after = database_now(alias)
        if after < lease_end:
            assert state == LockState.HELD
        elif before >= lease_end:
            assert state == LockState.STALE
            break
        assert time.monotonic() < deadline, "the lease never ended"
        time.sleep(0.05)
    assert list(JobLock.objects.using(alias).stale().values_list("name", flat=True)) == ["slow"]
    assert not JobLock.objects.using(alias).held().exists()
    # Nothing ran in between: one start (the killed run), one history row, still "running".
    assert runs(marker, "slow-start") == 1
    assert list(JobRun.objects.using(alias).values_list("token", "status")) == [
        (1, RunStatus.RUNNING)
    ]

    after_lease = manage(alias, "slow", env=quick)
    assert after_lease.returncode == 0, after_lease.stderr
    assert after_lease.stdout.startswith("acquired slow token=2 "), after_lease.stdout
    taken = row(alias, "slow")
    assert taken.token == 2
    assert taken.acquired_at is not None and taken.acquired_at >= lease_end
    assert runs(marker, "slow-start") == 2
    assert runs(marker, "slow-end") == 1
    assert JobRun.objects.using(alias).get(token=2).status == RunStatus.SUCCEEDED
    # The next holder closed the dead run: it no longer shows as running for ever.
    assert JobRun.objects.using(alias).get(token=1).status == RunStatus.LOST


# --- SIGSTOP / SIGCONT and fencing ----------------------------------------------------

FENCE = "fault_fence"


@pytest.fixture
def fence(alias: str) -> Iterator[Any]:
    """A one-row table guarded by fencing tokens; returns ``write(token, writer) -> rows``."""
    connection = connections[alias]
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {FENCE}")
        cursor.execute(
            f"CREATE TABLE {FENCE} (id INTEGER PRIMARY KEY, last_token BIGINT NOT NULL, "
            "writer VARCHAR(40) NOT NULL)"
        )
        cursor.execute(f"INSERT INTO {FENCE} (id, last_token, writer) VALUES (1, 0, '')")

    def write(token: int, writer: str) -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {FENCE} SET last_token = %s, writer = %s "
                "WHERE id = 1 AND last_token <= %s",
                [token, writer, token],
            )
            return int(cursor.rowcount)

    try:
        yield write
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {FENCE}")


def fenced_row(alias: str) -> tuple[int, str]:
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT last_token, writer FROM {FENCE} WHERE id = 1")
        token, writer = cursor.fetchone()
    return int(token), str(writer)


def test_paused_holder_learns_it_lost_at_next_renewal_and_fencing_refuses_its_token(
    alias: str, tmp_path: Path, processes: list[subprocess.Popen[str]], fence: Any
) -> None:
    child_pid_file = tmp_path / "child.pid"
    script = f"echo $$ > {child_pid_file}.tmp && mv {child_pid_file}.tmp {child_pid_file}; "
    script += "exec sleep 60"
    holder = start(
        processes,
        alias,
        "paused",
        "--ttl",
        "2",
        "--grace",
        "1",
        "--",
        "sh",
        "-c",
        script,
        env=command_env(),
    )
    wait_for(child_pid_file.exists)
    child_pid = int(child_pid_file.read_text())
    first = row(alias, "paused")
    assert fence(first.token, "first") == 1  # the holder's own guarded write

    rival: Lock | None = None
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        stale = lease_passed(alias, "paused")
        assert stale.token == first.token  # no renewal while stopped
        rival = try_acquire("paused", using=alias, ttl=60)
        assert rival is not None, "the lock of a stopped holder was not taken over"
        assert rival.token > first.token
        assert fence(rival.token, "second") == 1
    finally:
        os.kill(holder.pid, signal.SIGCONT)
    try:
        out, err = holder.communicate(timeout=60)
        assert holder.returncode == 4, err
        assert out.startswith(f"acquired paused token={first.token} ")
        # Found out on waking, by whichever came first: the watchdog (its deadline has
        # passed) or the renewal (the database shows the takeover).
        assert f"lock lost: paused token={first.token} " in err
        assert (
            "could not renew before the lease ran out: no renewal got through" in err
            or "the lease ran out or the lock was force-released or taken over" in err
        ), err
        assert "status=lost" in err
        with pytest.raises(ProcessLookupError):
            os.kill(child_pid, 0)  # stopped and reaped
        # The stale holder's write comes too late: the fence refuses its lower token.
        assert fence(first.token, "first-again") == 0
        assert fenced_row(alias) == (rival.token, "second")
        assert JobRun.objects.using(alias).get(token=first.token).status == RunStatus.LOST
        assert row(alias, "paused").token == rival.token
    finally:
        kill_if_alive(child_pid)
        if rival is not None:
            rival.release()


# --- database outage through the proxy ------------------------------------------------


def start_outage_worker(
    alias: str, proxy: TcpProxy, name: str, ttl: float, job_seconds: float, through_runner: bool
) -> tuple[Any, Any, int]:
    events = SPAWN.Queue()
    worker = SPAWN.Process(
        target=_fault_workers.hold_through_outage,
        args=(alias, proxy.port, name, ttl, job_seconds, events),
        kwargs={"through_runner": through_runner},
    )
    worker.start()
    try:
        first = events.get(timeout=60)
    except Empty:
        finish_worker(worker)
        raise
    if first[0] != "acquired":
        finish_worker(worker)
        raise AssertionError(f"worker failed before holding the lock: {first}")
    return worker, events, first[1]


def rivals_during(alias: str, name: str, seconds: float) -> list[tuple[float, int]]:
    """Try to take ``name`` directly (not through the proxy) for ``seconds``; release wins."""
    won = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        lock = try_acquire(name, using=alias, ttl=30)
        if lock is not None:
            won.append((time.monotonic(), lock.token))
            lock.release()
        time.sleep(0.05)
    return won


def outcome_of(events: Any) -> dict[str, Any]:
    message = events.get(timeout=90)
    if message[0] == "error":
        raise AssertionError(f"the worker failed: {message[2]}")
    assert message[0] == "finished", message
    report: dict[str, Any] = message[1]
    return report


@pytest.mark.slow
def test_outage_shorter_than_lease_keepalive_retries_and_lock_is_kept(
    server_alias: str, proxy: TcpProxy
) -> None:
    alias = server_alias
    worker, events, token = start_outage_worker(alias, proxy, "outage-short", 3.0, 4.5, False)
    try:
        time.sleep(0.2)
        proxy.cut("refuse")
        try:
            rivals = rivals_during(alias, "outage-short", 1.2)
        finally:
            proxy.restore()
            restored_at = time.monotonic()
        rivals += rivals_during(alias, "outage-short", 1.0)
        report = outcome_of(events)
    finally:
        finish_worker(worker)
    assert rivals == [], "another process took the lock during a short outage"
    assert report["retries"] >= 1, "the outage did not hit a renewal"
    assert (report["held"], report["lost"], report["lost_at"]) == (True, False, None)
    assert any(moved > restored_at for moved in report["lease_moved_at"]), "never renewed"
    assert report["released"] is True
    final = row(alias, "outage-short")
    assert final.token == token
    assert final.released_at is not None


@pytest.mark.slow
@pytest.mark.parametrize(
    ("outage", "ttl", "job_seconds", "status"),
    [(1.2, 3.0, 4.5, RunStatus.SUCCEEDED), (5.0, 3.0, 7.0, RunStatus.LOST)],
    ids=["short-outage", "long-outage"],
)
def test_run_layer_records_the_end_of_a_run_after_an_outage(
    server_alias: str,
    proxy: TcpProxy,
    outage: float,
    ttl: float,
    job_seconds: float,
    status: str,
) -> None:
    alias = server_alias
    worker, events, token = start_outage_worker(alias, proxy, "outage-run", ttl, job_seconds, True)
    try:
        time.sleep(0.2)
        proxy.cut("refuse")
        time.sleep(outage)
        proxy.restore()
        report = outcome_of(events)
    finally:
        finish_worker(worker)
    assert report["status"] == status
    run = JobRun.objects.using(alias).get(name="outage-run", token=token)
    assert run.status == status
    assert run.finished_at is not None


@pytest.mark.slow
def test_run_exclusive_after_a_short_outage_reports_the_run_that_happened(
    server_alias: str, proxy: TcpProxy, marker: Path, processes: list[subprocess.Popen[str]]
) -> None:
    alias = server_alias
    env = proxied_env(alias, proxy.port, MARKER=str(marker), JOB_SECONDS="4")
    holder = start(processes, alias, "slow", "--ttl", "3", env=env)
    wait_for(lambda: runs(marker, "slow-start") == 1)
    proxy.cut("refuse")
    try:
        time.sleep(1.2)
    finally:
        proxy.restore()
    out, err = holder.communicate(timeout=60)
    assert runs(marker, "slow-end") == 1  # the job did run to its end
    assert holder.returncode == 0, err
    assert "finished slow status=succeeded" in out
    assert JobLock.objects.using(alias).free().filter(name="slow").exists()
    assert JobRun.objects.using(alias).get(name="slow").status == RunStatus.SUCCEEDED


@pytest.mark.slow
def test_outage_longer_than_lease_holder_is_lost_before_another_takes_over(
    server_alias: str, proxy: TcpProxy
) -> None:
    alias = server_alias
    worker, events, token = start_outage_worker(alias, proxy, "outage-long", 3.0, 7.0, True)
    rival: Lock | None = None
    won_at = None
    try:
        time.sleep(0.2)
        proxy.cut("refuse")
        try:
            end = time.monotonic() + 5.0
            while time.monotonic() < end:
                if rival is None:
                    rival = try_acquire("outage-long", using=alias, ttl=60)
                    won_at = time.monotonic()
                time.sleep(0.05)
        finally:
            proxy.restore()
        report = outcome_of(events)
    finally:
        finish_worker(worker)
        if rival is not None:
            rival.release()
    assert rival is not None and won_at is not None, "nobody took the lock during the outage"
    assert report["status"] == "lost"
    assert report["lost_at"] is not None
    assert "could not renew before the lease ran out" in report["lost_reason"]
    # Never two holders: the rival won only after the first stopped counting itself as
    # holder (its `held` turned False at its conservative local deadline)...
    assert report["last_deadline"] is not None and won_at >= report["last_deadline"]
    # ...and after the first's lease had ended on the database's clock.
    assert rival.acquired_at is not None and rival.acquired_at >= report["expires_at"]
    assert rival.token == token + 1
    print(
        f"\n{alias}: lost marked {report['lost_at'] - report['last_deadline']:+.3f}s after the "
        f"local deadline; rival won {won_at - report['last_deadline']:+.3f}s after it"
    )


CHILD_THAT_REPORTS_SIGTERM = """\
import os, pathlib, signal, sys, time
term_file, ready_file = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
def stop(signum, frame):
    term_file.write_text(repr(time.monotonic()))
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
ready_file.with_suffix(".tmp").write_text(str(os.getpid()))
ready_file.with_suffix(".tmp").rename(ready_file)
for _ in range(1200):
    time.sleep(0.05)
"""


@pytest.mark.slow
def test_blackholed_database_stops_the_child_before_another_server_takes_over(
    server_alias: str, proxy: TcpProxy, tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    alias = server_alias
    script = tmp_path / "child.py"
    script.write_text(CHILD_THAT_REPORTS_SIGTERM)
    term, ready = tmp_path / "term", tmp_path / "ready"
    holder = start(
        processes,
        alias,
        "blackholed",
        "--ttl",
        "2",
        "--grace",
        "1",
        "--",
        sys.executable,
        str(script),
        str(term),
        str(ready),
        env=proxied_env(alias, proxy.port),
    )
    wait_for(ready.exists)
    child_pid = int(ready.read_text())
    rival: Lock | None = None
    term_at = None
    try:
        proxy.cut("blackhole")
        lease_passed(alias, "blackholed")
        deadline = time.monotonic() + 10
        while rival is None and time.monotonic() < deadline:
            rival = try_acquire("blackholed", using=alias, ttl=60)
            time.sleep(0.05)
        won_at = time.monotonic()
        assert rival is not None, "the lease ran out but the lock could not be taken"
        with suppress(AssertionError):
            wait_for(term.exists, timeout=3)  # the child notes when SIGTERM reached it
        term_at = float(term.read_text()) if term.exists() else None
    finally:
        proxy.restore()  # the holder's renewal gets through, finds the takeover, exits
        holder.communicate(timeout=60)
        kill_if_alive(child_pid)
        if rival is not None:
            rival.release()
    assert term_at is not None, (
        "another server holds the lock but the first one's child was never told to stop"
    )
    # A holder that cannot renew stops its child by its lease's end.
    assert term_at <= won_at
    assert holder.returncode == 4


@pytest.mark.parametrize(
    ("mode", "query"),
    [("refuse", ""), ("blackhole", "?connect_timeout=2")],
    ids=["refused", "blackholed-with-connect-timeout"],
)
def test_run_exclusive_without_its_database_exits_3_with_one_line_and_runs_nothing(
    server_alias: str, proxy: TcpProxy, marker: Path, mode: str, query: str
) -> None:
    alias = server_alias
    proxy.cut(mode)
    try:
        env = proxied_env(alias, proxy.port, query=query, MARKER=str(marker))
        result = manage(alias, "quick", env=env)
    finally:
        proxy.restore()
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"CommandError: Cannot reach database '{alias}'"), lines[0]
    assert lines[0].endswith("The job was not run.")
    assert result.stdout == ""
    assert not marker.exists()
    assert not JobLock.objects.using(alias).exists()
    assert not JobRun.objects.using(alias).exists()


# --- SQLite under contention ----------------------------------------------------------

HAMMER_PROCESSES = 8
HAMMER_ITERATIONS = 150


@pytest.mark.slow
@pytest.mark.parametrize("alias", ["sqlite"], indirect=True)
def test_sqlite_file_hammered_by_eight_processes_never_says_locked_and_counts_agree(
    alias: str, tmp_path: Path
) -> None:
    barrier = SPAWN.Barrier(HAMMER_PROCESSES)
    results = SPAWN.Queue()
    workers = [
        SPAWN.Process(
            target=_fault_workers.hammer_sqlite,
            args=(alias, HAMMER_ITERATIONS, barrier, results, worker, str(tmp_path)),
        )
        for worker in range(HAMMER_PROCESSES)
    ]
    for process in workers:
        process.start()
    try:
        reports = [results.get(timeout=300) for _ in workers]
    finally:
        for process in workers:
            finish_worker(process)
    errors = [error for _worker, _counts, error in reports if error]
    assert errors == [], errors[0]
    total = {key: sum(counts[key] for _w, counts, _e in reports) for key in reports[0][1]}
    calls = HAMMER_PROCESSES * HAMMER_ITERATIONS
    print(f"\nsqlite contention: {total}")
    assert total["overlaps"] == 0, "two holders at once"
    # try_acquire: every call won or skipped, and every win took the next token.
    assert total["wins"] + total["skips"] == calls
    assert row(alias, "hammer").token == total["wins"]
    # The decorated job: a skip never ran the body nor wrote history; every run did both.
    assert total["runs"] + total["job_skips"] == calls
    assert total["job_skips"] == total["returned_none"]
    history = JobRun.objects.using(alias).filter(name="hammer-job")
    assert history.count() == total["runs"]
    assert set(history.values_list("status", flat=True)) == {RunStatus.SUCCEEDED}
    assert sorted(history.values_list("token", flat=True)) == list(range(1, total["runs"] + 1))
    assert row(alias, "hammer-job").token == total["runs"]

"""Lock benchmarks: this app against the floor, a naive lock and django-db-mutex.

    python benchmarks/bench_locks.py --backend postgresql   # or mysql, sqlite
    python benchmarks/bench_locks.py --backend postgresql --quick

Kinds, all measured side by side in this one run on this machine:

* ``floor``: one plain SQL statement per step through the raw driver (a conditional
  UPDATE to take, an UPDATE to free). Nothing correct can be cheaper.
* ``naive``: INSERT to take, DELETE to free; the duplicate key decides.
* ``db-mutex``: django-db-mutex (``pip install django-db-mutex``), its ``db_mutex``
  context manager through Django's default connection. Skipped when not installed.
* ``ours``: ``try_acquire()`` + ``release()`` through Django's default connection.
* ``ours-opt-prepared`` (PostgreSQL only, informational): ours on a second alias of the
  same database whose DATABASES OPTIONS are ``{"server_side_binding": True,
  "prepare_threshold": 5}``, an option a project sets (psycopg then prepares the
  statements it runs repeatedly); nothing in this app does it.

Tables printed (Markdown):

* statements per step: what each kind sends to decide (won, lost to another holder),
  to release, and to take a name for the first time. ``sent`` counts the statements
  that go through Django's cursor (``connection.execute_wrapper``), or for the floor and
  the naive lock the ones their code hands the driver; ``wire`` counts what reaches the
  database: round trips on PostgreSQL (libpq's trace), statements on MariaDB/MySQL (the
  session's ``Questions`` status), statements on SQLite (the ``sqlite3`` trace
  callback), transaction control included.
* uncontended acquire+release: one process, the kinds interleaved.
* contended decision: P processes meet at a barrier and all try to take one lock; each
  times its own decision (won or skipped). p50/p99 over all decisions. The same P
  processes run every kind, in alternating blocks of rounds, so that the machine's
  background (other tenants, the database's own work) falls on every kind alike. Every
  kind is measured warm: each block opens its connection and makes a few untimed
  decisions (won ones and lost ones, on other names) before the clock starts. The
  client CPU column is the deciding process's own CPU time per decision, and the
  statements column the mean number each decision sent (as in the first table). With
  ``--breakdown`` more kinds show where ours' extra time goes: ``floor+read`` (SQLite
  and MariaDB/MySQL: the floor plus the SELECT ours sends after a lost take on SQLite,
  after every take on MariaDB) and ``floor+cpu-N`` (the floor plus N µs of client CPU
  burnt first, ``--burn-us``).
* doubled triggers: P processes start each trigger at a random moment within 0.3 s and
  run a 2 ms job if they get the lock; a trigger run more than once is doubled. Ours is
  measured as a plain lock and with a schedule (``every=``), which de-duplicates slots.
* large tables: acquire+run+release through ``@exclusive_job`` (which writes run
  history) with empty tables, then with 10,000 lock names and 1,000,000 run rows.

Each table puts the project's target beside the measurement (met / missed), and a
summary of the targets closes the output. It creates and uses a database named
``bench_exclusive_jobs`` (a temp file on SQLite).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import multiprocessing
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from machine import cpu_model  # benchmarks/machine.py, beside this script

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "bench_exclusive_jobs"
SPAWN = multiprocessing.get_context("spawn")
WARM_UP = 8  # untimed decisions of each outcome per block (psycopg prepares after 5)


# --- set-up ---------------------------------------------------------------------------


def database_settings(backend: str, sqlite_path: str) -> dict[str, Any]:
    if backend == "postgresql":
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": DB_NAME,
            "USER": "postgres",
            "HOST": "127.0.0.1",
            "PORT": 5432,
        }
    if backend == "mysql":
        return {
            "ENGINE": "django.db.backends.mysql",
            "NAME": DB_NAME,
            "USER": "root",
            "HOST": "127.0.0.1",
            "PORT": 3306,
            "OPTIONS": {"charset": "utf8mb4"},
        }
    return {"ENGINE": "django.db.backends.sqlite3", "NAME": sqlite_path, "OPTIONS": {"timeout": 30}}


def vendor_of(config: dict[str, Any]) -> str:
    engine = config["ENGINE"]
    if engine.endswith("postgresql"):
        return "postgresql"
    return "mysql" if engine.endswith("mysql") else "sqlite"


# psycopg's own prepared statements, which a project opts into with these two OPTIONS
# (Django's default binds parameters on the client, and PostgreSQL parses and plans
# every statement). An informational row: no code of this app is involved.
PREPARED = "prepared"
PREPARED_KIND = "ours-opt-prepared"
PREPARED_OPTIONS = {"server_side_binding": True, "prepare_threshold": 5}


def db_mutex_installed() -> bool:
    return importlib.util.find_spec("db_mutex") is not None


def all_kinds(config: dict[str, Any]) -> list[str]:
    """The kinds this run measures, ours first and the floor as the reference."""
    kinds = ["ours"]
    if vendor_of(config) == "postgresql":
        kinds.append(PREPARED_KIND)
    if db_mutex_installed():
        kinds.append("db-mutex")
    return [*kinds, "floor", "naive"]


def alias_of(kind: str) -> str:
    return PREPARED if kind == PREPARED_KIND else "default"


def setup_django(config: dict[str, Any]) -> None:
    import django
    from django.conf import settings

    databases = {"default": config}
    if vendor_of(config) == "postgresql":
        databases[PREPARED] = {**config, "OPTIONS": PREPARED_OPTIONS}
    apps = ["django.contrib.contenttypes", "django_exclusive_jobs"]
    if db_mutex_installed():
        apps.append("db_mutex")
    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=apps,
            DATABASES=databases,
            USE_TZ=True,
            # What db_mutex's migration was written with; this app sets its own.
            DEFAULT_AUTO_FIELD="django.db.models.AutoField",
            EXCLUSIVE_JOBS={"KEEPALIVE": False},
        )
        django.setup()


def create_database(backend: str) -> None:
    if backend == "postgresql":
        import psycopg

        with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as c:
            if not c.execute("SELECT 1 FROM pg_database WHERE datname=%s", [DB_NAME]).fetchone():
                c.execute(f"CREATE DATABASE {DB_NAME}")
    elif backend == "mysql":
        import MySQLdb

        connection = MySQLdb.connect(host="127.0.0.1", user="root")
        connection.cursor().execute(
            f"CREATE DATABASE IF NOT EXISTS {DB_NAME} CHARACTER SET utf8mb4"
        )
        connection.close()


def raw_connection(config: dict[str, Any]) -> Any:
    engine = config["ENGINE"]
    if engine.endswith("postgresql"):
        import psycopg

        return psycopg.connect(
            host="127.0.0.1", user="postgres", dbname=config["NAME"], autocommit=True
        )
    if engine.endswith("mysql"):
        import MySQLdb

        connection = MySQLdb.connect(host="127.0.0.1", user="root", db=config["NAME"])
        connection.autocommit(True)
        return connection
    import sqlite3

    return sqlite3.connect(config["NAME"], timeout=30, isolation_level=None)


def sql(config: dict[str, Any]) -> dict[str, str]:
    """The floor's and the naive lock's statements in each dialect."""
    engine = config["ENGINE"]
    if engine.endswith("postgresql"):
        now, later, mark = "now()", "now() + interval '60 seconds'", "%s"
    elif engine.endswith("mysql"):
        now, later, mark = "UTC_TIMESTAMP(6)", "UTC_TIMESTAMP(6) + INTERVAL 60 SECOND", "%s"
    else:
        now = "STRFTIME('%Y-%m-%d %H:%M:%f','NOW')"
        later = "STRFTIME('%Y-%m-%d %H:%M:%f','NOW','+60 seconds')"
        mark = "?"
    text = "TEXT" if not engine.endswith("mysql") else "VARCHAR(255)"
    stamp = "TIMESTAMP" if engine.endswith("postgresql") else "DATETIME(6)"
    if engine.endswith("sqlite3"):
        stamp = "TEXT"
    return {
        "create_floor": f"CREATE TABLE IF NOT EXISTS floor_lock (name {text} PRIMARY KEY, "
        f"holder {text}, expires_at {stamp})",
        "create_naive": f"CREATE TABLE IF NOT EXISTS naive_lock (name {text} PRIMARY KEY, "
        f"holder {text})",
        "seed_floor": f"INSERT INTO floor_lock VALUES ({mark}, '', {now})",
        "clear_floor": "DELETE FROM floor_lock",
        "clear_naive": "DELETE FROM naive_lock",
        "take": f"UPDATE floor_lock SET holder={mark}, expires_at={later} "
        f"WHERE name={mark} AND expires_at<={now}",
        "free": f"UPDATE floor_lock SET expires_at={now} WHERE name={mark} AND holder={mark}",
        "insert": f"INSERT INTO naive_lock VALUES ({mark}, {mark})",
        "delete": f"DELETE FROM naive_lock WHERE name={mark} AND holder={mark}",
        "read": f"SELECT holder, expires_at FROM floor_lock WHERE name={mark}",
    }


class Floor:
    """One plain statement per step through the raw driver."""

    def __init__(self, config: dict[str, Any], holder: str) -> None:
        self.connection = raw_connection(config)
        self.sql = sql(config)
        self.holder = holder
        self.is_mysql = config["ENGINE"].endswith("mysql")

    def execute(self, statement: str, params: list[Any]) -> int:
        cursor = self.connection.cursor()
        cursor.execute(statement, params)
        count = cursor.rowcount
        cursor.close()
        return int(count)

    def take(self, name: str) -> bool:
        return self.execute(self.sql["take"], [self.holder, name]) == 1

    def free(self, name: str) -> None:
        self.execute(self.sql["free"], [name, self.holder])


class Naive(Floor):
    """INSERT to take, DELETE to free: the duplicate key decides."""

    def take(self, name: str) -> bool:
        try:
            self.execute(self.sql["insert"], [name, self.holder])
        except Exception:
            return False
        return True

    def free(self, name: str) -> None:
        self.execute(self.sql["delete"], [name, self.holder])


class FloorRead(Floor):
    """``--breakdown``: the floor, plus a SELECT of the row where ours sends one.

    Ours reads the row after a take that lost on SQLite and after every take on
    MariaDB/MySQL (no RETURNING); on PostgreSQL its take returns the holder itself. This
    is the floor with that second statement and nothing else of ours.
    """

    def take(self, name: str) -> bool:
        won = super().take(name)
        if self.is_mysql or not won:
            self.execute(self.sql["read"], [name])
        return won


class FloorCpu(Floor):
    """``--breakdown``: the floor with ours' extra client CPU burnt before each statement."""

    burn = 0.0003  # seconds; set from --burn-us

    def take(self, name: str) -> bool:
        end = time.process_time() + self.burn
        while time.process_time() < end:
            pass
        return super().take(name)


class Ours:
    """This app: ``try_acquire()`` and ``release()`` on a Django alias."""

    def __init__(self, alias: str = "default", ttl: float = 60) -> None:
        self.alias = alias
        self.ttl = ttl
        self.lock: Any = None

    def take(self, name: str) -> bool:
        from django_exclusive_jobs import try_acquire

        self.lock = try_acquire(name, ttl=self.ttl, using=self.alias)
        return self.lock is not None

    def free(self, name: str) -> None:
        self.lock.release()
        self.lock = None


class DbMutex:
    """django-db-mutex: ``db_mutex(name)``'s start() and stop() (what ``with`` runs).

    A database error out of start() (MariaDB may pick a racing INSERT as a deadlock
    victim; django-db-mutex catches only the duplicate key) is counted in ``errors`` and
    the decision counts as not won.
    """

    alias = "default"

    def __init__(self) -> None:
        self.mutex: Any = None
        self.errors = 0

    def take(self, name: str) -> bool:
        from db_mutex import DBMutexError
        from db_mutex.db_mutex import db_mutex
        from django.db import DatabaseError

        self.mutex = db_mutex(name)
        try:
            self.mutex.start()
        except DBMutexError:
            return False
        except DatabaseError:
            self.errors += 1
            return False
        return True

    def free(self, name: str) -> None:
        self.mutex.stop()
        self.mutex = None


Tool = Floor | Ours | DbMutex


def make_tool(kind: str, config: dict[str, Any], holder: str) -> Tool:
    if kind == "floor":
        return Floor(config, holder)
    if kind == "floor+read":
        return FloorRead(config, holder)
    if kind.startswith("floor+cpu"):
        FloorCpu.burn = int(kind.rsplit("-", 1)[1]) / 1e6
        return FloorCpu(config, holder)
    if kind == "naive":
        return Naive(config, holder)
    if kind == "db-mutex":
        return DbMutex()
    return Ours(alias_of(kind))


def close_tool(tool: Tool) -> None:
    from django.db import connections

    if isinstance(tool, Floor):
        tool.connection.close()
    connections.close_all()


def prepare_tables(config: dict[str, Any]) -> None:
    floor = Floor(config, "setup")
    statements = sql(config)
    floor.execute(statements["create_floor"], [])
    floor.execute(statements["create_naive"], [])
    floor.connection.close()


def create_lock_row(name: str) -> None:
    """Make the lock's row exist, free, as a first run would have left it."""
    from django_exclusive_jobs import try_acquire

    lock = try_acquire(name, ttl=60)
    assert lock is not None
    lock.release()


def reset(config: dict[str, Any], names: list[str]) -> None:
    """Empty every kind's table; seed the floor's rows for ``names`` (it updates only)."""
    from django_exclusive_jobs.models import JobLock, JobRun

    JobLock.objects.all().delete()
    JobRun.objects.all().delete()
    if db_mutex_installed():
        from db_mutex.models import DBMutex

        DBMutex.objects.all().delete()
    floor = Floor(config, "setup")
    floor.execute(floor.sql["clear_floor"], [])
    floor.execute(floor.sql["clear_naive"], [])
    for name in names:
        floor.execute(floor.sql["seed_floor"], [name])
    floor.connection.close()


# --- statements per step --------------------------------------------------------------


class Wire:
    """What reaches the database on one raw connection while the block runs.

    PostgreSQL: round trips (libpq's protocol trace; a ``ReadyForQuery`` ends each).
    MariaDB/MySQL: statements (the session's ``Questions`` status, less the reading).
    SQLite: statements (the ``sqlite3`` module's trace callback).
    Transaction control (BEGIN, COMMIT, SET autocommit) counts like any statement.
    """

    def __init__(self, raw: Any, vendor: str) -> None:
        self.raw = raw
        self.vendor = vendor
        self.count = 0
        self.statements: list[str] = []
        self.path = ""
        self.offset = 0
        if vendor == "mysql":
            first = self.questions()
            self.offset = self.questions() - first  # what one reading adds

    def questions(self) -> int:
        cursor = self.raw.cursor()
        cursor.execute("SHOW SESSION STATUS LIKE 'Questions'")
        value = int(cursor.fetchone()[1])
        cursor.close()
        return value

    def __enter__(self) -> Wire:
        if self.vendor == "postgresql":
            from psycopg import pq

            descriptor, self.path = tempfile.mkstemp(prefix="bench-trace-")
            self.raw.pgconn.trace(descriptor)
            self.raw.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        elif self.vendor == "mysql":
            self.before = self.questions()
        else:
            self.raw.set_trace_callback(self.statements.append)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.vendor == "postgresql":
            self.raw.pgconn.untrace()  # closes the trace file
            parsed: set[str] = set()
            bound: list[tuple[int, str]] = []
            for line in Path(self.path).read_text().splitlines():
                parts = line.split("\t")
                if len(parts) < 3:
                    continue
                if parts[0] == "B" and parts[2] == "ReadyForQuery":
                    self.count += 1
                elif parts[0] == "F" and parts[2] in ("Query", "Parse", "Bind"):
                    quoted = parts[3].strip().split('"') if len(parts) > 3 else []
                    if parts[2] == "Query":  # "query"
                        self.statements.append(quoted[1])
                    elif parts[2] == "Parse":  # "statement name" "query" ...
                        parsed.add(quoted[1])
                        self.statements.append(quoted[3])
                    elif quoted[3] and quoted[3] not in parsed:  # "portal" "statement" ...
                        bound.append((len(self.statements), quoted[3]))
                        self.statements.append(quoted[3])
            os.unlink(self.path)
            if bound:  # executions of statements the driver prepared before the trace
                texts = dict(self.raw.execute("SELECT name, statement FROM pg_prepared_statements"))
                for index, name in bound:
                    self.statements[index] = f"{texts.get(name, '?')} (prepared)"
        elif self.vendor == "mysql":
            self.count = self.questions() - self.before - self.offset
        else:
            self.raw.set_trace_callback(None)
            self.count = len(self.statements)


def first_words(statements: list[str]) -> str:
    """``UPDATE, SELECT``: the first keyword of each statement, in order."""
    words = []
    for text in statements:
        word = (text.split() or ["?"])[0].upper().strip('"')
        words.append(f"{word} (prepared)" if text.endswith(" (prepared)") else word)
    return ", ".join(words)


class Count:
    """Statements of one step: as the code sent them, and as they reached the database."""

    def __init__(self, sent: list[str], wire: Wire) -> None:
        self.sent = sent
        self.wire = wire.count
        self.wire_statements = wire.statements

    def cell(self) -> str:
        return f"{len(self.sent)} / {self.wire}"

    def sequence(self) -> str:
        return first_words(self.wire_statements or self.sent)


@contextmanager
def sends(tool: Tool) -> Iterator[list[str]]:
    """Record the statements ``tool`` sends: through Django's cursor (``execute_wrapper``),
    or for the floor and the naive lock the ones their code hands the driver."""
    from django.db import connections

    sent: list[str] = []
    if isinstance(tool, Floor):
        execute = tool.execute

        def recorded(statement: str, params: list[Any]) -> int:
            sent.append(statement)
            return execute(statement, params)

        tool.execute = recorded  # type: ignore[method-assign]
        try:
            yield sent
        finally:
            del tool.execute
        return

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)
        return execute(sql, params, many, context)

    with connections[tool.alias].execute_wrapper(wrapper):
        yield sent


def counted(tool: Tool, config: dict[str, Any], step: Callable[[], Any]) -> Count:
    """Run ``step`` once on ``tool``'s connection: the statements sent and on the wire."""
    from django.db import connections

    if isinstance(tool, Floor):
        raw = tool.connection
    else:
        connections[tool.alias].ensure_connection()
        raw = connections[tool.alias].connection
    with sends(tool) as sent, Wire(raw, vendor_of(config)) as wire:
        step()
    return Count(sent, wire)


class OtherHolder:
    """Hold ``name`` from another thread (its own connection) for a ``with`` block."""

    def __init__(self, kind: str, config: dict[str, Any], name: str) -> None:
        self.kind, self.config, self.name = kind, config, name
        self.taken = threading.Event()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.hold, daemon=True)

    def hold(self) -> None:
        tool = make_tool(self.kind, self.config, "other")
        try:
            assert tool.take(self.name), f"{self.kind}: the other holder did not get the lock"
            self.taken.set()
            self.done.wait(60)
            tool.free(self.name)
        except BaseException as exc:
            self.error = exc
            self.taken.set()
        finally:
            close_tool(tool)

    def __enter__(self) -> OtherHolder:
        self.thread.start()
        self.taken.wait(60)
        if self.error is not None:
            raise self.error
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(60)


STEPS = ("won", "lost", "release", "new name")


def statement_counts(config: dict[str, Any], kinds: list[str]) -> dict[str, dict[str, Any]]:
    """Per kind: the statements of a won decision, a lost one, a release, a first take."""
    results: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        name = f"count-{kind}"
        floor = Floor(config, "setup")
        floor.execute(floor.sql["seed_floor"], [name])  # only the floor needs its row
        floor.connection.close()
        tool = make_tool(kind, config, "me")
        row: dict[str, Any] = {}
        try:
            for _ in range(WARM_UP):  # steady state: connection open, statements prepared
                assert tool.take(name)
                tool.free(name)
            row["won"] = counted(tool, config, lambda: tool.take(name))  # noqa: B023
            row["release"] = counted(tool, config, lambda: tool.free(name))  # noqa: B023
            with OtherHolder(kind, config, name):
                for _ in range(WARM_UP):
                    assert not tool.take(name)
                row["lost"] = counted(tool, config, lambda: tool.take(name))  # noqa: B023
            if kind == "floor":
                row["new name"] = None  # it can only update a row made beforehand
            else:
                fresh = f"count-new-{kind}"
                row["new name"] = counted(tool, config, lambda: tool.take(fresh))  # noqa: B023
                tool.free(fresh)
        finally:
            close_tool(tool)
        results[kind] = row
    return results


def job_cycle_count(config: dict[str, Any]) -> Count:
    """The statements of one acquire+run+release through ``@exclusive_job`` (warm)."""
    from django_exclusive_jobs import exclusive_job

    @exclusive_job("count-job", ttl=60)
    def job() -> None:
        return None

    for _ in range(WARM_UP):
        job()
    tool = Ours()
    return counted(tool, config, job)


# --- measurements ---------------------------------------------------------------------


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": percentile(values, 0.50) * 1e6,
        "p99": percentile(values, 0.99) * 1e6,
        "mean": statistics.fmean(values) * 1e6,
    }


def uncontended(
    config: dict[str, Any], kinds: list[str], iterations: int
) -> dict[str, dict[str, float]]:
    """``iterations`` acquire+release of each kind in one process, the kinds interleaved."""
    reset(config, ["bench"])
    tools = {kind: make_tool(kind, config, "me") for kind in kinds}
    for _ in range(max(WARM_UP, iterations // 10)):
        for tool in tools.values():
            assert tool.take("bench")
            tool.free("bench")
    results: dict[str, list[float]] = {kind: [] for kind in kinds}
    for number in range(iterations * len(kinds)):
        kind = kinds[number % len(kinds)]
        tool = tools[kind]
        started = time.perf_counter()
        assert tool.take("bench")
        tool.free("bench")
        results[kind].append(time.perf_counter() - started)
    for tool in tools.values():
        close_tool(tool)
    return {kind: summary(values) for kind, values in results.items()}


def warm_names(worker: int) -> tuple[str, str]:
    """Another name this worker wins, and one held throughout (it loses)."""
    return f"warm-up-{worker}", "warm-held"


def contender(
    config: dict[str, Any],
    schedule: list[tuple[str, int]],
    barrier: Any,
    out: Any,
    worker: int,
) -> None:
    """Run the blocks of ``schedule`` (kind, rounds) in order, as every other worker does."""
    setup_django(config)
    from django.db import connections

    timings: dict[str, list[float]] = {kind: [] for kind, _ in schedule}
    cpu: dict[str, list[float]] = {kind: [] for kind, _ in schedule}
    sent_per_decision: dict[str, list[int]] = {kind: [] for kind, _ in schedule}
    errors: Counter[str] = Counter()
    wins: list[int] = []
    number = 0
    mine, held = warm_names(worker)
    kind = ""
    try:
        for kind, rounds in schedule:
            # Before the clock starts: the connection, and a few decisions of each
            # outcome on other names (statements compiled, prepared where the driver
            # prepares them), as in a process that decides over and over.
            tool = make_tool(kind, config, f"w{worker}")
            for _ in range(WARM_UP):
                assert tool.take(mine)
                tool.free(mine)
                assert not tool.take(held)
            with sends(tool) as sent:
                for _ in range(rounds):
                    barrier.wait(300)
                    before = len(sent)
                    started, used = time.perf_counter(), time.process_time()
                    won = tool.take("contended")
                    timings[kind].append(time.perf_counter() - started)
                    cpu[kind].append(time.process_time() - used)
                    sent_per_decision[kind].append(len(sent) - before)
                    barrier.wait(300)
                    if won:
                        wins.append(number)
                        tool.free("contended")
                    barrier.wait(300)
                    number += 1
            errors[kind] += getattr(tool, "errors", 0)
            close_tool(tool)  # one connection per worker at a time
        out.put((timings, cpu, sent_per_decision, errors, wins, None))
    except Exception as exc:
        barrier.abort()
        out.put((timings, cpu, sent_per_decision, errors, wins, f"{kind}: {exc!r}"))
    finally:
        connections.close_all()


def hold(config: dict[str, Any], kinds: list[str], name: str) -> Ours:
    """Hold ``name`` in every kind's table for the whole run; ours is returned to free.

    The workers lose it while warming up. The floor's row gets a lease that never ends;
    the others stay until ``reset()`` empties their tables.
    """
    floor = Floor(config, "main")
    floor.execute(
        "UPDATE floor_lock SET holder='main', expires_at='2999-01-01 00:00:00' WHERE name="
        + ("?" if vendor_of(config) == "sqlite" else "%s"),
        [name],
    )
    close_tool(floor)
    for kind in kinds:
        if kind in ("naive", "db-mutex"):
            tool = make_tool(kind, config, "main")
            assert tool.take(name)
            close_tool(tool)
    ours = Ours(ttl=86_400)
    assert ours.take(name)  # both ours kinds: one table
    close_tool(ours)
    return ours


def contended(
    config: dict[str, Any], kinds: list[str], processes: int, rounds: int, block: int
) -> dict[str, dict[str, Any]]:
    """``rounds`` contended decisions of each kind, interleaved in blocks of ``block``.

    One set of processes runs every kind, a block of rounds of one kind after a block of
    the next, so that what the machine is doing meanwhile (other tenants, the page cache,
    the database's own background work) falls on every kind alike.
    """
    held_name = warm_names(0)[1]
    reset(config, ["contended", held_name, *(warm_names(n)[0] for n in range(processes))])
    create_lock_row("contended")  # the floor's row is seeded by reset() too
    holder = hold(config, kinds, held_name)
    schedule: list[tuple[str, int]] = []
    for number in range(-(-rounds // block)):
        turn = number % len(kinds)
        for kind in kinds[turn:] + kinds[:turn]:
            schedule.append((kind, min(block, rounds - number * block)))
    barrier = SPAWN.Barrier(processes)
    out = SPAWN.Queue()
    workers = [
        SPAWN.Process(target=contender, args=(config, schedule, barrier, out, n))
        for n in range(processes)
    ]
    for worker in workers:
        worker.start()
    timings: dict[str, list[float]] = {kind: [] for kind in kinds}
    cpu: dict[str, list[float]] = {kind: [] for kind in kinds}
    statements: dict[str, list[int]] = {kind: [] for kind in kinds}
    errors: Counter[str] = Counter()
    winners: Counter[int] = Counter()
    try:
        for _ in workers:
            got, used, sent, failed, wins, error = out.get(timeout=3600)
            errors.update(failed)
            if error:
                raise RuntimeError(f"contended worker failed: {error}")
            for kind, values in got.items():
                timings[kind].extend(values)
                cpu[kind].extend(used[kind])
                statements[kind].extend(sent[kind])
            winners.update(wins)
    finally:
        for worker in workers:
            worker.join(30)
            if worker.is_alive():
                worker.kill()
        holder.free(held_name)
    results: dict[str, dict[str, Any]] = {}
    number = 0
    bad: Counter[str] = Counter()
    for kind, count in schedule:
        bad[kind] += sum(1 for n in range(number, number + count) if winners[n] != 1)
        number += count
    for kind in kinds:
        results[kind] = {
            **summary(timings[kind]),
            "cpu": statistics.median(cpu[kind]) * 1e6,
            "sent": statistics.fmean(statements[kind]),
            "bad_rounds": bad[kind],
            "errors": errors[kind],
        }
    return results


def trigger_worker(
    config: dict[str, Any],
    kind: str,
    triggers: int,
    interval: float,
    ready: Any,
    go: Any,
    start_at: Any,
    out: Any,
    worker: int,
) -> None:
    setup_django(config)
    from django.db import connections

    from django_exclusive_jobs import exclusive_job

    rng = random.Random(worker)
    ran: list[int] = []
    tool = make_tool("ours" if kind == "ours-lock" else kind, config, f"w{worker}")
    name = {"floor": "trigger", "naive": "trigger", "db-mutex": "trigger-mutex"}.get(
        kind, "trigger-lock"
    )

    @exclusive_job("trigger-slot", every=interval, ttl=60)
    def scheduled(number: int) -> None:
        time.sleep(0.002)
        ran.append(number)

    try:
        ready.wait(300)
        go.wait(300)
        first = start_at.value
        for number in range(triggers):
            moment = first + number * interval + rng.uniform(0, 0.3)
            time.sleep(max(0.0, moment - time.time()))
            if kind == "ours-slots":
                scheduled(number)
            elif tool.take(name):
                time.sleep(0.002)
                ran.append(number)
                tool.free(name)
        out.put((ran, None))
    except Exception as exc:
        out.put((ran, repr(exc)))
    finally:
        close_tool(tool)
        connections.close_all()


def doubled(config: dict[str, Any], kind: str, processes: int, triggers: int) -> tuple[int, int]:
    """Triggers run more than once, and triggers not run at all.

    For ``ours-slots`` a run is counted for the slot it served (its JobRun row): a start
    held up past the slot tolerance serves the next slot, which then shows as a run of
    that trigger, not of the one whose start was late.
    """
    from django_exclusive_jobs.models import JobRun

    reset(config, ["trigger"])
    interval = 1.0
    ready = SPAWN.Barrier(processes + 1)
    go = SPAWN.Barrier(processes + 1)
    start_at = SPAWN.Value("d", 0.0)
    out = SPAWN.Queue()
    workers = [
        SPAWN.Process(
            target=trigger_worker,
            args=(config, kind, triggers, interval, ready, go, start_at, out, n),
        )
        for n in range(processes)
    ]
    for worker in workers:
        worker.start()
    ran: Counter[int] = Counter()
    try:
        ready.wait(300)  # every worker is set up
        start_at.value = float(int(time.time()) + 2)
        go.wait(300)  # only now may they read the start
        for _ in workers:
            got, error = out.get(timeout=triggers * interval + 300)
            if error:
                raise RuntimeError(f"{kind} worker failed: {error}")
            ran.update(got)
    finally:
        for worker in workers:
            worker.join(30)
            if worker.is_alive():
                worker.kill()
    if kind == "ours-slots":
        first = start_at.value
        slots = JobRun.objects.filter(name="trigger-slot").values_list("slot", flat=True)
        ran = Counter(round((slot.timestamp() - first) / interval) for slot in slots)
    doubled_triggers = sum(1 for number in range(triggers) if ran[number] > 1)
    missed = sum(1 for number in range(triggers) if ran[number] == 0)
    return doubled_triggers, missed


def fill_large_tables(config: dict[str, Any], names: int, runs: int) -> None:
    """10,000 lock names and 1,000,000 run rows, written set-wise in SQL."""
    from django.db import connection

    engine = config["ENGINE"]
    with connection.cursor() as cursor:
        if engine.endswith("postgresql"):
            series = "generate_series(1, %s) AS s(n)"
            cursor.execute(
                "INSERT INTO django_exclusive_jobs_joblock (name, token, host, instance, "
                "released_at, expires_at) "
                f"SELECT 'job-' || n, 1, 'h', '', now(), now() FROM {series}",
                [names],
            )
            cursor.execute(
                "INSERT INTO django_exclusive_jobs_jobrun (name, status, host, instance, attempts,"
                " started_at, finished_at, duration, error_type, error) SELECT 'job-' || (n %% %s),"
                " 'succeeded', 'h', '', 1, now() - n * interval '1 second', now(), 0.01, '', ''"
                f" FROM {series}",
                [names, runs],
            )
            cursor.execute("ANALYZE")
            # Write out what the fill dirtied now, not during the measurement: a
            # checkpoint of a million rows' WAL would otherwise land in the timings.
            cursor.execute("CHECKPOINT")
            return
        recursive = "WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < %s)"
        if engine.endswith("mysql"):
            variable = (
                "max_recursive_iterations"
                if connection.mysql_is_mariadb  # type: ignore[attr-defined]
                else "cte_max_recursion_depth"
            )
            cursor.execute(f"SET SESSION {variable} = 2000000")
            concat = "CONCAT('job-', n)"
            concat_mod = "CONCAT('job-', n %% %s)"
            now, earlier = "UTC_TIMESTAMP(6)", "UTC_TIMESTAMP(6) - INTERVAL n SECOND"
        else:
            concat, concat_mod = "'job-' || n", "'job-' || (n %% %s)"
            now = "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f','NOW')"
            earlier = now
        cursor.execute(
            "INSERT INTO django_exclusive_jobs_joblock (name, token, host, instance, released_at,"
            f" expires_at) {recursive} SELECT {concat}, 1, 'h', '', {now}, {now} FROM s",
            [names],
        )
        cursor.execute(
            "INSERT INTO django_exclusive_jobs_jobrun (name, status, host, instance, attempts,"
            f" started_at, finished_at, duration, error_type, error) {recursive}"
            f" SELECT {concat_mod}, 'succeeded', 'h', '', 1, {earlier}, {now}, 0.01, '', ''"
            " FROM s",
            [runs, names],
        )
        if engine.endswith("mysql"):
            cursor.execute(
                "ANALYZE TABLE django_exclusive_jobs_joblock, django_exclusive_jobs_jobrun"
            )
        else:
            cursor.execute("ANALYZE")


def job_cycle(iterations: int) -> dict[str, float]:
    from django_exclusive_jobs import exclusive_job

    @exclusive_job("job-42", ttl=60)
    def job() -> None:
        return None

    for _ in range(20):
        job()
    timings = []
    for _ in range(iterations):
        started = time.perf_counter()
        job()
        timings.append(time.perf_counter() - started)
    return summary(timings)


# --- report ---------------------------------------------------------------------------


class Targets:
    """The issue's targets: each is printed beside its measurement and in a summary."""

    def __init__(self, vendor: str) -> None:
        self.vendor = vendor
        self.rows: list[tuple[str, str, str, str]] = []

    def check(self, measure: str, target: str, measured: str, met: bool, scope: str = "") -> str:
        """Record one target; return the cell for the table (``≤ 1.5x: met``)."""
        verdict = "met" if met else "**missed**"
        if scope and scope != self.vendor:
            verdict = f"{'met' if met else 'missed'} (a {scope} target; for reference)"
        self.rows.append((measure, target, measured, verdict))
        return f"{target}: {verdict}"

    def print(self) -> None:
        print("\n| target | wanted | measured | verdict |")
        print("|---|---|---|---|")
        for measure, target, measured, verdict in self.rows:
            print(f"| {measure} | {target} | {measured} | {verdict} |")


def machine(config: dict[str, Any]) -> str:
    import django
    from django.db import connection

    cpu = cpu_model()
    with connection.cursor() as cursor:
        if config["ENGINE"].endswith("sqlite3"):
            cursor.execute("SELECT sqlite_version()")
            server = "SQLite " + cursor.fetchone()[0]
        else:
            cursor.execute("SELECT version()")
            server = cursor.fetchone()[0].split(" on ")[0]
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**30
    versions = f"Python {platform.python_version()}, Django {django.get_version()}"
    if db_mutex_installed():
        from importlib.metadata import version

        versions += f", django-db-mutex {version('django-db-mutex')}"
    return f"{cpu}, {os.cpu_count()} cores, {memory} GiB; {server}; {versions}; {code()}"


def code() -> str:
    """The app's commit, and whether its files differ from it."""
    import subprocess

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return f"code in {ROOT} (not a git checkout)"
    changed = git("status", "--porcelain", "--", "django_exclusive_jobs")
    return f"code {commit}" + (" with uncommitted changes to the app" if changed else "")


def connection_budget(config: dict[str, Any]) -> int | None:
    """How many worker connections PostgreSQL has room for (a few left for others)."""
    if not config["ENGINE"].endswith("postgresql"):
        return None
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('max_connections')::int"
            " - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
        )
        return int(cursor.fetchone()[0]) - 5


def print_statement_counts(config: dict[str, Any], kinds: list[str]) -> None:
    wire = {
        "postgresql": "round trips (libpq trace)",
        "mysql": "statements (session Questions)",
        "sqlite": "statements (sqlite3 trace)",
    }[vendor_of(config)]
    print(
        "| statements per step (sent / wire) | won decision | lost decision (held elsewhere)"
        " | release | first take of a new name |"
    )
    print("|---|---|---|---|---|")
    counts = statement_counts(config, kinds)
    for kind, row in counts.items():
        cells = [row[step].cell() if row[step] is not None else "n/a" for step in STEPS]
        print(f"| {kind} | {' | '.join(cells)} |")
    cycle = job_cycle_count(config)
    print(f"| ours, whole `@exclusive_job` cycle (with run history) | {cycle.cell()} | | | |")
    print(
        "\nsent: statements through Django's cursor (`execute_wrapper`) for ours and"
        f" db-mutex, through the driver's cursor for the floor and naive; wire: {wire}."
    )
    print("\nWhat each step sends (on MariaDB/MySQL: through the cursor):\n")
    for kind, row in counts.items():
        steps = "; ".join(
            f"{step}: {row[step].sequence()}" for step in STEPS if row[step] is not None
        )
        print(f"- {kind}: {steps}")
    print(f"- ours, `@exclusive_job` cycle: {cycle.sequence()}")


def main() -> None:
    parser = argparse.ArgumentParser(description="django-exclusive-jobs lock benchmarks")
    parser.add_argument(
        "--backend", choices=["postgresql", "mysql", "sqlite"], default="postgresql"
    )
    parser.add_argument("--iterations", type=int, default=1000, help="uncontended, per kind")
    parser.add_argument("--processes", default="10,50,100")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--triggers", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="fewer rounds; no large tables")
    parser.add_argument("--no-large", action="store_true", help="skip the large-table rows")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="add two contended kinds: the floor plus ours' read, the floor plus CPU",
    )
    parser.add_argument(
        "--burn-us", type=int, default=300, help="client CPU the floor+cpu kind burns (µs)"
    )
    args = parser.parse_args()
    if args.quick:
        args.iterations, args.rounds, args.triggers, args.processes = 200, 20, 8, "10"

    create_database(args.backend)
    config = database_settings(args.backend, str(Path(tempfile.mkdtemp()) / "bench.sqlite3"))
    setup_django(config)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    prepare_tables(config)
    vendor = vendor_of(config)
    kinds = all_kinds(config)
    targets = Targets(vendor)
    started = time.monotonic()
    print(f"## {args.backend}\n")
    print(f"{dt.datetime.now():%Y-%m-%d %H:%M}. Machine: {machine(config)}\n")
    if not db_mutex_installed():
        print("django-db-mutex is not installed (pip install django-db-mutex): skipping it.\n")
    if PREPARED_KIND in kinds:
        print(
            f"{PREPARED_KIND}: ours on an alias whose DATABASES OPTIONS are "
            f"{PREPARED_OPTIONS} (psycopg prepares what it runs repeatedly): an option a "
            "project sets, no code of this app; informational, no target.\n"
        )

    reset(config, [])
    print_statement_counts(config, kinds)

    print(
        f"\n| uncontended acquire+release ({args.iterations} each) | p50 µs | p99 µs | mean µs "
        "| mean / floor | p50 / floor | target |"
    )
    print("|---|---|---|---|---|---|---|")
    single = uncontended(config, kinds, args.iterations)
    for kind, row in single.items():
        ratio = row["mean"] / single["floor"]["mean"]
        target = ""
        if kind == "ours":
            target = targets.check(
                "uncontended acquire+release, mean / floor",
                "≤ 1.5x",
                f"{ratio:.2f}x",
                ratio <= 1.5,
                scope="postgresql",
            )
        print(
            f"| {kind} | {row['p50']:.0f} | {row['p99']:.0f} | {row['mean']:.0f} | {ratio:.2f}x"
            f" | {row['p50'] / single['floor']['p50']:.2f}x | {target} |"
        )

    print(
        "\n| contended decision | processes | p50 µs | p99 µs | p50 / floor p50 "
        "| client CPU p50 µs | statements sent, mean | rounds not won once | target |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    budget = connection_budget(config)
    extra = [f"floor+cpu-{args.burn_us}"] if args.breakdown else []
    if args.breakdown and vendor != "postgresql":
        extra.insert(0, "floor+read")
    for wanted in (int(p) for p in args.processes.split(",")):
        processes = wanted if budget is None else min(wanted, budget)
        if processes != wanted:
            print(
                f"| (PostgreSQL's max_connections leaves room for {processes} of {wanted}"
                " processes) | | | | | | | | |"
            )
        rounds = max(args.rounds // 2, args.rounds * 10 // processes)
        rows = contended(config, kinds + extra, processes, rounds, block=max(2, rounds // 6))
        for kind, row in rows.items():
            ratio = row["p50"] / rows["floor"]["p50"]
            target = ""
            if kind == "ours":
                target = targets.check(
                    f"contended decision p50 / floor p50, {processes} processes",
                    "≤ 1.5x",
                    f"{ratio:.2f}x",
                    ratio <= 1.5,
                )
                if wanted == 100:
                    target += "; " + targets.check(
                        f"contended decision p99, {processes} processes",
                        "< 50 ms",
                        f"{row['p99'] / 1000:.1f} ms",
                        row["p99"] < 50_000,
                        scope="postgresql",
                    )
            print(
                f"| {kind} | {processes} | {row['p50']:.0f} | {row['p99']:.0f} | {ratio:.2f}x |"
                f" {row['cpu']:.0f} | {row['sent']:.2f} | {row['bad_rounds']} of {rounds}"
                + (f" ({row['errors']} decisions raised an error)" if row["errors"] else "")
                + f" | {target} |"
            )

    if "floor+read" in extra:
        print(
            "\nfloor+read: the floor plus the SELECT ours sends after a lost take (after every"
            " take on MariaDB/MySQL)."
        )
    if extra:
        print(
            f"\nfloor+cpu-{args.burn_us}: the floor plus {args.burn_us} µs of client CPU burnt"
            " before each statement."
        )

    print(
        f"\n| doubled triggers (10 processes, {args.triggers} triggers, 2 ms job) "
        "| run twice or more | not run |"
    )
    print("|---|---|---|")
    trigger_kinds = ["naive", "floor", "db-mutex", "ours-lock", "ours-slots"]
    for kind in trigger_kinds:
        if kind == "db-mutex" and "db-mutex" not in kinds:
            continue
        twice, missed = doubled(config, kind, 10, args.triggers)
        print(f"| {kind} | {twice} of {args.triggers} | {missed} of {args.triggers} |")

    if not (args.quick or args.no_large):
        print(
            "\n| ours: acquire+run+release through `@exclusive_job` | p50 µs | p99 µs | mean µs"
            " | mean / empty | target |"
        )
        print("|---|---|---|---|---|---|")
        reset(config, [])
        empty = job_cycle(args.iterations)
        reset(config, [])
        fill_large_tables(config, 10_000, 1_000_000)
        large = job_cycle(args.iterations)
        for label, row in (("empty tables", empty), ("10k locks, 1M runs", large)):
            ratio = row["mean"] / empty["mean"]
            target = ""
            if row is large:
                target = targets.check(
                    "job cycle with 10k locks and 1M runs, mean / empty",
                    "≤ 1.2x",
                    f"{ratio:.2f}x",
                    ratio <= 1.2,
                )
            print(
                f"| {label} | {row['p50']:.0f} | {row['p99']:.0f} | {row['mean']:.0f} |"
                f" {ratio:.2f}x | {target} |"
            )
        reset(config, [])

    targets.print()
    print(f"\n(run took {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()

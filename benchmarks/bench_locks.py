"""Lock benchmarks: this app against the floor and a naive lock, on one backend per run.

    python benchmarks/bench_locks.py --backend postgresql   # or mysql, sqlite
    python benchmarks/bench_locks.py --backend postgresql --quick

Rows printed (Markdown), all measured in this one run on this machine:

* uncontended acquire+release: ``try_acquire()`` + ``release()``; the *floor* is one plain
  SQL statement per step through the raw driver (a conditional UPDATE to take, an UPDATE
  to free); the *naive* lock is INSERT to take and DELETE to free (the seed approach).
* contended decision: P processes meet at a barrier and all try to take one lock; each
  times its own decision (won or skipped). p50/p99 over all decisions. The same P
  processes run every kind, in alternating blocks of rounds, so that the machine's
  background (other tenants, the database's own work) falls on every kind alike. Ours
  is measured warm: each block starts with a few untimed decisions on another name, so
  the connection is open and the statements are compiled and prepared.
* doubled triggers: P processes start each trigger at a random moment within 0.3 s and
  run a 2 ms job if they get the lock; a trigger run more than once is doubled. Ours is
  measured as a plain lock and with a schedule (``every=``), which de-duplicates slots.
* large tables: acquire+run+release through ``@exclusive_job`` (which writes run
  history) with empty tables, then with 10,000 lock names and 1,000,000 run rows.

It creates and uses a database named ``bench_exclusive_jobs`` (a temp file on SQLite).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "bench_exclusive_jobs"
SPAWN = multiprocessing.get_context("spawn")


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


PREPARED = "prepared"
PREPARED_OPTIONS = {"server_side_binding": True, "prepare_threshold": 5}


def ours_kinds(config: dict[str, Any]) -> list[str]:
    """'ours' on Django's default connection, and on PostgreSQL 'ours-prepared' too."""
    return ["ours", "ours-prepared"] if config["ENGINE"].endswith("postgresql") else ["ours"]


def baseline_kinds(config: dict[str, Any]) -> list[str]:
    """The floor and the naive lock, and on the servers this app's SQL sent like the floor."""
    server = not config["ENGINE"].endswith("sqlite3")
    return ["ours-sql", "floor", "naive"] if server else ["floor", "naive"]


def alias_of(kind: str) -> str:
    return PREPARED if kind == "ours-prepared" else "default"  # ours-sql warms up on default


def setup_django(config: dict[str, Any]) -> None:
    import django
    from django.conf import settings

    databases = {"default": config}
    if config["ENGINE"].endswith("postgresql"):
        # The same database with psycopg's prepared statements, which a project opts into
        # with these two OPTIONS (Django's default parses and plans every statement).
        databases[PREPARED] = {**config, "OPTIONS": PREPARED_OPTIONS}
    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=["django.contrib.contenttypes", "django_exclusive_jobs"],
            DATABASES=databases,
            USE_TZ=True,
            DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
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


class OursSql(Floor):
    """This app's own take and release statements, sent by the raw driver like the floor's.

    What the lock's SQL costs on the server without Django and the lock's Python around
    it (on MariaDB in READ COMMITTED, as Django's connection runs). The statements are
    the ones the app compiled in this process, so a lock must have been taken first.
    """

    def __init__(self, config: dict[str, Any], holder: str) -> None:
        from django_exclusive_jobs import statements

        super().__init__(config, holder)
        compiled = {key[3]: value for key, value in statements._compiled.items()}
        self.take_sql = compiled.get("take") or compiled["take-mysql"]
        self.free_sql = compiled["release"]
        self.token = 0
        if self.is_mysql:
            self.connection.query(b"SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")

    def run(self, compiled: Any, **values: Any) -> tuple[int, list[Any]]:
        cursor = self.connection.cursor()
        params = compiled.bind(**values)
        if self.is_mysql:
            count = cursor.execute(compiled.sql, params)
            rows = [(self.connection.insert_id(),)]
        else:
            cursor.execute(compiled.sql, params, prepare=True)
            count, rows = cursor.rowcount, cursor.fetchall() if cursor.description else []
        cursor.close()
        return int(count), rows

    def take(self, name: str) -> bool:
        count, rows = self.run(self.take_sql, name=name, thread=1)
        if self.is_mysql:
            self.token = rows[0][0]
            return count == 1
        won = bool(rows) and rows[0][0]
        self.token = rows[0][1] if won else 0
        return bool(won)

    def free(self, name: str) -> None:
        self.run(self.free_sql, name=name, token=self.token)


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
    from django_exclusive_jobs.models import JobLock, JobRun

    JobLock.objects.all().delete()
    JobRun.objects.all().delete()
    floor = Floor(config, "setup")
    floor.execute(floor.sql["clear_floor"], [])
    floor.execute(floor.sql["clear_naive"], [])
    for name in names:
        floor.execute(floor.sql["seed_floor"], [name])
    floor.connection.close()


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


def uncontended(config: dict[str, Any], iterations: int) -> dict[str, dict[str, float]]:
    from django_exclusive_jobs import try_acquire

    reset(config, ["bench"])
    order = [*ours_kinds(config), *baseline_kinds(config)]
    results: dict[str, list[float]] = {kind: [] for kind in order}
    for _ in range(iterations // 10):  # warm-up
        for kind in ours_kinds(config):
            lock = try_acquire("bench", ttl=60, using=alias_of(kind))
            assert lock is not None
            lock.release()
    tools: dict[str, Floor] = {"floor": Floor(config, "me"), "naive": Naive(config, "me")}
    if "ours-sql" in order:
        tools["ours-sql"] = OursSql(config, "me")
    for number in range(iterations * len(order) // 3):
        kind = order[number % len(order)]
        started = time.perf_counter()
        if kind.startswith("ours"):
            lock = try_acquire("bench", ttl=60, using=alias_of(kind))
            assert lock is not None
            lock.release()
        else:
            tool = tools[kind]
            assert tool.take("bench")
            tool.free("bench")
        results[kind].append(time.perf_counter() - started)
    return {kind: summary(values) for kind, values in results.items()}


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

    from django_exclusive_jobs import mysqlquery, pgprepared, try_acquire

    timings: dict[str, list[float]] = {kind: [] for kind, _ in schedule}
    wins: list[int] = []
    number = 0
    try:
        for kind, rounds in schedule:
            tool: Floor | None = None
            if kind == "floor":
                tool = Floor(config, f"w{worker}")
            elif kind == "naive":
                tool = Naive(config, f"w{worker}")
            else:
                # Like the floor's connection, opened before the clock starts: our
                # connection, and the statements the ORM compiles once per process (on
                # another name). A process that makes decisions over and over has its
                # statements prepared after the first few: measure that steady state.
                for _ in range(max(pgprepared.PREPARE_AFTER, mysqlquery.PREPARE_AFTER)):
                    warm = try_acquire(f"warm-up-{worker}", ttl=60, using=alias_of(kind))
                    assert warm is not None
                    warm.release()
                if kind == "ours-sql":
                    connections.close_all()  # one connection per worker, as for the floor
                    tool = OursSql(config, f"w{worker}")
            for _ in range(rounds):
                barrier.wait(300)
                started = time.perf_counter()
                if tool is None:
                    lock = try_acquire("contended", ttl=60, using=alias_of(kind))
                    won = lock is not None
                else:
                    won = tool.take("contended")
                timings[kind].append(time.perf_counter() - started)
                barrier.wait(300)
                if won:
                    wins.append(number)
                    if tool is None:
                        lock.release()  # type: ignore[union-attr]
                    else:
                        tool.free("contended")
                barrier.wait(300)
                number += 1
            if tool is not None:
                tool.connection.close()
            connections.close_all()
        out.put((timings, wins, None))
    except Exception as exc:
        barrier.abort()
        out.put((timings, wins, repr(exc)))
    finally:
        connections.close_all()


def contended(
    config: dict[str, Any], kinds: list[str], processes: int, rounds: int, block: int
) -> dict[str, dict[str, Any]]:
    """``rounds`` contended decisions of each kind, interleaved in blocks of ``block``.

    One set of processes runs every kind, a block of rounds of one kind after a block of
    the next, so that what the machine is doing meanwhile (other tenants, the page cache,
    the database's own background work) falls on every kind alike.
    """
    reset(config, ["contended"])
    create_lock_row("contended")  # the floor's row is seeded by reset() too
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
    winners: Counter[int] = Counter()
    try:
        for _ in workers:
            got, wins, error = out.get(timeout=1800)
            if error:
                raise RuntimeError(f"contended worker failed: {error}")
            for kind, values in got.items():
                timings[kind].extend(values)
            winners.update(wins)
    finally:
        for worker in workers:
            worker.join(30)
            if worker.is_alive():
                worker.kill()
    results: dict[str, dict[str, Any]] = {}
    number = 0
    bad: Counter[str] = Counter()
    for kind, count in schedule:
        bad[kind] += sum(1 for n in range(number, number + count) if winners[n] != 1)
        number += count
    for kind in kinds:
        results[kind] = {**summary(timings[kind]), "bad_rounds": bad[kind]}
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

    from django_exclusive_jobs import exclusive_job, try_acquire

    rng = random.Random(worker)
    ran: list[int] = []
    tool: Floor | None = None
    if kind == "floor":
        tool = Floor(config, f"w{worker}")
    elif kind == "naive":
        tool = Naive(config, f"w{worker}")

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
            elif kind == "ours-lock":
                lock = try_acquire("trigger-lock", ttl=60)
                if lock is not None:
                    time.sleep(0.002)
                    ran.append(number)
                    lock.release()
            else:
                assert tool is not None
                if tool.take("trigger"):
                    time.sleep(0.002)
                    ran.append(number)
                    tool.free("trigger")
        out.put((ran, None))
    except Exception as exc:
        out.put((ran, repr(exc)))
    finally:
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


def machine(config: dict[str, Any]) -> str:
    import django
    from django.db import connection

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    with connection.cursor() as cursor:
        if config["ENGINE"].endswith("sqlite3"):
            cursor.execute("SELECT sqlite_version()")
            server = "SQLite " + cursor.fetchone()[0]
        else:
            cursor.execute("SELECT version()")
            server = cursor.fetchone()[0].split(" on ")[0]
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**30
    return (
        f"{cpu}, {os.cpu_count()} cores, {memory} GiB;"
        f" {server}; Python {platform.python_version()}, Django {django.get_version()}"
    )


def connection_budget(config: dict[str, Any]) -> int | None:
    if not config["ENGINE"].endswith("postgresql"):
        return None
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('max_connections')::int"
            " - current_setting('superuser_reserved_connections')::int"
            " - (SELECT count(*) FROM pg_stat_activity)"
        )
        return int(cursor.fetchone()[0]) - 2


def main() -> None:
    parser = argparse.ArgumentParser(description="django-exclusive-jobs lock benchmarks")
    parser.add_argument(
        "--backend", choices=["postgresql", "mysql", "sqlite"], default="postgresql"
    )
    parser.add_argument("--iterations", type=int, default=3000)
    parser.add_argument("--processes", default="10,50,100")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--triggers", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="fewer rounds; no large tables")
    parser.add_argument("--no-large", action="store_true", help="skip the large-table rows")
    args = parser.parse_args()
    if args.quick:
        args.iterations, args.rounds, args.triggers, args.processes = 600, 20, 8, "10"

    create_database(args.backend)
    config = database_settings(args.backend, str(Path(tempfile.mkdtemp()) / "bench.sqlite3"))
    setup_django(config)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    prepare_tables(config)
    print(f"## {args.backend}\n\nMachine: {machine(config)}\n")

    print("| uncontended acquire+release | p50 µs | p99 µs | mean µs | mean / floor |")
    print("|---|---|---|---|---|")
    single = uncontended(config, args.iterations)
    for kind in single:
        row = single[kind]
        ratio = row["mean"] / single["floor"]["mean"]
        print(
            f"| {kind} | {row['p50']:.0f} | {row['p99']:.0f} | {row['mean']:.0f} | {ratio:.2f}x |"
        )

    print(
        "\n| contended decision | processes | p50 µs | p99 µs | p50 / floor p50 "
        "| rounds not won once |"
    )
    print("|---|---|---|---|---|---|")
    budget = connection_budget(config)
    for wanted in (int(p) for p in args.processes.split(",")):
        processes = wanted if budget is None else min(wanted, budget)
        if processes != wanted:
            print(f"| (PostgreSQL max_connections allows only {processes} of {wanted}) | | | | | |")
        rounds = max(args.rounds // 2, args.rounds * 10 // processes)
        kinds = [*ours_kinds(config), *baseline_kinds(config)]
        rows = contended(config, kinds, processes, rounds, block=max(2, rounds // 6))
        for kind, row in rows.items():
            ratio = row["p50"] / rows["floor"]["p50"]
            print(
                f"| {kind} | {processes} | {row['p50']:.0f} | {row['p99']:.0f} | {ratio:.2f}x |"
                f" {row['bad_rounds']} of {rounds} |"
            )

    print(
        f"\n| doubled triggers (10 processes, {args.triggers} triggers, 2 ms job) "
        "| run twice or more | not run |"
    )
    print("|---|---|---|")
    for kind in ("naive", "floor", "ours-lock", "ours-slots"):
        twice, missed = doubled(config, kind, 10, args.triggers)
        print(f"| {kind} | {twice} of {args.triggers} | {missed} of {args.triggers} |")

    if not (args.quick or args.no_large):
        print("\n| acquire+run+release with history | p50 µs | p99 µs | mean µs | vs empty |")
        print("|---|---|---|---|---|")
        reset(config, [])
        empty = job_cycle(args.iterations // 3)
        reset(config, [])
        fill_large_tables(config, 10_000, 1_000_000)
        large = job_cycle(args.iterations // 3)
        for label, row in (("empty tables", empty), ("10k locks, 1M runs", large)):
            print(
                f"| {label} | {row['p50']:.0f} | {row['p99']:.0f} | {row['mean']:.0f} |"
                f" {row['mean'] / empty['mean']:.2f}x |"
            )
        reset(config, [])


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()

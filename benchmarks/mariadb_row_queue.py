"""Where MariaDB's contended decision time goes: the statement, the table, or the client?

    python benchmarks/mariadb_row_queue.py [--processes 50] [--rounds 40] [--repeats 4]

Two measurements on the ``bench_exclusive_jobs`` database (made by bench_locks.py):

* **Server CPU per losing take**: one connection sends 20,000 takes of a held lock in a
  row; the MariaDB server process's CPU time (from /proc) per take, for the floor's
  statement, this app's take sent as text, and this app's take prepared (``EXECUTE``).
* **Contended p50**: P processes race for one row, as in bench_locks.py, but every kind
  sent through the raw driver: the floor; the floor with 55 µs of CPU burnt in the
  client before each statement (about what Django and the lock's Python add per
  decision); this app's prepared take on its own table; and the same on a copy of the
  table whose clustered key is the name. Kinds alternate, and the medians of the
  repeats are printed.

The app's take is the statement the app compiles (``statements``), rendered as
``mysqlquery`` renders it; only the table name differs for the copy.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FORK = multiprocessing.get_context("fork")
TABLE = "django_exclusive_jobs_joblock"
COPY = "bench_joblock_by_name"
FLOOR = (
    "UPDATE floor_lock SET holder=%s, expires_at=UTC_TIMESTAMP(6) + INTERVAL 60 SECOND "
    "WHERE name=%s AND expires_at<=UTC_TIMESTAMP(6)"
)


def connect() -> Any:
    import MySQLdb

    connection = MySQLdb.connect(
        host="127.0.0.1", user="root", db="bench_exclusive_jobs", charset="utf8mb4"
    )
    connection.autocommit(True)
    connection.query(b"SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    return connection


class Take:
    """The app's take as mysqlquery renders it: its prepared form, and its values."""

    def __init__(self) -> None:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        sys.path.insert(0, str(ROOT))
        import bench_locks

        config = bench_locks.database_settings("mysql", "")
        bench_locks.create_database("mysql")
        bench_locks.setup_django(config)
        from django.core.management import call_command
        from django.db import connection

        from django_exclusive_jobs import mysqlquery, statements, try_acquire

        call_command("migrate", verbosity=0)
        bench_locks.prepare_tables(config)
        lock = try_acquire("warm-up", ttl=60)
        assert lock is not None
        lock.release()
        compiled = next(v for k, v in statements._compiled.items() if k[3] == "take-mysql")
        assert compiled is not None
        self.compiled = compiled
        self.mysqlquery = mysqlquery
        count = len(compiled.bind(name="job", thread=1))
        raw = connection.connection
        self.template = mysqlquery._render(
            raw, compiled.sql, compiled.params, compiled.varying, count
        )
        self.body = mysqlquery._text(self.template, [b"?"] * len(self.template.slots))
        connection.close()

    def values(self, raw: Any, thread: int) -> list[bytes]:
        """What mysqlquery sends for the name "job" and this thread, in slot order."""
        params = self.compiled.bind(name="job", thread=thread)
        bound = (*self.compiled.varying, *range(len(self.compiled.params), len(params)))
        return [self.mysqlquery._literal(raw, params[index]) for index in bound]

    def text(self, raw: Any, thread: int) -> bytes:
        return bytes(self.mysqlquery._text(self.template, self.values(raw, thread)))


def reset_tables() -> None:
    connection = connect()
    cursor = connection.cursor()
    cursor.execute(f"DROP TABLE IF EXISTS {COPY}")
    cursor.execute(f"CREATE TABLE {COPY} LIKE {TABLE}")
    cursor.execute(
        f"ALTER TABLE {COPY} DROP PRIMARY KEY, DROP KEY name, ADD PRIMARY KEY (name), "
        "ADD UNIQUE KEY by_id (id)"
    )
    for table in (TABLE, COPY):
        cursor.execute(f"DELETE FROM {table} WHERE name = 'job'")
        cursor.execute(
            f"INSERT INTO {table} (name, token, host, instance) VALUES ('job', 0, '', '')"
        )
    cursor.execute("DELETE FROM floor_lock")
    cursor.execute("INSERT INTO floor_lock VALUES ('job', '', UTC_TIMESTAMP(6))")
    connection.close()


def prepared_pair(connection: Any, take: Take, name: bytes, table: str) -> tuple[bytes, bytes]:
    """(PREPARE once, EXECUTE each time) for the take on ``table``, as this thread sends it."""
    body = take.body.replace(TABLE.encode(), table.encode())
    prepare = b"PREPARE " + name + b" FROM " + connection.string_literal(body)
    values = take.values(connection, threading.get_native_id())
    return prepare, take.mysqlquery._execute(b"EXECUTE " + name, values)


def contender(kind: str, take: Take, rounds: int, me: int, barrier: Any, out: Any) -> None:
    connection = connect()
    if kind.startswith("floor"):
        statement = (FLOOR % (f"'p{me}'", "'job'")).encode()
    else:
        table = TABLE if kind == "ours-prepared" else COPY
        prepare, statement = prepared_pair(connection, take, b"bench_take", table)
        connection.query(prepare)
    burn = 55e-6 if kind == "floor-burn" else 0.0
    timings = []
    for _ in range(rounds):
        barrier.wait(120)
        started = time.perf_counter()
        if burn:
            cpu = time.thread_time()
            while time.thread_time() - cpu < burn:
                pass
        connection.query(statement)
        connection.affected_rows()
        timings.append(time.perf_counter() - started)
        barrier.wait(120)
    out.put(timings)
    connection.close()


def contended(kind: str, take: Take, rounds: int, processes: int) -> float:
    table = {"floor": "floor_lock", "floor-burn": "floor_lock", "ours-prepared": TABLE}
    barrier = FORK.Barrier(processes + 1)
    out = FORK.Queue()
    workers = [
        FORK.Process(target=contender, args=(kind, take, rounds, n, barrier, out))
        for n in range(processes)
    ]
    for worker in workers:
        worker.start()
    connection = connect()
    for _ in range(rounds):
        connection.query(
            f"UPDATE {table.get(kind, COPY)} SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND"
            " WHERE name = 'job'".encode()
        )
        barrier.wait(120)
        barrier.wait(120)
    timings = [t for _ in workers for t in out.get(timeout=300)]
    for worker in workers:
        worker.join()
    connection.close()
    return statistics.median(timings) * 1e6


def server_cpu(take: Take, count: int = 20000) -> dict[str, float]:
    pid = next(
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit()
        and (entry / "comm").exists()
        and (entry / "comm").read_text().strip() in ("mariadbd", "mysqld")
    )
    ticks = os.sysconf("SC_CLK_TCK")

    def cpu() -> float:
        fields = (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1]).split()
        return (int(fields[11]) + int(fields[12])) / ticks

    connection = connect()
    held = "UTC_TIMESTAMP(6) + INTERVAL 1 HOUR"
    connection.query(f"UPDATE {TABLE} SET expires_at = {held} WHERE name = 'job'".encode())
    connection.query(f"UPDATE floor_lock SET expires_at = {held} WHERE name = 'job'".encode())
    prepare, execute = prepared_pair(connection, take, b"bench_take", TABLE)
    connection.query(prepare)
    kinds = {
        "floor": (FLOOR % ("'me'", "'job'")).encode(),
        "ours as text": take.text(connection, threading.get_native_id()),
        "ours prepared": execute,
    }
    result = {}
    for label, statement in kinds.items():
        for _ in range(500):
            connection.query(statement)
        before = cpu()
        for _ in range(count):
            connection.query(statement)
            connection.affected_rows()
        result[label] = (cpu() - before) / count * 1e6
    connection.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    take = Take()
    reset_tables()
    print("| losing take, one connection | server CPU µs per statement |\n|---|---|")
    for label, micros in server_cpu(take).items():
        print(f"| {label} | {micros:.1f} |")
    reset_tables()
    kinds = ["floor", "floor-burn", "ours-prepared", "ours-prepared-by-name"]
    p50s: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(args.repeats):
        for kind in kinds:
            p50s[kind].append(contended(kind, take, args.rounds, args.processes))
    floor = statistics.median(p50s["floor"])
    print(
        f"\n| {args.processes} processes, raw driver | p50 µs (median of {args.repeats}) |"
        " / floor |\n|---|---|---|"
    )
    for kind in kinds:
        median = statistics.median(p50s[kind])
        print(f"| {kind} | {median:.0f} | {median / floor:.2f}x |")


if __name__ == "__main__":
    main()

"""Wall time of `manage.py run_exclusive noop` against a bare `manage.py noop`.

All are whole processes in the demo project on the same database: Python and Django
start-up, then either nothing (`noop`, a command whose handle() returns; it runs
Django's system checks as every command does by default; `noop_nochecks` skips them,
as run_exclusive does, which runs only this app's checks) or the full
run_exclusive path (acquire, write the run row, run a job that does nothing, record
the end, release). The difference is what this app adds to a cron line.

    python benchmarks/bench_command.py [--runs 40] [--database-url URL]

Without --database-url it runs on SQLite and, if reachable, PostgreSQL and MariaDB.
Prints a Markdown table; the two commands alternate so drift hits both alike. The app
and the demo project are byte-compiled first, as an installed package is: with
PYTHONDONTWRITEBYTECODE set, every process would otherwise compile the modules that
run_exclusive imports and the bare command does not, and measure the compiler.
"""

from __future__ import annotations

import argparse
import compileall
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_model  # benchmarks/machine.py, beside this script

ROOT = Path(__file__).resolve().parent.parent
MANAGE = ROOT / "testproject" / "manage.py"


def reachable(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def run(args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, str(MANAGE), *args],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=120,
    )
    return time.perf_counter() - started


def bench(database_url: str, runs: int) -> dict[str, float]:
    env = {**os.environ, "DATABASE_URL": database_url}
    subprocess.run(
        [sys.executable, str(MANAGE), "migrate", "-v", "0"], env=env, check=True, timeout=300
    )
    commands = {
        "bare": ["noop"],
        "bare_nochecks": ["noop_nochecks"],
        "locked": ["run_exclusive", "noop", "-v", "0"],
    }
    for _ in range(3):  # warm the file cache and the database
        for command in commands.values():
            run(command, env)
    times: dict[str, list[float]] = {key: [] for key in commands}
    for _ in range(runs):
        for key, command in commands.items():
            times[key].append(run(command, env))
    return {key: statistics.median(values) for key, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    for folder in ("django_exclusive_jobs", "testproject"):
        compileall.compile_dir(ROOT / folder, quiet=1)
    targets: list[tuple[str, str]] = []
    if args.database_url:
        targets.append((args.database_url.split(":")[0], args.database_url))
    else:
        scratch = Path(tempfile.mkdtemp(prefix="bench-command-"))
        targets.append(("sqlite", f"sqlite:///{scratch / 'bench.sqlite3'}"))
        if reachable(5432):
            targets.append(("postgresql", "postgres://postgres@127.0.0.1:5432/postgres"))
        if reachable(3306):
            targets.append(("mariadb", "mysql://root@127.0.0.1:3306/test"))
    cpu = cpu_model()
    print(f"machine: {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"{args.runs} runs of each command, alternating; wall time per process\n")
    print(
        "| database | `noop` (all checks) | `noop_nochecks` | `run_exclusive noop` "
        "| ratio vs `noop` | ratio vs `noop_nochecks` |"
    )
    print("|---|---|---|---|---|---|")
    for label, url in targets:
        result = bench(url, args.runs)
        print(
            f"| {label} | {result['bare'] * 1000:.0f} ms | {result['bare_nochecks'] * 1000:.0f} ms"
            f" | {result['locked'] * 1000:.0f} ms | {result['locked'] / result['bare']:.3f}x"
            f" | {result['locked'] / result['bare_nochecks']:.3f}x |"
        )


if __name__ == "__main__":
    main()

"""Where a scheduled run's CPU outside the scheduler goes: the job's process and its guard.

    python benchmarks/bench_child.py [--runs 300] [--rounds 2]

Sets this process up as the scheduler's fork server is (Django and the scheduler
benchmark's 20 jobs loaded), then forks ``--runs`` children in a row for each variant
and prints the CPU time (user + system) per run of the children and of this process:

- fork, then exit at once;
- fork, start the guard (``guard.Guard``, a thread and a timer), end it, exit;
- ``process.main`` as a run does it: the guard, the job, its report, exit.

No database is touched (the benchmark's jobs append to a file only if told to). The
figures are in docs/performance.md ("Where a run's CPU outside the scheduler goes").
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import resource
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("fork, exit", "fork, guard, exit", "process.main")


def cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def child(kind: str, report: socket.socket) -> None:
    """What one child does; never returns."""
    from multiprocessing.connection import Connection

    from django_exclusive_jobs.run import guard as guards
    from django_exclusive_jobs.run import process

    connection = Connection(report.detach())
    if kind == "fork, exit":
        os._exit(0)
    if kind == "fork, guard, exit":
        guard = guards.Guard(connection, guards.Limits(time.monotonic() + 60, 1.0, None))
        guard.start()
        guard.end()
        os._exit(0)
    slot = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    process.main("bench_000", slot, time.monotonic() + 60, 1.0, None, {}, {}, 1, report=connection)
    os._exit(70)  # main() exits by itself


def measure(kind: str, runs: int) -> tuple[float, float]:
    """CPU ms per run: the children's, and this (forking) process's."""
    from multiprocessing.connection import Connection

    children, forker = cpu(resource.RUSAGE_CHILDREN), cpu(resource.RUSAGE_SELF)
    for _ in range(runs):
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            ours.close()
            child(kind, theirs)
        theirs.close()
        reader = Connection(ours.detach())
        try:
            while True:
                reader.recv()
        except EOFError:
            pass
        reader.close()
        os.waitpid(pid, 0)
    return (
        (cpu(resource.RUSAGE_CHILDREN) - children) / runs * 1000,
        (cpu(resource.RUSAGE_SELF) - forker) / runs * 1000,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]
    os.environ.update(
        BENCH_BACKEND="postgresql",
        BENCH_JOBS="20",
        DJANGO_SETTINGS_MODULE="scheduler_bench.settings",
    )
    os.environ.pop("BENCH_RUNS_FILE", None)
    from django_exclusive_jobs.run.forkserver import _set_up_django

    failure = _set_up_django()
    from django_exclusive_jobs.run.process import _read_once

    _read_once()  # as the fork server does once set up
    if failure:
        sys.exit(failure)
    rss = int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) / 1024
    print(f"forking process RSS: {rss:.1f} MiB; {args.runs} runs per variant and round\n")
    print("| round | what each child does | the children, ms | the forking process, ms |")
    print("|---|---|---|---|")
    for round_number in range(1, args.rounds + 1):
        for kind in VARIANTS:
            children, forker = measure(kind, args.runs)
            print(f"| {round_number} | {kind} | {children:.2f} | {forker:.2f} |")


if __name__ == "__main__":
    main()

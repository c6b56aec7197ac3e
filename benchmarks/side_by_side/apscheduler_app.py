"""APScheduler 4's side of ``burst.sh``: W processes each run one ``AsyncScheduler`` on
the same SQL data store (``SQLAlchemyDataStore`` on PostgreSQL, asyncpg), with
``AsyncpgEventBroker`` (LISTEN/NOTIFY) so that every scheduler hears of the others' jobs.

``setup`` makes the data store's tables (its own ``start()``: made if missing), empties
them and this script's ``bench_apscheduler_workers``, then adds ``--jobs`` tasks and
schedules ``t00``, ``t01`` ... (procrastinate's task names): each task runs ``record``
in the thread pool executor (a sync job, as procrastinate's tasks and ours), at most one
run of it at a time (APScheduler's default), and each schedule is a ``CronTrigger`` in
UTC on the instants that are multiples of ``--every`` seconds (``second="*/S"``, or
``minute="*/S/60", second=0``), the same instants as the other variants.

Lateness is run late, not skipped: ``misfire_grace_time=None`` (APScheduler's default: a
job has no start deadline and runs however late, as procrastinate's jobs once deferred),
``coalesce="latest"`` (the default: a schedule processed after later instants have also
passed makes one job, for the latest; the earlier ones are never run, counted missed).

``worker`` runs one scheduler (role ``both``: it processes due schedules into jobs and
runs jobs) with ``max_concurrent_jobs=--max-concurrent``, writes its pid into
``bench_apscheduler_workers`` once started (``burst.sh`` waits for W rows), and stops on
SIGTERM. Each run appends ``name slot pid time`` to ``--runs`` (one write in append
mode, as procrastinate's tasks and ``scheduler_bench``'s jobs do): ``slot`` is the job's
``scheduled_fire_time`` (epoch seconds), ``pid`` the worker's (the job runs in one of
its threads), ``time`` this machine's clock at the job's first line.

Connections per worker: the engine's pool (SQLAlchemy's default 5 + 10 overflow, so up
to 15; ``--pool N``: N, no overflow) and the event broker's one asyncpg connection (it
both LISTENs and sends each event as ``SELECT pg_notify(...)``).

Counters: each worker counts the statements SQLAlchemy executes (``before_cursor_execute``;
an ``executemany`` is one, its parameter sets are counted apart; BEGIN and COMMIT are
not counted), the events it publishes (one ``pg_notify`` each) and the notifications it
receives, and prints them half a period after each instant (``counts SLOT key=value
...``), when ``burst.sh`` samples its other counters. Not part of the package: it runs
in a virtualenv of its own (``burst.sh`` makes it).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import socket
import time
from collections import Counter
from typing import Any

import anyio
from apscheduler import AsyncScheduler, CoalescePolicy, ConflictPolicy, Event, current_job
from apscheduler.datastores.sqlalchemy import SQLAlchemyDataStore
from apscheduler.eventbrokers.asyncpg import AsyncpgEventBroker
from apscheduler.eventbrokers.local import LocalEventBroker
from apscheduler.triggers.cron import CronTrigger
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

DSN = "postgresql+asyncpg://postgres@127.0.0.1:5432/bench_apscheduler"
NAME = "t{:02d}"
WORKERS_TABLE = "bench_apscheduler_workers"
COUNTS: Counter[str] = Counter()


def record() -> None:
    """The job: one line in the runs file, at its first line (a thread of the worker)."""
    first = time.time()
    job = current_job.get()
    slot = job.scheduled_fire_time.timestamp()  # type: ignore[union-attr]
    with open(os.environ["APS_RUNS_FILE"], "a") as handle:
        handle.write(f"{job.task_id} {slot:.6f} {os.getpid()} {first:.6f}\n")


def count_statement(*args: Any) -> None:
    """SQLAlchemy's ``before_cursor_execute``: one statement (executemany: one)."""
    parameters, executemany = args[3], args[5]
    COUNTS["statements"] += 1
    if executemany:
        COUNTS["executemany_sets"] += len(parameters)


class CountingBroker(AsyncpgEventBroker):
    """``AsyncpgEventBroker`` that counts the events it sends and the ones it hears."""

    async def publish(self, event: Event) -> None:
        COUNTS["notifies"] += 1
        await super().publish(event)

    def reconstitute_event_str(self, payload: str) -> Event | None:
        COUNTS["received"] += 1
        return super().reconstitute_event_str(payload)


def make_engine(dsn: str, pool: int | None) -> AsyncEngine:
    options: dict[str, Any] = {"pool_size": pool, "max_overflow": 0} if pool else {}
    engine = create_async_engine(dsn, **options)
    event.listen(engine.sync_engine, "before_cursor_execute", count_statement)
    return engine


def trigger(every: int) -> CronTrigger:
    """Every ``every`` seconds, on the multiples of it since the epoch (as ``burst.sh``)."""
    if every < 60 and 60 % every == 0:
        return CronTrigger(second=f"*/{every}", timezone="UTC")
    if every % 60 == 0 and 3600 % every == 0:
        return CronTrigger(minute=f"*/{every // 60}", second=0, timezone="UTC")
    raise SystemExit("--every must divide 60 s, or be whole minutes dividing 60")


async def setup(args: argparse.Namespace) -> None:
    engine = make_engine(args.dsn, None)
    try:
        store = SQLAlchemyDataStore(engine)
        async with AsyncScheduler(store, LocalEventBroker(), cleanup_interval=None) as scheduler:
            async with engine.begin() as conn:
                await conn.execute(
                    text(f"create table if not exists {WORKERS_TABLE} (pid integer primary key)")
                )
                await conn.execute(
                    text(f"truncate {WORKERS_TABLE}, jobs, job_results, schedules, tasks")
                )
            # The callable by reference, "apscheduler_app:record": the workers import it.
            func = importlib.import_module("apscheduler_app").record
            for number in range(args.jobs):
                name = NAME.format(number)
                await scheduler.configure_task(
                    name,
                    func=func,
                    job_executor="threadpool",
                    max_running_jobs=1,
                    misfire_grace_time=None,
                )
                await scheduler.add_schedule(
                    name,
                    trigger(args.every),
                    id=name,
                    coalesce=CoalescePolicy.latest,
                    misfire_grace_time=None,
                    conflict_policy=ConflictPolicy.replace,
                )
    finally:
        await engine.dispose()


def print_counts(slot: int | str) -> None:
    fields = " ".join(f"{key}={COUNTS[key]}" for key in sorted(COUNTS))
    print(f"counts {slot} {fields}", flush=True)


async def snapshots(every: int) -> None:
    """The counters half a period after each instant (the instant's label)."""
    while True:
        now = time.time()
        slot = int((now - every / 2) // every * every) + every
        await anyio.sleep(slot + every / 2 - now)
        print_counts(slot)


async def worker(args: argparse.Namespace) -> None:
    os.environ["APS_RUNS_FILE"] = args.runs
    engine = make_engine(args.dsn, args.pool)
    scheduler = AsyncScheduler(
        SQLAlchemyDataStore(engine),
        CountingBroker.from_async_sqla_engine(engine),
        identity=f"{socket.gethostname()}-{os.getpid()}",
        max_concurrent_jobs=args.max_concurrent,
    )
    try:
        async with scheduler:
            await scheduler.start_in_background()
            async with engine.begin() as conn:
                await conn.execute(
                    text(f"insert into {WORKERS_TABLE} (pid) values (:pid)"), {"pid": os.getpid()}
                )
            async with anyio.create_task_group() as group:
                group.start_soon(snapshots, args.every)
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        break
                group.cancel_scope.cancel()
            # Leaving the scheduler's context stops it (running jobs are waited for).
    finally:
        await engine.dispose()
        print_counts("end")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["setup", "worker"])
    parser.add_argument("--dsn", default=DSN)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--every", type=int, default=10, help="seconds between instants")
    parser.add_argument("--max-concurrent", type=int, default=10)
    parser.add_argument("--pool", type=int, help="pool size (no overflow); default 5 + 10")
    parser.add_argument("--runs", help="the runs file (worker)")
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    if args.command == "worker" and not args.runs:
        parser.error("worker needs --runs")
    trigger(args.every)  # checked before anything starts
    anyio.run(setup if args.command == "setup" else worker, args)


if __name__ == "__main__":
    main()

"""procrastinate's side of ``side_by_side.sh`` and ``burst.sh``: ``$SIDE_JOBS`` periodic
tasks (20 unless set), ``t00``, ``t01`` ..., all on the cron ``$SIDE_CRON`` (six fields,
the sixth is seconds; every second unless set).

Each run appends ``name timestamp pid time`` to ``$SIDE_RUNS_FILE`` (one write in append
mode), as ``scheduler_bench``'s jobs do: ``timestamp`` is the periodic slot procrastinate
passes (epoch seconds), ``time`` this machine's clock at the task's first line.
``$SIDE_POOL_SIZE``, if set, is the connection pool's size (procrastinate's default,
psycopg_pool's 4, otherwise). Not part of the package: it runs in a virtualenv of its
own, with procrastinate installed (``side_by_side.sh`` makes it).
"""

import os
import time

from procrastinate import App, PsycopgConnector

DSN = os.environ.get("SIDE_DSN", "postgresql://postgres@127.0.0.1:5432/bench_procrastinate")
TASKS = int(os.environ.get("SIDE_JOBS", "20"))
# Six fields: the sixth is seconds, so by default each task is due every second.
CRON = os.environ.get("SIDE_CRON", "* * * * * *")
POOL = {"min_size": int(os.environ["SIDE_POOL_SIZE"])} if os.environ.get("SIDE_POOL_SIZE") else {}

app = App(connector=PsycopgConnector(conninfo=DSN, **POOL))


def make_task(number: int) -> object:
    name = f"t{number:02d}"

    def task(timestamp: int) -> None:
        first = time.time()
        with open(os.environ["SIDE_RUNS_FILE"], "a") as handle:
            handle.write(f"{name} {timestamp} {os.getpid()} {first:.6f}\n")

    task.__name__ = task.__qualname__ = name
    return app.periodic(cron=CRON)(app.task(name=name)(task))


for number in range(TASKS):
    make_task(number)

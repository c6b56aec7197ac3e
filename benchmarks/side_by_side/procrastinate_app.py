"""procrastinate's side of ``side_by_side.sh``: 20 periodic tasks, each due every second.

Each run appends ``name timestamp pid time`` to ``$SIDE_RUNS_FILE`` (one write in append
mode), as ``scheduler_bench``'s jobs do. Not part of the package: it runs in a
virtualenv of its own, with procrastinate installed (``side_by_side.sh`` makes it).
"""

import os
import time

from procrastinate import App, PsycopgConnector

DSN = os.environ.get("SIDE_DSN", "postgresql://postgres@127.0.0.1:5432/bench_procrastinate")
TASKS = int(os.environ.get("SIDE_JOBS", "20"))

app = App(connector=PsycopgConnector(conninfo=DSN))


def make_task(number: int) -> object:
    name = f"t{number:02d}"

    def task(timestamp: int) -> None:
        with open(os.environ["SIDE_RUNS_FILE"], "a") as handle:
            handle.write(f"{name} {timestamp} {os.getpid()} {time.time():.6f}\n")

    task.__name__ = task.__qualname__ = name
    # Six fields: the sixth is seconds, so each task is due every second.
    return app.periodic(cron="* * * * * *")(app.task(name=name)(task))


for number in range(TASKS):
    make_task(number)

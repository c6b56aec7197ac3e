"""The figures of ``burst.sh``: one variant's run read back (``measure``), then every
variant side by side (``table``). Standard library only.

``measure`` reads what a variant left:

* the runs file: ``name slot pid time`` per execution, one line each, written by the
  task or job itself at its first line (``slot``: epoch seconds from procrastinate, an
  ISO date from ``scheduler_bench``; ``time``: this machine's clock, ``time.time()``);
* the rows file, from the variant's own tables, ``|``-separated: ``name|slot|started|
  worker|deferred`` (epoch seconds on the database's clock; ``worker`` and ``deferred``
  may be empty): procrastinate's succeeded jobs with their ``started`` and ``deferred``
  events, or our succeeded ``JobRun`` rows (``started_at``, the scheduler's pid); none
  for a variant that keeps no row of a run (APScheduler), whose figures from rows are
  then ``-``;
* the counters ``burst.sh`` sampled at the window's two edges (CPU ticks of the
  workers, of the database server, of the variant's database's backends; committed
  transactions), given on the command line;

and writes one JSON file. ``table`` prints the JSON files as one Markdown table, one
column each.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections import Counter
from pathlib import Path
from typing import Any


def epoch(text: str) -> float:
    """A slot as epoch seconds: ``1767225600`` or ``2026-01-01T00:00:00+00:00``."""
    try:
        return float(text)
    except ValueError:
        return dt.datetime.fromisoformat(text).timestamp()


def key(name: str, slot: float) -> tuple[str, int]:
    return name, round(slot)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def spread(values: list[float]) -> str:
    """p50 / p99 / max, in seconds."""
    if not values:
        return "-"
    return f"{percentile(values, 0.5):.2f} / {percentile(values, 0.99):.2f} / {max(values):.2f}"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    slots = [round(float(s)) for s in args.slots.split(",")]
    names = [args.name_format.format(number) for number in range(args.jobs)]
    window = {key(name, slot) for name in names for slot in slots}
    pairs = len(window)

    # Executions, from the runs file: every line is one real run.
    runs = []
    for line in Path(args.runs).read_text().splitlines():
        name, slot, pid, first = line.split()
        runs.append((key(name, epoch(slot)), int(pid), float(first)))
    executed = Counter(pair for pair, _, _ in runs)
    first_start: dict[tuple[str, int], tuple[float, int]] = {}
    for pair, pid, first in runs:
        if pair in window and (pair not in first_start or first < first_start[pair][0]):
            first_start[pair] = (first, pid)
    late = {pair: first - pair[1] for pair, (first, _) in first_start.items()}

    # Rows, from the variant's tables: the start on the database's clock, the worker.
    rows: list[tuple[tuple[str, int], float, str, str]] = []
    if args.rows:
        for line in Path(args.rows).read_text().splitlines():
            name, slot, started, worker, deferred = line.split("|")
            rows.append((key(name, float(slot)), float(started), worker, deferred))
    row_count = Counter(pair for pair, _, _, _ in rows)
    in_window = [row for row in rows if row[0] in window]

    # Runs per worker: by the scheduler's pid in our rows; by the pid that ran the task
    # (procrastinate runs it in a thread of the worker process) otherwise.
    workers = [int(pid) for pid in args.worker_pids.split(",")]
    if args.worker_from == "rows":
        per_worker = Counter(int(worker) for _, _, worker, _ in in_window if worker)
    else:
        per_worker = Counter(pid for _, pid in first_start.values())
    shares = [per_worker.get(pid, 0) for pid in workers]
    even = sum(shares) / len(workers) if workers else 0

    # Each slot's burst: its first and its last start (job's first line), from the slot.
    bursts: dict[int, list[float]] = {}
    for pair, seconds in late.items():
        bursts.setdefault(pair[1], []).append(seconds)

    span = args.span
    per_instant = args.every / span if span else 0.0  # a counter's delta -> per period
    cpu_app = args.app_ticks / args.tck
    cpu_db = args.db_ticks / args.tck
    cpu_backends = args.backend_ticks / args.tck
    return {
        "label": args.label,
        "workers": len(workers),
        "jobs": args.jobs,
        "every": args.every,
        "max_concurrent": args.max_concurrent,
        "slots": len(slots),
        "pairs": pairs,
        "executed": sum(executed[pair] for pair in window),
        "doubled": sum(1 for times in executed.values() if times > 1),
        "doubled_rows": sum(1 for times in row_count.values() if times > 1) if args.rows else "-",
        "missed": sum(1 for pair in window if pair not in executed),
        "missed_rows": sum(1 for pair in window if pair not in row_count) if args.rows else "-",
        "late": spread(list(late.values())),
        "late_db": spread([started - pair[1] for pair, started, _, _ in in_window]),
        "deferred": spread(
            [float(deferred) - pair[1] for pair, _, _, deferred in in_window if deferred]
        ),
        "late_first_job": spread([s for pair, s in late.items() if pair[0] == names[0]]),
        "late_last_job": spread([s for pair, s in late.items() if pair[0] == names[-1]]),
        "burst_first": spread([min(starts) for starts in bursts.values()]),
        "burst_last": spread([max(starts) for starts in bursts.values()]),
        "per_worker": f"{min(shares, default=0)} / {max(shares, default=0)}",
        "workers_ran": sum(1 for n in shares if n),
        "busiest_share": f"{max(shares) / even:.2f}x" if even else "-",
        "cpu_app_run_ms": f"{cpu_app / pairs * 1000:.2f}" if pairs else "-",
        "cpu_app_instant": f"{cpu_app * per_instant:.2f}",
        "cpu_db_run_ms": f"{cpu_db / pairs * 1000:.2f}" if pairs else "-",
        "cpu_db_instant": f"{cpu_db * per_instant:.2f}",
        "cpu_backends_run_ms": f"{cpu_backends / pairs * 1000:.2f}" if pairs else "-",
        "cpu_backends_instant": f"{cpu_backends * per_instant:.2f}",
        "xacts_instant": f"{args.xacts * per_instant:,.0f}",
        "xacts_pair": f"{args.xacts / pairs:.1f}" if pairs else "-",
        "load": args.load,
        "span": f"{span:.1f}",
    }


# (label, key) of the table's rows, in order.
ROWS = [
    ("workers x jobs, every (s); each worker's concurrency", None),
    ("measured window: slots x jobs = (job, slot) pairs", None),
    ("executions of the window's pairs (runs file)", "executed"),
    ("**doubled**: (job, slot) run twice or more, any slot (runs file)", "doubled"),
    ("- (job, slot) with two or more succeeded rows (tables)", "doubled_rows"),
    ("**missed**: window pairs never run (runs file)", "missed"),
    ("- window pairs with no succeeded row (tables)", "missed_rows"),
    ("start lateness, job's first line - slot, p50 / p99 / max s", "late"),
    ("- start on the database clock (row's start - slot)", "late_db"),
    ("- job row deferred (procrastinate's deferred event - slot)", "deferred"),
    ("- of the first job (t00 / bench_000)", "late_first_job"),
    ("- of the last job", "late_last_job"),
    ("each burst's first start, across slots, p50 / p99 / max s", "burst_first"),
    ("each burst's last start, across slots, p50 / p99 / max s", "burst_last"),
    ("runs per worker, min / max", "per_worker"),
    ("- workers that ran any; busiest / its even share", None),
    ("application CPU per run, ms (worker process trees)", "cpu_app_run_ms"),
    ("application CPU per instant, s", "cpu_app_instant"),
    ("database server CPU per run, ms (whole server, approximate)", "cpu_db_run_ms"),
    ("database server CPU per instant, s", "cpu_db_instant"),
    ("- its backends of this database only, CPU per run, ms", "cpu_backends_run_ms"),
    ("- its backends of this database only, CPU per instant, s", "cpu_backends_instant"),
    ("transactions per instant (xact_commit + xact_rollback delta)", "xacts_instant"),
    ("- per (job, slot)", "xacts_pair"),
    ("load average before / after", "load"),
]


def table(paths: list[str]) -> None:
    results = [json.loads(Path(path).read_text()) for path in paths]
    print("| measure | " + " | ".join(r["label"] for r in results) + " |")
    print("|---" * (len(results) + 1) + "|")
    for label, name in ROWS:
        cells = []
        for r in results:
            if name:
                cells.append(str(r[name]))
            elif label.startswith("workers x"):
                cells.append(f"{r['workers']} x {r['jobs']}, {r['every']:g}; {r['max_concurrent']}")
            elif label.startswith("measured"):
                cells.append(f"{r['slots']} x {r['jobs']} = {r['pairs']}")
            else:
                cells.append(f"{r['workers_ran']} of {r['workers']}; {r['busiest_share']}")
        print(f"| {label} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("measure")
    one.add_argument("--label", required=True)
    one.add_argument("--runs", required=True)
    one.add_argument("--rows", help="none: the variant keeps no rows of its runs")
    one.add_argument("--slots", required=True, help="the window's slots, epoch, comma-separated")
    one.add_argument("--jobs", type=int, required=True)
    one.add_argument("--name-format", required=True, help="t{:02d} or bench_{:03d}")
    one.add_argument("--every", type=float, required=True)
    one.add_argument("--max-concurrent", type=int, required=True)
    one.add_argument("--worker-pids", required=True)
    one.add_argument("--worker-from", choices=["runs", "rows"], default="runs")
    one.add_argument("--span", type=float, required=True, help="seconds between the samples")
    one.add_argument("--app-ticks", type=int, required=True)
    one.add_argument("--db-ticks", type=int, required=True)
    one.add_argument("--backend-ticks", type=int, required=True)
    one.add_argument("--tck", type=int, required=True)
    one.add_argument("--xacts", type=int, required=True)
    one.add_argument("--load", default="")
    one.add_argument("--json", required=True)
    both = sub.add_parser("table")
    both.add_argument("json", nargs="+")
    args = parser.parse_args()
    if args.command == "measure":
        Path(args.json).write_text(json.dumps(measure(args)))
    else:
        table(args.json)


if __name__ == "__main__":
    main()

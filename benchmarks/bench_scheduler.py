"""The scheduler: real ``manage.py exclusive_scheduler`` processes, as a deployment runs them.

    python benchmarks/bench_scheduler.py --backend postgresql
    python benchmarks/bench_scheduler.py --backend mysql --measure cluster
    python benchmarks/bench_scheduler.py --backend postgresql --quick

The processes run the benchmark project in ``benchmarks/scheduler_bench/`` (its own
settings, database ``bench_scheduler``, which this script creates and migrates). Its
jobs ``bench_000`` ... are due every ``--every``; each appends ``name slot pid time`` to
a file when it really runs, so executions are counted, not only history rows. Each
scheduler process counts the statements it sends through Django's cursor, its
keep-alive threads' included (``scheduler_bench/counting.py``).

Measurements (``--measure``, comma-separated; default all four):

* ``cluster``: ``--schedulers`` processes, each serving the same ``--jobs`` jobs due
  every ``--every`` (a time-compressed minute), for ``--seconds``. The measured window
  leaves out the first and the last slot after all schedulers started. Doubled: a
  (job, slot) executed more than once (any slot) or with two history rows; missed: a
  (job, slot) of the window with no successful run. Start latency: ``JobRun.started_at -
  slot``, both database time. Child start: the job's first line (``time.time()``)
  minus the slot, and minus ``started_at`` (same machine, same clock as the database).
  Statements per slot per server: what all schedulers sent during the window, divided
  by the window's (job, slot) pairs and by the number of schedulers; and apart, per
  server and minute, the periodic ones (heartbeat, clock, the look for runs asked for
  now), which a time-compressed slot holds fewer of than a real one.
* ``child``: the cluster measurement with one scheduler and one job due every second,
  for ``--child-seconds``: what starting a job's process costs when nothing competes.
* ``idle``: one scheduler serving ``--jobs`` jobs due every ``--idle-every`` (nothing
  falls due): CPU seconds (utime + stime of the scheduler and of its fork server, if
  started) and statements per minute, over ``--idle-seconds`` after a settling pause.
* ``rss``: one scheduler serving ``--rss-jobs`` jobs due every ``--rss-every`` until
  ``--rss-slots`` slots have run: VmRSS of the scheduler and its fork server after the
  warm-up (``--rss-warmup`` slots) and every so often until the end.

``--in-process`` declares the jobs ``in_process=True``: the scheduler runs them in a
thread of its own process instead of a child process each.

Every table prints the load average (``/proc/loadavg``) at its start and end: the
machine may be shared, and a figure taken under load says so.
"""

from __future__ import annotations

import argparse
import compileall
import datetime as dt
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from machine import cpu_model  # benchmarks/machine.py, beside this script

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
DB_NAME = "bench_scheduler"
CLK_TCK = os.sysconf("SC_CLK_TCK")
# What a scheduler sends on its own clock, whatever falls due: heartbeat, clock, and the
# look for runs asked for now (by the kinds scheduler_bench/counting.py gives them).
PERIODIC = (" scheduler", " clock", " request")
SCHEDULER_ARGS = ["--database", "default"]  # the command's defaults otherwise


# --- the project, the database, the processes --------------------------------------------


def project_env(backend: str, **extra: str) -> dict[str, str]:
    """The environment of every process: the benchmark project's settings."""
    env = dict(os.environ)
    env.update(
        BENCH_BACKEND=backend,
        DJANGO_SETTINGS_MODULE="scheduler_bench.settings",
        PYTHONPATH=os.pathsep.join([str(BENCH), str(ROOT)]),
    )
    env.update(extra)
    return env


def prepare_database(backend: str) -> None:
    """Create ``bench_scheduler`` if needed, migrate it, and set Django up in this process."""
    if backend == "postgresql":
        import psycopg

        with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres") as raw:
            raw.autocommit = True
            found = raw.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DB_NAME])
            if found.fetchone() is None:
                raw.execute(f"CREATE DATABASE {DB_NAME}")
    elif backend == "mysql":
        import MySQLdb  # type: ignore[import-untyped]

        raw = MySQLdb.connect(host="127.0.0.1", user="root")
        raw.cursor().execute(f"CREATE DATABASE IF NOT EXISTS {DB_NAME} CHARACTER SET utf8mb4")
        raw.close()
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v", "0"],
        cwd=ROOT,
        env=project_env(backend),
        check=True,
        timeout=300,
    )
    os.environ.update(BENCH_BACKEND=backend, DJANGO_SETTINGS_MODULE="scheduler_bench.settings")
    sys.path.insert(0, str(BENCH))
    import django

    django.setup()


def clear_tables() -> None:
    """Empty the app's tables (TRUNCATE): each measurement starts from fresh tables, not
    from the dead rows of the one before (a server may run without autovacuum)."""
    from django.apps import apps
    from django.core.management.color import no_style
    from django.db import connection

    models = apps.get_app_config("django_exclusive_jobs").get_models()
    tables = [model._meta.db_table for model in models]
    with connection.cursor() as cursor:
        for statement in connection.ops.sql_flush(no_style(), tables, reset_sequences=True):
            cursor.execute(statement)


@dataclass
class Cluster:
    """Scheduler processes started by this script, their logs and their output files."""

    out: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    children: dict[int, dict[str, int]] = field(default_factory=dict)

    @property
    def runs_file(self) -> Path:
        return self.out / "runs.txt"

    def start(self, count: int, env: dict[str, str]) -> None:
        for number in range(count):
            log = (self.out / f"scheduler-{number:02d}.log").open("wb")
            self.processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "django", "exclusive_scheduler", *SCHEDULER_ARGS],
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            log.close()

    def wait_started(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        for number, process in enumerate(self.processes):
            log = self.out / f"scheduler-{number:02d}.log"
            while "scheduler started" not in log.read_text():
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"scheduler {number} did not start:\n{log.read_text()}")
                time.sleep(0.2)

    def helpers(self, pid: int) -> dict[str, int]:
        """The scheduler's fork server (``process.serve_forks``), once started."""
        found = self.children.setdefault(pid, {})
        if not found:
            for child in child_pids(pid):
                if "serve_forks" in command_line(child):
                    found["fork server"] = child
        return found

    def cpu(self) -> float:
        """CPU seconds used so far by the schedulers and their helper processes."""
        total = 0.0
        for process in self.processes:
            total += cpu_seconds(process.pid)
            total += sum(cpu_seconds(pid) for pid in self.helpers(process.pid).values())
        return total

    def check_alive(self) -> None:
        """Stop the measurement if a scheduler exited (a failure, not a figure)."""
        for number, process in enumerate(self.processes):
            if process.poll() is not None:
                log = (self.out / f"scheduler-{number:02d}.log").read_text()
                raise SystemExit(f"scheduler {number} exited {process.returncode}:\n{log[-2000:]}")

    def stop(self, timeout: float = 90) -> None:
        for process in self.processes:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for number, process in enumerate(self.processes):
            try:
                process.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.returncode != 0:
                log = (self.out / f"scheduler-{number:02d}.log").read_text()
                print(f"scheduler {number} exited {process.returncode}:\n{log[-2000:]}")

    def statements(self) -> list[dict[str, Any]]:
        return [json.loads(path.read_text()) for path in self.out.glob("statements-*.json")]

    def warnings(self) -> list[str]:
        """Log lines other than the normal decisions (at verbosity 1)."""
        normal = ("acquired ", "finished ", "scheduler started", "scheduler stopped")
        lines = []
        for log in sorted(self.out.glob("scheduler-*.log")):
            lines += [line for line in log.read_text().splitlines() if not line.startswith(normal)]
        return lines


def scheduler_env(
    backend: str, out: Path, *, jobs: int, every: str, timeline: bool = True
) -> dict[str, str]:
    return project_env(
        backend,
        BENCH_JOBS=str(jobs),
        BENCH_EVERY=every,
        BENCH_RUNS_FILE=str(out / "runs.txt"),
        BENCH_STATEMENTS=str(out),
        BENCH_TIMELINE="1" if timeline else "0",
    )


# --- /proc ------------------------------------------------------------------------------


def proc_stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (field 3 onwards)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return []


def cpu_seconds(pid: int, *, children: bool = False) -> float:
    """utime + stime (with ``children``: cutime + cstime, of reaped children)."""
    fields = proc_stat(pid)
    if not fields:
        return 0.0
    first = 13 if children else 11  # fields 16/17 or 14/15, counted from 1
    return (int(fields[first]) + int(fields[first + 1])) / CLK_TCK


def database_cpu(backend: str) -> float:
    """CPU seconds the database server has used so far: every ``postgres`` process
    (with the reaped backends' time, counted in the postmaster's children) or
    ``mariadbd``/``mysqld``. A local server only (this machine's /proc)."""
    names = {"postgresql": ("postgres",), "mysql": ("mariadbd", "mysqld")}[backend]
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if comm in names:
            total += cpu_seconds(int(entry.name)) + cpu_seconds(int(entry.name), children=True)
    return total


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return 0.0


def child_pids(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = proc_stat(int(entry.name))
            if fields and fields[1] == str(pid):
                found.append(int(entry.name))
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return ""


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# --- figures ----------------------------------------------------------------------------


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def ms(values: list[float]) -> str:
    """p50 / p99 / max in milliseconds."""
    if not values:
        return "-"
    p50, p99 = percentile(values, 0.5) * 1000, percentile(values, 0.99) * 1000
    return f"{p50:,.0f} / {p99:,.0f} / {max(values) * 1000:,.0f}"


def seconds_of(every: str) -> float:
    from django_exclusive_jobs.lock.durations import parse_duration

    return parse_duration(every, what="--every").total_seconds()


def read_runs(path: Path) -> list[tuple[str, dt.datetime, int, float]]:
    """The runs file: (job, slot, pid of the child, time.time() at the job's first line)."""
    runs = []
    if path.exists():
        for line in path.read_text().splitlines():
            name, slot, pid, first = line.split()
            runs.append((name, dt.datetime.fromisoformat(slot), int(pid), float(first)))
    return runs


def statements_between(dumps: Iterable[dict[str, Any]], start: float, end: float) -> Counter[str]:
    """Statements all processes sent in wall-clock seconds [start, end), by kind."""
    total: Counter[str] = Counter()
    for dump in dumps:
        for second, counts in dump["timeline"].items():
            if start <= int(second) < end:
                total.update(counts)
    return total


def doubled_in_history() -> int:
    """(job, slot) pairs with more than one history row (the unique constraint forbids it)."""
    from django.db.models import Count

    from django_exclusive_jobs.models import JobRun

    return (
        JobRun.objects.filter(slot__isnull=False)
        .values("name", "slot")
        .annotate(rows=Count("id"))
        .filter(rows__gt=1)
        .count()
    )


# --- measurements -----------------------------------------------------------------------


def cluster_run(
    backend: str, schedulers: int, jobs: int, every: str, seconds: float
) -> dict[str, Any]:
    """N schedulers, the same jobs, each slot once: doubled, missed, latency, statements."""
    from django_exclusive_jobs.models import JobRun

    period = seconds_of(every)
    clear_tables()
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="bench-scheduler-cluster-")))
    load_before = load()
    cluster.start(schedulers, scheduler_env(backend, cluster.out, jobs=jobs, every=every))
    try:
        cluster.wait_started()
        ready = time.time()
        first = math.floor(ready / period) * period + period  # the first slot: left out
        last = math.floor((ready + seconds) / period) * period  # the last slot: left out
        measured = [first + period * k for k in range(1, round((last - first) / period))]
        if not measured:
            raise SystemExit("--seconds is too short for a measured slot")
        # Each period of the window holds one slot's starts; CPU is sampled mid-period.
        time.sleep(max(0.0, measured[0] - period / 2 - time.time()))
        db_before, db_from = database_cpu(backend), time.time()
        cpu_before = cluster.cpu()  # a look at every process: may take a while
        cpu_from = time.time()
        time.sleep(max(0.0, last - period / 2 - time.time()))
        db_used, db_span = database_cpu(backend) - db_before, time.time() - db_from
        cpu_used = cluster.cpu() - cpu_before
        cpu_span = time.time() - cpu_from
        rss = [rss_mib(process.pid) for process in cluster.processes]
        time.sleep(max(0.0, last + min(period / 2, 5.0) - time.time()))
        cluster.check_alive()
    finally:
        cluster.stop()
    load_after = load()

    slots = [dt.datetime.fromtimestamp(moment, dt.UTC) for moment in measured]
    runs = read_runs(cluster.runs_file)
    executed = Counter((name, slot) for name, slot, _, _ in runs)
    rows = list(JobRun.objects.filter(slot__in=slots))
    succeeded = {
        (row.name, row.slot): row for row in rows if row.status == "succeeded" and row.slot
    }
    names = [f"bench_{number:03d}" for number in range(jobs)]
    pairs = [(name, slot) for name in names for slot in slots]
    window = set(pairs)
    first_lines = {(name, slot): first for name, slot, _, first in runs if (name, slot) in window}
    # Mid-period edges, like the CPU's: a start a few ms early (the clock's estimate)
    # still falls inside, and each period holds one slot's starts and ends.
    sent = statements_between(cluster.statements(), measured[0] - period / 2, last - period / 2)
    wins = Counter(row.pid for row in succeeded.values())
    shares = [wins.get(process.pid, 0) for process in cluster.processes]
    even = len(succeeded) / schedulers
    # Each slot's burst: when its first and its last run started (any job), database time.
    bursts: dict[dt.datetime, list[float]] = {}
    for (_, slot), row in succeeded.items():
        bursts.setdefault(slot, []).append((row.started_at - slot).total_seconds())
    return {
        "schedulers": schedulers,
        "jobs": jobs,
        "every": every,
        "slots": len(slots),
        "pairs": len(pairs),
        "executed": sum(executed.values()),
        "doubled": sum(1 for times in executed.values() if times > 1),
        "doubled_history": doubled_in_history(),
        "missed": sum(1 for pair in pairs if pair not in succeeded),
        "not_executed": sum(1 for pair in pairs if pair not in executed),
        "statuses": Counter(row.status for row in rows),
        "latency": [
            (row.started_at - slot).total_seconds() for (_, slot), row in succeeded.items()
        ],
        # Every scheduler starts the due jobs in the same order: by name.
        "latency_first": [
            (row.started_at - slot).total_seconds()
            for (name, slot), row in succeeded.items()
            if name == names[0]
        ],
        "latency_last": [
            (row.started_at - slot).total_seconds()
            for (name, slot), row in succeeded.items()
            if name == names[-1]
        ],
        "child_from_slot": [first - pair[1].timestamp() for pair, first in first_lines.items()],
        "child_from_row": [
            first - succeeded[pair].started_at.timestamp()
            for pair, first in first_lines.items()
            if pair in succeeded
        ],
        "burst_first": [min(starts) for starts in bursts.values()],
        "burst_last": [max(starts) for starts in bursts.values()],
        "statements": sent,
        "wins": (min(shares, default=0), max(shares, default=0), len(wins)),
        "chi_square": sum((n - even) ** 2 / even for n in shares) if even else 0.0,
        "above_share": max(shares, default=0) / even if even else 0.0,
        "db_cpu_per_slot": db_used / db_span * period,
        "cpu_per_minute": cpu_used / schedulers / cpu_span * 60,
        "cpu_ms_per_pair": cpu_used / len(pairs) * 1000,
        "rss": statistics.fmean(rss),
        "warnings": cluster.warnings(),
        "load": (load_before, load_after),
        "out": cluster.out,
    }


def idle_run(backend: str, jobs: int, every: str, seconds: float) -> dict[str, Any]:
    """One scheduler with nothing due: CPU and statements per minute."""
    clear_tables()
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="bench-scheduler-idle-")))
    load_before = load()
    cluster.start(1, scheduler_env(backend, cluster.out, jobs=jobs, every=every))
    [process] = cluster.processes
    try:
        cluster.wait_started()
        time.sleep(15)  # start-up's own statements and CPU are not idling
        start = math.ceil(time.time())
        time.sleep(max(0.0, start - time.time()))
        cpu_before = cluster.cpu()
        time.sleep(seconds)
        end = time.time()
        cpu_used = cluster.cpu() - cpu_before
        helpers = dict(cluster.helpers(process.pid))
        rss = rss_mib(process.pid)
        cluster.check_alive()
    finally:
        cluster.stop()
    sent = statements_between(cluster.statements(), start, math.floor(end))
    minutes = (math.floor(end) - start) / 60
    return {
        "jobs": jobs,
        "every": every,
        "seconds": end - start,
        "cpu_per_minute": cpu_used / ((end - start) / 60),
        "statements_per_minute": {kind: n / minutes for kind, n in sent.items()},
        "helpers": helpers,
        "rss": rss,
        "runs": len(read_runs(cluster.runs_file)),
        "warnings": cluster.warnings(),
        "load": (load_before, load()),
    }


def rss_run(backend: str, jobs: int, every: str, slots: int, warmup: int) -> dict[str, Any]:
    """One scheduler running ``slots`` slots: memory of it and its helpers as they go."""
    from django_exclusive_jobs.models import JobRun

    clear_tables()
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="bench-scheduler-rss-")))
    load_before = load()
    env = scheduler_env(backend, cluster.out, jobs=jobs, every=every, timeline=False)
    cluster.start(1, env)
    [process] = cluster.processes
    samples: list[dict[str, Any]] = []
    marks = sorted({warmup, *range(2000, slots, 2000), slots})

    def sample(done: int) -> dict[str, Any]:
        helpers = cluster.helpers(process.pid)
        return {
            "slots": done,
            "elapsed": time.time() - began,
            "scheduler": rss_mib(process.pid),
            "helpers": {label: rss_mib(pid) for label, pid in helpers.items()},
            "cpu": cpu_seconds(process.pid),
            "children_cpu": sum(
                cpu_seconds(pid, children=True) + cpu_seconds(pid) for pid in helpers.values()
            ),
            "load": load(),
        }

    try:
        cluster.wait_started()
        began = time.time()
        peak = 0.0
        done = 0
        while marks:
            time.sleep(1)
            cluster.check_alive()
            done = count_lines(cluster.runs_file)
            peak = max(peak, rss_mib(process.pid))
            if done >= marks[0]:
                samples.append(sample(done))
                while marks and done >= marks[0]:
                    marks.pop(0)
    finally:
        cluster.stop()
    rows = list(JobRun.objects.filter(status="succeeded"))
    dump = cluster.statements()
    return {
        "jobs": jobs,
        "every": every,
        "samples": samples,
        "peak": peak,
        "statuses": Counter(row.status for row in JobRun.objects.all()),
        "latency": [(row.started_at - row.slot).total_seconds() for row in rows if row.slot],
        "statements": Counter(dump[0]["totals"]) if dump else Counter(),
        "succeeded": len(rows),
        "doubled": sum(
            1
            for times in Counter(
                (name, slot) for name, slot, _, _ in read_runs(cluster.runs_file)
            ).values()
            if times > 1
        ),
        "warnings": cluster.warnings(),
        "load": (load_before, load()),
    }


def count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    with path.open("rb") as handle:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))


# --- tables -----------------------------------------------------------------------------


def table(rows: list[tuple[str, Any]], head: tuple[str, str] = ("measure", "value")) -> None:
    print(f"| {head[0]} | {head[1]} |")
    print("|---|---|")
    for label, value in rows:
        print(f"| {label} | {value} |")


def print_warnings(lines: list[str]) -> None:
    for line in lines[:10]:
        print(f"    {line}")


def print_cluster(backend: str, result: dict[str, Any], title: str = "Cluster") -> None:
    n, pairs, jobs = result["schedulers"], result["pairs"], result["jobs"]
    print(f"\n### {title}: {n} scheduler(s) x {jobs} job(s) every {result['every']}, {backend}\n")
    print(f"load average before / after: {result['load'][0]} / {result['load'][1]}\n")
    total = sum(result["statements"].values())
    periodic = sum(n for kind, n in result["statements"].items() if kind.endswith(PERIODIC))
    minutes = result["slots"] * seconds_of(result["every"]) / 60
    low, high, winners = result["wins"]
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(result["statuses"].items()))
    table(
        [
            ("measured window", f"{result['slots']} slots x {jobs} jobs = {pairs} (job, slot)"),
            ("executions (all slots, from the jobs' file)", result["executed"]),
            ("doubled: (job, slot) executed twice or more, any slot", result["doubled"]),
            ("doubled: (job, slot) with two history rows", result["doubled_history"]),
            ("missed: window pairs with no succeeded run", f"{result['missed']} of {pairs}"),
            ("window pairs not executed (jobs' file)", result["not_executed"]),
            ("history rows in the window", statuses),
            ("slot start latency (started_at - slot), p50 / p99 / max ms", ms(result["latency"])),
            ("- of the first job started (bench_000)", ms(result["latency_first"])),
            (f"- of the last job started (bench_{jobs - 1:03d})", ms(result["latency_last"])),
            ("child start: slot to job's first line, ms", ms(result["child_from_slot"])),
            ("child start: run row to job's first line, ms", ms(result["child_from_row"])),
            ("- of each burst's first start, across slots", ms(result["burst_first"])),
            ("- of each burst's last start, across slots", ms(result["burst_last"])),
            (f"runs won per scheduler, min / max ({winners} of {n} won any)", f"{low} / {high}"),
            (
                f"- chi-square against an even share ({n - 1} d.f.); busiest / its share",
                f"{result['chi_square']:.1f}; {result['above_share']:.2f}x",
            ),
            ("statements per instant (slot), all servers", f"{total / result['slots']:,.0f}"),
            ("database server CPU per instant, s", f"{result['db_cpu_per_slot']:.2f}"),
            ("statements per (job, slot) per server", f"{total / pairs / n:.2f}"),
            ("- without the periodic ones (see below)", f"{(total - periodic) / pairs / n:.2f}"),
            ("periodic statements per server per minute", f"{periodic / n / minutes:.1f}"),
            ("statements per (job, slot), all servers", f"{total / pairs:.1f}"),
            ("CPU per scheduler (with helpers), s per minute", f"{result['cpu_per_minute']:.2f}"),
            ("CPU of all schedulers per (job, slot), ms", f"{result['cpu_ms_per_pair']:.1f}"),
            ("scheduler RSS at the end, mean MiB", f"{result['rss']:.1f}"),
            ("warning lines in the schedulers' output", len(result["warnings"])),
        ]
    )
    print()
    table(
        [(kind, f"{count / pairs:.2f}") for kind, count in result["statements"].most_common()],
        ("statements in the window, by thread and kind", "per (job, slot), all servers"),
    )
    print(f"\nPeriodic: the kinds ending in {', '.join(k.strip() for k in PERIODIC)}.")
    print_warnings(result["warnings"])


def print_idle(backend: str, result: dict[str, Any]) -> None:
    print(
        f"\n### Idle: one scheduler, {result['jobs']} jobs every {result['every']}, "
        f"{result['seconds']:.0f} s, {backend}\n"
    )
    print(f"load average before / after: {result['load'][0]} / {result['load'][1]}\n")
    helpers = ", ".join(result["helpers"]) or "none started (they start with the first run)"
    rates = result["statements_per_minute"]
    table(
        [
            ("CPU (scheduler and helpers), s per minute", f"{result['cpu_per_minute']:.3f}"),
            ("helper processes", helpers),
            ("statements per minute", f"{sum(rates.values()):.1f}"),
            *[(f"- {kind}", f"{rate:.1f}") for kind, rate in sorted(rates.items())],
            ("scheduler RSS, MiB", f"{result['rss']:.1f}"),
            ("jobs run during the measurement", result["runs"]),
        ]
    )
    print_warnings(result["warnings"])


def print_rss(backend: str, result: dict[str, Any]) -> None:
    print(
        f"\n### Memory: one scheduler, {result['jobs']} jobs every {result['every']}, {backend}\n"
    )
    print(f"load average before / after: {result['load'][0]} / {result['load'][1]}\n")
    labels = sorted({label for sample in result["samples"] for label in sample["helpers"]})
    columns = ["slots run", "elapsed s", "scheduler RSS MiB"]
    columns += [f"{label} RSS MiB" for label in labels] + ["load"]
    print("| " + " | ".join(columns) + " |")
    print("|---" * len(columns) + "|")
    for sample in result["samples"]:
        cells = [f"{sample['slots']:,}", f"{sample['elapsed']:.0f}", f"{sample['scheduler']:.1f}"]
        cells += [f"{sample['helpers'].get(label, 0):.1f}" for label in labels]
        print("| " + " | ".join([*cells, sample["load"]]) + " |")
    first, last = result["samples"][0], result["samples"][-1]
    slots = last["slots"] - first["slots"]
    runs = max(1, result["succeeded"])
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(result["statuses"].items()))
    growth = (last["scheduler"] - first["scheduler"]) / slots * 1000
    children = (last["children_cpu"] - first["children_cpu"]) / slots * 1000
    print()
    table(
        [
            ("scheduler RSS peak (sampled each second), MiB", f"{result['peak']:.1f}"),
            ("scheduler RSS growth after warm-up, MiB per 1,000 slots", f"{growth:.3f}"),
            (
                "scheduler CPU per slot run, ms",
                f"{(last['cpu'] - first['cpu']) / slots * 1000:.2f}",
            ),
            ("fork server and job processes, CPU per slot run, ms", f"{children:.2f}"),
            ("slots per second", f"{slots / (last['elapsed'] - first['elapsed']):.1f}"),
            ("slot start latency, p50 / p99 / max ms", ms(result["latency"])),
            ("history rows", statuses),
            ("doubled (job, slot)", result["doubled"]),
            (
                "statements per succeeded run (start-up included)",
                f"{sum(result['statements'].values()) / runs:.2f}",
            ),
            *[(f"- {kind}", f"{n / runs:.3f}") for kind, n in result["statements"].most_common()],
        ]
    )
    print_warnings(result["warnings"])


def code() -> str:
    """The app's commit, and whether its files differ from it."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "not a git checkout"
    if git("status", "--porcelain", "--", "django_exclusive_jobs"):
        commit += " with uncommitted changes to the app"
    return commit


def describe_machine() -> str:
    import django
    from django.db import connection

    cpu = cpu_model()
    with connection.cursor() as cursor:
        sqlite = connection.vendor == "sqlite"
        cursor.execute("SELECT sqlite_version()" if sqlite else "SELECT version()")
        server = ("SQLite " if sqlite else "") + cursor.fetchone()[0].split(" on ")[0]
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**30
    return (
        f"{cpu}, {os.cpu_count()} cores, {memory} GiB; {server}; Python "
        f"{platform.python_version()}, Django {django.get_version()}; code {code()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--backend", choices=["postgresql", "mysql", "sqlite"], default="postgresql"
    )
    parser.add_argument("--measure", default="cluster,child,idle,rss", help="comma-separated")
    parser.add_argument("--schedulers", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--every", default="10s", help="the cluster's jobs' period")
    parser.add_argument("--seconds", type=float, default=200, help="the cluster run's length")
    parser.add_argument(
        "--max-concurrent", type=int, default=None, help="each scheduler's (its default: 10)"
    )
    parser.add_argument("--child-seconds", type=float, default=60)
    parser.add_argument("--idle-every", default="1h")
    parser.add_argument("--idle-seconds", type=float, default=120)
    parser.add_argument("--rss-jobs", type=int, default=20)
    parser.add_argument("--rss-every", default="1s")
    parser.add_argument("--rss-slots", type=int, default=10_000)
    parser.add_argument("--rss-warmup", type=int, default=1_000)
    parser.add_argument(
        "--in-process", action="store_true", help="jobs run in the scheduler's process"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="5 schedulers x 10 jobs for 60 s; child 20 s; idle 30 s; 2,000 slots",
    )
    args = parser.parse_args()
    if args.quick:
        args.schedulers, args.jobs, args.seconds = 5, 10, 60
        args.child_seconds, args.idle_seconds, args.rss_slots, args.rss_warmup = 20, 30, 2_000, 500
    measures = {part.strip() for part in args.measure.split(",")}
    if args.in_process:
        os.environ["BENCH_IN_PROCESS"] = "1"  # every process's environment (project_env)
    if args.max_concurrent is not None:
        SCHEDULER_ARGS.extend(["--max-concurrent", str(args.max_concurrent)])
    # As an installed package is: no process measures Python's compiler.
    for folder in (ROOT / "django_exclusive_jobs", BENCH / "scheduler_bench"):
        compileall.compile_dir(folder, quiet=1)
    prepare_database(args.backend)
    print(f"machine: {describe_machine()}")
    where = "in the scheduler (in_process=True)" if args.in_process else "each in a process"
    print(f"jobs run: {where}")
    measured = code()
    if "cluster" in measures:
        print_cluster(
            args.backend,
            cluster_run(args.backend, args.schedulers, args.jobs, args.every, args.seconds),
        )
    if "child" in measures:
        result = cluster_run(args.backend, 1, 1, "1s", args.child_seconds)
        print_cluster(args.backend, result, "Child start, nothing competing")
    if "idle" in measures:
        print_idle(
            args.backend, idle_run(args.backend, args.jobs, args.idle_every, args.idle_seconds)
        )
    if "rss" in measures:
        result = rss_run(
            args.backend, args.rss_jobs, args.rss_every, args.rss_slots, args.rss_warmup
        )
        print_rss(args.backend, result)
    if code() != measured:
        print(f"\nThe code changed during the run: {measured} at the start, {code()} now.")


if __name__ == "__main__":
    main()

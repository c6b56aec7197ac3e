"""A randomized fault campaign: schedulers and cron lines under a nemesis, checked afterwards.

    python benchmarks/campaign.py --backend postgresql --seconds 60
    python benchmarks/campaign.py --backend mysql --seconds 1800 --seed 12345
    python benchmarks/campaign.py --backend sqlite --seconds 120

Starts ``--schedulers`` ``exclusive_scheduler`` processes and ``--crons`` cron-style
callers (a loop here that starts ``run_exclusive NAME`` at each slot of ``--cron-jobs``,
as a crontab line would) for the jobs of ``benchmarks/campaign_project/`` (due every 1
or 2 s, ``ttl`` ``--ttl``). On PostgreSQL and MariaDB each scheduler and each cron
caller reaches the database through a TCP proxy of its own on 127.0.0.1, so one
server's link can be cut or slowed; ``--skewed`` of them run under libfaketime with a
clock some seconds off (the app judges leases on the database's clock). SQLite has no
proxy and no skew (its "database time" is each process's own clock).

A nemesis thread injects faults drawn from ``--seed`` (printed; the same seed gives the
same schedule of kinds, targets, delays and durations; the processes' own timing is not
replayed):

* ``kill_scheduler``: ``kill -9`` of a scheduler, restarted 1-3 s later;
* ``kill_cron``: ``kill -9`` of a running ``run_exclusive`` (the next slot starts another);
* ``pause_scheduler``: ``SIGSTOP`` of a scheduler past its lease, then ``SIGCONT``
  (its job's process runs on: the guard stops it);
* ``pause_machine``: ``SIGSTOP`` of a scheduler, its fork server and its jobs (a frozen
  VM), or of a running ``run_exclusive``, past the lease, then ``SIGCONT``;
* ``cut``: a server's proxy refuses and drops every connection for a few seconds;
* ``blackhole``: its proxy holds every byte (packets dropped) for a few seconds;
* ``slow``: its proxy delays every chunk of traffic (a slow statement);
* ``restart``: ``SIGTERM`` of a scheduler (a deploy), started again.

Every job run appends ``start``, ``fenced_write`` and ``end`` events to one history
file; at the end the app's JSON log lines of every process and the ``JobRun`` table are
added to it, and ``benchmarks/history_check.py`` checks it. The exit code is 1 when the
checker finds a violation. Everything is written to ``--out`` (a temporary directory by
default): ``history.jsonl``, each process's log, ``summary.txt``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import history_check  # noqa: E402  (benchmarks/history_check.py, beside this script)
from proxy import TcpProxy  # noqa: E402  (benchmarks/proxy.py)

FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
UPSTREAM = {"postgresql": ("127.0.0.1", 5432), "mysql": ("127.0.0.1", 3306)}
SCHEDULER_KINDS = ("kill_scheduler", "pause_scheduler", "pause_machine", "restart")
CRON_KINDS = ("kill_cron", "pause_machine")
PROXY_KINDS = ("cut", "blackhole", "slow")
FAULT_KINDS = ("kill_scheduler", "kill_cron", "pause_scheduler", "pause_machine", "restart")
# A fault aimed at a cron caller waits this long for one of its runs to be inside its job
# (two of camp_b's slots), and at most CRON_WAIT for one to be running at all.
IN_JOB_WAIT = 4.0
CRON_WAIT = 8.0


# --- the processes -----------------------------------------------------------------------


@dataclass
class Server:
    """One scheduler or cron caller: its proxy, its clock skew, its processes."""

    label: str  # s0, s1 ... (schedulers), c0 ... (cron callers)
    proxy: TcpProxy | None
    skew: float  # seconds its clock is off (0: none)
    generation: int = 0
    process: subprocess.Popen[bytes] | None = None  # a scheduler's process
    runs: list[subprocess.Popen[bytes]] = field(default_factory=list)  # a cron caller's
    busy: threading.Lock = field(default_factory=threading.Lock)  # one process fault at a time
    proxy_busy: threading.Lock = field(default_factory=threading.Lock)


class Campaign:
    def __init__(self, args: argparse.Namespace, out: Path) -> None:
        self.args = args
        self.out = out
        self.history = out / "history.jsonl"
        self.rng = random.Random(args.seed)
        self.stopping = threading.Event()
        self.mutex = threading.Lock()
        self.logs: list[Path] = []
        self.faults: Counter[str] = Counter()
        self.skipped_faults: Counter[str] = Counter()
        self.cron_starts = 0
        self.cron_skipped = 0
        self.schedulers: list[Server] = []
        self.crons: list[Server] = []
        self.sqlite_path = out / "campaign.sqlite3"
        self.running = out / "running"  # a marker per job inside its function (jobs.py)
        self.running.mkdir(exist_ok=True)
        self.threads: list[threading.Thread] = []

    # --- the history

    def emit(self, kind: str, **fields: Any) -> None:
        event = {"kind": kind, "wall": time.time(), "proc": "campaign", **fields}
        data = (json.dumps(event, default=str) + "\n").encode()
        handle = os.open(self.history, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(handle, data)
        finally:
            os.close(handle)

    # --- environment and database

    def env(self, server: Server | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        env.update(
            CAMPAIGN_BACKEND=self.args.backend,
            CAMPAIGN_DB_NAME=self.args.db_name,
            CAMPAIGN_SQLITE_PATH=str(self.sqlite_path),
            CAMPAIGN_HISTORY=str(self.history),
            CAMPAIGN_RUNNING=str(self.running),
            CAMPAIGN_SEED=str(self.args.seed),
            CAMPAIGN_TTL=f"{self.args.ttl:g}s",
            CAMPAIGN_PROC=server.label if server else "campaign",
            DJANGO_SETTINGS_MODULE="campaign_project.settings",
            PYTHONPATH=os.pathsep.join([str(BENCH), str(ROOT)]),
            PYTHONUNBUFFERED="1",
        )
        env.pop("CAMPAIGN_DB_PORT", None)
        if server is not None and server.proxy is not None:
            env["CAMPAIGN_DB_PORT"] = str(server.proxy.port)
        if server is not None and server.skew:
            env.update(LD_PRELOAD=FAKETIME, FAKETIME=f"{server.skew:+.0f}s")
        return env

    def prepare_database(self) -> None:
        """A fresh database (dropped and created), migrated, with the fenced resource."""
        backend, name = self.args.backend, self.args.db_name
        if backend == "postgresql":
            import psycopg

            with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres") as raw:
                raw.autocommit = True
                raw.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                raw.execute(f'CREATE DATABASE "{name}"')
        elif backend == "mysql":
            import MySQLdb  # type: ignore[import-untyped]

            raw = MySQLdb.connect(host="127.0.0.1", user="root")
            cursor = raw.cursor()
            cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
            cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
            raw.close()
        else:
            self.sqlite_path.unlink(missing_ok=True)
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "-v", "0"],
            cwd=ROOT,
            env=self.env(),
            check=True,
            timeout=600,
        )
        os.environ.update({k: v for k, v in self.env().items() if k.startswith("CAMPAIGN_")})
        os.environ["DJANGO_SETTINGS_MODULE"] = "campaign_project.settings"
        sys.path.insert(0, str(BENCH))
        import django

        django.setup()
        from campaign_project.jobs import FENCED, JOBS
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                f"CREATE TABLE {FENCED} (job VARCHAR(100) PRIMARY KEY, "
                "token BIGINT NOT NULL, seq BIGINT NOT NULL)"
            )
            for job in JOBS:
                cursor.execute(f"INSERT INTO {FENCED} (job, token, seq) VALUES (%s, 0, 0)", [job])
        connection.close()

    # --- processes

    def log_file(self, server: Server, what: str) -> Any:
        path = self.out / f"{server.label}-{what}.log"
        self.logs.append(path)
        return path.open("ab")

    def start_scheduler(self, server: Server) -> None:
        server.generation += 1
        with self.log_file(server, "scheduler") as log:
            server.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "django",
                    "exclusive_scheduler",
                    "--database",
                    "default",
                    "--grace",
                    "3s",
                ],
                cwd=ROOT,
                env=self.env(server),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.emit("process", target=server.label, pid=server.process.pid, what="scheduler")

    def start_cron_run(self, server: Server, job: str) -> None:
        server.runs = [run for run in server.runs if run.poll() is None]
        if len(server.runs) >= self.args.max_cron_runs:
            self.cron_skipped += 1  # the machine is behind: a cron line would pile up
            return
        with self.log_file(server, "cron") as log:
            run = subprocess.Popen(
                [sys.executable, "-m", "django", "run_exclusive", job, "--database", "default"],
                cwd=ROOT,
                env=self.env(server),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        server.runs.append(run)
        self.cron_starts += 1

    def cron_loop(self, server: Server) -> None:
        """Start ``run_exclusive`` for each cron job at each of its slots (this clock)."""
        from campaign_project.jobs import JOBS

        jobs = [job for job in self.args.cron_jobs if job in JOBS]
        due = {job: (time.time() // JOBS[job]["every"] + 1) * JOBS[job]["every"] for job in jobs}
        while not self.stopping.is_set():
            job = min(due, key=lambda name: due[name])
            if self.stopping.wait(max(0.0, due[job] - time.time())):
                break
            self.start_cron_run(server, job)
            due[job] += JOBS[job]["every"]
            while due[job] < time.time():  # this loop fell behind: cron does not catch up
                due[job] += JOBS[job]["every"]

    def wait_started(self, server: Server, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        log = self.out / f"{server.label}-scheduler.log"
        while "scheduler started" not in log.read_text(errors="replace"):
            assert server.process is not None
            if server.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{server.label} did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)

    # --- the nemesis

    def schedule(self) -> list[dict[str, Any]]:
        """The faults, drawn from the seed before anything runs: each kind in turn, in a
        shuffled order each round, on a target drawn for it."""
        rng = random.Random(f"{self.args.seed}/nemesis")
        kinds = list(FAULT_KINDS)
        if not self.crons:
            kinds.remove("kill_cron")
        if self.args.backend != "sqlite":
            kinds += list(PROXY_KINDS)
        plan = []
        at = self.args.warmup
        end = self.args.seconds - self.args.ttl - 4
        bag: list[str] = []
        while True:
            at += rng.uniform(*self.args.fault_gap)
            if at >= end:
                break
            if not bag:
                bag = list(kinds)
                rng.shuffle(bag)
            kind = bag.pop()
            pool = self.pool(kind)
            target = rng.choice(pool).label
            length = {
                "pause_scheduler": self.args.ttl + rng.uniform(1, 3),
                "pause_machine": self.args.ttl + rng.uniform(1, 3),
                "cut": rng.uniform(1, 6),
                "blackhole": rng.uniform(1, 6),
                "slow": rng.uniform(2, 6),
                "kill_scheduler": rng.uniform(1, 3),  # until the restart
            }.get(kind, 0.0)
            delay = rng.uniform(0.05, 0.8) if kind == "slow" else None
            plan.append(
                {
                    "at": round(at, 3),
                    "fault": kind,
                    "target": target,
                    "length": length,
                    "delay": delay,
                }
            )
        return plan

    def pool(self, kind: str) -> list[Server]:
        """The servers a fault of ``kind`` may hit."""
        servers = []
        if kind in (*SCHEDULER_KINDS, *PROXY_KINDS):
            servers += self.schedulers
        if kind in (*CRON_KINDS, *PROXY_KINDS):
            servers += self.crons
        return servers

    def server(self, label: str) -> Server:
        return next(s for s in (*self.schedulers, *self.crons) if s.label == label)

    def nemesis(self, plan: list[dict[str, Any]], began: float) -> None:
        for fault in plan:
            if self.stopping.wait(max(0.0, began + fault["at"] - time.monotonic())):
                return
            thread = threading.Thread(target=self.inject, args=(fault,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def inject(self, fault: dict[str, Any]) -> None:
        kind = fault["fault"]
        # The drawn target, else (busy with another fault) the next free one of its kind.
        pool = self.pool(kind)
        first = pool.index(self.server(fault["target"]))
        for server in pool[first:] + pool[:first]:
            lock = server.proxy_busy if kind in PROXY_KINDS else server.busy
            if lock.acquire(blocking=False):
                break
        else:
            # All busy with other faults (a lone cron caller often is): wait a while for
            # the drawn target rather than leave a kind of fault out.
            server = pool[first]
            lock = server.proxy_busy if kind in PROXY_KINDS else server.busy
            if not lock.acquire(timeout=10):
                self.skipped_faults[kind] += 1
                self.emit("fault_skipped", fault=kind, target=fault["target"], why="targets busy")
                return
        fault = {**fault, "target": server.label}
        try:
            began = time.time()
            did = getattr(self, f"_{kind}")(server, fault)
            if did is not None:
                with self.mutex:
                    self.faults[kind] += 1
                self.emit("fault", began=began, ended=time.time(), **fault, **did)
            else:
                self.skipped_faults[kind] += 1
                self.emit("fault_skipped", fault=kind, target=server.label, why="no process")
        finally:
            lock.release()

    def in_job(self, holder: int) -> bool:
        """A job whose lock ``holder`` (a scheduler's or run_exclusive's pid) holds is
        inside its function now."""
        return any(name.startswith(f"{holder}-") for name in os.listdir(self.running))

    def _victim(self, server: Server) -> subprocess.Popen[bytes] | None:
        """A cron caller's running ``run_exclusive``: one inside its job if there is one
        within ``IN_JOB_WAIT`` s, else the oldest running one, as soon as there is one
        (the caller starts one at each slot of its job, so a fault aimed at it lands even
        when it came between two runs); None if none ran for ``CRON_WAIT`` s."""
        began = time.monotonic()
        while not self.stopping.is_set():
            running = [run for run in server.runs if run.poll() is None]
            for run in running:
                if self.in_job(run.pid):
                    return run
            waited = time.monotonic() - began
            if running and waited >= IN_JOB_WAIT:
                return running[0]
            if waited >= CRON_WAIT:
                return None
            time.sleep(0.05)
        return None

    def _when_in_job(self, server: Server, seconds: float = 3) -> None:
        """Wait up to ``seconds`` for the scheduler to be running a job: a fault then
        hits a holder, not an idle server."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.stopping.is_set():
            if server.process is not None and self.in_job(server.process.pid):
                return
            time.sleep(0.05)

    def _kill_scheduler(self, server: Server, fault: dict[str, Any]) -> dict[str, Any] | None:
        self._when_in_job(server)
        process = server.process
        if process is None or process.poll() is not None:
            return None
        process.kill()
        process.wait()
        time.sleep(fault["length"])
        self.start_scheduler(server)
        return {"pid": process.pid}

    def _kill_cron(self, server: Server, fault: dict[str, Any]) -> dict[str, Any] | None:
        victim = self._victim(server)
        if victim is None:
            return None
        victim.kill()
        return {"pid": victim.pid}

    def _restart(self, server: Server, fault: dict[str, Any]) -> dict[str, Any] | None:
        process = server.process
        if process is None or process.poll() is not None:
            return None
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
        self.start_scheduler(server)
        return {"pid": process.pid, "exit": code}

    def _pause(self, pids: list[int], seconds: float) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        time.sleep(seconds)
        for pid in reversed(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def _pause_scheduler(self, server: Server, fault: dict[str, Any]) -> dict[str, Any] | None:
        self._when_in_job(server)
        process = server.process
        if process is None or process.poll() is not None:
            return None
        self._pause([process.pid], fault["length"])
        return {"pid": process.pid}

    def _pause_machine(self, server: Server, fault: dict[str, Any]) -> dict[str, Any] | None:
        if server.label.startswith("c"):
            victim = self._victim(server)
            root = victim.pid if victim is not None else None
        else:
            self._when_in_job(server)
            root = server.process.pid if server.process and server.process.poll() is None else None
        if root is None:
            return None
        stopped: list[int] = []
        for _round in range(3):  # again: a child forked while the tree was being stopped
            for pid in [root, *descendants(root)]:
                if pid not in stopped:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGSTOP)
                        stopped.append(pid)
        time.sleep(fault["length"])
        for pid in reversed(stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        return {"pids": stopped}

    def _cut(self, server: Server, fault: dict[str, Any]) -> dict[str, Any] | None:
        assert server.proxy is not None
        server.proxy.cut("refuse")
        time.sleep(fault["length"])
        server.proxy.restore()
        return {}

    def _blackhole(self, server: Server, fault: dict[str, Any]) -> dict[str, Any] | None:
        assert server.proxy is not None
        server.proxy.cut("blackhole")
        time.sleep(fault["length"])
        server.proxy.restore()
        return {}

    def _slow(self, server: Server, fault: dict[str, Any]) -> dict[str, Any] | None:
        assert server.proxy is not None
        server.proxy.slow(fault["delay"])
        time.sleep(fault["length"])
        server.proxy.restore()
        return {}

    # --- the campaign

    def run(self) -> history_check.Report:
        args = self.args
        print(
            f"campaign: backend {args.backend}, seed {args.seed}, {args.seconds:g} s, "
            f"{args.schedulers} schedulers, {args.crons} cron callers; out {self.out}"
        )
        self.prepare_database()
        from campaign_project.jobs import JOBS

        skews = random.Random(f"{args.seed}/skew")
        upstream = UPSTREAM.get(args.backend)
        for number in range(args.schedulers + args.crons):
            label = f"s{number}" if number < args.schedulers else f"c{number - args.schedulers}"
            skew = 0.0
            # The first --skewed schedulers; c0 too when --skewed is more than them.
            first = label[0] == "s" and number < args.skewed
            if upstream and (first or (label == "c0" and args.skewed > args.schedulers)):
                skew = skews.choice((-1, 1)) * skews.uniform(5, 25)
            server = Server(label, TcpProxy(upstream) if upstream else None, skew)
            (self.schedulers if label.startswith("s") else self.crons).append(server)
        plan = self.schedule()
        self.emit(
            "config",
            backend=args.backend,
            seed=args.seed,
            seconds=args.seconds,
            ttl=args.ttl,
            jobs={name: {"every": j["every"], "retries": j["retries"]} for name, j in JOBS.items()},
            cron_jobs=args.cron_jobs,
            servers={s.label: {"skew": s.skew} for s in (*self.schedulers, *self.crons)},
            plan=plan,
        )
        for server in self.schedulers:
            self.start_scheduler(server)
        for server in self.schedulers:
            self.wait_started(server)
        began = time.monotonic()
        for server in self.crons:
            thread = threading.Thread(target=self.cron_loop, args=(server,), daemon=True)
            thread.start()
            self.threads.append(thread)
        nemesis = threading.Thread(target=self.nemesis, args=(plan, began), daemon=True)
        nemesis.start()
        try:
            while time.monotonic() - began < args.seconds:
                time.sleep(0.5)
                with contextlib.suppress(Exception):
                    self.restart_exited()
        finally:
            self.stop()
        return self.finish()

    def restart_exited(self) -> None:
        """A scheduler that exited on its own (not by the nemesis) is started again."""
        for server in self.schedulers:
            if server.busy.acquire(blocking=False):
                try:
                    if server.process is not None and server.process.poll() is not None:
                        code = server.process.returncode
                        self.emit("process_exited", target=server.label, code=code)
                        self.start_scheduler(server)
                finally:
                    server.busy.release()

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=60)
        for server in (*self.schedulers, *self.crons):
            if server.proxy is not None:
                server.proxy.restore()
        # Whatever was left stopped (a fault cut short) goes on.
        for server in self.schedulers:
            if server.process is not None and server.process.poll() is None:
                for pid in [server.process.pid, *descendants(server.process.pid)]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
        for server in self.crons:
            for run in server.runs:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(run.pid, signal.SIGCONT)
                try:
                    run.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    run.kill()
                    run.wait()
        for server in self.schedulers:
            if server.process is not None and server.process.poll() is None:
                server.process.send_signal(signal.SIGTERM)
        for server in self.schedulers:
            if server.process is not None:
                try:
                    server.process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    server.process.kill()
                    server.process.wait()

    def finish(self) -> history_check.Report:
        """Add the log lines and the JobRun table to the history, and check it."""
        from django.db import connection

        from django_exclusive_jobs.models import JobLock, JobRun

        for path in dict.fromkeys(self.logs):
            label = path.name.split("-", 1)[0]
            for text in path.read_text(errors="replace").splitlines():
                if not text.startswith("{"):
                    continue
                try:
                    line = json.loads(text)
                except ValueError:
                    continue
                self.emit("log", target=label, line=line)
        for run in JobRun.objects.order_by("name", "slot", "attempt").values():
            self.emit(
                "jobrun",
                job=run["name"],
                slot=run["slot"],
                attempt=run["attempt"],
                status=run["status"],
                token=run["token"],
                pid=run["pid"],
                host=run["host"],
                started_at=run["started_at"],
                finished_at=run["finished_at"],
                error_type=run["error_type"],
                error=(run["error"] or "")[:300],
            )
        columns = ("name", "token", "acquired_at", "expires_at", "released_at")
        for lock in JobLock.objects.values(*columns):
            self.emit("joblock", **lock)
        connection.close()
        report = history_check.check(history_check.read(self.history))
        report.counts["cron starts"] = f"{self.cron_starts} ({self.cron_skipped} not started: "
        report.counts["cron starts"] += "the caller's runs piled up)"
        report.counts["faults skipped (target busy or no process)"] = dict(self.skipped_faults)
        report.counts["skewed clocks"] = {
            s.label: f"{s.skew:+.1f}s" for s in (*self.schedulers, *self.crons) if s.skew
        }
        text = (
            f"backend {self.args.backend}, seed {self.args.seed}, {self.args.seconds:g} s, "
            f"{self.args.schedulers} schedulers, {self.args.crons} cron callers\n"
            + report.summary()
        )
        (self.out / "summary.txt").write_text(text + "\n")
        print(text)
        for server in (*self.schedulers, *self.crons):
            if server.proxy is not None:
                server.proxy.stop()
        return report


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), parents before children."""
    found: list[int] = []
    queue = [pid]
    while queue:
        current = queue.pop(0)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                text = Path(f"/proc/{current}/task/{task}/children").read_text()
            except OSError:
                continue
            for child in text.split():
                if int(child) not in found:
                    found.append(int(child))
                    queue.append(int(child))
    return found


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    backends = ("postgresql", "mysql", "sqlite")
    parser.add_argument("--backend", choices=backends, default="postgresql")
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--schedulers", type=int, default=3)
    parser.add_argument("--crons", type=int, default=1)
    parser.add_argument("--cron-jobs", nargs="+", default=["camp_b"], metavar="NAME")
    parser.add_argument("--max-cron-runs", type=int, default=2, help="per cron caller at once")
    parser.add_argument("--seed", type=int, default=None, help="replay this fault schedule")
    parser.add_argument("--ttl", type=float, default=4.0, help="the jobs' lease, seconds")
    parser.add_argument("--skewed", type=int, default=2, help="servers with a clock off")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before the first fault")
    parser.add_argument(
        "--fault-gap",
        type=float,
        nargs=2,
        default=(1.5, 4.0),
        metavar=("MIN", "MAX"),
        help="seconds between two faults' starts",
    )
    parser.add_argument(
        "--db-name", default=None, help="default: campaign + $EXCLUSIVE_JOBS_TEST_DB_SUFFIX"
    )
    parser.add_argument("--out", type=Path, default=None, help="default: a new temporary directory")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 10**9)
    if args.db_name is None:
        args.db_name = "campaign" + os.environ.get("EXCLUSIVE_JOBS_TEST_DB_SUFFIX", "")
    if args.schedulers + args.crons > 8:
        parser.error("at most 8 schedulers and cron callers together (a small machine)")
    if args.skewed and args.backend != "sqlite" and not os.path.exists(FAKETIME):
        parser.error(f"--skewed needs libfaketime ({FAKETIME}); give --skewed 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix=f"campaign-{args.backend}-"))
    out.mkdir(parents=True, exist_ok=True)
    report = Campaign(args, out).run()
    print(f"history: {out / 'history.jsonl'}; replay with --seed {args.seed}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

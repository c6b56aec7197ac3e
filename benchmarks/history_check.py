"""Checks the history a fault campaign wrote (``benchmarks/campaign.py``). Pure Python.

    python benchmarks/history_check.py /tmp/campaign-xyz/history.jsonl

The history is one JSON object per line, appended by every process of the campaign:

``config``
    the campaign: backend, seed, and each job's schedule (``every`` in seconds).
``fault``
    a fault the nemesis injected: ``fault`` (its kind), ``target``, ``began``, ``ended``.
``start`` / ``end``
    a job's function began / ended: ``job``, ``slot``, ``attempt``, ``token`` and
    ``run_id`` (the run's ``JobRun`` row, found by the job), ``pid``, ``db_now`` (the
    database's clock) and ``lock``: the job's ``JobLock`` row read in the same statement
    as ``db_now`` (``token``, ``acquired_at``, ``expires_at``, ``released_at``).
``fenced_write``
    the job's write through the fenced resource (``UPDATE ... SET token = mine WHERE job
    = %s AND token <= mine``): ``token``, ``accepted``, ``seq`` (the resource's own
    count of accepted writes, read in the write's transaction: the database's order of
    the accepted writes) and ``db_now``.
``job_error``
    a job's statement failed (the database was cut): ``where`` and ``error``.
``log``
    a JSON line of a scheduler or ``run_exclusive`` (``line``: its fields, as
    ``django_exclusive_jobs/logs.py`` writes them).
``jobrun``
    a row of the ``JobRun`` table at the end: ``job``, ``slot``, ``attempt``,
    ``status``, ``token``, ``started_at``...

What is checked (each a list of offending events; all empty means no violation):

1. **doubled**: a ``(job, slot, attempt)`` whose function started in two runs (two
   ``start`` events with different tokens or processes); a ``(job, slot, attempt)``
   with two ``JobRun`` rows; a slot with two ``succeeded`` rows; a function that started
   with no claimed run row for its slot (``start`` with no ``run_id``, the lookup having
   succeeded).
2. **overlapping valid holders**: each run's *held interval* is ``[acquired_at, t]``
   where ``acquired_at`` is its token's take (from the lock row its ``start`` read)
   and ``t`` the latest ``db_now`` at which the lock row read by that run still showed
   its token, not released, with ``expires_at > db_now``. The database held the lease
   for that run over at least that interval, so two runs of one job whose held
   intervals overlap were two valid holders at once. Executions that overlap on
   database time while the older one no longer held a valid lease (a frozen or cut-off
   holder, which the app documents as possible) are counted, not flagged: the fenced
   writes are what must refuse them (check 4).
3. **slots neither run nor recorded**: for each job, every slot of its schedule from its
   first to its last slot in ``JobRun`` has a row (a run, ``missed``, ``skipped``,
   ``paused``): a later start passed it, so it must have a fate.
4. **accepted stale writes**: in the resource's order of accepted writes (``seq``), a
   write accepted with a lower token than an earlier accepted one.
5. **tokens only grow**: two runs (``JobRun`` rows that are runs, not ``missed`` /
   ``skipped`` / ``paused``) of one job with the same token, or a run with a lower token
   than a run that started before it on the database's clock; or a job function given
   a ``token`` other than its run row's (a ``job_error`` where ``token``).

Not checked: whether a takeover came before the previous holder's last *renewal* ran out
(renewals and releases are not in the history, only the lock row seen by the job), and
the live server's own view of time (only database time is compared).
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NOT_RUNS = ("missed", "skipped", "paused")
EARLIEST = dt.datetime.min.replace(tzinfo=dt.UTC)
CHECKS = (
    "doubled",
    "overlapping_holders",
    "unaccounted_slots",
    "stale_writes",
    "tokens_not_growing",
)


def when(value: Any) -> dt.datetime | None:
    """An ISO 8601 time as an aware UTC datetime (a naive one is taken as UTC)."""
    if value in (None, ""):
        return None
    parsed = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.astimezone(dt.UTC)


def read(path: str | Path) -> list[dict[str, Any]]:
    """The events of a history file (a line that is not JSON is skipped: a process killed
    in the middle of a write)."""
    events = []
    for text in Path(path).read_text(errors="replace").splitlines():
        text = text.strip()
        if not text:
            continue
        try:
            event = json.loads(text)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


@dataclass
class Report:
    """What the checks found: each check's offending events, and counts."""

    violations: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {name: [] for name in CHECKS}
    )
    counts: dict[str, Any] = field(default_factory=dict)
    faults: Counter[str] = field(default_factory=Counter)
    logs: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def summary(self) -> str:
        lines = []
        lines.append("faults injected: " + _counter(self.faults))
        lines.append("JobRun rows by status: " + _counter(self.statuses))
        lines.append("log lines by event: " + _counter(self.logs))
        for key, value in self.counts.items():
            lines.append(f"{key}: {value}")
        for name in CHECKS:
            found = self.violations[name]
            lines.append(f"check {name}: {len(found)}")
            for item in found[:20]:
                lines.append("    " + json.dumps(item, default=str, sort_keys=True))
            if len(found) > 20:
                lines.append(f"    ... and {len(found) - 20} more")
        lines.append("RESULT: " + ("no violation" if self.ok else "VIOLATIONS FOUND"))
        return "\n".join(lines)


def _counter(counter: Counter[str]) -> str:
    if not counter:
        return "none"
    return ", ".join(f"{key} {value}" for key, value in sorted(counter.items()))


def _slot_key(value: Any) -> str | None:
    slot = when(value)
    return slot.isoformat() if slot is not None else None


def check(events: Iterable[dict[str, Any]]) -> Report:
    """Every check on ``events`` (as :func:`read` returns them)."""
    events = list(events)
    report = Report()
    config: dict[str, Any] = {}
    starts: list[dict[str, Any]] = []
    ends: list[dict[str, Any]] = []
    writes: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    errors = 0
    for event in events:
        kind = event.get("kind")
        if kind == "config":
            config = event
        elif kind == "fault":
            report.faults[str(event.get("fault"))] += 1
        elif kind == "start":
            starts.append(event)
        elif kind == "end":
            ends.append(event)
        elif kind == "fenced_write":
            writes.append(event)
        elif kind == "jobrun":
            rows.append(event)
            report.statuses[str(event.get("status"))] += 1
        elif kind == "job_error":
            errors += 1
            if event.get("where") == "token":  # the job's token is not its run's
                why = "a job was given a token other than its run row's"
                report.violations["tokens_not_growing"].append({"why": why, **event})
        elif kind == "log":
            line = event.get("line") or {}
            report.logs[str(line.get("event") or line.get("level") or "?")] += 1
    accepted = [w for w in writes if w.get("accepted")]
    report.counts.update(
        {
            "job starts": len(starts),
            "job ends": len(ends),
            "job statement errors": errors,
            "fenced writes": f"{len(writes)} ({len(accepted)} accepted, "
            f"{len(writes) - len(accepted)} refused)",
        }
    )
    _doubled(report, starts, rows)
    _overlaps(report, starts, ends, writes)
    _unaccounted(report, rows, config)
    _stale_writes(report, accepted)
    _tokens(report, rows)
    return report


def _identity(event: dict[str, Any]) -> tuple[Any, ...]:
    """One run: its run row, else its token and process."""
    if event.get("run_id") is not None:
        return ("run", event["run_id"])
    return ("token", event.get("token"), event.get("pid"))


def _doubled(report: Report, starts: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    found = report.violations["doubled"]
    by_attempt: defaultdict[tuple[Any, ...], dict[tuple[Any, ...], dict[str, Any]]] = defaultdict(
        dict
    )
    for event in starts:
        if event.get("run_id") is None and not event.get("lookup_failed"):
            found.append({"why": "the job ran with no claimed run row for its slot", **event})
            continue
        if event.get("attempt") is None:
            continue
        key = (event.get("job"), _slot_key(event.get("slot")), event.get("attempt"))
        by_attempt[key].setdefault(_identity(event), event)
    for key, runs in by_attempt.items():
        if len(runs) > 1:
            found.append(
                {
                    "why": "one (job, slot, attempt) started by two runs",
                    "job": key[0],
                    "slot": key[1],
                    "attempt": key[2],
                    "runs": list(runs.values()),
                }
            )
    per_attempt: Counter[tuple[Any, ...]] = Counter()
    succeeded: defaultdict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row.get("slot") is None:
            continue
        slot = (row.get("job"), _slot_key(row.get("slot")))
        per_attempt[(*slot, row.get("attempt"))] += 1
        if row.get("status") == "succeeded":
            succeeded[slot].append(row)
    for key, count in per_attempt.items():
        if count > 1:
            found.append({"why": "two JobRun rows for one (job, slot, attempt)", "key": list(key)})
    for key, done in succeeded.items():
        if len(done) > 1:
            found.append(
                {
                    "why": "two succeeded runs of one slot",
                    "job": key[0],
                    "slot": key[1],
                    "rows": done,
                }
            )


@dataclass
class _Held:
    """What the history shows of one run's lease."""

    job: str
    token: int
    acquired: dt.datetime | None = None
    valid_until: dt.datetime | None = None  # the last db_now at which it was seen valid
    began: dt.datetime | None = None  # start's db_now
    ended: dt.datetime | None = None  # end's db_now
    last_seen_valid: bool = False
    events: list[dict[str, Any]] = field(default_factory=list)


def _valid(event: dict[str, Any]) -> bool:
    """The lock row this event read shows the run's own token, not released, open."""
    lock = event.get("lock") or {}
    now, expires = when(event.get("db_now")), when(lock.get("expires_at"))
    return (
        lock.get("token") is not None
        and lock.get("token") == event.get("token")
        and lock.get("released_at") is None
        and now is not None
        and expires is not None
        and expires > now
    )


def _overlaps(
    report: Report,
    starts: list[dict[str, Any]],
    ends: list[dict[str, Any]],
    writes: list[dict[str, Any]],
) -> None:
    held: dict[tuple[str, int], _Held] = {}
    for event in [*starts, *ends]:
        token = event.get("token")
        if token is None or event.get("job") is None:
            continue
        run = held.setdefault((event["job"], token), _Held(event["job"], token))
        run.events.append(event)
        lock = event.get("lock") or {}
        now = when(event.get("db_now"))
        if lock.get("token") == token and lock.get("acquired_at"):
            run.acquired = when(lock["acquired_at"])
        if event.get("kind") == "start":
            run.began = now
        else:
            run.ended = now
        if _valid(event) and now is not None:
            if run.valid_until is None or now > run.valid_until:
                run.valid_until = now
            if event.get("kind") == "end":
                run.last_seen_valid = True
    found = report.violations["overlapping_holders"]
    by_job: defaultdict[str, list[_Held]] = defaultdict(list)
    for run in held.values():
        by_job[run.job].append(run)
    refused = {(w.get("job"), w.get("token")) for w in writes if not w.get("accepted")}
    executions = 0
    stale: set[tuple[str, int]] = set()  # older runs that ran on past their lease
    for runs in by_job.values():
        intervals = [r for r in runs if r.acquired is not None and r.valid_until is not None]
        intervals.sort(key=lambda r: r.acquired or EARLIEST)
        for number, first in enumerate(intervals):
            for second in intervals[number + 1 :]:
                assert first.acquired and first.valid_until and second.acquired
                if second.acquired < first.valid_until and first.token != second.token:
                    found.append(
                        {
                            "why": "two runs of one job held a valid lease at once",
                            "job": first.job,
                            "first": {
                                "token": first.token,
                                "held": [str(first.acquired), str(first.valid_until)],
                            },
                            "second": {
                                "token": second.token,
                                "held": [str(second.acquired), str(second.valid_until)],
                            },
                        }
                    )
        ran = [r for r in runs if r.began is not None and r.ended is not None]
        ran.sort(key=lambda r: r.began or EARLIEST)
        for number, older in enumerate(ran):
            for newer in ran[number + 1 :]:
                assert older.ended and newer.began
                if newer.began < older.ended:
                    executions += 1
                    if not older.last_seen_valid:
                        stale.add((older.job, older.token))
    report.counts["executions overlapping on database time"] = (
        f"{executions} pairs; older runs no longer a valid holder at their end: "
        f"{len(stale)}, their fenced write refused: {len(stale & refused)}"
    )


def _unaccounted(report: Report, rows: list[dict[str, Any]], config: dict[str, Any]) -> None:
    found = report.violations["unaccounted_slots"]
    jobs = config.get("jobs") or {}
    slots: defaultdict[str, set[dt.datetime]] = defaultdict(set)
    for row in rows:
        slot = when(row.get("slot"))
        if slot is not None and row.get("job") is not None:
            slots[row["job"]].add(slot)
    window = {}
    for name, present in sorted(slots.items()):
        every = (jobs.get(name) or {}).get("every")
        if not every or not present:
            continue
        step = dt.timedelta(seconds=float(every))
        first, last = min(present), max(present)
        window[name] = int((last - first) / step) + 1
        current = first
        while current < last:
            if current not in present:
                found.append(
                    {"why": "a slot neither run nor recorded", "job": name, "slot": current}
                )
            current += step
    report.counts["slots in each job's window (first to last recorded)"] = window


def _stale_writes(report: Report, accepted: list[dict[str, Any]]) -> None:
    found = report.violations["stale_writes"]
    by_job: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    for write in accepted:
        by_job[str(write.get("job"))].append(write)
    for writes in by_job.values():
        writes.sort(key=lambda w: (w.get("seq") is None, w.get("seq") or 0))
        highest: dict[str, Any] | None = None
        for write in writes:
            if highest is not None and int(write["token"]) < int(highest["token"]):
                found.append(
                    {
                        "why": "a write accepted with an older token than an earlier accepted one",
                        "write": write,
                        "earlier": highest,
                    }
                )
            if highest is None or int(write["token"]) > int(highest["token"]):
                highest = write


def _tokens(report: Report, rows: list[dict[str, Any]]) -> None:
    found = report.violations["tokens_not_growing"]
    by_job: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row.get("status") in NOT_RUNS or row.get("token") is None:
            continue
        by_job[str(row.get("job"))].append(row)
    for job, runs in by_job.items():
        seen: dict[int, dict[str, Any]] = {}
        for row in runs:
            token = int(row["token"])
            if token in seen:
                found.append(
                    {"why": "two runs with one token", "job": job, "rows": [seen[token], row]}
                )
            seen[token] = row
        runs.sort(key=lambda r: (when(r.get("started_at")) or EARLIEST, int(r["token"])))
        for before, after in itertools.pairwise(runs):
            if int(after["token"]) < int(before["token"]):
                found.append(
                    {
                        "why": "a run started later with a lower token",
                        "job": job,
                        "rows": [before, after],
                    }
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("history", help="the campaign's history.jsonl")
    args = parser.parse_args(argv)
    report = check(read(args.history))
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Backfill: run the past slots of a job that did not succeed, oldest first, once each.

After an outage an operator asks for a range of slots (``exclusive_jobs backfill NAME
--from T --to T``, or the admin's **Backfill…**). :func:`plan` finds the slots of the
job's schedule in the range that have no run that succeeded (or enqueued its task): the
missed, skipped, failed, timed-out, interrupted and lost ones, and those with no row at
all. Each is then run as a run of its own, serving that slot, under the job's lock (so
once across all servers, and never while another run of the job goes on), its row the
slot's next attempt with ``backfill=True`` and who asked. A slot that has gained a
successful run by the time its turn comes is skipped, never run twice.

The command runs them here (:func:`run_slots`); the admin asks for one run request per
slot (:func:`request_slots`), which the schedulers serve like "run now", a job's slots
oldest first.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import logs, values
from ..conf import app_settings
from ..lock.clock import database_now
from ..lock.durations import parse_duration
from ..lock.errors import LockConfigurationError
from ..lock.retry import run_statement
from . import audit, control
from .registry import Job
from .runner import EXIT_FAILED, EXIT_OK, Run, RunResult
from .start import Start
from .status import RunStatus

if TYPE_CHECKING:
    from ..models import RunRequest

logger = logging.getLogger("django_exclusive_jobs")

MAX_SLOTS = 1000  # a backfill of more is refused: ask for a shorter range


@dataclass(frozen=True)
class Backfill:
    """What a backfill of ``job`` over [``start``, ``end``] (database time) would do."""

    job: Job
    start: dt.datetime
    end: dt.datetime
    slots: list[dt.datetime]  # to run, oldest first
    done: dict[dt.datetime, str]  # slots in the range left alone: the status of their run

    @property
    def warning(self) -> str:
        return warning(self.job)

    def describe(self) -> str:
        """``backfill nightly: 3 slot(s) to run, FIRST .. LAST (2 already succeeded)``."""
        done = f" ({len(self.done)} already succeeded)" if self.done else ""
        if not self.slots:
            return f"backfill {self.job.name}: no slot to run{done}"
        return (
            f"backfill {self.job.name}: {len(self.slots)} slot(s) to run, {span(self.slots)}{done}"
        )


def warning(job: Job) -> str:
    """Why a backfill of ``job`` may be pointless: its function does not take ``slot``,
    so each run does what a run now would. Empty when it does."""
    if job.wants_slot:
        return ""
    return (
        f"{job.name} does not take a slot argument: each backfilled run does the same work "
        "as a run now, whatever its slot"
    )


def plan(
    job: Job,
    start: dt.datetime | str,
    end: dt.datetime | str | None = None,
    *,
    using: str,
    names: tuple[str, str] = ("--from", "--to"),
) -> Backfill:
    """The slots of ``job``'s schedule from ``start`` to ``end`` (both included; default
    now, on the database's clock) that have no successful run, oldest first. Each is a
    moment (``values.moment``: ISO 8601 text or a datetime, called ``names`` in a
    message); a time without a zone is in the job's zone (``Job.zone``). Refused
    (LockConfigurationError, one line): a moment out of bounds, a job without a schedule,
    ``start`` after ``end``, ``end`` in the future, more than :data:`MAX_SLOTS` slots."""
    from ..models import JobRun

    schedule = job.schedule
    if schedule is None:
        raise LockConfigurationError(
            f"{job.name} has no schedule (every= or cron=): it has no slots to backfill."
        )
    zone = job.zone
    first, last = names
    start = values.moment(start, what=first, zone=zone).astimezone(dt.UTC)
    given_end = None if end is None else values.moment(end, what=last, zone=zone)
    now = run_statement(using, lambda: database_now(using))
    end = now if given_end is None else given_end.astimezone(dt.UTC)
    if end > now:
        raise LockConfigurationError(
            f"{last} {end.isoformat()} is in the future (database time {now.isoformat()}): "
            "only past slots can be backfilled."
        )
    if start > end:
        raise LockConfigurationError(
            f"{first} {start.isoformat()} is after {last} {end.isoformat()}: give the older first."
        )
    slots: list[dt.datetime] = []
    for slot in schedule.slots_back(schedule.latest_at_or_before(end)[0]):
        if slot < start:
            break
        if len(slots) == MAX_SLOTS:
            raise LockConfigurationError(
                f"{start.isoformat()} .. {end.isoformat()} has more than {MAX_SLOTS} slots of "
                f"{job.name}: backfill a shorter range at a time."
            )
        slots.append(slot)
    slots.reverse()
    rows = JobRun.objects.using(using).done_in(job.name, start, end)
    found = run_statement(using, lambda: list(rows))
    done = {slot: status for slot, status in found if slot is not None}
    return Backfill(job, start, end, [slot for slot in slots if slot not in done], done)


def span(slots: list[dt.datetime]) -> str:
    first, last = slots[0].isoformat(), slots[-1].isoformat()
    return first if len(slots) == 1 else f"{first} .. {last}"


@dataclass
class Done:
    """What :func:`run_slots` did: each slot's result, the slots it did not get to, and
    why it stopped early (empty: it did not)."""

    backfill: Backfill
    results: dict[dt.datetime, RunResult] = field(default_factory=dict)
    not_run: list[dt.datetime] = field(default_factory=list)
    stopped: str = ""
    signum: int | None = None

    def summary(self) -> str:
        """``backfilled nightly 3 slot(s): 2 succeeded, 1 failed``."""
        counts: dict[str, int] = {}
        for result in self.results.values():
            status = result.status.value
            if result.status == RunStatus.SKIPPED:  # another backfill or a catch-up ran it
                status = "already succeeded"
            counts[status] = counts.get(status, 0) + 1
        said = ", ".join(f"{number} {status}" for status, number in counts.items())
        line = f"backfilled {self.backfill.job.name} {len(self.results)} slot(s): {said or 'none'}"
        if self.not_run:
            line += f" ({len(self.not_run)} not run: {span(self.not_run)})"
        return line

    @property
    def exit_code(self) -> int:
        """128+N after signal N; 1 when a slot did not succeed or was not run; else 0."""
        if self.signum is not None:
            return 128 + self.signum
        bad = [r for r in self.results.values() if r.exit_code and r.status != RunStatus.SKIPPED]
        return EXIT_FAILED if bad or self.not_run else EXIT_OK


def run_slots(
    backfill: Backfill,
    *,
    by: str,
    using: str,
    wait: dt.timedelta | None = None,
    report: Callable[[str, bool], None] | None = None,
) -> Done:
    """Run each slot of ``backfill`` here, in this thread, oldest first, one :class:`Run`
    each. A slot that fails does not stop the others (each is a slot of its own, as the
    scheduler runs them). It stops early when the job's lock stays held (another run
    goes on) longer than ``wait`` (default: the job's ttl), or at SIGTERM/SIGINT, which
    also stops the slot running then."""
    from .shutdown import stop_on_signals

    job = backfill.job
    if wait is None:
        wait = parse_duration(job.ttl if job.ttl is not None else app_settings.TTL, what="ttl")
    bound = job.but(using=using, wait=wait)
    done = Done(backfill)
    received: list[int] = []
    current: list[Run] = []

    def on_signal(signum: int) -> None:
        received.append(signum)
        if current:
            current[0].on_signal(signum)

    def say(text: str, normal: bool = True, **fields: Any) -> None:
        logs.say(report, logs.line("backfill", text, job_name=job.name, **fields), normal=normal)

    say(backfill.describe(), status="planned", slots=backfill.slots)
    if backfill.slots:
        _audit(backfill, by=by, using=using)
    with stop_on_signals(on_signal):
        for index, slot in enumerate(backfill.slots):
            if received:
                done.not_run = backfill.slots[index:]
                break
            run = Run(bound, start=Start.backfill(slot, by), report=report, supervised=True)
            current[:] = [run]
            result = run.call()
            if run.slot != slot:  # nothing claimed: stopped, or the lock was not won
                done.not_run = backfill.slots[index:]
                if not received and result.status != RunStatus.INTERRUPTED:
                    done.stopped = (
                        f"backfill of {job.name} stopped: its lock stayed held by "
                        f"{result.holder or '?'} for over {wait.total_seconds():g}s (--wait)"
                    )
                    break
            else:
                done.results[slot] = result
            if received or result.status == RunStatus.INTERRUPTED:
                done.signum = received[0] if received else result.signum
                done.not_run = done.not_run or backfill.slots[index + 1 :]
                done.stopped = f"backfill of {job.name} stopped by signal {done.signum}"
                break
    return _ended(done, received, say)


def _ended(done: Done, received: list[int], say: Callable[..., None]) -> Done:
    """How the backfill ended, said: stopped (by a signal, or a lock held too long:
    where to take it up again), and what ran."""
    if received and done.signum is None:
        done.signum = received[0]
        done.stopped = f"backfill of {done.backfill.job.name} stopped by signal {done.signum}"
    if done.stopped:
        rerun = f"; run it again with --from {done.not_run[0].isoformat()}" if done.not_run else ""
        say(done.stopped + rerun, False, status="stopped")
    say(done.summary(), done.exit_code == EXIT_OK, status="done")
    return done


def request_slots(backfill: Backfill, *, by: str, using: str) -> list[RunRequest]:
    """One run request per slot of ``backfill``, oldest first: the schedulers that serve
    the job run them as they run "run now" requests, one at a time, oldest slot first."""
    made = [
        control.request_run(backfill.job.name, by=by, using=using, slot=slot)
        for slot in backfill.slots
    ]
    if made:
        _audit(backfill, by=by, using=using)
    return made


def _audit(backfill: Backfill, *, by: str, using: str) -> None:
    """One line in the audit for the whole range (each slot is a run of its own)."""
    from ..models import JobChange

    slots = [slot.isoformat() for slot in backfill.slots]
    after = {"slots": len(slots), "from": slots[0], "to": slots[-1]}
    audit.recorded(backfill.job.name, JobChange.Action.BACKFILL, by=by, after=after, using=using)

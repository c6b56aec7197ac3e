"""The claim of a scheduled slot as one decision over values (:func:`decide`).

Given the job, why it starts (:class:`~.start.Start`), the database's time at the
lock's acquisition, the run rows the claim read and what operators decided about the
job (its ``JobState`` row), :func:`decide` says what the claim writes and what runs: a
frozen :class:`Decision`. No database call, no clock read, no logging in here: the
reads before it and the writes it asks for are ``history.claim``'s, in their order.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from ..lock.errors import LockConfigurationError
from . import catchup, overrides
from .catchup import CatchUp
from .status import RunStatus

if TYPE_CHECKING:
    from ..models import JobRun, JobState
    from .groups import Busy
    from .registry import Job
    from .start import Start


@dataclass(frozen=True)
class Record:
    """Rows for slots that did not run, all with one status and one text."""

    slots: tuple[dt.datetime, ...]
    status: str
    text: str


@dataclass(frozen=True)
class Insert:
    """The run row the claim writes: this run's."""

    slot: dt.datetime | None
    attempt: int = 1
    requested_by: str = ""  # run now, a backfill: who asked
    backfill: bool = False  # a past slot run again


@dataclass(frozen=True)
class Found:
    """What a claim found, which it tells its run (``history.Claim``: this and the row)."""

    slot: dt.datetime | None = None
    missed: list[dt.datetime] = field(default_factory=list)
    more: bool = False  # more slots to run after this one (catch_up="all", buffered ones)
    why: str = ""  # nothing runs now: why
    skipped: list[dt.datetime] = field(default_factory=list)  # came during a run (overlap)
    retry_at: dt.datetime | None = None  # the slot's next attempt is due then (skipped now)
    # the replaced schedule's slots among ``missed`` (and the older ones, as one range)
    replaced: catchup.Replaced | None = None
    waits: bool = False  # nothing runs now: another member of its group runs; look again

    def found(self) -> dict[str, Any]:
        """These fields, by name (to build a ``history.Claim`` from a decision)."""
        return {each.name: getattr(self, each.name) for each in fields(Found)}


@dataclass(frozen=True)
class Decision(Found):
    """What a claim does, in its order: look at the history (``look_up_to``, then decide
    again), or look again in turn with the job's other slots' first claims (``in_turn``,
    then decide again); give up an older slot's pending retry (``give_up``); write the
    ``records`` then the run row (``insert``), in one transaction when ``together``, all
    under the lock's lease when ``under_lease`` (the job's first rows). What it found
    (:class:`Found`) is what the claim tells its run."""

    current: dt.datetime | None = None  # the slot the start is for (None: no schedule)
    look_up_to: dt.datetime | None = None  # read the newest run up to it, decide again
    in_turn: bool = False  # a first claim under allow_all: look in turn, decide again
    under_lease: bool = False  # the job's first rows: renew the lease with them
    give_up: JobRun | None = None  # its pending retry is never run: a newer slot began
    records: tuple[Record, ...] = ()
    together: bool = False  # the records and the run row in one transaction
    insert: Insert | None = None
    existing: JobRun | None = None  # the run that has the slot already

    @property
    def final(self) -> bool:
        """Whether this decides the claim (not a look to make first)."""
        return self.look_up_to is None and not self.in_turn


def start_time(acquired: dt.datetime, not_before: dt.datetime | None) -> dt.datetime:
    """When a start is, on database time: the lock's acquisition, or the scheduler's
    due slot (``not_before``) when the lock came a little before it."""
    return acquired if not_before is None else max(acquired, not_before)


def aim(
    job: Job, start: Start, acquired: dt.datetime, state: JobState | None, slot: dt.datetime | None
) -> Decision:
    """A scheduled start before any read: the slot to look up to (``look_up_to``), or,
    without a schedule or for a slot not begun (``overlap="allow_all"``), the claim."""
    schedule = job.schedule
    if schedule is None:
        if state is not None and state.paused_now(acquired):
            return Decision(why=state.why_paused())
        return Decision(insert=Insert(None))
    now = start_time(acquired, start.not_before)
    current = _current(job, start, now)
    if job.overlap.lock_per_slot and slot is not None:  # the slot of its lock
        if slot > current:
            return Decision(why=f"slot {slot.isoformat()} has not begun on database time")
        current = slot
    return Decision(current=current, look_up_to=current)


def _current(job: Job, start: Start, now: dt.datetime) -> dt.datetime:
    """The slot of ``now``; the scheduler's start (``not_before``) serves its due slot,
    never a coming one."""
    assert job.schedule is not None
    if start.not_before is None:
        return job.schedule.slot_at(now)
    return job.schedule.latest_at_or_before(now)[0]


def decide(
    job: Job,
    start: Start,
    acquired: dt.datetime,
    holder: str,
    latest: JobRun | None,
    state: JobState | None,
    *,
    slot: dt.datetime | None = None,
    turn: bool = False,
) -> Decision:
    """The claim of a scheduled start whose look at the history found ``latest`` (the
    current slot's newest attempt, else the newest run before it; after the look in
    turn, ``turn``: the job's newest slotted run). ``acquired``: the database's time at
    the lock's acquisition; ``holder``: the lock's holder, named in the rows' texts;
    ``slot``: under ``overlap="allow_all"``, the slot of the lock taken."""
    aimed = aim(job, start, acquired, state, slot)
    if aimed.final:
        return aimed
    current = aimed.current
    assert current is not None and job.schedule is not None
    now = start_time(acquired, start.not_before)
    side_by_side = job.overlap.lock_per_slot
    if turn:  # the look in turn found the job's newest slotted run, if any
        if latest is not None and latest.slot is not None and latest.slot >= current:
            why = f"the job's history began after this slot, at {latest.slot.isoformat()}"
            return Decision(current=current, why=why)
    elif latest is not None and latest.slot == current:
        return _again(job, latest, current, now)
    elif latest is None and side_by_side:  # a first claim, in turn with its other slots'
        return Decision(current=current, in_turn=True)
    first = Decision(
        current=current,
        under_lease=latest is None and not side_by_side,  # the job's first rows
        give_up=latest if latest is not None and latest.retry_at is not None else None,
    )
    if state is not None and state.paused_now(acquired):  # recorded paused, once
        why = state.why_paused()
        paused = Record((current,), RunStatus.PAUSED, f"Paused: {why}.")
        return replace(first, records=(paused,), slot=current, why=why)
    return _planned(first, job, current, now, acquired, holder, latest, state)


def _planned(
    first: Decision,
    job: Job,
    current: dt.datetime,
    now: dt.datetime,
    acquired: dt.datetime,
    holder: str,
    latest: JobRun | None,
    state: JobState | None,
) -> Decision:
    """The claim of a start that catch-up and overlap plan (``catchup.plan``): the slots
    a schedule change replaced, those missed and skipped, recorded; the slot it runs."""
    assert job.schedule is not None
    quiet = state.quiet(now) if state is not None else []
    replaced = replaced_slots(state, latest.slot if latest else None, now)
    plan = catchup.plan(
        job.schedule,
        job.catch_up or CatchUp(),
        now,
        latest.slot if latest else None,
        quiet=quiet,
        current=current,
        overlap=job.overlap,
        ran=ran(latest),
        start_of=job.start_of,
    )
    records: list[Record] = []
    if replaced is not None:
        records += replaced_records(replaced, holder, acquired)
    if plan.missed:
        records.append(Record(tuple(plan.missed), RunStatus.MISSED, missed_text(holder, acquired)))
    if plan.skipped and latest is not None:
        records.append(Record(tuple(plan.skipped), RunStatus.SKIPPED, skipped_text(latest)))
    old = replaced.slots if replaced is not None else []
    planned = replace(
        first,
        records=tuple(records),
        together=bool(old or plan.missed or plan.skipped),
        missed=old + plan.missed,  # the old schedule's, then the new one's
        skipped=plan.skipped,
        replaced=replaced,
    )
    if plan.run is None:
        return replace(planned, why=_why_none(job, plan, current, state))
    return replace(planned, insert=Insert(plan.run), slot=plan.run, more=plan.more)


def run_now(by: str) -> Decision:
    """A run asked for now, here: outside the schedule, paused or not."""
    return Decision(insert=Insert(None, requested_by=by))


def backfill(slot: dt.datetime, by: str, found: list[JobRun]) -> Decision:
    """A backfill of ``slot`` whose rows are ``found`` (newest attempt first): its next
    attempt (1 when it has none, else one above its newest: missed, skipped, failed...),
    recorded ``backfill`` with who asked; or, when the slot has a run that succeeded (or
    enqueued its task) by now, that run: never twice."""
    done = [run for run in found if run.status in RunStatus.done()]
    if done:
        return Decision(existing=done[0], slot=slot)
    attempt = found[0].attempt + 1 if found else 1
    return Decision(insert=Insert(slot, attempt, by, backfill=True), slot=slot)


def held_by_group(decided: Decision, busy: Busy, skips: bool) -> Decision:
    """A claim that would run while another member of the job's group runs (``busy``):
    with ``skips`` (``overlap="skip"``) the first attempt of a scheduled slot is recorded
    skipped, naming that run; any other run (a retry, a run asked for, a job without a
    schedule, or a policy that waits its turn) runs nothing now and looks again
    (``waits``). The rest of the claim (slots missed, skipped) is written as decided."""
    insert = decided.insert
    assert insert is not None
    scheduled = insert.attempt == 1 and not (insert.requested_by or insert.backfill)
    if skips and insert.slot is not None and scheduled:
        skipped = Record((insert.slot,), RunStatus.SKIPPED, busy.text)
        return replace(
            decided,
            records=(*decided.records, skipped),
            together=True,
            insert=None,
            why=busy.why,
        )
    return replace(decided, insert=None, why=busy.why, waits=True, more=False)


def _again(job: Job, latest: JobRun, current: dt.datetime, now: dt.datetime) -> Decision:
    """The current slot has a run: its next attempt once its retry is due, else a skip
    (the run found tells why: succeeded, running, or its last attempt)."""
    retry, retry_at = job.retry, latest.retry_at
    waits = retry is not None and latest.attempt <= retry.count
    if retry_at is None or not waits or latest.status not in RunStatus.unsuccessful():
        return Decision(current=current, existing=latest, slot=current)
    if retry_at > now:
        when = retry_at.isoformat(timespec="seconds")
        why = f"retry of slot {current.isoformat()} at {when} (attempt {latest.attempt} ended)"
        return Decision(current=current, slot=current, why=why, retry_at=retry_at)
    return Decision(current=current, insert=Insert(current, latest.attempt + 1), slot=current)


def _why_none(job: Job, plan: catchup.Plan, current: dt.datetime, state: JobState | None) -> str:
    """Why a start of its slot runs nothing."""
    if plan.missed:  # the new schedule's slots: the replaced one's are not late
        policy = (job.catch_up or CatchUp()).name
        late = plan.missed[-1].isoformat()
        return f"slot {late} started too late (catch_up={policy}): recorded missed"
    if plan.skipped:
        return f"slot {plan.skipped[-1].isoformat()} came during a run (overlap={job.overlap})"
    if state is not None and state.schedule_since is not None and current < state.schedule_since:
        since = state.schedule_since.isoformat(timespec="seconds")
        return f"its slot came before its schedule was put in force at {since}"
    return "its slot fell in its last pause"


def ran(run: JobRun | None) -> tuple[dt.datetime, dt.datetime] | None:
    """When ``run`` started and when its job ended (``started_at + duration``), if it ran
    and recorded its own end (a run closed as abandoned by a later holder has no known
    end: its server died). Not ``finished_at``: that is when the end was written, after
    the lock's release, and a write delayed by a slow database would make a short run
    look as if it overran its interval, and the next slot be skipped (found by the
    protocol's model, docs/model.md)."""
    if run is None or run.status in (RunStatus.RUNNING, *RunStatus.not_runs()):
        return None
    if run.duration is None or run.finished_at is None:
        return None
    return run.started_at, run.started_at + dt.timedelta(seconds=run.duration)


def _noticed(acquired: dt.datetime | None) -> str:
    return acquired.isoformat(timespec="seconds") if acquired else "?"


def missed_text(holder: str, acquired: dt.datetime | None) -> str:
    """What a ``missed`` row says: who noticed, when."""
    return f"No server ran this slot before {holder} started the job at {_noticed(acquired)}."


def skipped_text(during: JobRun) -> str:
    """What a ``skipped`` row says: the run it came during (its overlap policy)."""
    ran = during.slot.isoformat() if during.slot else "?"
    return f"Overlap: the run of slot {ran} by {during.holder} was still running."


def replaced_records(
    replaced: catchup.Replaced, holder: str, acquired: dt.datetime | None
) -> list[Record]:
    """The replaced schedule's slots no server ran: the older ones (beyond
    ``catchup.MAX_RECORDED``) as one missed-range record at the oldest's slot, then the
    newest one by one."""
    changed = replaced.changed.isoformat(timespec="seconds")
    why = (
        f"No server ran this slot of its replaced schedule ({replaced.schedule}) before its "
        f"schedule changed at {changed}; noticed by {holder} at {_noticed(acquired)}."
    )
    records = []
    if replaced.first is not None:
        records.append(Record((replaced.first,), RunStatus.MISSED, replaced.range_record()))
    if replaced.slots:
        records.append(Record(tuple(replaced.slots), RunStatus.MISSED, why))
    return records


def replaced_slots(
    state: JobState | None, since: dt.datetime | None, now: dt.datetime
) -> catchup.Replaced | None:
    """The slots of the schedule that ``state``'s change replaced, after ``since`` (the
    job's latest recorded slot) and before the change: no server ran them, outside the
    last pause (at most ``MAX_RECORDED`` walked, the newest; the older ones counted as
    one range: ``catchup.replaced``). None if the latest slot is after the change."""
    changed = state.schedule_since if state is not None else None
    if state is None or changed is None or not state.schedule_before or since is None:
        return None
    if since >= changed:
        return None
    try:  # the schedule of a bad override now gone (Back to the code): none recorded
        schedule = overrides.make(state.schedule_before, None)
        said = overrides.describe("schedule", state.schedule_before)
        pause = state.last_pause(now)
        return catchup.replaced(schedule, said, since, changed, min(changed, now), pause)
    except (LockConfigurationError, ArithmeticError, TypeError, ValueError, LookupError):
        return None

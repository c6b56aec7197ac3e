"""Run history: the ``JobRun`` rows a claim writes (its run, and the slots it missed or skipped).

The unique (name, slot, attempt) row is what makes a scheduled slot run once: a server
whose cron fired late takes the free lock, finds the slot's row, and skips. A retry
(``retries=N``) is a row of its own, one attempt higher, written only once the previous
attempt's ``retry_at`` has come. It looks before it writes, so the normal path never
makes the database report a unique violation.

How a run's end is written is in ``end_rows.py``; pruning old runs, in ``pruning.py``.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, transaction

from ..lock.acquire import prepare_locks
from ..lock.clock import DatabaseNow
from ..lock.errors import LockLost
from ..lock.lock import Lock, process
from ..lock.retry import run_statement
from ..logs import extra
from . import claim as decision
from . import run_requests
from .end_rows import abandoned_by_its_holder, abandoned_runs, close_abandoned, is_ours, runs_on
from .retries import Retries
from .schedules import Schedule
from .status import RunStatus
from .tracebacks import error_type as error_type

if TYPE_CHECKING:
    from ..models import JobRun, JobState, RunRequest
    from .registry import Job
    from .start import Start

logger = logging.getLogger("django_exclusive_jobs")
# What a claim would do, once the job's concurrency groups are taken (or are not).
Held = Callable[[decision.Decision], decision.Decision]


def _no_groups(decided: decision.Decision) -> decision.Decision:
    """A job in no concurrency group (or whose groups are taken): the claim as decided."""
    return decided


@dataclass(frozen=True)
class Claim(decision.Found):
    """What :func:`claim` found (:class:`.claim.Found`) and the run row: ours, another's,
    or None when nothing runs now (``why`` says why)."""

    run: JobRun | None = None


@dataclass
class Look:
    """A start's look at its job's history made with the job's operator row, in one
    statement, before the row's override is applied (:func:`look`)."""

    latest: JobRun | None  # the newest run up to the latest slot the start may serve
    abandoned: bool  # whether any of the job's runs was left running by an earlier holder
    state: JobState | None  # what operators decided about the job


def _acquired(lock: Lock) -> dt.datetime:
    """When ``lock`` was taken, on database time (LockLost if that is unknown)."""
    if lock.acquired_at is None:
        raise LockLost(lock.name, lock.token, "the acquisition time is unknown")
    return lock.acquired_at


def start_time(lock: Lock, not_before: dt.datetime | None) -> dt.datetime:
    """When a start is, on database time: the lock's acquisition, or the scheduler's
    due slot (``not_before``) when the lock came a little before it."""
    return decision.start_time(_acquired(lock), not_before)


ORDER = ("-slot", "-attempt")  # a job's newest slot first, and its newest attempt


def look(lock: Lock, name: str, schedule: Schedule, not_before: dt.datetime | None) -> Look:
    """A start of its slot's look at the history, with the job's operator row (its pause
    and override), in one statement: the run :func:`claim` reads and the row
    ``Run._in_force`` reads, each sent on its own before. The override may change the
    schedule, so the look is bounded not by the slot but by the latest the start may
    serve under any schedule (the start's time and the slot tolerance, which an
    override keeps); :func:`claim` looks again if the run read is after its slot."""
    from ..models import JobRun, JobState, statements  # models: not before apps are ready

    bound = start_time(lock, not_before) + schedule.early_limit()
    where = [("name", "=", name), ("slot", "<=", bound)]
    exists = ("abandoned", abandoned_runs(name, lock))
    beside = (JobState, [("name", "=", name)])

    def read() -> tuple[JobRun | None, JobState | None]:
        return statements.first_beside(
            JobRun, lock.using, where, ORDER, exists=exists, beside=beside
        )

    run, state = run_statement(lock.using, read)
    return Look(run, bool(getattr(run, "abandoned", False)), state)


def claim(
    lock: Lock,
    job: Job,
    start: Start,
    *,
    slot: dt.datetime | None = None,
    state: JobState | None = None,
    looked: Look | None = None,
    groups: Held | None = None,
) -> Claim:
    """This run's row, or the run that already has its slot (:func:`is_ours` tells).

    Closes the job's runs abandoned by earlier holders (:func:`close_abandoned`): first,
    or, for a start of its slot, once its look at the history has found any.
    A run asked for (``start``: run now, a backfill) is claimed here; a start of its
    slot reads the history, and :func:`.claim.decide` says what to write and what
    runs, from the values read: the slot of the lock's acquisition time on database
    time (or the scheduler's due slot, ``start.not_before``, when the lock came a
    little before it), the slots nobody ran since the job's latest recorded slot
    (recorded ``missed``), a retry once its ``retry_at`` has come. The job's
    arguments (``job.kwargs``) are recorded on its rows.
    ``slot``: under ``overlap="allow_all"``, the slot whose lock ``lock`` is (see
    ``slot_locks.py``; None: the job's own lock, for runs with no slot); the start serves
    that slot, and only that lock's runs, and slots whose lock was left stale, are
    closed as abandoned.
    ``state``: what operators decided about the job (:func:`job_state`, read by the
    caller, which applies its override to the job first): a pause skips the slot and
    records it ``paused``; slots of the schedule before it came in force are not missed.
    ``looked``: the look at the history made with ``state`` (:func:`look`), if it was.
    ``groups``: what it does once the job's groups are taken if it runs (``groups.py``).
    """
    name, arguments = job.name, job.kwargs or {}
    # A start of its slot asks in its look at the history whether any run was abandoned
    # (below); every other start closes them first.
    its_slot = start.serves_its_slot(job.schedule, job.overlap)
    if not its_slot:
        close_abandoned(lock, name, job.retry, slot=slot, side_by_side=job.overlap.lock_per_slot)
    held = groups or _no_groups
    if start.request is not None:  # run now or a backfill: paused or not
        return _take_request(lock, name, start.request, arguments, held)
    if start.past_slot is not None:  # a backfill, here: paused or not
        return _backfill(lock, name, start.past_slot, start.requested_by, arguments, held)
    if start.requested_by:  # run now, here: paused or not, outside the schedule
        return _apply(lock, name, held(decision.run_now(start.requested_by)), arguments)
    acquired, holder = _acquired(lock), lock.holder
    decided = decision.aim(job, start, acquired, state, slot)
    current = decided.look_up_to
    if current is not None:
        latest = _latest(lock, name, current, its_slot, looked, job.retry)
        decided = decision.decide(job, start, acquired, holder, latest, state, slot=slot)
    decided = held(decided)  # out of any transaction: it may take locks
    with ExitStack() as first_claim:
        if decided.under_lease:  # the job's first rows: under its lease
            first_claim.enter_context(_under_lease(lock))
        elif decided.in_turn:  # and in turn with its other slots' first claims
            latest = first_claim.enter_context(_in_turn(lock, name))
            decided = decision.decide(
                job, start, acquired, holder, latest, state, slot=slot, turn=True
            )
        return _apply(lock, name, decided, arguments)


def _latest(
    lock: Lock,
    name: str,
    current: dt.datetime,
    its_slot: bool,
    looked: Look | None,
    retry: Retries | None,
) -> JobRun | None:
    """One indexed look-up: the current slot's newest attempt if any, else the newest
    attempt of the newest slot before it; and whether any run was left running by an
    earlier holder. Only then are they closed (close_abandoned) and the look made again:
    a start that finds none sends one statement, not two. A start that read the job's
    operator row with it (``looked``) looked up to a later bound: a run it read after
    the slot (an override moved the schedule) has it look again."""
    from ..models import JobRun, statements  # models: not before apps are ready

    where = [("name", "=", name), ("slot", "<=", current)]
    exists = ("abandoned", abandoned_runs(name, lock)) if its_slot else None

    def up_to_the_slot() -> tuple[JobRun | None, bool]:
        found: JobRun | None = statements.first(JobRun, lock.using, where, ORDER, exists=exists)
        return found, bool(getattr(found, "abandoned", False))

    if its_slot and looked is not None and _up_to(looked.latest, current):
        latest, abandoned = looked.latest, looked.abandoned
    else:
        latest, abandoned = run_statement(lock.using, up_to_the_slot)
    if its_slot and (latest is None or abandoned):
        close_abandoned(lock, name, retry)
        if latest is not None and abandoned_by_its_holder(latest, lock):
            latest, _ = run_statement(lock.using, up_to_the_slot)  # it is closed now, or ended
    return latest


def _apply(lock: Lock, name: str, decided: decision.Decision, kwargs: dict[str, Any]) -> Claim:
    """The writes ``decided`` asks for, in its order; what the claim found."""
    if decided.give_up is not None:
        assert decided.current is not None
        _give_up(lock, decided.give_up, decided.current)
    with _together(lock, several=decided.together):
        for record in decided.records:
            _record_slots(lock, name, list(record.slots), record.status, record.text, kwargs)
        run, insert = decided.existing, decided.insert
        if insert is not None:
            run = _insert(
                lock,
                name,
                insert.slot,
                kwargs,
                requested_by=insert.requested_by,
                attempt=insert.attempt,
                backfill=insert.backfill,
            )
    return Claim(run=run, **decided.found())


def _up_to(run: JobRun | None, slot: dt.datetime) -> bool:
    """Whether ``run`` is the newest up to ``slot`` when it is the newest up to a later
    bound: there is none, or it is of ``slot`` or before."""
    return run is None or (run.slot is not None and run.slot <= slot)


def _together(lock: Lock, *, several: bool) -> AbstractContextManager[Any]:
    """A claim's rows (missed, skipped, its run), in one transaction when there are
    several statements of them. Their slots are not written in order (a missed slot can
    be newer than a skipped one, or than a buffered slot the claim runs): a start that
    died between two of them would leave an older slot without a row after a newer one
    with a row, for ever, since the next claim looks only after the newest row (found by
    the protocol's model, docs/model.md). One insert alone needs no transaction; inside
    a first claim's (:func:`_under_lease`) this adds nothing."""
    if not several:
        return nullcontext()
    return transaction.atomic(using=lock.using, savepoint=False)


@contextmanager
def _under_lease(lock: Lock) -> Iterator[None]:
    """The job's first rows, written in one transaction that renews the lease first.

    The renewal locks the lock's row, so no later holder takes the lock before these rows
    are committed, and a holder whose lease ran out while it looked writes nothing
    (:class:`LockLost`). Without it a first claimant stalled past its lease could write
    its slot after a later holder's first run and leave the slots between without a row
    (the first-run gap found by the protocol's model, docs/model.md). Later claims need
    none of this: the next holder records every slot after the latest row before its own,
    so a stale write of an older slot meets a row and changes nothing.

    A failure after the renewal rolls it back with the rows, while the lock's local
    deadline has moved on: the caller (``Run.start``) releases the lock at once then.
    """
    with transaction.atomic(using=lock.using):
        lock.renew()
        yield


@contextmanager
def _in_turn(lock: Lock, name: str) -> Iterator[JobRun | None]:
    """``overlap="allow_all"``: a job's first claim, under its lease (:func:`_under_lease`)
    and in turn with its other slots' first claims; yields the job's newest row, if one
    of them came first.

    Each slot has a lock of its own, so the first claims of two slots can both find no
    row, and the older slot's row land after the newer one's: the slots between would be
    left without a row (found by the protocol's model, docs/model.md). After the renewal,
    this locks the job's own lock row until the commit (every first claim of its slots
    does), then looks again, at every slot. The look is a locking read too: on MariaDB
    and MySQL it sees what the claim before it committed even under REPEATABLE READ; on
    PostgreSQL that takes READ COMMITTED, Django's default. (On SQLite the renewal
    already put the transactions in turn.)
    """
    from ..models import JobLock  # models: not before apps are ready

    prepare_locks([name], using=lock.using)  # the job's own row exists, to be locked

    def look() -> JobRun | None:
        JobLock.objects.using(lock.using).lock_row(name)
        return runs_on(lock.using).lock_newest_attempt(name)

    with _under_lease(lock):
        yield run_statement(lock.using, look)


def _ours(lock: Lock) -> dict[str, Any]:
    return {
        "status": RunStatus.RUNNING,
        "host": process.host,
        "pid": process.pid,
        "instance": process.instance,
        "token": lock.token,
        "started_at": DatabaseNow(),
    }


def job_state(name: str, *, using: str) -> JobState | None:
    """What operators decided about ``name`` (its pause, its override): one query, which
    every start makes after taking the lock, before its claim."""
    from ..models import JobState, statements  # models: not before apps are ready

    state: JobState | None = run_statement(
        using, lambda: statements.first(JobState, using, [("name", "=", name)])
    )
    return state


def _take_request(
    lock: Lock,
    name: str,
    request: RunRequest,
    kwargs: dict[str, Any],
    held: Held = _no_groups,
) -> Claim:
    """Mark ``request`` taken by this run, unless another run took it first; left for
    a later look while another member of the job's group runs (``held``: its groups are
    taken first, as for a run asked for here)."""
    from ..models import RunRequest  # models: not before apps are ready

    if (asked := held(decision.run_now(""))).waits:
        return Claim(**asked.found())
    requests = RunRequest.objects.using(lock.using)
    if not run_requests.take(request, by=lock.holder, using=lock.using):
        return Claim(why=f"run request {request.pk} was taken by another run")
    if request.slot is not None:
        found = _backfill(lock, name, request.slot, request.requested_by, kwargs)
        if found.run is None or not is_ours(found.run, lock):
            return found  # the slot has succeeded meanwhile: the request is used up
    else:
        found = _apply(lock, name, decision.run_now(request.requested_by), kwargs)
    run = found.run
    assert run is not None
    run_statement(lock.using, lambda: requests.record_run(request.pk, run))
    return Claim(run=run, slot=request.slot)


def _backfill(
    lock: Lock,
    name: str,
    slot: dt.datetime,
    requested_by: str,
    kwargs: dict[str, Any],
    held: Held = _no_groups,
) -> Claim:
    """A backfill of ``slot``: the slot's rows read, then what :func:`.claim.backfill`
    decides (its next attempt, or the run that succeeded). Under the lock, so no other
    run of the job writes the slot's rows meanwhile."""
    rows = runs_on(lock.using).attempts_of(name, slot)
    found = run_statement(lock.using, lambda: list(rows))
    return _apply(lock, name, held(decision.backfill(slot, requested_by, found)), kwargs)


def _give_up(lock: Lock, latest: JobRun, current: dt.datetime) -> None:
    """A newer slot has begun: an older slot's pending retry is never run (the newer
    slot wins), and that attempt becomes the slot's last."""
    given_up = run_statement(
        lock.using,
        lambda: runs_on(lock.using).give_up_retry(latest.pk),
    )
    if given_up:
        logger.warning(
            "%s: the retry of slot %s was not run before slot %s began: given up, attempt %s "
            "was the slot's last",
            latest.name,
            latest.slot.isoformat() if latest.slot else "?",
            current.isoformat(),
            latest.attempt,
            extra=extra("retry_given_up", job_name=latest.name, slot=latest.slot),
        )


def _insert(
    lock: Lock,
    name: str,
    slot: dt.datetime | None,
    kwargs: dict[str, Any],
    *,
    requested_by: str = "",
    attempt: int = 1,
    backfill: bool = False,
) -> JobRun:
    from ..models import JobRun, statements  # models: not before apps are ready

    runs = runs_on(lock.using)
    values = {"requested_by": requested_by, "backfill": backfill, "kwargs": kwargs, **_ours(lock)}

    def create() -> JobRun:
        run = JobRun(name=name, slot=slot, attempt=attempt, **values)
        # In a transaction (a first claim), a savepoint: the look below may follow.
        inside = connections[lock.using].in_atomic_block
        with transaction.atomic(using=lock.using) if inside else nullcontext():
            statements.insert(run, lock.using)
        return run

    try:
        return run_statement(lock.using, create)
    except IntegrityError:
        # A retried insert whose first try committed, or a holder that lost its lease.
        found: JobRun = run_statement(
            lock.using, lambda: runs.get(name=name, slot=slot, attempt=attempt)
        )
        return found


def _record_slots(
    lock: Lock,
    name: str,
    slots: list[dt.datetime],
    status: str,
    why: str,
    kwargs: dict[str, Any] | None = None,
) -> None:
    """Rows for slots that did not run (``missed``, ``skipped``), ignoring any that has a
    row already; written by the lock's holder."""
    from ..models import JobRun  # models: not before apps are ready

    noticed = lock.acquired_at  # database time
    assert noticed is not None
    rows = [
        JobRun(
            name=name,
            slot=slot,
            status=status,
            host=process.host,
            pid=process.pid,
            instance=process.instance,
            token=lock.token,
            started_at=noticed,
            finished_at=noticed,
            error=why,
            kwargs=kwargs or {},
        )
        for slot in slots
    ]
    run_statement(lock.using, lambda: runs_on(lock.using).bulk_create(rows, ignore_conflicts=True))

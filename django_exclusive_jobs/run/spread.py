"""Work spread: which live scheduler starts each slot first, and in what order.

Every scheduler that serves a job is due at the same slot. Without this, each races for
every due job, in the same order: one (job, slot) costs a statement per server, the
last job of a burst waits for the whole burst, and work spreads by chance.

Instead each scheduler ranks the live schedulers that serve a job for one slot by a
hash of (scheduler, job, slot) (rendezvous hashing: every scheduler computes the same
ranking from the same list, with no message between them, and a scheduler that comes or
goes moves only its own share). The first choice starts the slot at its time, as
before. The others wait :func:`handoff` (their rank times ``HANDOFF``, within an eighth
of the interval and half the slot tolerance), then ask in one query which of the slots
they waited for have a run row (``claimed``); they start only those that have none
(their first choice is dead, busy with ``--max-concurrent`` runs, or slow), under the
same lock and claim as always, so correctness never depends on the ranking. A
scheduler that stopped beating drops out of the list within ``Scheduler.ALIVE_FOR``;
until then its share starts a handoff late.

The order in which a scheduler starts a burst of its own is its own hash order too, so
no job is always last.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..lock.retry import run_statement

if TYPE_CHECKING:
    from .registry import Job

HANDOFF = 0.5  # seconds each rank waits before taking over a slot nobody claimed


@dataclass(frozen=True)
class Peer:
    """A live scheduler: its instance and the jobs it serves."""

    instance: str
    jobs: frozenset[str]


def peers(using: str) -> list[Peer]:
    """The live schedulers (one query), from their heartbeat rows."""
    from ..models import Scheduler

    rows = Scheduler.objects.using(using).alive().values_list("instance", "jobs")
    return [
        Peer(instance, frozenset(jobs or ()))
        for instance, jobs in run_statement(using, lambda: list(rows))
    ]


def _key(*parts: str) -> bytes:
    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest()


def rank(me: str, job: str, slot: dt.datetime, live: list[Peer]) -> int:
    """This scheduler's place (0: first) among the live ones serving ``job``, for ``slot``."""
    moment = slot.isoformat()
    serving = {peer.instance for peer in live if job in peer.jobs} | {me}
    ranked = sorted(serving, key=lambda instance: _key(instance, job, moment))
    return ranked.index(me)


def turn(me: str, job: str, due: dt.datetime) -> bytes:
    """Where ``job`` comes in this scheduler's own start order of a burst at ``due``."""
    return _key(me, job, due.isoformat(), "turn")


def handoff(job: Job, slot: dt.datetime, place: int) -> dt.timedelta:
    """How long after its start the scheduler ranked ``place`` waits for the slot: its
    rank times ``HANDOFF``, within an eighth of the interval and half the slot tolerance
    (so a start taken over is still on time for ``catch_up="skip"``)."""
    assert job.schedule is not None
    interval = job.schedule.next_after(slot) - slot
    allowance = job.schedule.early_allowance(slot)
    return min(dt.timedelta(seconds=place * HANDOFF), interval / 8, allowance / 2)


def claimed(slots: dict[str, dt.datetime], *, using: str) -> set[str]:
    """Which of these jobs' slots have a run row (one query for all of them)."""
    from django.db.models import Q

    from ..models import JobRun

    if not slots:
        return set()
    wanted = Q()
    for name, slot in slots.items():
        wanted |= Q(name=name, slot=slot)
    found = JobRun.objects.using(using).filter(wanted).values_list("name", flat=True)
    return set(run_statement(using, lambda: list(found)))

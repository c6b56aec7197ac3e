"""Work spread: which live scheduler starts each slot first, and in what order.

Every scheduler that serves a job is due at the same slot. Without this, each races for
every due job, in the same order: one (job, slot) costs a statement per server, the
last job of a burst waits for the whole burst, and work spreads by chance.

Instead each scheduler ranks the live schedulers that serve a job for one slot by a hash
of (scheduler, job, slot): rendezvous hashing, the ones with no free capacity at their
last beat (``--max-concurrent`` less its running jobs) last. The slots due together (a
burst; those of jobs still running here count too, see ``Handoffs.later``) are then
shared out with bounded loads among the schedulers that serve them: each may be the
first choice for at most its share, by free capacity (:func:`_caps`), and each slot, in
the order of its draw, goes to the first of its ranking still below its cap. Every
scheduler computes the same shares from the same rows, with no message between them; one
with twice the free capacity is the first choice for twice the slots, a full one for
none while another has room, and each for its share of every burst, not for a random
number of slots around it (rendezvous hashing alone left the busiest of 100 schedulers
of 100 jobs with 2.3 to 3.5 times its share). Views that differ a little seldom differ in
a cap when shares are small; with large shares (20 schedulers of 1,000 jobs) a view that
sees one scheduler busier moves a few caps, and a scheduler that comes or goes moves its
own share and a few others: those slots wait for a handoff. The first choice starts the
slot at its time, as before. The second waits :data:`HANDOFF`; the third waits, as a
last resort, an eighth of the interval or half the slot tolerance, whichever is shorter
(:func:`handoff`); the others leave the slot to those three, so however many schedulers
serve a job, at most three ever race for one of its slots (five with the safety net).
The schedulers read each other's free capacity at their own beats, so their caps, and so
their orders, can disagree; the first two by the draw alone (the safety net: no
capacities, so every view that lists the same schedulers agrees on it) take the third's
place, without asking whether the first choice is at work, when the order by capacity
does not already have them first or second, so that some scheduler always starts the
slot by the last resort. Each asks, in one query for all the slots it waited for, which
have a run row (``claimed``), and whether each one's first choice has claimed the head
of its share of the burst (:func:`places`: the slot that scheduler starts first). A slot
with no run whose first choice has not claimed its head either is started: that
scheduler is dead, full, or stuck. A first choice that has claimed its head is alive and
working through its share, and its slots are left to it, so a busy burst does not turn
into schedulers racing for the slots not reached yet: only the second choice, and the
safety net, look at the last resort's time and start what is still unclaimed then (the
first choice may have died during the burst). Any start taken over goes through the same
lock and claim as always, so correctness never depends on the ranking. All the slots of
one burst for which a scheduler is second are looked at together, and all the others at
the last resort's time: at most two looks per instant, whatever the number of jobs due
(while it has room under ``--max-concurrent``; a full one looks again as its runs end).
A scheduler that stopped beating drops out of the list within ``Scheduler.ALIVE_FOR``.

The order in which a scheduler starts a burst of its own is its own hash order too, so
no job is always last.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..lock.retry import run_statement

if TYPE_CHECKING:
    from .registry import Job

HANDOFF = 1.0  # seconds the second choice waits before it may take over a slot


@dataclass(frozen=True)
class Peer:
    """A live scheduler: its instance, the jobs it serves and its free capacity."""

    instance: str
    jobs: frozenset[str]
    free: int | None = None  # at its last beat; None: not said (counted as 1)


def peers(using: str, alive: Iterable[tuple[str, Any, int | None]] | None = None) -> list[Peer]:
    """The live schedulers, from their heartbeat rows: ``alive`` (instance, jobs, free)
    as a beat read them on PostgreSQL, else read here (one query)."""
    from ..models import Scheduler

    if alive is None:
        rows = Scheduler.objects.using(using).alive().values_list("instance", "jobs", "free")
        alive = run_statement(using, lambda: list(rows))
    return [Peer(instance, frozenset(jobs or ()), free) for instance, jobs, free in alive]


_MASK = 2**64 - 1


def _key(*parts: str) -> bytes:
    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest()


def _number(*parts: str) -> int:
    return int.from_bytes(_key(*parts), "big")


@dataclass(frozen=True)
class _Member:
    """A live scheduler as the ranking sees it: its hash number and its weight."""

    instance: str
    number: int  # the hash of its instance
    weight: int  # its free capacity; not said: 1
    jobs: frozenset[str]


def _members(me: str, burst: frozenset[str], live: list[Peer]) -> list[_Member]:
    """The live schedulers, and ``me``, which serves at least the jobs of its ``burst``."""
    everyone = {peer.instance: peer for peer in live}
    mine = everyone.get(me, Peer(me, frozenset()))
    everyone[me] = Peer(me, mine.jobs | burst, mine.free)
    return [
        _Member(p.instance, _number(p.instance), 1 if p.free is None else p.free, p.jobs)
        for p in everyone.values()
    ]


def _ranking(job: str, slot: dt.datetime, members: list[_Member]) -> tuple[list[str], list[str]]:
    """``members`` (those serving ``job``) ranked for ``job``'s ``slot`` by a draw mixed
    from the hash of (job, slot) and the scheduler's (splitmix64's finalizer: a few
    integer operations per scheduler, one hash per job): rendezvous hashing. Full ones
    (no free capacity) come after all the others. And the first two by the draw alone,
    full or not: the safety net, which no view of free capacity can move (see
    :func:`places`)."""
    seed = _number(job, slot.isoformat())
    drawn = []
    for member in members:
        x = seed ^ member.number
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
        x ^= x >> 31
        drawn.append((-x, member.instance, member.weight == 0))
    drawn.sort()
    by_draw = [instance for _, instance, _ in drawn[:2]]
    return [instance for _, instance, full in drawn if not full] + [
        instance for _, instance, full in drawn if full
    ], by_draw


def _caps(
    members: list[_Member], slots: dict[str, dt.datetime], due: dt.datetime
) -> dict[str, int]:
    """How many of ``slots`` (due together) each of ``members`` is the first choice for,
    at most: its share by free capacity, rounded down; the slots left over go one each to
    the largest remainders, so the caps add up to the slots and a small difference in
    free capacity seldom moves one. Equal remainders go by a draw from the scheduler, the
    instant and these jobs, so the rounding up goes round across instants and groups of
    jobs. Fewer slots than schedulers: by a draw weighed by the remainders (weighted
    rendezvous hashing, ``remainder / -ln(u)``), so a job due alone goes to a scheduler
    drawn in proportion to its free capacity, not always to the one with the most (for
    a whole beat, until the others see it busier). All full: equal shares."""
    weights = [member.weight for member in members]
    total = sum(weights)
    if not total:
        weights, total = [1] * len(members), len(members)
    count = len(slots)
    caps = {m.instance: count * w // total for m, w in zip(members, weights, strict=True)}
    these = _key(due.isoformat(), *sorted(slots)).hex()
    drawn: list[tuple[float, float, str]] = []
    for member, weight in zip(members, weights, strict=True):
        remainder = count * weight % total
        if remainder:
            u = ((_number(member.instance, these) >> 12) + 0.5) / 2**52  # in (0, 1)
            if count < len(members):
                drawn.append((remainder / math.log(u), 0.0, member.instance))
            else:
                drawn.append((-remainder, -u, member.instance))
    for _, _, instance in sorted(drawn)[: count - sum(caps.values())]:
        caps[instance] += 1
    return caps


def _first_three(
    due: dt.datetime, slots: dict[str, dt.datetime], serving: list[_Member]
) -> dict[str, tuple[list[str], list[str]]]:
    """The first three choices for each of these jobs' slots, due together and served by
    the same ``serving`` schedulers, and each one's safety net (:func:`_ranking`).
    Bounded loads: the jobs, in the order of their draw, each take the first scheduler
    of their ranking that is still below its cap (:func:`_caps`), so each scheduler is
    the first choice for its share of the burst, not a random number of slots around it;
    the second and third are the first two of the ranking after it."""
    caps = _caps(serving, slots, due)
    load = dict.fromkeys(caps, 0)
    chosen = {}
    for name in sorted(slots, key=lambda name: _key(name, slots[name].isoformat())):
        ranking, net = _ranking(name, slots[name], serving)
        first = next((one for one in ranking if load[one] < caps[one]), ranking[0])
        load[first] += 1
        chosen[name] = ([first, *[one for one in ranking if one != first][:2]], net)
    return chosen


def turn(me: str, job: str, due: dt.datetime) -> bytes:
    """Where ``job`` comes in this scheduler's own start order of a burst at ``due``."""
    return _key(me, job, due.isoformat(), "turn")


def places(
    me: str, due: dt.datetime, slots: dict[str, dt.datetime], live: list[Peer]
) -> dict[str, tuple[int, str | None]]:
    """For each job of a burst (the jobs whose slot starts at ``due``, with their slot):
    this scheduler's place (0, 1, 2; 3: later), and the head of the job's first choice's
    share: the job that first choice starts first, which it has claimed within moments
    if it is alive.

    Head None: this scheduler is in the safety net, the first two by the draw alone,
    and not first or second in the order by capacity: it is third (``place`` 2) and
    starts the slot at the last resort if nobody has claimed it, whatever the first
    choice does. The schedulers' views of each other's free capacity differ (each read
    the rows at its own beat), so they may disagree on the caps, and then none of them
    may think itself first, second or third. The order by the draw alone needs only the
    list of live schedulers: the first of them by the draw sees itself first or
    second by it in its own view (second if one that died is still listed), so every
    slot has a scheduler that starts it by the last resort."""
    members = _members(me, frozenset(slots), live)
    # Jobs served by the same schedulers share out their slots among them: each of
    # those schedulers serves every one of these jobs, so (with the jobs still running
    # here counted, see Handoffs.later) all of them plan the same burst.
    groups: dict[frozenset[str], dict[str, dt.datetime]] = {}
    for name, slot in slots.items():
        serving = frozenset(m.instance for m in members if name in m.jobs)
        groups.setdefault(serving, {})[name] = slot
    orders: dict[str, tuple[list[str], list[str]]] = {}
    for serving, group in groups.items():
        orders.update(_first_three(due, group, [m for m in members if m.instance in serving]))
    heads: dict[str, str] = {}
    for name, (order, _) in orders.items():
        first = order[0]
        if first not in heads or turn(first, name, due) < turn(first, heads[first], due):
            heads[first] = name
    placed: dict[str, tuple[int, str | None]] = {}
    for name, (order, net) in orders.items():
        place = order.index(me) if me in order else 3
        if me in net and place >= 2:
            placed[name] = (2, None)
        else:
            placed[name] = (place, heads[order[0]])
    return placed


def handoff(job: Job, slot: dt.datetime, place: int) -> dt.timedelta | None:
    """How long after its start the scheduler ranked ``place`` waits for the slot: the
    second choice ``HANDOFF``, the third, as a last resort, the longest wait: an eighth
    of the interval or half the slot tolerance, whichever is shorter (so a start taken
    over is still on time for ``catch_up="skip"``); the second choice's wait is at most
    half of that. None: a later one leaves the slot to those three (at most three
    servers ever race for a slot, however many serve the job; five with the safety
    net)."""
    assert job.schedule is not None
    if place > 2:
        return None
    interval = job.schedule.next_after(slot) - slot
    allowance = job.schedule.early_allowance(slot)
    longest = min(interval / 8, allowance / 2)
    if place == 2:
        return longest
    return min(dt.timedelta(seconds=HANDOFF), longest / 2)


_NO_PLAN = dt.datetime.min.replace(tzinfo=dt.UTC)


@dataclass
class Handoffs:
    """What one scheduler keeps between two loops about the slots it is not the first
    choice for: the live schedulers (read at each beat), the jobs waiting their handoff
    (their slot's start), the slots' starts it is first for, the plan of the latest
    burst (its start, each job's place and head, its slots) and, for each handed job,
    the head of its first choice's share, its slot, and when to look again if that
    first choice is at work (None: leave the slot to it)."""

    peers: list[Peer] = field(default_factory=list)
    handed: dict[str, dt.datetime] = field(default_factory=dict)
    first_for: dict[str, dt.datetime] = field(default_factory=dict)
    plan: tuple[dt.datetime, dict[str, tuple[int, str | None]], dict[str, dt.datetime]] = field(
        default_factory=lambda: (_NO_PLAN, {}, {})
    )
    heads: dict[str, tuple[str, dt.datetime, dt.datetime | None]] = field(default_factory=dict)

    @property
    def shared(self) -> bool:
        """Whether another live scheduler shares the work (else nothing is handed off)."""
        return len(self.peers) >= 2

    def forget(self, name: str) -> None:
        """``name`` is not due (misconfigured): nothing of it is kept."""
        self.handed.pop(name, None)
        self.heads.pop(name, None)
        self.first_for.pop(name, None)

    def later(
        self,
        me: str,
        jobs: dict[str, Job],
        bursts: dict[dt.datetime, dict[str, dt.datetime]],
        running: dict[dt.datetime, dict[str, dt.datetime]],
    ) -> dict[str, dt.datetime | None]:
        """When to look again at each slot of ``bursts`` (each burst's start: its jobs'
        slots) that scheduler ``me`` is not the first choice for (None: never, it is not
        among the first three); ``running``: the slots of the same starts whose jobs run
        here. Each burst is planned once, the jobs still running here included, so that
        every scheduler shares out the same slots; a job of the burst placed later (its
        run here ended) keeps its place in that plan."""
        looks: dict[str, dt.datetime | None] = {}
        for due, slots in bursts.items():
            if self.plan[0] != due or not slots.keys() <= self.plan[1].keys():
                whole = {**running.get(due, {}), **slots}
                self.plan = (due, places(me, due, whole, self.peers), whole)
            _, placed, whole = self.plan
            for name in slots:
                place, head = placed[name]
                if not place:
                    self.first_for[name] = due
                    continue
                job = jobs[name]
                wait = handoff(job, slots[name], place)
                if wait is None:  # left to the first three choices
                    looks[name] = None
                    continue
                looks[name] = due + wait
                # The second choice looks again at the last resort's time, then without
                # asking whether the first choice is at work (it may have died since);
                # so does the safety net (head None), at once.
                last = handoff(job, slots[name], 2)
                again = due + last if place == 1 and last is not None else None
                head = name if head is None else head
                self.heads[name] = (head, whole[head], again)
        return looks

    def take_heads(
        self, slots: dict[str, dt.datetime]
    ) -> dict[str, tuple[str, dt.datetime, dt.datetime | None]]:
        """The head of each waited slot's first choice's share (the slot itself if none
        was noted), taken out until :meth:`verdict` or :meth:`put_back`."""
        return {name: self.heads.pop(name, (name, slot, None)) for name, slot in slots.items()}

    def put_back(
        self,
        waited: dict[str, dt.datetime],
        heads: dict[str, tuple[str, dt.datetime, dt.datetime | None]],
    ) -> None:
        """The look could not be made (the database is down): looked at again later."""
        self.handed.update(waited)
        self.heads.update(heads)

    def verdict(
        self,
        name: str,
        due: dt.datetime,
        head: tuple[str, dt.datetime, dt.datetime | None],
        slot: dt.datetime,
        claimed: set[str],
        *,
        rechecks: bool,
        full: bool,
    ) -> tuple[str, dt.datetime | None]:
        """What a scheduler does with a slot it waited for, once it has looked which
        slots and heads are ``claimed``: start it (``START``) if nobody claimed it and
        its first choice has not claimed its head either (dead, full or stuck). If its
        first choice is at work, the second choice looks again at the last resort's time
        (``LOOK``, when) and then starts it if it is still unclaimed; a later choice
        leaves it (``LEAVE``: its next slot). A job whose policy has it look again
        (``rechecks``: retries, a buffering overlap) starts as usual, and decides. A
        ``full`` scheduler looks again at once, when it has room."""
        holder, _, again = head
        at_work = holder != name and holder in claimed
        if (name in claimed or at_work) and not rechecks:
            if name not in claimed and again is not None:
                self.handed[name] = due
                self.heads[name] = (name, slot, None)
                return LOOK, again
            return LEAVE, None
        if full:
            self.handed[name] = due
            self.heads[name] = head
            return LOOK, due
        return START, None


START, LOOK, LEAVE = "start", "look again", "leave"  # a waited slot's verdict


def claimed(slots: dict[str, dt.datetime], *, using: str) -> set[str]:
    """Which of these jobs' slots have a run row (one query for all of them)."""
    from ..models import JobRun

    if not slots:
        return set()
    found = JobRun.objects.using(using).claimed(slots)
    return set(run_statement(using, lambda: list(found)))

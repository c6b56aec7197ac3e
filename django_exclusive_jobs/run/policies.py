"""A job's policies as values: each ``overlap`` and each ``catch_up`` is a small class.

Users write a policy's name (``@exclusive_job(overlap="buffer_one", catch_up="all")``,
``--overlap``, an operator's override), and rows and output show it: :func:`overlap_policy`
and :func:`catch_up_policy` turn the name into the policy at the door, ``str(policy)``
and ``policy.name`` give it back. The rest of the code asks the policy its questions
(what each one means: ``catchup.py``'s docstring) rather than compare names.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..lock.errors import LockConfigurationError

if TYPE_CHECKING:
    from .schedules import Schedule


def _one_of(what: str, names: Any, given: object) -> LockConfigurationError:
    return LockConfigurationError(
        f"{what} must be one of {', '.join(map(repr, names))}, not {given!r}."
    )


# Overlap: what becomes of the slots that come while the job's previous run still runs.


@dataclass(frozen=True)
class Overlap:
    """An ``overlap`` policy. The class attributes answer the code's questions."""

    name: ClassVar[str]
    # Each slot takes a lock of its own, so slots run side by side (``slot_locks.py``):
    # no slot comes "during" a run, and abandoned runs are closed per slot lock.
    lock_per_slot: ClassVar[bool] = False
    # A start whose lock is held by a run of an older slot asks that run to stop.
    stops_older_run: ClassVar[bool] = False
    # A slot that came while a run began late, but did not last its interval, is
    # catch_up's (a late start), not this policy's: only a run that overran counts.
    only_overruns_count: ClassVar[bool] = False
    # Slots that came before the previous run began (it was itself a buffered, late
    # run) count as having come during it: they were buffered with it.
    counts_slots_before_run_began: ClassVar[bool] = False
    # An operator's override may move the job to or from this policy.
    may_be_overridden: ClassVar[bool] = True
    # A start that finds another member of its concurrency group running waits its turn
    # (and runs after it) rather than record its slot skipped (``groups.py``).
    waits_for_group: ClassVar[bool] = True

    def __str__(self) -> str:
        return self.name

    @property
    def needs_child_process(self) -> bool:
        """A run must be stoppable (it runs in a child process, never in a thread)."""
        return self.stops_older_run

    def slots_run_after(self, catch_up: CatchUp) -> int:
        """How many of the slots that came during a run still run after it (the
        newest); the others are recorded skipped."""
        return 0

    @property
    def buffers(self) -> bool:
        """A slot that came during a run runs after it, rather than being skipped or
        run alongside."""
        return self.slots_run_after(CatchUp()) > 0

    def goes_with(self, catch_up: CatchUp) -> bool:
        """``catch_up`` may be declared with this policy."""
        return True


@dataclass(frozen=True)
class Skip(Overlap):
    """``"skip"`` (the default): slots that came during a run are recorded skipped."""

    name: ClassVar[str] = "skip"
    only_overruns_count: ClassVar[bool] = True
    waits_for_group: ClassVar[bool] = False


@dataclass(frozen=True)
class BufferOne(Overlap):
    """``"buffer_one"``: the latest slot that came during a run runs right after it."""

    name: ClassVar[str] = "buffer_one"

    def slots_run_after(self, catch_up: CatchUp) -> int:
        return 1


@dataclass(frozen=True)
class BufferAll(Overlap):
    """``"buffer_all"``: each slot that came during a run runs after it, in order, at
    most ``catch_up_limit`` (the newest)."""

    name: ClassVar[str] = "buffer_all"
    counts_slots_before_run_began: ClassVar[bool] = True

    def slots_run_after(self, catch_up: CatchUp) -> int:
        return catch_up.limit


@dataclass(frozen=True)
class CancelOther(Overlap):
    """``"cancel_other"``: a newer slot's start asks the running run to stop, then runs;
    as with ``"buffer_one"``, the latest slot that came during the run runs after it."""

    name: ClassVar[str] = "cancel_other"
    stops_older_run: ClassVar[bool] = True

    def slots_run_after(self, catch_up: CatchUp) -> int:
        return 1


@dataclass(frozen=True)
class AllowAll(Overlap):
    """``"allow_all"``: each slot takes a lock of its own and runs at its time, beside
    the runs still going."""

    name: ClassVar[str] = "allow_all"
    lock_per_slot: ClassVar[bool] = True
    may_be_overridden: ClassVar[bool] = False

    def goes_with(self, catch_up: CatchUp) -> bool:
        # "all" runs missed slots one after the other; allow_all runs each slot under
        # its own lock, at its own time.
        return not catch_up.runs_each_missed


SKIP = Skip()
OVERLAP: dict[str, Overlap] = {
    policy.name: policy for policy in (SKIP, BufferOne(), BufferAll(), CancelOther(), AllowAll())
}


def find_overlap(name: object) -> Overlap | None:
    """The overlap policy called ``name``; None if there is none (any value, such as
    one read from a row)."""
    return OVERLAP.get(name) if isinstance(name, str) else None


def overlap_policy(name: object) -> Overlap:
    """The overlap policy called ``name`` (else LockConfigurationError)."""
    policy = find_overlap(name)
    if policy is None:
        raise _one_of("overlap", OVERLAP, name)
    return policy


# Catch-up: what a start does with the slots that no server ran (missed).


@dataclass(frozen=True, init=False)
class CatchUp:
    """A ``catch_up`` policy, with its ``limit`` and ``window``. ``CatchUp(name, limit,
    window)`` is the policy of that name (``CatchUp()``: ``"latest"``)."""

    name: ClassVar[str] = ""
    # Missed slots each run, oldest first (at most ``limit``), not only the current one.
    runs_each_missed: ClassVar[bool] = False
    limit: int
    window: dt.timedelta | None

    def __new__(
        cls, policy: str = "latest", limit: int = 10, window: dt.timedelta | None = None
    ) -> CatchUp:
        if cls is CatchUp:
            cls = catch_up_class(policy)
        self = object.__new__(cls)
        object.__setattr__(self, "limit", limit)
        object.__setattr__(self, "window", window)
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass  # set by __new__

    def __str__(self) -> str:
        return self.name

    @property
    def policy(self) -> str:
        """Its name, as ``catch_up=`` takes it."""
        return self.name

    def window_at(self, schedule: Schedule, now: dt.datetime) -> dt.timedelta | None:
        """How late after its start a missed slot may still run (None: however late)."""
        return self.window

    def slots_to_run(self, due: list[dt.datetime], current: dt.datetime) -> list[dt.datetime]:
        """Which of the ``due`` slots (oldest first, within the window) a start runs:
        the latest, if it is the ``current`` slot; the others are recorded missed."""
        return [slot for slot in due[-1:] if slot == current]


@dataclass(frozen=True, init=False)
class CatchUpLatest(CatchUp):
    """``"latest"`` (the default): the most recent slot runs, late, once."""

    name: ClassVar[str] = "latest"


@dataclass(frozen=True, init=False)
class CatchUpSkip(CatchUp):
    """``"skip"``: nothing runs that starts later than the window (by default the slot
    tolerance) after its slot."""

    name: ClassVar[str] = "skip"

    def window_at(self, schedule: Schedule, now: dt.datetime) -> dt.timedelta | None:
        return self.window if self.window is not None else schedule.early_allowance(now)


@dataclass(frozen=True, init=False)
class CatchUpAll(CatchUp):
    """``"all"``: each slot no server ran runs, oldest first, at most ``limit`` (the
    newest)."""

    name: ClassVar[str] = "all"
    runs_each_missed: ClassVar[bool] = True

    def slots_to_run(self, due: list[dt.datetime], current: dt.datetime) -> list[dt.datetime]:
        return due[-self.limit :]


CATCH_UP: dict[str, type[CatchUp]] = {
    policy.name: policy for policy in (CatchUpLatest, CatchUpSkip, CatchUpAll)
}


def catch_up_class(name: object) -> type[CatchUp]:
    """The catch-up policy called ``name`` (else LockConfigurationError)."""
    policy = CATCH_UP.get(name) if isinstance(name, str) else None
    if policy is None:
        raise _one_of("catch_up", CATCH_UP, name)
    return policy

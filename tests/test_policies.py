"""Each policy's answers to the code's questions, against tables written out here (pure:
no database). A policy that answers one question wrongly fails its row."""

from __future__ import annotations

import copy
import datetime as dt
import pickle
from pathlib import Path

import pytest

from django_exclusive_jobs.lock.errors import LockConfigurationError
from django_exclusive_jobs.run import catchup, policies
from django_exclusive_jobs.run.policies import (
    CATCH_UP,
    OVERLAP,
    AllowAll,
    BufferAll,
    BufferOne,
    CancelOther,
    CatchUp,
    CatchUpAll,
    CatchUpLatest,
    CatchUpSkip,
    Skip,
    catch_up_class,
    find_overlap,
    overlap_policy,
)
from django_exclusive_jobs.run.schedules import Every

# name: (class, lock_per_slot, stops_older_run, needs_child_process, only_overruns_count,
#        counts_slots_before_run_began, may_be_overridden, buffers)
OVERLAPS = {
    "skip": (Skip, False, False, False, True, False, True, False),
    "buffer_one": (BufferOne, False, False, False, False, False, True, True),
    "buffer_all": (BufferAll, False, False, False, False, True, True, True),
    "cancel_other": (CancelOther, False, True, True, False, False, True, True),
    "allow_all": (AllowAll, True, False, False, False, False, False, False),
}
# name: slots that came during a run still run after it, for catch_up_limit 1, 7, 1000
RUN_AFTER = {
    "skip": (0, 0, 0),
    "buffer_one": (1, 1, 1),
    "buffer_all": (1, 7, 1000),
    "cancel_other": (1, 1, 1),
    "allow_all": (0, 0, 0),
}
# name: goes with catch_up "latest", "skip", "all"
GOES_WITH = {
    "skip": (True, True, True),
    "buffer_one": (True, True, True),
    "buffer_all": (True, True, True),
    "cancel_other": (True, True, True),
    "allow_all": (True, True, False),
}


def test_the_overlap_policies_are_the_five_names_in_their_order() -> None:
    assert tuple(OVERLAP) == tuple(OVERLAPS)
    assert tuple(OVERLAPS) == catchup.OVERLAPS


@pytest.mark.parametrize("name", OVERLAPS)
def test_each_overlap_policy_answers_each_question(name: str) -> None:
    kind, per_slot, stops, child, overruns, before, overridden, buffers = OVERLAPS[name]
    policy = overlap_policy(name)
    assert type(policy) is kind
    assert (
        policy.lock_per_slot,
        policy.stops_older_run,
        policy.needs_child_process,
        policy.only_overruns_count,
        policy.counts_slots_before_run_began,
        policy.may_be_overridden,
        policy.buffers,
    ) == (per_slot, stops, child, overruns, before, overridden, buffers)
    limits = tuple(policy.slots_run_after(CatchUp("latest", limit)) for limit in (1, 7, 1000))
    assert limits == RUN_AFTER[name]
    goes = tuple(policy.goes_with(CatchUp(catch)) for catch in ("latest", "skip", "all"))
    assert goes == GOES_WITH[name]


@pytest.mark.parametrize("name", OVERLAPS)
def test_an_overlap_policy_is_written_and_shown_as_its_name(name: str) -> None:
    policy = OVERLAP[name]
    assert (policy.name, str(policy), f"overlap={policy}") == (name, name, f"overlap={name}")
    assert pickle.loads(pickle.dumps(policy)) == policy == copy.deepcopy(policy)
    assert find_overlap(name) == policy


def test_overlap_policies_differ_from_each_other() -> None:
    assert len(set(OVERLAP.values())) == len(OVERLAP)
    assert OVERLAP["buffer_one"] != OVERLAP["cancel_other"]  # same answers, not one policy


@pytest.mark.parametrize("given", ["queue", "Skip", "", None, 1, ["skip"], {"skip": 1}])
def test_an_unknown_overlap_is_refused_with_the_message_of_old(given: object) -> None:
    assert find_overlap(given) is None
    message = (
        "overlap must be one of 'skip', 'buffer_one', 'buffer_all', 'cancel_other', "
        f"'allow_all', not {given!r}."
    )
    with pytest.raises(LockConfigurationError) as raised:
        overlap_policy(given)
    assert str(raised.value) == message
    with pytest.raises(LockConfigurationError) as again:
        catchup.make_overlap(given)  # type: ignore[arg-type]
    assert str(again.value) == message


def test_allow_all_refuses_catch_up_all_at_the_door() -> None:
    with pytest.raises(LockConfigurationError) as raised:
        catchup.make_overlap("allow_all", CatchUp("all"))
    assert str(raised.value) == (
        "overlap='allow_all' runs each slot at its time: catch_up='all' does not go with it "
        "(use catch_up='latest' or 'skip', and `exclusive_jobs backfill` for past slots)."
    )
    assert catchup.make_overlap("allow_all", CatchUp("latest")) == AllowAll()
    assert catchup.make_overlap("buffer_all", CatchUp("all")) == BufferAll()


# Catch-up. name: (class, runs_each_missed)
CATCH_UPS = {
    "latest": (CatchUpLatest, False),
    "skip": (CatchUpSkip, False),
    "all": (CatchUpAll, True),
}
HOUR = dt.timedelta(hours=1)
T = dt.datetime(2026, 3, 2, 11, 40, tzinfo=dt.UTC)
SLOTS = [dt.datetime(2026, 3, 2, hour, tzinfo=dt.UTC) for hour in (8, 9, 10, 11)]
CURRENT = SLOTS[-1]
# name, limit: the slots run of SLOTS (11:00 current) and of SLOTS[:-1] (10:00 not current)
TO_RUN = {
    ("latest", 10): ([CURRENT], []),
    ("latest", 2): ([CURRENT], []),
    ("skip", 10): ([CURRENT], []),
    ("all", 10): (SLOTS, SLOTS[:-1]),
    ("all", 2): (SLOTS[-2:], SLOTS[1:3]),
    ("all", 1): ([CURRENT], [SLOTS[2]]),
}


def test_the_catch_up_policies_are_the_three_names_in_their_order() -> None:
    assert tuple(CATCH_UP) == tuple(CATCH_UPS) == catchup.POLICIES


@pytest.mark.parametrize("name", CATCH_UPS)
def test_each_catch_up_policy_answers_each_question(name: str) -> None:
    kind, each = CATCH_UPS[name]
    policy = CatchUp(name, 3, HOUR)
    assert (type(policy), policy.runs_each_missed, policy.limit, policy.window) == (
        kind,
        each,
        3,
        HOUR,
    )
    assert catch_up_class(name) is kind
    assert kind(limit=3, window=HOUR) == policy == catchup.make_catch_up(name, 3, "1h")
    assert (policy.name, policy.policy, str(policy)) == (name, name, name)
    assert pickle.loads(pickle.dumps(policy)) == policy == copy.deepcopy(policy)


@pytest.mark.parametrize(("name", "limit"), TO_RUN)
def test_which_due_slots_a_start_runs(name: str, limit: int) -> None:
    policy = CatchUp(name, limit)
    current, not_current = TO_RUN[name, limit]
    assert policy.slots_to_run(SLOTS, CURRENT) == current
    assert policy.slots_to_run(SLOTS[:-1], CURRENT) == not_current
    assert policy.slots_to_run([], CURRENT) == []


def test_the_default_window_is_the_slot_tolerance_for_skip_alone() -> None:
    schedule = Every(tolerance=dt.timedelta(minutes=5), period=HOUR)
    windows = {name: CatchUp(name).window_at(schedule, T) for name in CATCH_UPS}
    assert windows == {"latest": None, "skip": dt.timedelta(minutes=5), "all": None}
    given = {name: CatchUp(name, window=HOUR).window_at(schedule, T) for name in CATCH_UPS}
    assert given == {"latest": HOUR, "skip": HOUR, "all": HOUR}


def test_the_default_catch_up_is_latest_ten_no_window() -> None:
    assert CatchUp() == CatchUpLatest(limit=10, window=None) == catchup.make_catch_up()
    assert CatchUp() != CatchUpSkip() and CatchUp("all") != CatchUp("all", 9)


@pytest.mark.parametrize("given", ["never", "Latest", None, 3])
def test_an_unknown_catch_up_is_refused_with_the_message_of_old(given: object) -> None:
    message = f"catch_up must be one of 'latest', 'skip', 'all', not {given!r}."
    for make in (catch_up_class, CatchUp, catchup.make_catch_up):
        with pytest.raises(LockConfigurationError) as raised:
            make(given)  # type: ignore[operator]
        assert str(raised.value) == message


def test_the_module_stays_small() -> None:
    assert len(Path(policies.__file__).read_text().splitlines()) < 250

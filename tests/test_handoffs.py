"""A scheduler's handoffs (run/spread.py, ``Handoffs``): what it does with a slot it
waited for, once it has looked which slots are claimed. Pure: no database, no clock."""

from __future__ import annotations

import datetime as dt

import pytest

from django_exclusive_jobs.run import spread

DUE = dt.datetime(2026, 11, 24, 11, tzinfo=dt.UTC)
AGAIN = DUE + dt.timedelta(seconds=7)


def verdict(
    claimed: set[str], *, head: str = "b", again: dt.datetime | None = None, **given: bool
) -> tuple[tuple[str, dt.datetime | None], spread.Handoffs]:
    handoffs = spread.Handoffs()
    found = handoffs.verdict(
        "a",
        DUE,
        (head, DUE, again),
        DUE,
        claimed,
        rechecks=given.get("rechecks", False),
        full=given.get("full", False),
    )
    return found, handoffs


def test_a_slot_nobody_claimed_whose_first_choice_has_not_claimed_its_head_is_started() -> None:
    (action, _), handoffs = verdict(set())
    assert action == spread.START
    assert not handoffs.handed and not handoffs.heads


def test_a_slot_claimed_by_another_is_left_to_it() -> None:
    (action, at), _ = verdict({"a"})
    assert (action, at) == (spread.LEAVE, None)


def test_a_later_choice_leaves_the_slot_to_a_first_choice_at_work() -> None:
    (action, _), _ = verdict({"b"})  # the head of its first choice's share is claimed
    assert action == spread.LEAVE


def test_the_second_choice_looks_again_at_the_last_resort_while_the_first_is_at_work() -> None:
    (action, at), handoffs = verdict({"b"}, again=AGAIN)
    assert (action, at) == (spread.LOOK, AGAIN)
    # Then without asking about the head again: only whether the slot itself is claimed.
    assert handoffs.handed == {"a": DUE} and handoffs.heads == {"a": ("a", DUE, None)}
    (action, _), _ = verdict(set(), head="a")
    assert action == spread.START


def test_a_job_that_rechecks_starts_and_lets_its_claim_decide() -> None:
    """Retries or a buffering overlap: the claimed slot's run may fail, or its slots
    that came during it must run."""
    (action, _), _ = verdict({"a"}, rechecks=True)
    assert action == spread.START


@pytest.mark.parametrize("claimed", [set(), {"a"}], ids=["unclaimed", "rechecking"])
def test_a_full_scheduler_looks_again_at_once_keeping_the_head(claimed: set[str]) -> None:
    (action, at), handoffs = verdict(claimed, full=True, rechecks=bool(claimed))
    assert (action, at) == (spread.LOOK, DUE)
    assert handoffs.handed == {"a": DUE} and handoffs.heads == {"a": ("b", DUE, None)}


def test_heads_taken_out_are_put_back_when_the_look_fails() -> None:
    handoffs = spread.Handoffs(heads={"a": ("b", DUE, AGAIN)})
    heads = handoffs.take_heads({"a": DUE, "c": DUE})
    assert heads == {"a": ("b", DUE, AGAIN), "c": ("c", DUE, None)} and not handoffs.heads
    handoffs.put_back({"a": DUE, "c": DUE}, heads)
    assert handoffs.heads == heads and handoffs.handed == {"a": DUE, "c": DUE}


def test_forgetting_a_job_drops_all_it_kept() -> None:
    handoffs = spread.Handoffs(
        handed={"a": DUE}, first_for={"a": DUE}, heads={"a": ("a", DUE, None)}
    )
    handoffs.forget("a")
    assert not (handoffs.handed or handoffs.first_for or handoffs.heads)

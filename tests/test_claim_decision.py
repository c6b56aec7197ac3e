"""The claim as one decision over values (run/claim.py), and why a run starts
(run/start.py): pure, no database. The rows are unsaved model instances."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django_exclusive_jobs.models import JobRun, JobState, RunRequest
from django_exclusive_jobs.run.catchup import make_catch_up, make_overlap
from django_exclusive_jobs.run.claim import Decision, Insert, Record, aim, backfill, decide, run_now
from django_exclusive_jobs.run.overrides import schedule_spec
from django_exclusive_jobs.run.registry import Job
from django_exclusive_jobs.run.schedules import make_schedule
from django_exclusive_jobs.run.start import Start
from django_exclusive_jobs.run.status import RunStatus

HOURLY = make_schedule(every="1h")
ME = "here:1:me"  # the lock's holder, named in the rows' texts


def at(hour: int, minute: int = 0, second: int = 0) -> dt.datetime:
    return dt.datetime(2026, 11, 24, hour, minute, second, tzinfo=dt.UTC)


def job(**settings: Any) -> Job:
    return Job("nightly", lambda: None, schedule=HOURLY, **settings)


def run(slot: dt.datetime, status: str = RunStatus.SUCCEEDED, **fields: Any) -> JobRun:
    """A run row as read: it started at its slot and lasted a minute, unless told."""
    started = fields.pop("started_at", slot)
    duration = fields.pop("duration", 60.0)
    ended = started + dt.timedelta(seconds=duration)
    values = {"attempt": 1, "host": "there", "pid": 7, "instance": "it", "token": 3}
    return JobRun(
        name="nightly",
        slot=slot,
        status=status,
        started_at=started,
        duration=duration,
        finished_at=ended,
        **{**values, **fields},
    )


def claim(spec: Job, now: dt.datetime, latest: JobRun | None, **given: Any) -> Decision:
    start = given.pop("start", Start.call())
    return decide(spec, start, now, ME, latest, given.pop("state", None), **given)


# --- a scheduled start's decision --------------------------------------------------------


def test_a_jobs_first_run_inserts_its_slot_under_the_lease() -> None:
    decided = claim(job(), at(11, 0, 5), None)
    assert decided.insert == Insert(at(11), 1)
    assert (decided.slot, decided.under_lease, decided.together) == (at(11), True, False)
    assert (decided.records, decided.missed, decided.why, decided.existing) == ((), [], "", None)


def test_before_any_read_the_start_looks_up_to_its_slot() -> None:
    aimed = aim(job(), Start.call(), at(11, 20), None, None)
    assert (aimed.look_up_to, aimed.final, aimed.insert) == (at(11), False, None)
    # The scheduler's start serves its due slot, never a coming one (a lock taken a
    # little early: the start is at its due time).
    due = aim(job(), Start.slot(at(12)), at(11, 59, 59), None, None)
    assert due.look_up_to == at(12)
    # A direct call a second early serves the coming slot (the slot tolerance); a due
    # slot's start at that time serves the one begun.
    assert aim(job(), Start.call(), at(11, 59, 59), None, None).look_up_to == at(12)
    assert aim(job(), Start.slot(at(11, 59, 59)), at(11, 59, 59), None, None).look_up_to == at(11)


def test_a_job_without_a_schedule_runs_at_once_unless_paused() -> None:
    spec = Job("manual", lambda: None)
    assert aim(spec, Start.call(), at(11), None, None) == Decision(insert=Insert(None))
    paused = JobState(name="manual", paused=True, paused_by="ops", paused_at=at(9))
    decided = aim(spec, Start.call(), at(11), paused, None)
    assert (decided.insert, decided.why) == (None, "paused by ops since 2026-11-24T09:00:00+00:00")


def test_a_slot_that_succeeded_is_the_run_that_has_it() -> None:
    done = run(at(11))
    decided = claim(job(), at(11, 30), done)
    assert (decided.existing, decided.insert, decided.slot) == (done, None, at(11))
    assert (decided.under_lease, decided.records, decided.why) == (False, (), "")


def test_a_running_slot_is_the_run_that_has_it_even_with_retries() -> None:
    going = run(at(11), RunStatus.RUNNING, retry_at=None)
    decided = claim(job(retries=2), at(11, 30), going)
    assert (decided.existing, decided.insert) == (going, None)


def test_a_due_retry_is_the_slots_next_attempt() -> None:
    failed = run(at(11), RunStatus.FAILED, attempt=1, retry_at=at(11, 5))
    decided = claim(job(retries=2), at(11, 5), failed)
    assert (decided.insert, decided.existing, decided.slot) == (Insert(at(11), 2), None, at(11))


def test_a_retry_not_yet_due_skips_and_says_when() -> None:
    failed = run(at(11), RunStatus.FAILED, attempt=1, retry_at=at(11, 5))
    decided = claim(job(retries=2), at(11, 4), failed)
    assert (decided.insert, decided.existing, decided.retry_at) == (None, None, at(11, 5))
    assert (
        decided.why
        == "retry of slot 2026-11-24T11:00:00+00:00 at 2026-11-24T11:05:00+00:00 (attempt 1 ended)"
    )


def test_a_last_attempt_is_the_run_that_has_the_slot() -> None:
    failed = run(at(11), RunStatus.FAILED, attempt=3, retry_at=at(11, 5))
    decided = claim(job(retries=2), at(11, 30), failed)
    assert (decided.existing, decided.insert, decided.retry_at) == (failed, None, None)


def test_an_older_slots_pending_retry_is_given_up_when_a_newer_slot_begins() -> None:
    failed = run(at(10), RunStatus.FAILED, retry_at=at(10, 30))
    decided = claim(job(retries=2), at(11, 0, 5), failed)
    assert decided.give_up is failed
    assert (decided.insert, decided.current, decided.under_lease) == (Insert(at(11)), at(11), False)
    assert claim(job(retries=2), at(11, 0, 5), run(at(10))).give_up is None


def test_a_paused_job_records_its_slot_paused_once() -> None:
    state = JobState(
        name="nightly", paused=True, paused_by="ops", paused_at=at(9), pause_reason="db"
    )
    decided = claim(job(), at(11, 0, 5), run(at(10)), state=state)
    why = "paused by ops since 2026-11-24T09:00:00+00:00: db"
    assert decided.records == (Record((at(11),), RunStatus.PAUSED, f"Paused: {why}."),)
    assert (decided.insert, decided.slot, decided.why, decided.together) == (
        None,
        at(11),
        why,
        False,
    )
    assert decided.missed == []  # the slots before it are not missed


def test_a_pause_that_ended_is_no_pause() -> None:
    state = JobState(name="nightly", paused=True, paused_at=at(9), paused_until=at(10, 30))
    decided = claim(job(), at(11, 0, 5), run(at(10)), state=state)
    assert (decided.insert, decided.records) == (Insert(at(11)), ())


def missed_text(noticed: dt.datetime) -> str:
    return f"No server ran this slot before {ME} started the job at {noticed.isoformat()}."


def test_catch_up_latest_runs_the_newest_slot_and_records_the_others_missed() -> None:
    decided = claim(job(catch_up=make_catch_up("latest")), at(11, 40), run(at(8)))
    assert decided.insert == Insert(at(11))
    assert decided.records == (Record((at(9), at(10)), RunStatus.MISSED, missed_text(at(11, 40))),)
    assert (decided.missed, decided.together, decided.more) == ([at(9), at(10)], True, False)


def test_catch_up_skip_runs_nothing_late_and_says_why() -> None:
    decided = claim(job(catch_up=make_catch_up("skip")), at(11, 40), run(at(8)))
    assert decided.insert is None
    assert decided.missed == [at(9), at(10), at(11)]
    assert decided.records[0].slots == (at(9), at(10), at(11))
    late = "slot 2026-11-24T11:00:00+00:00 started too late (catch_up=skip): recorded missed"
    assert (decided.why, decided.slot, decided.together) == (late, None, True)


def test_catch_up_all_runs_the_oldest_slot_and_says_more_are_due() -> None:
    decided = claim(job(catch_up=make_catch_up("all")), at(11, 40), run(at(8)))
    assert (decided.insert, decided.more, decided.missed, decided.records) == (
        Insert(at(9)),
        True,
        [],
        (),
    )


def overran() -> JobRun:
    """The run of 10:00, which lasted until 12:30: 11:00 and 12:00 came during it."""
    return run(at(10), duration=2.5 * 3600)


def skipped_text() -> str:
    return "Overlap: the run of slot 2026-11-24T10:00:00+00:00 by there:7:it was still running."


def test_slots_that_came_during_a_run_are_skipped_under_skip() -> None:
    decided = claim(job(overlap=make_overlap("skip")), at(12, 31), overran())
    assert decided.insert is None
    assert decided.skipped == [at(11), at(12)]
    assert decided.records == (Record((at(11), at(12)), RunStatus.SKIPPED, skipped_text()),)
    assert decided.why == "slot 2026-11-24T12:00:00+00:00 came during a run (overlap=skip)"
    assert decided.together


def test_buffer_one_runs_the_latest_slot_that_came_during_a_run() -> None:
    decided = claim(job(overlap=make_overlap("buffer_one")), at(12, 31), overran())
    assert (decided.insert, decided.skipped) == (Insert(at(12)), [at(11)])
    assert decided.records == (Record((at(11),), RunStatus.SKIPPED, skipped_text()),)


def test_buffer_all_runs_each_slot_that_came_during_a_run_oldest_first() -> None:
    decided = claim(job(overlap=make_overlap("buffer_all")), at(12, 31), overran())
    assert (decided.insert, decided.more, decided.skipped, decided.records) == (
        Insert(at(11)),
        True,
        [],
        (),
    )
    assert not decided.together  # one insert alone


def test_a_slot_before_the_schedule_was_put_in_force_runs_nothing() -> None:
    state = JobState(name="nightly", schedule_since=at(11, 30))
    decided = claim(job(), at(11, 40), run(at(8)), state=state)
    assert (decided.insert, decided.missed, decided.records) == (None, [], ())
    since = "its slot came before its schedule was put in force at 2026-11-24T11:30:00+00:00"
    assert decided.why == since


def test_a_slot_that_fell_in_the_last_pause_runs_nothing() -> None:
    state = JobState(name="nightly", paused=True, paused_at=at(10, 30), paused_until=at(11, 30))
    decided = claim(job(), at(11, 40), run(at(10)), state=state)
    assert (decided.insert, decided.records, decided.why) == (
        None,
        (),
        "its slot fell in its last pause",
    )


def test_the_replaced_schedules_slots_nobody_ran_are_recorded_missed_first() -> None:
    every_half_hour = schedule_spec(make_schedule(every="30m"))
    state = JobState(name="nightly", schedule_since=at(10), schedule_before=every_half_hour)
    decided = claim(job(), at(11, 40), run(at(8)), state=state)
    old = [at(8, 30), at(9), at(9, 30)]
    why = (
        "No server ran this slot of its replaced schedule (every 30m) before its schedule "
        f"changed at 2026-11-24T10:00:00+00:00; noticed by {ME} at 2026-11-24T11:40:00+00:00."
    )
    assert decided.records == (Record(tuple(old), RunStatus.MISSED, why),)
    assert (decided.insert, decided.missed, decided.together) == (Insert(at(11)), old, True)
    assert decided.replaced is not None and decided.replaced.slots == old


def test_allow_all_a_slot_not_begun_runs_nothing() -> None:
    spec = job(overlap=make_overlap("allow_all"))
    decided = aim(spec, Start.call(), at(11, 40), None, at(12))
    assert decided.final and decided.insert is None
    assert decided.why == "slot 2026-11-24T12:00:00+00:00 has not begun on database time"
    assert claim(spec, at(11, 40), None, slot=at(12)).why == decided.why
    begun = aim(spec, Start.call(), at(11, 40), None, at(11))
    assert (begun.look_up_to, begun.why) == (at(11), "")


def test_allow_all_a_first_claim_looks_in_turn_then_serves_the_slot_of_its_lock() -> None:
    spec = job(overlap=make_overlap("allow_all"))
    first = claim(spec, at(11, 40), None, slot=at(10))
    assert (first.in_turn, first.final, first.insert) == (True, False, None)
    none_before = claim(spec, at(11, 40), None, slot=at(10), turn=True)
    assert (none_before.insert, none_before.under_lease) == (Insert(at(10)), False)
    began = claim(spec, at(11, 40), run(at(10)), slot=at(10), turn=True)  # its own slot too
    assert (began.insert, began.why) == (
        None,
        "the job's history began after this slot, at 2026-11-24T10:00:00+00:00",
    )


# --- a run asked for -----------------------------------------------------------------


def test_a_run_now_inserts_a_run_with_no_slot_and_who_asked() -> None:
    assert run_now("ops") == Decision(insert=Insert(None, 1, "ops"))


def test_a_backfill_runs_the_slots_next_attempt_with_who_asked() -> None:
    assert backfill(at(9), "ops", []) == Decision(
        insert=Insert(at(9), 1, "ops", backfill=True), slot=at(9)
    )
    newest = [run(at(9), RunStatus.FAILED, attempt=2), run(at(9), RunStatus.MISSED)]
    decided = backfill(at(9), "ops", newest)
    assert (decided.insert, decided.existing) == (Insert(at(9), 3, "ops", backfill=True), None)


def test_a_backfill_of_a_slot_that_succeeded_is_that_run() -> None:
    done = run(at(9), RunStatus.SUCCEEDED)
    decided = backfill(at(9), "ops", [run(at(9), RunStatus.FAILED, attempt=2), done])
    assert (decided.existing, decided.insert, decided.slot) == (done, None, at(9))


# --- why a run starts --------------------------------------------------------------------


def test_each_start_says_what_the_run_asks() -> None:
    slot, cron, call = Start.slot(at(11)), Start.cron(), Start.call()
    assert (slot.not_before, slot.waits_for_start, slot.asked) == (at(11), False, False)
    assert (cron.not_before, cron.waits_for_start, cron.reason) == (None, True, "cron")
    assert (call.not_before, call.waits_for_start, call.requested_by) == (None, False, "")
    retry = Start.cron(retry_at=at(11, 5))
    assert (retry, retry.waits_for_start) == (Start.retry(at(11, 5)), False)
    assert cron.waited(at(11, 0, 30)).not_before == at(11, 0, 30)


def test_asked_starts_do_not_serve_their_schedules_slot() -> None:
    skip, allow_all = make_overlap("skip"), make_overlap("allow_all")
    assert Start.call().serves_its_slot(HOURLY, skip)
    assert Start.slot(at(11)).serves_its_slot(HOURLY, skip)
    assert not Start.call().serves_its_slot(None, skip)
    assert not Start.call().serves_its_slot(HOURLY, allow_all)
    now = Start.run_now("ops " + "x" * 300)
    assert not now.serves_its_slot(HOURLY, skip)
    assert (len(now.requested_by), now.backfilled, now.slot_asked) == (255, False, None)
    past = Start.backfill(at(9), "ops")
    assert not past.serves_its_slot(HOURLY, skip)
    assert (past.requested_by, past.backfilled, past.slot_asked) == ("ops", True, at(9))


def test_a_request_a_scheduler_serves_is_asked_by_its_row() -> None:
    request = RunRequest(name="nightly", requested_by="carol (admin)", slot=at(9))
    served = Start.run_now(request=request)
    assert (served.request, served.requested_by, served.backfilled) == (request, "", True)
    assert (served.slot_asked, served.reason, served.asked) == (at(9), "backfill", True)
    now = Start.run_now(request=RunRequest(name="nightly", requested_by="carol (admin)"))
    assert (now.backfilled, now.slot_asked, now.reason) == (False, None, "run_now")
    assert not now.serves_its_slot(HOURLY, make_overlap("skip"))

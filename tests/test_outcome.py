"""How a run ends, decided over values (run/ending.py): every rule, and which wins when
several apply. No database, no process, no clock: each case is a few values in, one
answer out."""

from __future__ import annotations

import asyncio
import signal
from types import SimpleNamespace
from typing import Any

import pytest

from django_exclusive_jobs.lock.errors import LockLost
from django_exclusive_jobs.run.ending import (
    EXIT_FAILED,
    EXIT_LOST,
    EXIT_OK,
    EXIT_TIMED_OUT,
    LEASE_ENDED,
    ChildEnd,
    Ending,
    RunResult,
    child_end,
    describe_exit,
    status_of,
    status_of_error,
    stopped_while_running,
)
from django_exclusive_jobs.run.process import JobFailed, Outcome
from django_exclusive_jobs.run.shutdown import Interrupted, TimedOut
from django_exclusive_jobs.run.status import RunStatus

S = RunStatus

# --- status_of: a run's status once its lock is released ------------------------------

STATUS_RULES = [
    # (what the job's execution made of it, the facts, how the run ended)
    # nothing more to say: the job's own end stands
    *[(status, {}, status) for status in (S.SUCCEEDED, S.FAILED, S.TIMED_OUT, S.INTERRUPTED)],
    (S.LOST, {}, S.LOST),
    # a lost lock: any end but a stop is LOST
    (S.SUCCEEDED, {"lost": True}, S.LOST),
    (S.FAILED, {"lost": True}, S.LOST),
    (S.TIMED_OUT, {"lost": True}, S.LOST),
    (S.INTERRUPTED, {"lost": True}, S.INTERRUPTED),
    # a program's non-zero exit makes a success a failure, and only a success
    (S.SUCCEEDED, {"returncode": 3}, S.FAILED),
    (S.SUCCEEDED, {"returncode": -9}, S.FAILED),
    (S.SUCCEEDED, {"returncode": 0}, S.SUCCEEDED),
    (S.TIMED_OUT, {"returncode": 3}, S.TIMED_OUT),
    (S.INTERRUPTED, {"returncode": -15}, S.INTERRUPTED),
    # an enqueued task's success
    (S.SUCCEEDED, {"enqueued": True}, S.ENQUEUED),
    (S.FAILED, {"enqueued": True}, S.FAILED),
    # a stop a newer slot asked for; a run it did not stop is not cancelled
    (S.INTERRUPTED, {"cancelled": True}, S.CANCELLED),
    (S.SUCCEEDED, {"cancelled": True}, S.SUCCEEDED),
    (S.FAILED, {"cancelled": True}, S.FAILED),
    # precedence: a lost lock before the program's exit, the task and the cancel
    (S.SUCCEEDED, {"lost": True, "returncode": 1}, S.LOST),
    (S.SUCCEEDED, {"lost": True, "enqueued": True}, S.LOST),
    (S.SUCCEEDED, {"lost": True, "cancelled": True}, S.LOST),
    (S.INTERRUPTED, {"lost": True, "cancelled": True}, S.CANCELLED),
    # the program's exit before the task
    (S.SUCCEEDED, {"returncode": 1, "enqueued": True}, S.FAILED),
    (S.SUCCEEDED, {"returncode": 0, "enqueued": True}, S.ENQUEUED),
]


@pytest.mark.parametrize(("status", "facts", "ended"), STATUS_RULES)
def test_status_of(status: RunStatus, facts: dict[str, Any], ended: RunStatus) -> None:
    assert status_of(Ending(status, **facts)) == ended


# --- status_of_error: what a job's exception means ------------------------------------

ERRORS = [
    (Interrupted(signal.SIGTERM), S.INTERRUPTED, signal.SIGTERM),
    (Interrupted(signal.SIGINT), S.INTERRUPTED, signal.SIGINT),
    (TimedOut(5.0), S.TIMED_OUT, None),
    (LockLost("job", 7, "force-released"), S.LOST, None),  # an Exception, but not a failure
    (ValueError("boom"), S.FAILED, None),
    (JobFailed("ValueError", "Traceback ...\nValueError: boom"), S.FAILED, None),
    (KeyboardInterrupt(), S.INTERRUPTED, None),
    (SystemExit(2), S.INTERRUPTED, None),
    (asyncio.CancelledError(), S.INTERRUPTED, None),
]


@pytest.mark.parametrize(("exc", "status", "signum"), ERRORS)
def test_status_of_error(exc: BaseException, status: RunStatus, signum: int | None) -> None:
    assert status_of_error(exc) == (status, signum)


# --- child_end: a job's process (or thread) ended ---------------------------------------

FAILED = JobFailed("ValueError", "Traceback ...\nValueError: boom")


def _end(outcome: Outcome, **given: Any) -> ChildEnd:
    facts: dict[str, Any] = {"stopped": False, "stopped_by": None, "lost": False}
    facts.update(given)
    return child_end(outcome, lock=("job", 7), **{"time_limit": 30.0, **facts})


def _what(end: ChildEnd) -> tuple[str, Any]:
    """The answer, comparable: the error's type and what it says, or the stop's signal."""
    if end.error is not None:
        assert not end.interrupted
        return type(end.error).__name__, str(end.error)
    if end.interrupted:
        return "interrupted", end.signum
    return "as the job did", None


LEASE = ("LockLost", str(LockLost("job", 7, LEASE_ENDED)))
TIMEOUT = ("TimedOut", str(TimedOut(30.0)))
ERROR = ("JobFailed", str(FAILED))
KILLED = ("JobFailed", str(JobFailed("ProcessDied", describe_exit(-9))))
EXITED = ("JobFailed", str(JobFailed("ProcessDied", describe_exit(2))))
AS_DID = ("as the job did", None)
LOST = {"lost": True}
Out = Outcome

CHILD_RULES = [
    # (the id, the outcome, the facts, the answer)
    ("returned", Out(0, finished=True, ended=5.0), {}, AS_DID),
    ("thread returned", Out(None, finished=True), {}, AS_DID),
    ("program exit 3", Out(3, finished=True), {}, AS_DID),
    ("lease ended", Out(-15, lease_ended=9.0), {}, LEASE),
    ("lease ended, returned before", Out(0, finished=True, ended=8.0, lease_ended=9.0), {}, AS_DID),
    ("lease ended, returned after", Out(0, finished=True, ended=9.5, lease_ended=9.0), {}, LEASE),
    ("lease ended before the timeout", Out(-15, lease_ended=9.0, timed_out=9.0), {}, LEASE),
    ("lease ended before its error", Out(1, error=FAILED, lease_ended=9.0), {}, LEASE),
    ("lease ended, lost anyway", Out(-15, lease_ended=9.0), LOST, LEASE),
    ("timed out", Out(-15, timed_out=9.0), {}, TIMEOUT),
    ("timed out after returning", Out(0, finished=True, timed_out=9.0), {}, AS_DID),
    ("timed out before its error", Out(1, error=FAILED, timed_out=9.0), {}, TIMEOUT),
    ("raised", Out(1, error=FAILED), {}, ERROR),
    (
        "raised before a stop",
        Out(1, error=FAILED, interrupted_by=15),
        {"stopped": True, "stopped_by": 15},
        ERROR,
    ),
    ("raised, lost", Out(1, error=FAILED), LOST, ERROR),
    ("stopped in the child", Out(-15, interrupted_by=15), {}, ("interrupted", 15)),
    ("stopped by the scheduler", Out(-9), {"stopped": True, "stopped_by": 2}, ("interrupted", 2)),
    (
        "the child's signal first",
        Out(-15, interrupted_by=15),
        {"stopped": True, "stopped_by": 2},
        ("interrupted", 15),
    ),
    ("stopped, lost", Out(-15, interrupted_by=15), LOST, AS_DID),
    ("killed", Out(-9), {}, KILLED),
    ("exited early", Out(2), {}, EXITED),
    ("killed, lost", Out(-9), LOST, AS_DID),
    ("killed after returning", Out(-9, finished=True), {}, AS_DID),
    ("thread gone", Out(None), {}, AS_DID),
]


@pytest.mark.parametrize(
    ("outcome", "facts", "answer"),
    [case[1:] for case in CHILD_RULES],
    ids=[case[0] for case in CHILD_RULES],
)
def test_child_end(outcome: Outcome, facts: dict[str, Any], answer: tuple[str, Any]) -> None:
    assert _what(_end(outcome, **facts)) == answer


def test_a_timeout_is_reported_with_the_jobs_limit_and_none_as_zero() -> None:
    killed = Outcome(-15, timed_out=1.0)
    assert _what(_end(killed, time_limit=12.5)) == ("TimedOut", str(TimedOut(12.5)))
    assert _what(_end(killed, time_limit=None)) == ("TimedOut", str(TimedOut(0.0)))


# --- stopped_while_running, describe_exit, exit codes ---------------------------------


@pytest.mark.parametrize(
    ("stopped_by", "stopped_at", "outcome", "stopped"),
    [
        (None, None, Outcome(-15), False),  # never stopped
        (15, None, Outcome(-15), False),  # a thread: no time of its stop
        (15, 5.0, Outcome(-15), True),  # the job had not returned
        (15, 5.0, Outcome(0, finished=True, ended=None), True),
        (15, 5.0, Outcome(0, finished=True, ended=6.0), True),  # returned after the stop
        (15, 5.0, Outcome(0, finished=True, ended=4.0), False),  # returned before it
    ],
)
def test_stopped_while_running(
    stopped_by: int | None, stopped_at: float | None, outcome: Outcome, stopped: bool
) -> None:
    child = SimpleNamespace(stopped_by=stopped_by, stopped_at=stopped_at)
    assert stopped_while_running(child, outcome) is stopped  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("returncode", "said"),
    [
        (-9, "The job's process was killed by SIGKILL."),
        (-15, "The job's process was killed by SIGTERM."),
        (-200, "The job's process was killed by signal 200."),
        (3, "The job's process exited with code 3 before the job returned."),
    ],
)
def test_describe_exit(returncode: int, said: str) -> None:
    assert describe_exit(returncode) == said


@pytest.mark.parametrize(
    ("status", "given", "code"),
    [
        (S.SUCCEEDED, {}, EXIT_OK),
        (S.SKIPPED, {}, EXIT_OK),
        (S.ENQUEUED, {}, EXIT_OK),
        (S.CANCELLED, {}, EXIT_OK),
        (S.INTERRUPTED, {"signum": 15}, 143),
        (S.INTERRUPTED, {}, EXIT_FAILED),
        (S.LOST, {"returncode": 3}, EXIT_LOST),
        (S.TIMED_OUT, {"returncode": -15}, EXIT_TIMED_OUT),
        (S.FAILED, {"returncode": 3}, 3),
        (S.FAILED, {"returncode": -9}, 137),
        (S.FAILED, {}, EXIT_FAILED),
    ],
)
def test_exit_code(status: RunStatus, given: dict[str, Any], code: int) -> None:
    assert RunResult("job", status, **given).exit_code == code

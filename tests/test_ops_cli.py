"""`manage.py exclusive_locks`: list and release locks from a shell, per backend."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_exclusive_jobs import LockLost, try_acquire
from django_exclusive_jobs.models import JobLock, LockState

from .helpers import expire_now, other_holder


def run(alias: str, *args: str) -> str:
    out = io.StringIO()
    call_command("exclusive_locks", *args, "--database", alias, stdout=out)
    return out.getvalue()


def state_of(alias: str, name: str) -> str:
    return JobLock.objects.using(alias).with_state().get(name=name).state  # type: ignore[attr-defined]


@pytest.fixture
def two_locks(alias: str):  # type: ignore[no-untyped-def]
    with other_holder(alias) as other:
        other.try_acquire("live", ttl=600)
        other.try_acquire("dead", ttl=600)
        expire_now(alias, "dead")
        yield other


def test_lists_locks_with_state_token_and_holder(alias: str, two_locks: object) -> None:
    lines = run(alias).splitlines()
    assert lines[0].split() == ["NAME", "STATE", "TOKEN", "LEASE", "HOLDER"]
    dead, live = lines[1].split(), lines[2].split()
    assert dead[:3] == ["dead", "stale", "1"]
    assert live[:3] == ["live", "held", "1"]
    assert "ends in" in lines[2]
    assert "ended" in lines[1]


def test_stale_lists_only_expired_locks(alias: str, two_locks: object) -> None:
    assert [line.split()[0] for line in run(alias, "--stale").splitlines()[1:]] == ["dead"]


def test_json_output(alias: str, two_locks: object) -> None:
    records = json.loads(run(alias, "--json"))
    assert [(r["name"], r["state"], r["token"]) for r in records] == [
        ("dead", "stale", 1),
        ("live", "held", 1),
    ]
    assert records[1]["seconds_left"] > 500
    assert records[0]["seconds_left"] < 0
    assert records[1]["holder"] == two_locks.holder  # type: ignore[attr-defined]


def test_force_release_refuses_a_held_lock_without_live(alias: str, two_locks: object) -> None:
    with pytest.raises(CommandError, match="is held by") as info:
        run(alias, "force-release", "live")
    assert info.value.returncode == 1
    assert "--live" in str(info.value)
    assert state_of(alias, "live") == LockState.HELD


def test_force_release_with_live_frees_a_held_lock_and_its_holder_loses(alias: str) -> None:
    lock = try_acquire("mine", using=alias, ttl=600)
    assert lock is not None
    assert "force-released mine (was held" in run(alias, "force-release", "mine", "--live")
    assert state_of(alias, "mine") == LockState.FREE
    with pytest.raises(LockLost):
        lock.renew()


def test_force_release_stale(alias: str, two_locks: object) -> None:
    assert run(alias, "force-release", "--stale").strip() == "force-released 1 stale lock(s)"
    assert state_of(alias, "dead") == LockState.FREE
    assert state_of(alias, "live") == LockState.HELD


def test_force_release_unknown_lock_exits_1(alias: str) -> None:
    with pytest.raises(CommandError, match="No lock named 'ghost'") as info:
        run(alias, "force-release", "ghost")
    assert info.value.returncode == 1


def test_unknown_database_exits_2() -> None:
    with pytest.raises(CommandError, match="Unknown database alias") as info:
        call_command("exclusive_locks", "--database", "nope")
    assert info.value.returncode == 2


@pytest.mark.parametrize(
    "args",
    [("force-release",), ("force-release", "x", "--stale"), ("list", "x")],
    ids=["nothing-to-release", "name-and-stale", "list-with-name"],
)
def test_force_release_needs_one_target(args: tuple[str, ...]) -> None:
    with pytest.raises(CommandError) as info:
        call_command("exclusive_locks", *args)
    assert info.value.returncode == 2


@pytest.mark.parametrize(
    "command",
    [["exclusive_locks", "--json"], ["exclusive_locks"]],
    ids=["json", "table"],
)
def test_output_piped_into_head_ends_quietly(alias: str, command: list[str]) -> None:
    """`exclusive_locks | head` must not end in a BrokenPipeError traceback."""
    import subprocess
    import sys
    from pathlib import Path

    from .test_command import ROOT, command_env

    JobLock.objects.using(alias).bulk_create(
        JobLock(name=f"piped-{number:05d}", token=1) for number in range(3000)
    )
    line = " ".join(["python", "-m", "django", *command, "--database", alias])
    result = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {line} | head -n 1"],
        cwd=ROOT,
        env={**command_env(), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.stderr == ""
    assert result.returncode == 0
    assert len(result.stdout.splitlines()) == 1


def test_force_release_refuses_a_lock_taken_between_its_read_and_its_update(alias: str) -> None:
    """The state is read first; a stale lock taken in between must not be freed."""
    from django.db import connections

    with other_holder(alias) as other:
        other.try_acquire("raced-stale", ttl=600)
        expire_now(alias, "raced-stale")
        other.release("raced-stale")  # gone: the row is stale-then-free...
        other.try_acquire("raced-stale", ttl=600)
        expire_now(alias, "raced-stale")  # ...and now stale: its holder died
        taken = []

        def take_after_the_read(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
            if not taken and sql.lstrip().upper().startswith("UPDATE"):
                taken.append(other.try_acquire("raced-stale", ttl=600))  # just before ours
            return execute(sql, params, many, context)

        with (
            connections[alias].execute_wrapper(take_after_the_read),
            pytest.raises(CommandError, match="taken meanwhile") as info,
        ):
            run(alias, "force-release", "raced-stale")
        assert taken and taken[0] is not None
        assert info.value.returncode == 1
        assert state_of(alias, "raced-stale") == LockState.HELD

"""The protocol's Promela models (tests/model/protocol.pml, and groups.pml for
concurrency groups), checked by spin.

Each check runs ``scripts/model.sh NAME``: the model itself must hold with no error under
every bound (an exhaustive search, no bitstate), and each mutant of the protocol (among
them the first claim written without renewing its lease: the first-run gap, fixed,
docs/model.md) must be refuted with a counterexample. No database is used. Together
they take about five minutes of CPU (two of them jobs-faults'): marked slow. Of the long
checks (``scripts/model.sh --long``, GBs of memory), jobs-faults (3 servers, 2 jobs and a
fault: 2.1 minutes, 9 GB) is run here, buffer-all-long (buffer_all with five slots) is not.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "model.sh"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.no_deadline,  # pure CPU: in the README command's CPU lane (tests/cpu_report.py)
    pytest.mark.skipif(shutil.which("spin") is None, reason="spin is not installed"),
    pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed"),
]

HOLDS = [
    "races",
    "faults",
    "restarts",
    "buffer-faults",
    "buffer-restarts",
    "slots",
    "buffer-slots",
    "allow-all-faults",
    "allow-all-restarts",
    "allow-all-slots",
    "buffer-all-faults",
    "buffer-all-slots",
    "buffer-all-chain",
    "jobs-faults",
    "groups-restarts",
    "groups-three",
    "groups-force",
]
# Each mutant, and the property its counterexample must break.
REFUTED = {
    "take-ignores-expiry": "(a)",
    "release-not-holder-checked": "(a)",
    "claim-not-unique": "(c)",
    "no-watchdog": "(f)",
    "first-run-unguarded": "(d)",
    "claim-writes-apart": "(d)",
    "slots-out-of-turn": "(d)",
    "buffer-all-records-ahead": "(d)",
    "groups-guard-own-lease": "(g)",
}
LINE = re.compile(
    r"^(?P<name>[\w-]+) \((?P<expected>holds|refuted)\): (?P<errors>\d+) errors, "
    r"(?P<states>[\d.e+]+) states, depth (?P<depth>\d+)",
    re.MULTILINE,
)


def model(name: str) -> tuple[subprocess.CompletedProcess[str], re.Match[str]]:
    # At the CPU-only tests' priority (nice 10, tests/cpu_report.py): below the tests
    # that wait on 1-s slots and 3-s leases, level with the other CPU-only worker (at
    # nice 19, jobs-faults starved behind it: 620 s for 183 s of CPU). At nice 10 it gets
    # its CPU once the first lane ends (CI 2026-12-06: 698 s, then over 900 s with a first
    # lane of 1,300-1,500 s of CPU): the budget is for a hung check, not a slow machine.
    command = ["bash", str(SCRIPT), name]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1500, check=False)
    found = LINE.search(done.stdout)
    assert found is not None, done.stdout + done.stderr
    assert found["name"] == name
    return done, found


@pytest.mark.parametrize("name", HOLDS)
def test_the_model_holds(name: str) -> None:
    done, found = model(name)
    assert done.returncode == 0, done.stdout
    assert found["expected"] == "holds"
    assert found["errors"] == "0"
    assert float(found["states"]) > 100_000  # it explored something
    assert "Search not completed" not in done.stdout


@pytest.mark.parametrize(("name", "violated"), REFUTED.items())
def test_each_mutant_is_refuted_with_a_readable_trail(name: str, violated: str) -> None:
    done, found = model(name)
    assert done.returncode == 0, done.stdout
    assert found["expected"] == "refuted"
    assert int(found["errors"]) >= 1
    trail = done.stdout.split("counterexample", 1)[1]
    assert re.search(r"^    t=\d+ S\d take job\d: won, token \d+", trail, re.MULTILINE)
    assert f"VIOLATED {violated}:" in trail


def test_a_check_that_does_not_exist_fails() -> None:
    done = subprocess.run(
        ["bash", str(SCRIPT), "no-such-check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    assert "no check named no-such-check" in done.stderr


def test_the_buffer_checks_reach_a_buffered_run() -> None:
    """The buffer checks hold for runs that exist: with BUFFER=1 the model reaches a
    claim that runs a slot which came during the previous run, before the current one
    (an assertion that this never happens is refuted)."""
    done, found = model("buffered-reached")
    assert done.returncode == 0, done.stdout
    assert found["expected"] == "refuted"
    trail = done.stdout.split("counterexample", 1)[1]
    claims = re.findall(r"claim job0 slot (\d): newest row: .* run 1 \(slot (\d)\)", trail)
    buffered = [served for current, served in claims if int(served) < int(current)]
    assert buffered, trail
    assert f"STARTS job0 slot {buffered[-1]} " in trail
    assert "REACHED: a slot that came during a run starts after it" in trail


def test_the_groups_checks_reach_a_busy_group() -> None:
    """The groups checks hold for starts that find the group held: the model reaches a
    start whose take of the group finds another member's run holding it (an assertion
    that none does is refuted)."""
    done, found = model("groups-busy-reached")
    assert done.returncode == 0, done.stdout
    assert found["expected"] == "refuted"
    trail = done.stdout.split("counterexample", 1)[1]
    runs = re.search(r"S\d take the group: won, token \d+; job(\d) runs", trail)
    reached = re.search(r"REACHED: job(\d) finds the group held by job(\d)'s run", trail)
    assert runs and reached, trail
    assert reached[2] == runs[1] != reached[1]
    busy = f"take the group: held by another member's run: job{reached[1]} does not run now"
    assert busy in trail


def test_the_buffer_all_checks_reach_a_slot_left_for_a_later_start() -> None:
    """With BUFFER=2 (buffer_all) a claim leaves buffered slots to the starts after it,
    with no row; the model reaches a later start that runs one (an assertion that none
    does is refuted)."""
    done, found = model("left-reached")
    assert done.returncode == 0, done.stdout
    assert found["expected"] == "refuted"
    trail = done.stdout.split("counterexample", 1)[1]
    left = re.findall(r"buffer_all: slot \d now; slots ([1-9]\d*) \(bit mask\) left", trail)
    assert left, trail
    assert "REACHED: a later start runs a slot left for it" in trail

"""The suite's CPU: who gets it first, and where it went, test by test.

Tests marked ``no_deadline`` only burn CPU, with no deadline of their own (hostile input
through real processes, fuzzing, a million rows, hypothesis); they run at a lower
priority (nice 10), with every process they start, so that on a busy machine the tests
that wait on 2-s slots and 3-s leases get the CPU first (spin's model checks run at nice
19 already). A test that starts schedulers (the ``schedulers`` fixture) keeps its
priority. Lowering a priority needs no right; raising it back at the test's end needs
root or RLIMIT_NICE: without them nothing is lowered.

The README's command (scripts/test.sh) runs them in a lane of their own, two workers at
nice 10 beside the workers that run the rest (``keep_the_lane``): on two cores the tests
that wait on slots leave a core idle most of the time, and the CPU-only tests take it.

Where it went: what the README's command prints after its slowest tests.

On two cores the suite's length is kept under watch by where the CPU goes as well as by
the slowest tests (a test that waits 30 s on slots costs little CPU; one that starts 70
Django processes costs 45 s of it): more workers help only while a core is idle. Each
test's CPU is its worker's own plus that of the processes it started and reaped (a
scheduler's job processes too, once the scheduler has reaped them); the database
servers' is not counted. On with ``EXCLUSIVE_JOBS_TEST_CPU=1`` (scripts/test.sh
sets it); the hooks are taken in by conftest.py.
"""

from __future__ import annotations

import os
import resource
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

ON = os.environ.get("EXCLUSIVE_JOBS_TEST_CPU") == "1"
NO_DEADLINE_NICE = 10
SHOWN = 15
_costs: dict[str, float] = {}  # test id -> CPU seconds (a worker's, or every worker's)


def _may_renice() -> bool:
    """Whether this process may raise its priority back to where it is now."""
    now = os.getpriority(os.PRIO_PROCESS, 0)
    return os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20 - now


MAY_RENICE = _may_renice()


def cpu_only(item: pytest.Item) -> bool:
    """Marked ``no_deadline`` and not beside a scheduler (the ``schedulers`` fixture)."""
    return item.get_closest_marker("no_deadline") is not None and "schedulers" not in getattr(
        item, "fixturenames", ()
    )


@pytest.fixture(autouse=True)
def below_the_tests_with_deadlines(request: pytest.FixtureRequest) -> Iterator[None]:
    """A ``no_deadline`` test runs at nice 10 (on Linux a thread's: this worker's main
    thread, and the processes it starts inherit it)."""
    if not cpu_only(request.node) or not MAY_RENICE:
        yield
        return
    before = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, max(before, NO_DEADLINE_NICE))
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)


def keep_the_lane(config: pytest.Config, items: list[pytest.Item]) -> None:
    """scripts/test.sh runs the suite in two lanes side by side: the tests with deadlines
    on its workers, the CPU-only ones on two workers at nice 10 (``EXCLUSIVE_JOBS_TEST_LANE``
    ``deadlines`` or ``cpu``; unset: every test). Each lane deselects the other's."""
    lane = os.environ.get("EXCLUSIVE_JOBS_TEST_LANE", "")
    if lane not in ("deadlines", "cpu"):
        return
    kept: list[pytest.Item] = []
    other: list[pytest.Item] = []
    for item in items:
        (kept if cpu_only(item) == (lane == "cpu") else other).append(item)
    if other:
        config.hook.pytest_deselected(items=other)
        items[:] = kept


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    before = _cpu() if ON else 0.0
    yield
    if ON:
        _costs[item.nodeid] = _cpu() - before


def pytest_sessionfinish(session: pytest.Session) -> None:
    output = getattr(session.config, "workeroutput", None)
    if ON and output is not None:  # an xdist worker: its tests' costs go to the controller
        output["cpu"] = dict(_costs)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    _costs.update(getattr(node, "workeroutput", {}).get("cpu", {}))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not ON or not _costs or hasattr(terminalreporter.config, "workeroutput"):
        return
    files: Counter[str] = Counter()
    for test, seconds in _costs.items():
        files[test.split("::")[0]] += seconds
    write = terminalreporter.write_line
    terminalreporter.section("CPU (the workers' and the processes they reaped)")
    write(f"{sum(_costs.values()):.0f} s of CPU in {len(_costs)} tests; the files that took most:")
    for name, seconds in files.most_common(SHOWN):
        write(f"{seconds:8.1f} s  {name}")
    write("the tests that took most:")
    for test, seconds in Counter(_costs).most_common(SHOWN):
        write(f"{seconds:8.1f} s  {test}")

"""The suite's CPU, test by test: what the README's command prints after its slowest tests.

On two cores the suite is bound by CPU as soon as it runs on more than two workers, so
its length is kept under watch by where the CPU goes, not only by the slowest tests (a
test that waits 30 s on slots costs little; one that starts 70 Django processes costs
45 s of CPU). Each test's CPU is its worker's own plus that of the processes it started
and reaped (a scheduler's job processes too, once the scheduler has reaped them); the
database servers' is not counted. On with ``EXCLUSIVE_JOBS_TEST_CPU=1`` (scripts/test.sh
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
SHOWN = 15
_costs: dict[str, float] = {}  # test id -> CPU seconds (a worker's, or every worker's)


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

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connections

from django_exclusive_jobs.conf import DEFAULTS

from .cpu_report import (  # noqa: F401  (the suite's CPU: who gets it first, where it went)
    below_the_tests_with_deadlines,
    keep_the_lane,
    pytest_runtest_protocol,
    pytest_sessionfinish,
    pytest_terminal_summary,
    pytest_testnodedown,
)

# Seconds before and after each hour a test does not start in: the app's default slot
# tolerance plus 10 s for the test to run, and 5 s after.
HOURS_EDGE = (DEFAULTS["SLOT_TOLERANCE"].total_seconds() + 10, 5.0)


def seconds_to_wait_out_the_hours_edge(now: float, period: float = 3600) -> float:
    """How long a test starting at ``now`` (epoch seconds) waits: 0 unless it is within
    :data:`HOURS_EDGE` of an hour (or of a multiple of ``period`` seconds)."""
    into = now % period
    before, after = HOURS_EDGE
    if into < after:
        return after - into
    if into > period - before:
        return period - into + after
    return 0.0


@pytest.fixture(autouse=True)
def clear_of_the_hours_edge() -> None:
    """Many tests call an hourly job directly and read "the current slot" first. Within
    the slot tolerance before an hour, a start rightly serves the coming slot early, and
    a retry is rightly not run before its slot's time: such a test would see another
    slot than it planned for (CI failed three that way at 07:59:5x). No test starts
    there."""
    time.sleep(seconds_to_wait_out_the_hours_edge(time.time()))


# Test-id name of each backend -> its alias in tests/settings.py
BACKENDS = {"sqlite": "default", "postgresql": "postgres", "mysql": "mysql"}


# The longest test by far (spin's jobs-faults check: 3-4 min of CPU under four workers)
# goes first: collected in its place, it started after 13 minutes once and ran on alone
# for over a minute after every other test had ended.
FIRST = ("tests/test_model.py::test_the_model_holds[jobs-faults]",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep_the_lane(config, items)
    items.sort(key=lambda item: item.nodeid not in FIRST)  # stable: the rest keep their order


def pytest_report_header(config: pytest.Config) -> list[str]:
    from django.conf import settings as s

    lines = [f"backends: {', '.join(a for a in BACKENDS.values() if a in s.DATABASES)}"]
    lines += [f"unavailable: {alias}: {why}" for alias, why in s.UNAVAILABLE.items()]
    return lines


@pytest.fixture(scope="session")
def django_db_setup(django_test_environment: None, django_db_blocker: Any) -> Iterator[None]:
    """Create every test database once, and tell worker processes their names."""
    from django.test.utils import setup_databases, teardown_databases

    with django_db_blocker.unblock():
        config = setup_databases(verbosity=0, interactive=False, aliases=set(settings.DATABASES))
        names = {alias: connections[alias].settings_dict["NAME"] for alias in settings.DATABASES}
    os.environ["EXCLUSIVE_JOBS_TEST_DB_NAMES"] = json.dumps(names)
    yield
    with django_db_blocker.unblock():
        connections.close_all()
        teardown_databases(config, verbosity=0)


def clean_tables(alias: str) -> None:
    from django_tasks_db.models import DBTaskResult

    from django_exclusive_jobs.models import (
        JobChange,
        JobLock,
        JobRun,
        JobState,
        RunRequest,
        RunTimeSchedule,
        RunTotal,
        Scheduler,
    )

    models = (
        RunRequest, JobLock, JobRun, RunTotal, Scheduler, JobState, JobChange, DBTaskResult,
        RunTimeSchedule,
    )  # fmt: skip
    for model in models:
        model.objects.using(alias).all().delete()


@pytest.fixture(params=list(BACKENDS))
def alias(
    request: pytest.FixtureRequest, django_db_setup: None, django_db_blocker: Any
) -> Iterator[str]:
    """Each test that takes this runs once per database backend, in autocommit."""
    name = BACKENDS[request.param]
    if name not in settings.DATABASES:
        pytest.skip(f"{request.param}: {settings.UNAVAILABLE.get(name, 'not configured')}")
    with django_db_blocker.unblock():
        clean_tables(name)
        try:
            yield name
        finally:
            clean_tables(name)
            connections.close_all()


@pytest.fixture
def forget_bulk_jobs() -> Iterator[None]:
    """Unregisters the ``bulk_NNNN`` jobs a test declared (the query-count tests)."""
    yield
    from django_exclusive_jobs.run.registry import _jobs

    for name in [name for name in _jobs if name.startswith("bulk_")]:
        _jobs.pop(name, None)


@pytest.fixture
def postgres(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    """The PostgreSQL test database, with clean lock tables."""
    if "postgres" not in settings.DATABASES:
        pytest.skip(f"postgres: {settings.UNAVAILABLE.get('postgres', 'not configured')}")
    with django_db_blocker.unblock():
        clean_tables("postgres")
        try:
            yield "postgres"
        finally:
            clean_tables("postgres")
            connections.close_all()

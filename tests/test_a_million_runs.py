"""A thousand jobs and a million runs: the jobs page, the health overview and a metrics
scrape each send as many queries as for one job with ten runs.

The history is written once per database for the three (a million rows take 10-30 s to
write and as long to delete; each surface's own test file checks it with fewer rows)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.core.management.color import no_style
from django.db import connections
from django.test import Client
from django.test.utils import CaptureQueriesContext

from django_exclusive_jobs.health import overview
from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.models import JobLock, JobRun, RunRequest

from .test_metrics import bulk_jobs, scrape_as_before
from .test_metrics import count_queries as scrape
from .test_pictures import jobs_page, jobs_page_as_before

pytestmark = pytest.mark.no_deadline  # CPU only, no deadline: nice 10 (tests/cpu_report.py)

JOBS = 1000
RUNS = 1_000_000


@pytest.fixture
def truncate_runs(alias: str) -> Iterator[None]:
    """Empties the run table with TRUNCATE when the test ends: the flush after a
    transactional test deletes row by row on MariaDB (67-107 s for a million rows)."""
    yield
    connection = connections[alias]
    tables = [JobRun._meta.db_table, RunRequest._meta.db_table]
    flush = connection.ops.sql_flush(no_style(), tables, reset_sequences=True, allow_cascade=True)
    connection.ops.execute_sql_flush(flush)


def look_at_health(alias: str) -> int:
    with CaptureQueriesContext(connections[alias]) as queries:
        overview(alias)
    return len(queries)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True, databases="__all__")
@pytest.mark.usefixtures("forget_bulk_jobs", "truncate_runs")
def test_the_jobs_page_health_and_a_scrape_send_as_many_queries_for_a_million_runs(
    alias: str,
) -> None:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    JobLock.objects.using(alias).create(name="quick", token=1)
    now = database_now(alias)
    JobRun.objects.using(alias).bulk_create(
        JobRun(name="quick", status="succeeded", started_at=now, finished_at=now, duration=1.0)
        for _ in range(10)
    )
    # Each one's first look makes the declared jobs' missing lock rows.
    jobs_page(client, alias)
    overview(alias)
    scrape(alias)
    _, page_few = jobs_page(client, alias)
    health_few = look_at_health(alias)
    scrape_few, _ = scrape(alias)

    bulk_jobs(alias, JOBS, RUNS)
    assert JobRun.objects.using(alias).count() == RUNS + 10

    _, page_many, page_took = jobs_page_as_before(client, alias, page_few, jobs=JOBS, runs=RUNS)
    assert look_at_health(alias) == health_few
    scrape_took = scrape_as_before(alias, scrape_few, jobs=JOBS, runs=RUNS)
    logging.getLogger(__name__).warning(
        "%s: %s jobs, %s runs: the jobs page %s queries in %.2fs, health %s, a scrape %s in %.2fs",
        alias,
        JOBS,
        RUNS,
        page_many,
        page_took,
        health_few,
        scrape_few,
        scrape_took,
    )

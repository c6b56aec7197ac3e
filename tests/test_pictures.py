"""The pictures: each job's strip of its last runs on the jobs page, a job's durations over
30 days on its page; their geometry, what the pages draw, and what they cost the database."""

from __future__ import annotations

import datetime as dt
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings
from django.urls import reverse

from django_exclusive_jobs import exclusive_job
from django_exclusive_jobs.admin import pictures
from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.models import JobLock, JobRun
from django_exclusive_jobs.run.registry import _jobs
from django_exclusive_jobs.run.status import RunStatus

from .test_operate import insert_runs

JOBS = reverse("admin:django_exclusive_jobs_jobstate_changelist")
JOB = reverse("admin:django_exclusive_jobs_jobstate_job")
T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


@dataclass
class Row:
    """A run as the pictures read it."""

    pk: int
    status: str
    duration: float | None
    started_at: dt.datetime = T0
    slot: dt.datetime | None = None


def rows(*runs: tuple[str, float | None]) -> list[Row]:
    """Runs newest first, as ``last_runs`` reads them."""
    return [
        Row(pk, status, seconds, started_at=T0 - dt.timedelta(minutes=pk))
        for pk, (status, seconds) in enumerate(runs, start=1)
    ]


# --- the strip's geometry ---------------------------------------------------------------


def test_the_newest_run_is_at_the_right_end_and_the_oldest_on_its_left() -> None:
    strip = pictures.strip(rows(("succeeded", 1.0), ("failed", 2.0), ("succeeded", 3.0)))
    assert [bar.run_id for bar in strip.bars] == [3, 2, 1]
    xs = [bar.x for bar in strip.bars]
    assert xs == sorted(xs)
    assert strip.bars[-1].x + pictures.BAR_WIDTH <= strip.width
    assert strip.width - strip.bars[-1].x == pictures.BAR_STEP


def test_a_bars_height_is_its_duration_against_the_longest_one() -> None:
    strip = pictures.strip(rows(("succeeded", 10.0), ("succeeded", 5.0), ("succeeded", 0.0001)))
    longest, half, tiny = (bar for bar in reversed(strip.bars))
    assert longest.height == pictures.BAR_AREA
    assert half.height == pictures.BAR_AREA / 2
    assert tiny.height == pictures.LOWEST  # still seen
    for bar in strip.bars:
        assert bar.y + bar.height == pictures.BAR_AREA  # every bar stands on the baseline


def test_each_status_has_a_look_and_missed_and_skipped_slots_are_no_bars() -> None:
    assert set(pictures.LOOKS) == set(RunStatus)
    assert {look for look, _ in pictures.LEGEND} == set(pictures.LOOKS.values())
    strip = pictures.strip(
        rows(("missed", None), ("skipped", None), ("failed", 1.0), ("running", None))
    )
    looks = {bar.look: bar for bar in strip.bars}
    assert set(looks) == {"missed", "skipped", "failed", "running"}
    assert looks["missed"].height == pictures.BAR_AREA  # a full-height outline: a gap
    assert looks["skipped"].height == 0  # a circle on the baseline
    assert looks["failed"].marked and looks["running"].marked
    assert not looks["missed"].marked
    assert strip.label == "the last 4 runs: 1 running, 1 failed, 1 missed, 1 skipped"


def test_a_strip_holds_at_most_its_runs_and_a_title_tells_slot_status_duration() -> None:
    many = rows(*[("succeeded", 1.0)] * (pictures.STRIP_RUNS + 5))
    assert len(pictures.strip(many).bars) == pictures.STRIP_RUNS
    run = Row(7, "timed_out", 150.0, slot=T0)
    assert pictures.title(run) == "2026-03-01 12:00:00: timed out, 2.5 min"


# --- the chart's geometry ---------------------------------------------------------------


def chart_of(durations: list[float], **kwargs: Any) -> pictures.Chart:
    now = T0
    runs = [
        Row(n, "succeeded", seconds, started_at=now - dt.timedelta(days=len(durations) - n))
        for n, seconds in enumerate(durations, start=1)
    ]
    return pictures.chart(runs, now=now, **kwargs)


def test_the_chart_puts_every_point_inside_the_plot_later_runs_to_the_right() -> None:
    chart = chart_of([1.0, 4.0, 2.0, 8.0], median=3.0, timeout=None)
    xs = [point.x for point in chart.points]
    assert xs == sorted(xs)
    for point in chart.points:
        assert chart.left <= point.x <= chart.right
        assert chart.top <= point.y <= chart.bottom
    assert chart.line.split() == [f"{p.x},{p.y}" for p in chart.points]
    assert chart.x_ticks[0].x == chart.left and chart.x_ticks[-1].x == chart.right
    assert chart.y_ticks[0].y == chart.bottom and chart.y_ticks[0].seconds == 0


def test_the_median_and_the_timeout_are_lines_at_their_height() -> None:
    chart = chart_of([1.0, 4.0, 2.0, 8.0], median=3.0, timeout=10.0)
    assert chart.median is not None and chart.timeout is not None
    longest = min(chart.points, key=lambda p: p.y)
    assert chart.timeout.y < longest.y < chart.median.y  # 10 s above 8 s above 3 s
    scale = (chart.bottom - chart.median.y) / 3.0
    assert chart.bottom - chart.timeout.y == pytest.approx(10.0 * scale, abs=0.2)
    assert chart.timeout_above is None


def test_a_timeout_far_above_the_runs_is_said_and_not_drawn() -> None:
    far = 1 + pictures.TIMEOUT_SHOWN_UP_TO * 8.0
    chart = chart_of([1.0, 8.0], median=None, timeout=far)
    assert chart.timeout is None and chart.median is None
    assert chart.timeout_above == far
    assert chart.y_ticks[-1].seconds < far
    assert [tick.seconds for tick in chart.y_ticks] == [0, 2.5, 5, 7.5, 10]  # round, over 8 s


# --- the queries ------------------------------------------------------------------------


def test_last_runs_reads_each_jobs_newest_runs_in_one_query(alias: str) -> None:
    now = database_now(alias)
    for name, count in (("a", 7), ("b", 2)):
        JobRun.objects.using(alias).bulk_create(
            JobRun(name=name, status="missed", started_at=now - dt.timedelta(minutes=n))
            for n in range(count)
        )
    with CaptureQueriesContext(connections[alias]) as seen:
        found = list(JobRun.objects.using(alias).last_runs(5))
    assert len(seen) == 1
    by_job: dict[str, list[dt.datetime]] = {}
    for run in found:
        by_job.setdefault(run.name, []).append(run.started_at)
    assert by_job == {
        "a": [now - dt.timedelta(minutes=n) for n in range(5)],
        "b": [now - dt.timedelta(minutes=n) for n in range(2)],
    }


# --- the pages --------------------------------------------------------------------------


@pytest.fixture
def admin_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


def jobs_page(client: Client, alias: str) -> tuple[str, int]:
    with (
        override_settings(EXCLUSIVE_JOBS={"DATABASE": alias}),
        CaptureQueriesContext(connections[alias]) as seen,
    ):
        answer = client.get(JOBS)
    assert answer.status_code == 200
    return answer.content.decode(), len(seen)


def job_row(html: str, name: str) -> str:
    start = html.index(f'<tr class="job-row" data-job="{name}">')
    return html[start : html.index("</tr>", start)]


@pytest.mark.django_db(transaction=True)
def test_the_jobs_page_draws_each_jobs_strip_escaped(admin_client: Client) -> None:
    evil = "<script>alert('strip')</script>"

    @exclusive_job(evil, using="default")
    def bad() -> None:
        raise ValueError("<b>boom</b>")

    try:
        with pytest.raises(ValueError, match="boom"):
            bad()
        html, _ = jobs_page(admin_client, "default")
        row = job_row(html, "&lt;script&gt;alert(&#x27;strip&#x27;)&lt;/script&gt;")
        [bar] = re.findall(r'<a href="[^"]+" class="ej-bar ej-failed">.*?</a>', row)
        run = JobRun.objects.get(name=evil)
        assert f'href="/admin/django_exclusive_jobs/jobrun/{run.pk}/change/"' in bar
        assert f"<title>{pictures.title(run)}</title>" in bar
        assert '<use href="#ej-mark-failed"' in bar
        assert "<script>" not in html and "<b>boom" not in html
        assert html.count('id="ej-pattern-failed"') == 1  # defined once for every strip
        assert 'class="ej-legend"' in html
    finally:
        _jobs.pop(evil, None)


@pytest.mark.django_db(transaction=True)
def test_a_jobs_page_charts_its_durations_with_the_median_and_the_timeout(
    admin_client: Client,
) -> None:
    @exclusive_job("charted", using="default", timeout="20s")
    def charted() -> None:
        pass

    try:
        now = database_now("default")
        durations = [4.0, 6.0, 5.0, 30.0]  # the last one ran past the timeout
        statuses = ["succeeded", "succeeded", "succeeded", "timed_out"]
        JobRun.objects.bulk_create(
            JobRun(
                name="charted",
                status=status,
                started_at=now - dt.timedelta(days=len(durations) - n),
                duration=seconds,
            )
            for n, (status, seconds) in enumerate(zip(statuses, durations, strict=True))
        )
        JobRun.objects.create(  # older than the chart's 30 days: not on it
            name="charted", status="succeeded", started_at=now - dt.timedelta(days=40), duration=9
        )
        answer = admin_client.get(JOB, {"job": "charted"})
        assert answer.status_code == 200
        html = answer.content.decode()
        assert html.count('class="ej-point-link') == len(durations)
        assert html.count('<use href="#ej-point-timed-out"') == 1
        assert "median 5.0 s" in html  # the median of the successful runs
        assert "timeout 20.0 s" in html
        assert 'id="job-strip"' in html and html.count('" class="ej-bar ej-') == 5
        assert answer.context["chart_runs"] == len(durations)
        missing = admin_client.get(JOB, {"job": "no such job"})
        assert missing.status_code == 302
    finally:
        _jobs.pop("charted", None)


def jobs_page_as_before(
    client: Client, alias: str, few: int, *, jobs: int, runs: int
) -> tuple[str, int, float]:
    """The jobs page, after ``runs`` runs of ``jobs`` bulk jobs were written: it sends
    ``few`` queries, as before them, and bulk_0007's strip shows its last runs."""
    started = time.monotonic()
    html, many = jobs_page(client, alias)
    took = time.monotonic() - started
    assert many == few
    assert job_row(html, "bulk_0007").count('class="ej-bar ej-ok"') == min(
        pictures.STRIP_RUNS, runs // jobs
    )
    return html, many, took


def page_costs_the_same(client: Client, alias: str, jobs: int, runs: int) -> None:
    """The jobs page sends as many queries for ``jobs`` jobs and ``runs`` runs as for one
    job with ten, and each strip shows its job's last runs."""
    JobLock.objects.using(alias).create(name="quick", token=1)
    now = database_now(alias)
    JobRun.objects.using(alias).bulk_create(
        JobRun(name="quick", status="succeeded", started_at=now - dt.timedelta(minutes=n))
        for n in range(10)
    )
    jobs_page(client, alias)  # its first look makes the declared jobs' missing lock rows
    _, few = jobs_page(client, alias)
    names = [f"bulk_{n:04d}" for n in range(jobs)]
    for name in names:
        exclusive_job(name, every="1h")(lambda: None)
    JobLock.objects.using(alias).bulk_create(
        [JobLock(name=name, token=1) for name in names], batch_size=500
    )
    insert_runs(alias, names, runs)
    html, many, took = jobs_page_as_before(client, alias, few, jobs=jobs, runs=runs)
    logging.getLogger(__name__).warning(
        "%s: the jobs page with %s jobs and %s runs: %s queries, %.2fs, %d kB",
        alias,
        jobs,
        runs,
        many,
        took,
        len(html) // 1024,
    )


@pytest.mark.django_db(transaction=True, databases="__all__")
@pytest.mark.usefixtures("forget_bulk_jobs")
def test_the_jobs_page_query_count_does_not_grow_with_jobs_or_runs(
    admin_client: Client, alias: str
) -> None:
    page_costs_the_same(admin_client, alias, jobs=50, runs=10_000)

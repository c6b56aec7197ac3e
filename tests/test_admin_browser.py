"""The admin in a real headless Chromium (Debian's), driven by Playwright.

Screenshots go to tests/.artifacts/screenshots; with UPDATE_DOCS_SCREENSHOTS=1 they are
also copied to docs/_static/screenshots for the documentation.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from django_exclusive_jobs import exclusive_job
from django_exclusive_jobs.models import JobLock, LockState
from django_exclusive_jobs.run.registry import _jobs

from .helpers import expire_now, other_holder

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "tests" / ".artifacts" / "screenshots"
DOC_SHOTS = ROOT / "docs" / "_static" / "screenshots"

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.environ.get("CI"):
        if not Path(CHROMIUM).exists():
            pytest.skip("Chromium is not installed (apt-get install chromium)")
        pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop on this thread; the test's own ORM calls
    # are still plain synchronous code, so let Django allow them here.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            yield browser
        finally:
            browser.close()
            if previous is None:
                os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
            else:
                os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


def shot(page: Any, name: str, part: str | None = None) -> None:
    """The whole page, or with ``part`` (a selector) only what it matches."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    if part is not None:
        page.locator(part).first.screenshot(path=str(path))
    else:
        page.screenshot(path=str(path), full_page=True)
    if os.environ.get("UPDATE_DOCS_SCREENSHOTS"):
        DOC_SHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, DOC_SHOTS / path.name)


def state_of(name: str) -> str:
    return JobLock.objects.with_state().get(name=name).state  # type: ignore[attr-defined]


def log_in(page: Any, base: str) -> None:
    page.goto(f"{base}/admin/login/?next=/admin/")
    page.fill("#id_username", "oncall")
    page.fill("#id_password", "correct horse")
    page.click("input[type=submit]")
    page.wait_for_url(f"{base}/admin/")


def choose_action(page: Any, names: list[str], action: str) -> None:
    for name in names:
        row = page.locator("#result_list tbody tr", has_text=name)
        row.locator("input.action-select").check()
    page.select_option("select[name=action]", action)
    page.click("button[name=index]")


def test_on_call_engineer_force_releases_a_stale_lock_but_not_a_held_one(
    browser: Any, live_server: Any, request: pytest.FixtureRequest
) -> None:
    User.objects.create_superuser("oncall", password="correct horse")

    @exclusive_job("nightly_export", using="default")
    def nightly_export() -> None:
        raise ConnectionError("export bucket unreachable <b>not bold</b>")

    # Gone from the registry afterwards: the docs' tests declare a job of that name too.
    request.addfinalizer(lambda: _jobs.pop("nightly_export", None))

    with pytest.raises(ConnectionError):
        nightly_export()

    with other_holder("default") as other:
        other.try_acquire("hourly_report", ttl=600)
        other.try_acquire("cleanup_sessions", ttl=600)
        expire_now("default", "cleanup_sessions")  # its server died mid-job

        context = browser.new_context(viewport={"width": 1600, "height": 800})
        page = context.new_page()
        try:
            log_in(page, live_server.url)
            page.goto(f"{live_server.url}/admin/django_exclusive_jobs/joblock/")
            for name in ("nightly_export", "hourly_report", "cleanup_sessions"):
                assert page.locator("#result_list tbody tr", has_text=name).count() == 1
            held = page.locator("#result_list tbody tr", has_text="hourly_report")
            stale = page.locator("#result_list tbody tr", has_text="cleanup_sessions")
            assert held.locator(".exclusive-jobs-held").is_visible()
            assert stale.locator(".exclusive-jobs-stale").is_visible()
            assert "ends in" in held.inner_text()
            shot(page, "admin-locks")

            # The expired lock goes through the safe action.
            choose_action(page, ["cleanup_sessions"], "force_release_stale")
            assert "Force-released 1 stale lock." in page.locator(".messagelist").inner_text()
            assert state_of("cleanup_sessions") == LockState.FREE

            # The live one is shown as live and refused without the extra box.
            choose_action(page, ["hourly_report"], "force_release_selected")
            assert "HELD: its job may still be running" in page.inner_text("#force-release-list")
            assert page.locator("#release-held").is_visible()
            shot(page, "admin-force-release-confirmation")
            page.click("input[type=submit][value='Yes, force-release']")
            assert (
                "Not released, still held: hourly_report"
                in page.locator(".messagelist").inner_text()
            )
            assert state_of("hourly_report") == LockState.HELD

            # The failed run's traceback is one click away.
            page.goto(f"{live_server.url}/admin/django_exclusive_jobs/jobrun/?status=failed")
            assert page.locator(".exclusive-jobs-failed").first.is_visible()
            shot(page, "admin-runs")
            page.click("#result_list tbody tr a")
            traceback = page.locator("pre.exclusive-jobs-traceback")
            assert "Traceback (most recent call last)" in traceback.inner_text()
            assert "export bucket unreachable <b>not bold</b>" in traceback.inner_text()
            assert page.locator("pre.exclusive-jobs-traceback b").count() == 0
            shot(page, "admin-run-detail")

            page.goto(f"{live_server.url}/admin/django_exclusive_jobs/jobstate/")
            row = page.locator("#jobs tr.job-row", has_text="nightly_export")
            assert "failing" in row.inner_text()
        finally:
            context.close()


@pytest.mark.no_deadline  # no scheduler, no slot: at nice 10 (tests/cpu_report.py)
def test_admin_pages_follow_dark_mode(browser: Any, live_server: Any) -> None:
    User.objects.create_superuser("oncall", password="correct horse")
    with other_holder("default") as other:
        other.try_acquire("hourly_report", ttl=600)
        context = browser.new_context(viewport={"width": 1600, "height": 600}, color_scheme="dark")
        page = context.new_page()
        try:
            log_in(page, live_server.url)
            page.goto(f"{live_server.url}/admin/django_exclusive_jobs/joblock/")
            badge = page.locator(".exclusive-jobs-held").first
            color = badge.evaluate("el => getComputedStyle(el).color")
            body = page.evaluate("getComputedStyle(document.body).color")
            assert color == body  # badge text follows the theme's text colour
            assert page.evaluate("getComputedStyle(document.body).backgroundColor") != (
                "rgb(255, 255, 255)"
            )
            shot(page, "admin-locks-dark")
            page.goto(f"{live_server.url}/admin/django_exclusive_jobs/jobstate/")
            assert page.locator("#jobs tr.job-row").count() >= 5
            shot(page, "admin-jobs-dark")
        finally:
            context.close()


def test_on_call_engineer_pauses_resumes_and_runs_a_job_now(
    browser: Any, live_server: Any, tmp_path: Path
) -> None:
    from django.contrib.auth.models import Permission

    from .test_command import command_env, manage, runs
    from .test_scheduler import start_scheduler, stop

    user = User.objects.create_user("oncall", password="correct horse", is_staff=True)
    for codename in ("view_jobstate", "change_jobstate", "view_jobrun", "view_joblock"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    marker = tmp_path / "marker.txt"
    env = command_env(marker, TICK_EVERY="1h")
    context = browser.new_context(viewport={"width": 1600, "height": 900})
    page = context.new_page()
    jobs_page = f"{live_server.url}/admin/django_exclusive_jobs/jobstate/"
    schedulers: list[Any] = []
    try:
        log_in(page, live_server.url)
        page.goto(jobs_page)
        quick = page.locator("#jobs tr[data-job=quick]")
        quick.locator("a.button", has_text="Pause").click()
        assert "will skip it" in page.inner_text("#what-happens")
        page.fill("#id_reason", "the vendor's API is down")
        shot(page, "admin-jobs-pause-confirmation")
        page.click("#confirm")
        assert "Paused quick." in page.locator(".messagelist").inner_text()
        assert "paused" in page.locator("#jobs tr[data-job=quick]").inner_text()

        skipped = manage("default", "quick", env=env)
        assert skipped.returncode == 0, skipped.stderr
        assert "skipped quick: paused by oncall (admin)" in skipped.stdout
        assert runs(marker, "quick") == 0

        quick = page.locator("#jobs tr[data-job=quick]")
        quick.locator("a.button", has_text="Resume").click()
        page.click("#confirm")
        assert "Resumed quick." in page.locator(".messagelist").inner_text()

        # A scheduler serves the request within seconds (it polls every 5 s).
        start_scheduler(schedulers, "default", "--exclude", "tick_all", env=env)
        quick = page.locator("#jobs tr[data-job=quick]")
        quick.locator("a.button", has_text="Run now").click()
        page.click("#confirm")
        assert "Asked for a run of quick" in page.locator(".messagelist").inner_text()
        deadline = time.monotonic() + 60
        while runs(marker, "quick") < 1:
            assert time.monotonic() < deadline, "no scheduler ran the request"
            time.sleep(0.2)
        page.goto(f"{live_server.url}/admin/django_exclusive_jobs/jobrun/?name=quick")
        assert page.locator("#result_list tbody tr").count() == 1
        page.goto(jobs_page)
        shot(page, "admin-jobs")
        for process in schedulers:
            stop(process)
        assert runs(marker, "quick") == 1  # one request, one run
    finally:
        for process in schedulers:
            if process.poll() is None:
                process.kill()
                process.communicate(timeout=30)
        context.close()


def test_on_call_engineer_runs_a_job_now_with_arguments(
    browser: Any, live_server: Any, tmp_path: Path
) -> None:
    from django.contrib.auth.models import Permission

    from django_exclusive_jobs.models import JobRun, RunRequest

    from .test_command import command_env
    from .test_scheduler import start_scheduler, stop

    user = User.objects.create_user("oncall", password="correct horse", is_staff=True)
    for codename in ("view_jobstate", "change_jobstate"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    marker = tmp_path / "marker.txt"
    env = command_env(marker, TICK_EVERY="1h")
    context = browser.new_context(viewport={"width": 1600, "height": 900})
    page = context.new_page()
    schedulers: list[Any] = []
    try:
        start_scheduler(schedulers, "default", "--jobs", "digest", env=env)
        log_in(page, live_server.url)
        page.goto(f"{live_server.url}/admin/django_exclusive_jobs/jobstate/")
        page.locator("#jobs tr[data-job=digest]").locator("a.button", has_text="Run now").click()
        arguments = page.locator("#id_arguments")
        assert arguments.input_value() == '{"recipients": ["ops@example.com"], "limit": 5}'
        arguments.fill('{"limt": 2}')  # a typo: refused on the form, nothing asked
        page.click("#confirm")
        assert "unknown argument 'limt'" in page.locator(".errorlist").inner_text()
        assert not RunRequest.objects.exists()
        page.locator("#id_arguments").fill('{"limit": 2}')
        shot(page, "admin-run-now-arguments")
        page.click("#confirm")
        assert 'with arguments {"limit": 2}' in page.locator(".messagelist").inner_text()
        asked = JobRun.objects.filter(name="digest", requested_by="oncall (admin)")
        deadline = time.monotonic() + 60
        while not asked.filter(finished_at__isnull=False).exists():
            assert time.monotonic() < deadline, "no scheduler ran the request"
            time.sleep(0.2)
        [run] = asked
        assert (run.status, run.kwargs) == (
            "succeeded",
            {"recipients": ["ops@example.com"], "limit": 2},
        )
        for process in schedulers:
            stop(process)
        assert "digest ops@example.com 2" in marker.read_text()  # the job got them
    finally:
        for process in schedulers:
            if process.poll() is None:
                process.kill()
                process.communicate(timeout=30)
        context.close()


@pytest.mark.no_deadline  # no scheduler, no slot: at nice 10 (tests/cpu_report.py)
def test_a_viewer_sees_no_buttons_and_a_forged_post_is_refused(
    browser: Any, live_server: Any
) -> None:
    from django.contrib.auth.models import Permission

    user = User.objects.create_user("oncall", password="correct horse", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_jobstate"))
    context = browser.new_context(viewport={"width": 1600, "height": 900})
    page = context.new_page()
    try:
        log_in(page, live_server.url)
        page.goto(f"{live_server.url}/admin/django_exclusive_jobs/jobstate/")
        assert page.locator("#jobs tr.job-row").count() >= 5
        assert page.locator("#jobs a.button").count() == 0
        # A forged POST from the page itself, with its CSRF token: still refused.
        status = page.evaluate(
            """async () => {
                const token = document.cookie.match(/csrftoken=([^;]+)/)[1];
                const body = new URLSearchParams({job: "quick", confirm: "yes"});
                const answer = await fetch("act/pause/", {method: "POST", body,
                    headers: {"X-CSRFToken": token}});
                return answer.status;
            }"""
        )
        assert status == 403
    finally:
        context.close()


def test_on_call_engineer_cancels_a_waiting_run_and_acknowledges_a_crashed_scheduler(
    browser: Any, live_server: Any
) -> None:
    import datetime as dt

    from django_exclusive_jobs.lock.clock import database_now
    from django_exclusive_jobs.models import RunRequest, Scheduler
    from django_exclusive_jobs.run import control

    User.objects.create_superuser("oncall", password="correct horse")
    now = database_now("default")
    Scheduler.objects.create(  # killed with -9 three minutes ago
        instance="k9",
        host="web-3",
        pid=4242,
        jobs=["tick"],
        started_at=now - dt.timedelta(hours=1),
        last_beat_at=now - dt.timedelta(minutes=3),
    )
    waiting = control.request_run("quick", by="alice (admin)", using="default")
    context = browser.new_context(viewport={"width": 1600, "height": 900})
    page = context.new_page()
    try:
        log_in(page, live_server.url)
        page.goto(f"{live_server.url}/admin/django_exclusive_jobs/jobstate/")
        assert "scheduler web-3:4242: gone: no beat since" in page.inner_text("#scheduler-problems")
        quick = page.locator("#jobs tr[data-job=quick]")
        request = quick.locator(".exclusive-jobs-request")
        assert "run now requested by alice (admin) at " in request.inner_text()
        assert "unserved" in quick.locator(".exclusive-jobs-badge").first.inner_text()
        problem = quick.locator(".exclusive-jobs-problem").first.inner_text()
        assert problem.endswith("waits, and no live scheduler serves it")
        shot(page, "admin-jobs-waiting-run")
        quick.locator("a.button", has_text="Cancel").click()
        assert "will not start" in page.inner_text("#what-happens")
        page.click("#confirm")
        assert "Cancelled the run of quick." in page.locator(".messagelist").inner_text()
        assert page.locator("#jobs tr[data-job=quick] .exclusive-jobs-request").count() == 0
        assert RunRequest.objects.get(pk=waiting.pk).cancelled_by == "oncall (admin)"

        page.click("#scheduler-problems a")  # the Schedulers page, filtered to the problem
        row = page.locator("#result_list tbody tr", has_text="web-3")
        assert "gone" in row.locator(".exclusive-jobs-badge").inner_text()
        assert "no clean stop" in row.inner_text()
        shot(page, "admin-schedulers")
        row.locator("input.action-select").check()
        page.select_option("select[name=action]", "acknowledge")
        page.click("button[name=index]")
        assert "Acknowledged 1 gone scheduler." in page.locator(".messagelist").inner_text()
        page.goto(f"{live_server.url}/admin/django_exclusive_jobs/jobstate/")
        assert page.locator("#scheduler-problems").count() == 0
    finally:
        context.close()


@pytest.mark.no_deadline  # no scheduler, no slot: at nice 10 (tests/cpu_report.py)
def test_on_call_engineer_previews_and_asks_for_a_backfill(browser: Any, live_server: Any) -> None:
    import datetime as dt

    from django_exclusive_jobs.lock.clock import database_now
    from django_exclusive_jobs.models import JobRun, RunRequest
    from django_exclusive_jobs.run.schedules import Every

    User.objects.create_superuser("oncall", password="correct horse")
    hour = dt.timedelta(hours=1)
    three, two, one = (
        Every(period=hour).slot_at(database_now("default")) - n * hour for n in (3, 2, 1)
    )
    JobRun.objects.create(name="backfill_slotless", slot=two, status="succeeded", started_at=two)
    context = browser.new_context(viewport={"width": 1600, "height": 900})
    page = context.new_page()
    try:
        log_in(page, live_server.url)
        page.goto(f"{live_server.url}/admin/django_exclusive_jobs/jobstate/")
        row = page.locator("#jobs tr[data-job=backfill_slotless]")
        row.locator("a.button", has_text="Backfill").click()
        warning = page.locator("#backfill-warning")
        assert warning.is_visible()
        assert "does not take a slot argument" in warning.inner_text()
        assert page.locator("#backfill-unserved").is_visible()
        page.fill("#id_start", three.strftime("%Y-%m-%dT%H:%M"))  # no zone: the job's (UTC)
        page.fill("#id_end", one.strftime("%Y-%m-%dT%H:%M"))
        page.click("#preview")
        page.locator("#backfill-slots li").first.wait_for()  # all_inner_texts does not wait
        slots = page.locator("#backfill-slots li").all_inner_texts()
        assert slots == [f"{slot:%Y-%m-%d %H:%M:%S} UTC" for slot in (three, one)]
        assert page.locator("#backfill-done li").all_inner_texts() == [
            f"{two:%Y-%m-%d %H:%M:%S} UTC (succeeded)"
        ]
        assert page.locator("#backfill-warning").is_visible()  # still there at the button
        shot(page, "admin-backfill-confirmation")
        page.click("#confirm")
        assert "Asked for a backfill of 2 slots" in page.locator(".messagelist").inner_text()
        waiting = page.locator("#jobs tr[data-job=backfill_slotless] .exclusive-jobs-request")
        assert waiting.count() == 2
        assert waiting.first.inner_text().startswith(f"backfill of slot {three:%Y-%m-%d %H:%M:%S}")
        assert [r.slot for r in RunRequest.objects.order_by("id")] == [three, one]
    finally:
        context.close()


def contrast(one: str, other: str) -> float:
    """The WCAG contrast ratio of two CSS ``rgb(r, g, b)`` colours."""

    def luminance(colour: str) -> float:
        channels = [int(c) / 255 for c in colour[colour.index("(") + 1 : -1].split(",")[:3]]
        linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    light, dark = sorted((luminance(one), luminance(other)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def pictured_runs() -> None:
    """Sixty slots, twelve hours apart, of a job with a 20 s timeout: mostly successes of
    4 to 10 s, failures, a timeout, a lost run, an interrupted one, missed and skipped
    slots."""
    import datetime as dt

    from django_exclusive_jobs.lock.clock import database_now
    from django_exclusive_jobs.models import JobRun
    from django_exclusive_jobs.run.schedules import Every

    period = dt.timedelta(hours=12)
    newest = Every(period=period).slot_at(database_now("default"))
    odd = {3: "failed", 9: "missed", 14: "timed_out", 20: "skipped", 27: "lost", 33: "interrupted"}
    odd |= {41: "failed", 42: "failed", 47: "missed"}
    rows = []
    for n in range(60):
        slot = newest - n * period
        status = odd.get(n, "succeeded")
        seconds = {"missed": None, "skipped": None, "timed_out": 20.0}.get(status, 4.0 + n % 7)
        rows.append(
            JobRun(
                name="pictured",
                slot=slot,
                status=status,
                started_at=slot,
                finished_at=slot if seconds is None else slot + dt.timedelta(seconds=seconds),
                duration=seconds,
                error="RuntimeError: disk full" if status == "failed" else "",
            )
        )
    JobRun.objects.bulk_create(rows)


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.no_deadline  # no scheduler, no slot: at nice 10 (tests/cpu_report.py)
def test_each_jobs_strip_and_a_jobs_chart_read_in_light_and_dark(
    browser: Any, live_server: Any, scheme: str
) -> None:
    from django_exclusive_jobs.run.registry import _jobs

    User.objects.create_superuser("oncall", password="correct horse")
    exclusive_job("pictured", every="12h", timeout="20s")(lambda: None)
    pictured_runs()
    context = browser.new_context(viewport={"width": 1600, "height": 900}, color_scheme=scheme)
    page = context.new_page()
    try:
        log_in(page, live_server.url)
        page.goto(f"{live_server.url}/admin/django_exclusive_jobs/jobstate/")
        row = page.locator("#jobs tr[data-job=pictured]")
        strip = row.locator("svg.ej-strip")
        assert strip.get_attribute("aria-label") == (
            "the last 50 runs: 41 succeeded, 3 failed, 1 interrupted, 1 lost, 2 missed, "
            "1 timed out, 1 skipped"
        )
        failed = strip.locator("a.ej-failed")
        assert failed.count() == 3
        assert failed.first.locator("use").get_attribute("href") == "#ej-mark-failed"
        assert failed.first.locator("title").text_content().endswith(": failed, 4.0 s")
        assert strip.locator("a.ej-missed rect").count() == 2
        assert strip.locator("a.ej-skipped circle").count() == 1
        body = page.evaluate("getComputedStyle(document.body).backgroundColor")
        ok = strip.locator("a.ej-ok rect").first.evaluate("el => getComputedStyle(el).fill")
        mark = page.locator("#ej-mark-failed path").evaluate("el => getComputedStyle(el).stroke")
        assert contrast(ok, body) >= 3, (ok, body)
        assert contrast(mark, body) >= 3, (mark, body)
        outline = strip.locator("a.ej-missed rect").first.evaluate(
            "el => getComputedStyle(el).stroke"
        )
        assert contrast(outline, body) >= 3, (outline, body)
        assert page.locator(".ej-legend li").count() == 8
        row.scroll_into_view_if_needed()
        shot(page, f"admin-jobs-strips-{scheme}")

        # The failed bar opens its run, with its error.
        failed.first.click()
        assert "disk full" in page.locator("pre.exclusive-jobs-traceback").inner_text()

        page.goto(f"{live_server.url}/admin/django_exclusive_jobs/jobstate/")
        page.locator("#jobs tr[data-job=pictured] a.exclusive-jobs-name").click()
        chart = page.locator("#duration-chart")
        assert chart.locator("a.ej-point-link").count() == 57  # the runs with a duration
        assert chart.locator("a.ej-timed-out use").get_attribute("href") == "#ej-point-timed-out"
        assert "timeout 20.0 s" in chart.locator("#chart-timeout").text_content()
        assert "median " in chart.locator("#chart-median").text_content()
        timeout = chart.locator("#chart-timeout line").evaluate("el => getComputedStyle(el).stroke")
        assert contrast(timeout, body) >= 3, (timeout, body)
        shot(page, f"admin-job-{scheme}")

        # The admin's theme toggle wins over the system's preference, the pictures with it.
        other = "dark" if scheme == "light" else "light"
        page.evaluate(f"document.documentElement.dataset.theme = '{other}'")
        flipped = page.evaluate("getComputedStyle(document.body).backgroundColor")
        line = chart.locator("#chart-timeout line").evaluate("el => getComputedStyle(el).stroke")
        assert flipped != body and line != timeout
        assert contrast(line, flipped) >= 3, (line, flipped)
    finally:
        context.close()
        _jobs.pop("pictured", None)


def test_operator_overrides_a_schedule_a_running_scheduler_follows_and_back_to_the_code(
    browser: Any, live_server: Any, tmp_path: Path
) -> None:
    """digest runs hourly in the code. An operator overrides it to every 2 s with other
    arguments on its page; a scheduler already running picks it up (no restart), the job
    runs at the new times; "Back to the code" restores it. A viewer sees no form and
    gets 403 on a forged POST of an override, with the page's own CSRF token."""
    from django.contrib.auth.models import Permission

    from django_exclusive_jobs.models import JobChange, JobRun, JobState
    from django_exclusive_jobs.run.scheduler import REQUEST_POLL

    from .test_command import command_env
    from .test_run_now_arguments import said
    from .test_scheduler import start_scheduler, stop

    user = User.objects.create_user("oncall", password="correct horse", is_staff=True)
    viewer = User.objects.create_user("viewer", password="correct horse", is_staff=True)
    for codename in ("view_jobstate", "change_jobstate"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    viewer.user_permissions.add(Permission.objects.get(codename="view_jobstate"))
    marker = tmp_path / "marker.txt"
    env = command_env(marker, TICK_EVERY="1h")
    job_page = f"{live_server.url}/admin/django_exclusive_jobs/jobstate/job/?job=digest"
    schedulers: list[Any] = []
    contexts = []
    try:
        start_scheduler(schedulers, "default", "--jobs", "digest", env=env)
        for scheme in ("light", "dark"):
            contexts.append(
                browser.new_context(viewport={"width": 1400, "height": 900}, color_scheme=scheme)
            )
        page = contexts[0].new_page()
        log_in(page, live_server.url)
        page.goto(job_page)
        page.click("#override-link")
        assert page.locator("#id_every").input_value() == "1h"
        page.fill("#id_every", "")
        page.fill("#id_cron", "61 * * * *")  # a bad cron: refused on the form
        page.fill("#id_reason", "load test of the mail relay")
        page.click("#preview")
        assert "is not valid" in page.locator(".errorlist").inner_text()
        page.fill("#id_cron", "")
        page.fill("#id_every", "2s")
        page.fill("#id_arguments", '{"recipients": ["relay@example.com"], "limit": 2}')
        page.click("#preview")
        page.locator("#override-preview li").first.wait_for()  # count() does not wait
        assert page.locator("#override-preview li").count() == 5
        shot(page, "admin-override-preview")
        assert not JobState.objects.filter(name="digest").exists()  # not before confirm
        page.click("#confirm")
        assert "overridden: every 2s" in page.locator(".messagelist").inner_text()
        drift = page.locator(".exclusive-jobs-drift").inner_text()
        assert "by oncall (admin)" in drift and "code says every 1h" in drift
        # The running scheduler follows within one poll: runs every 2 s, new arguments.
        deadline = time.monotonic() + 60
        while said(marker).count("digest relay@example.com 2") < 2:
            assert time.monotonic() < deadline, "the scheduler did not follow the override"
            time.sleep(0.2)
        slots = list(JobRun.objects.filter(name="digest").values_list("slot", flat=True))
        assert len(slots) == len(set(slots))  # each slot once
        page.goto(job_page)
        assert page.locator("#job-changes tr[data-action=override]").count() == 1
        shot(page, "admin-job-override")
        dark = contexts[1].new_page()
        log_in(dark, live_server.url)
        dark.goto(f"{live_server.url}/admin/django_exclusive_jobs/jobstate/")
        assert dark.locator("#jobs tr[data-job=digest] .exclusive-jobs-drift").count() == 1
        shot(dark, "admin-jobs-override-dark", "#jobs tr[data-job=digest]")
        dark.goto(job_page)
        shot(dark, "admin-job-override-dark")

        page.click("#back-link")
        page.fill("#id_reason", "load test done")
        page.click("#confirm")
        assert "runs as its code says." in page.locator(".messagelist").inner_text()
        assert page.locator(".exclusive-jobs-drift").count() == 0
        time.sleep(REQUEST_POLL + 2)  # the scheduler's next poll
        settled = len(said(marker))
        time.sleep(6)  # three of the override's slots: none runs any more
        assert len(said(marker)) == settled
        actions = list(JobChange.objects.order_by("id").values_list("action", flat=True))
        assert actions == ["override", "back_to_code"]
        for process in schedulers:
            stop(process)

        # A viewer: no override link, and a forged POST with the page's token is refused.
        other = browser.new_context(viewport={"width": 1400, "height": 900})
        contexts.append(other)
        seen = other.new_page()
        seen.goto(f"{live_server.url}/admin/login/?next=/admin/")
        seen.fill("#id_username", "viewer")
        seen.fill("#id_password", "correct horse")
        seen.click("input[type=submit]")
        seen.wait_for_url(f"{live_server.url}/admin/")
        seen.goto(job_page)
        assert seen.locator("#override-link").count() == 0
        status = seen.evaluate(
            """async () => {
                const token = document.cookie.match(/csrftoken=([^;]+)/)[1];
                const body = new URLSearchParams({job: "digest", every: "1s", overlap: "skip",
                    reason: "forged", confirm: "yes"});
                const answer = await fetch("../act/override/", {method: "POST", body,
                    headers: {"X-CSRFToken": token}});
                return answer.status;
            }"""
        )
        assert status == 403
        assert JobState.objects.get(name="digest").override == {}
    finally:
        for process in schedulers:
            if process.poll() is None:
                process.kill()
                process.communicate(timeout=30)
        for context in contexts:
            context.close()


@pytest.mark.no_deadline  # no scheduler, no slot: at nice 10 (tests/cpu_report.py)
def test_staff_add_edit_pause_and_delete_a_run_time_schedule(
    browser: Any, live_server: Any
) -> None:
    """customer_report has no schedule in the code. Staff add one for acme, every hour
    with its own arguments; it is listed, and the jobs page marks it run-time (the
    declared job: in the code). They move it to Mondays at 8, switch it off and delete
    it: each step one audited change, by them, with their reason."""
    from django.contrib.auth.models import Permission

    from django_exclusive_jobs.models import JobChange, RunTimeSchedule

    user = User.objects.create_user("oncall", password="correct horse", is_staff=True)
    for codename in ("view_jobstate", "view_jobrun", "view_joblock"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    for what in ("add", "change", "delete", "view"):
        user.user_permissions.add(Permission.objects.get(codename=f"{what}_runtimeschedule"))
    name = "customer_report:acme"
    row_of = f'#runtime-schedules tr[data-job="{name}"]'
    jobs_page = f"{live_server.url}/admin/django_exclusive_jobs/jobstate/"
    context = browser.new_context(viewport={"width": 1600, "height": 900})
    page = context.new_page()
    try:
        log_in(page, live_server.url)
        page.goto(jobs_page)
        page.click("#add-runtime-schedule")
        page.select_option("#id_job", "customer_report")
        page.fill("#id_key", "acme")
        page.fill("#id_every", "1h")
        page.fill("#id_kwargs", '{"customer": "acme", "lines": "x", "nope": 1}')
        page.fill("#id_reason", "acme signed")
        page.click("input[name=_save]")
        assert "unknown argument 'nope'" in page.locator(".errorlist.nonfield").inner_text()
        assert not RunTimeSchedule.objects.exists()
        page.fill("#id_kwargs", '{"customer": "acme"}')
        shot(page, "admin-runtime-schedule-add")
        page.click("input[name=_save]")
        assert "was added successfully" in page.locator(".messagelist").inner_text()
        listed = page.locator("#result_list tbody tr", has_text=name)
        assert "every 1h" in listed.inner_text() and "oncall (admin)" in listed.inner_text()

        page.goto(jobs_page)
        row = page.locator(row_of)
        assert "run-time" in row.locator(".exclusive-jobs-origin").inner_text()
        assert row.locator(".exclusive-jobs-next-slots li").count() == 5
        declared = page.locator("#jobs tr[data-job=customer_report] .exclusive-jobs-origin")
        assert declared.inner_text() == "in the code"
        shot(page, "admin-jobs-runtime-schedules", "#runtime-schedules")

        row.locator("a.exclusive-jobs-edit").click()
        page.fill("#id_every", "")
        page.fill("#id_cron", "0 8 * * 1")
        page.fill("#id_timezone", "Europe/Paris")
        page.fill("#id_reason", "Monday mornings")
        page.click("input[name=_continue]")
        assert "was changed successfully" in page.locator(".messagelist").inner_text()
        assert page.locator("#id_cron").input_value() == "0 8 * * 1"
        page.uncheck("#id_enabled")
        page.fill("#id_reason", "acme on holiday")
        page.click("input[name=_continue]")
        audit = page.locator("#schedule-audit #job-changes tbody tr")
        audit.nth(2).wait_for()  # count() does not wait for the page
        assert audit.count() == 3
        assert not RunTimeSchedule.objects.get(name=name).enabled
        assert "acme on holiday" in audit.first.inner_text()  # newest first
        page.goto(jobs_page)
        assert "switched off" in page.locator(row_of).inner_text()

        page.goto(page.url.replace("/jobstate/", "/runtimeschedule/"))
        page.locator("#result_list tbody tr", has_text=name).locator("a").first.click()
        page.click("a.deletelink")
        page.click("input[type=submit]")
        assert "was deleted successfully" in page.locator(".messagelist").inner_text()
        assert not RunTimeSchedule.objects.exists()
        changes = JobChange.objects.filter(name=name).order_by("id")
        assert list(changes.values_list("action", "by", "reason")) == [
            ("schedule_added", "oncall (admin)", "acme signed"),
            ("schedule_edited", "oncall (admin)", "Monday mornings"),
            ("schedule_edited", "oncall (admin)", "acme on holiday"),
            ("schedule_gone", "oncall (admin)", ""),
        ]
        edited = changes[1]
        assert edited.before["every"] == 3600 and edited.after["cron"] == "0 8 * * 1"
        assert changes[2].after == {"enabled": False}
    finally:
        context.close()

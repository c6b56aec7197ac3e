"""The admin through Django's test client: permissions, escaping, releasing locks."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_exclusive_jobs import LockLost, exclusive_job, try_acquire
from django_exclusive_jobs.admin import jobs as jobs_admin
from django_exclusive_jobs.admin.jobs import NEXT_SLOTS
from django_exclusive_jobs.health import overview
from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.models import JobLock, JobRun, LockState, Scheduler
from django_exclusive_jobs.run.preview import upcoming
from django_exclusive_jobs.run.registry import get_job

from .helpers import expire_now, other_holder

LOCKS = reverse("admin:django_exclusive_jobs_joblock_changelist")
RUNS = reverse("admin:django_exclusive_jobs_jobrun_changelist")
JOBS = reverse("admin:django_exclusive_jobs_jobstate_changelist")

pytestmark = pytest.mark.django_db(transaction=True)


def make_user(name: str, *, staff: bool = True, perms: tuple[str, ...] = ()) -> User:
    user = User.objects.create_user(name, password="pw", is_staff=staff)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def superuser_client() -> Client:
    return client_for(User.objects.create_superuser("root", password="pw"))


@pytest.fixture
def locks() -> Iterator[dict[str, Any]]:
    """One live lock held by another server and one whose holder died (stale)."""
    with other_holder("default") as other:
        other.try_acquire("live-job", ttl=600)
        other.try_acquire("dead-job", ttl=600)
        expire_now("default", "dead-job")
        yield {
            "live": JobLock.objects.get(name="live-job"),
            "dead": JobLock.objects.get(name="dead-job"),
            "other": other,
        }


def state_of(name: str) -> str:
    return JobLock.objects.with_state().get(name=name).state  # type: ignore[attr-defined]


def test_changelist_shows_state_holder_and_token(
    superuser_client: Client, locks: dict[str, Any]
) -> None:
    page = superuser_client.get(LOCKS).content.decode()
    assert "live-job" in page
    assert "dead-job" in page
    assert "exclusive-jobs-held" in page
    assert "exclusive-jobs-stale" in page
    assert "ends in" in page
    assert "ended" in page


def test_a_short_lease_is_shown_in_seconds(superuser_client: Client) -> None:
    import re

    lock = try_acquire("short-lease", using="default", ttl=7)
    assert lock is not None
    try:
        page = superuser_client.get(LOCKS).content.decode()
    finally:
        lock.release()
    found = re.search(r"ends in (\d+)\xa0?\s*seconds?", page)
    assert found is not None, "a 7-second lease must not read 'ends in 0 minutes'"
    assert 4 <= int(found.group(1)) <= 7


def test_state_filter(superuser_client: Client, locks: dict[str, Any]) -> None:
    page = superuser_client.get(LOCKS, {"state": "stale"}).content.decode()
    assert "dead-job" in page
    assert "live-job" not in page


def test_force_release_stale_action_frees_only_stale_locks(
    superuser_client: Client, locks: dict[str, Any]
) -> None:
    ids = [locks["live"].pk, locks["dead"].pk]
    response = superuser_client.post(
        LOCKS, {"action": "force_release_stale", "_selected_action": ids}, follow=True
    )
    assert response.status_code == 200
    assert "Force-released 1 stale lock." in response.content.decode()
    assert state_of("dead-job") == LockState.FREE
    assert state_of("live-job") == LockState.HELD


def test_force_release_selected_asks_and_refuses_held_lock_without_extra_confirmation(
    superuser_client: Client, locks: dict[str, Any]
) -> None:
    ids = [locks["live"].pk, locks["dead"].pk]
    confirm = superuser_client.post(
        LOCKS, {"action": "force_release_selected", "_selected_action": ids}
    )
    page = confirm.content.decode()
    assert confirm.status_code == 200
    assert "HELD: its job may still be running" in page
    assert "Also force-release held locks" in page
    done = superuser_client.post(
        LOCKS,
        {"action": "force_release_selected", "_selected_action": ids, "post": "yes"},
        follow=True,
    )
    text = done.content.decode()
    assert "Force-released 1 lock." in text
    assert "Not released, still held: live-job" in text
    assert state_of("live-job") == LockState.HELD
    assert state_of("dead-job") == LockState.FREE


def test_force_release_held_lock_with_extra_confirmation_makes_holder_lose(
    superuser_client: Client,
) -> None:
    lock = try_acquire("mine", using="default", ttl=600)
    assert lock is not None
    pk = JobLock.objects.get(name="mine").pk
    superuser_client.post(
        LOCKS,
        {
            "action": "force_release_selected",
            "_selected_action": [pk],
            "post": "yes",
            "release_held": "yes",
        },
    )
    assert state_of("mine") == LockState.FREE
    with pytest.raises(LockLost):
        lock.ensure_held()
    again = try_acquire("mine", using="default", ttl=60)
    assert again is not None
    assert again.token == lock.token + 1
    again.release()


def test_lock_rows_are_read_only(superuser_client: Client, locks: dict[str, Any]) -> None:
    pk = locks["live"].pk
    add = superuser_client.get(reverse("admin:django_exclusive_jobs_joblock_add"))
    assert add.status_code == 403
    detail = superuser_client.get(reverse("admin:django_exclusive_jobs_joblock_change", args=[pk]))
    assert detail.status_code == 200
    assert b'name="token"' not in detail.content  # no form fields
    delete = superuser_client.get(reverse("admin:django_exclusive_jobs_joblock_delete", args=[pk]))
    assert delete.status_code == 403
    assert b"delete_selected" not in superuser_client.get(LOCKS).content


def test_view_only_staff_sees_but_cannot_force_release(locks: dict[str, Any]) -> None:
    viewer = client_for(make_user("viewer", perms=("view_joblock", "view_jobrun")))
    page = viewer.get(LOCKS)
    assert page.status_code == 200
    assert b"force_release_selected" not in page.content
    response = viewer.post(
        LOCKS, {"action": "force_release_stale", "_selected_action": [locks["dead"].pk]}
    )
    assert response.status_code in (200, 302, 403)
    assert state_of("dead-job") == LockState.STALE


def test_staff_with_delete_permission_can_force_release(locks: dict[str, Any]) -> None:
    operator = client_for(make_user("operator", perms=("view_joblock", "delete_joblock")))
    page = operator.get(LOCKS).content.decode()
    assert "force_release_selected" in page
    operator.post(LOCKS, {"action": "force_release_stale", "_selected_action": [locks["dead"].pk]})
    assert state_of("dead-job") == LockState.FREE


def test_staff_without_permissions_and_non_staff_are_kept_out(locks: dict[str, Any]) -> None:
    nobody = client_for(make_user("nobody"))
    assert nobody.get(LOCKS).status_code == 403
    outsider = client_for(make_user("outsider", staff=False))
    response = outsider.get(LOCKS)
    assert response.status_code == 302
    assert "/login/" in response["Location"]
    assert outsider.get(JOBS).status_code == 302


def test_names_and_errors_are_escaped(superuser_client: Client) -> None:
    evil = "<script>alert(1)</script>"

    @exclusive_job(evil, using="default")
    def job() -> None:
        raise RuntimeError("<img src=x onerror=alert(2)>")

    with pytest.raises(RuntimeError):
        job()
    pages = [
        superuser_client.get(LOCKS).content.decode(),
        superuser_client.get(RUNS).content.decode(),
        superuser_client.get(JOBS).content.decode(),
        superuser_client.get(
            reverse(
                "admin:django_exclusive_jobs_jobrun_change",
                args=[JobRun.objects.get(name=evil).pk],
            )
        ).content.decode(),
    ]
    for page in pages:
        assert "<script>alert(1)" not in page
        assert "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[0]
    assert "&lt;img src=x onerror=alert(2)&gt;" in pages[3]


def test_run_detail_shows_traceback_and_the_jobs_page_counts_failures(
    superuser_client: Client,
) -> None:
    @exclusive_job("nightly-export", using="default")
    def job(fail: bool) -> None:
        if fail:
            raise ValueError("export target full")

    job(False)
    with pytest.raises(ValueError, match="full"):
        job(True)
    failed = JobRun.objects.get(name="nightly-export", status="failed")
    detail = superuser_client.get(
        reverse("admin:django_exclusive_jobs_jobrun_change", args=[failed.pk])
    ).content.decode()
    assert "Traceback (most recent call last)" in detail
    assert "export target full" in detail
    jobs_page = superuser_client.get(JOBS).content.decode()
    assert "nightly-export" in jobs_page
    assert "exclusive-jobs-failed" in jobs_page
    runs_page = superuser_client.get(RUNS, {"status": "failed"}).content.decode()
    assert "nightly-export" in runs_page
    assert "All jobs" in superuser_client.get(RUNS).content.decode()


# --- schedulers: alive, stopped, gone ---------------------------------------------------

SCHEDULERS = reverse("admin:django_exclusive_jobs_scheduler_changelist")


@pytest.fixture
def schedulers() -> dict[str, Scheduler]:
    now = database_now("default")
    hour = dt.timedelta(hours=1)

    def make(instance: str, **times: Any) -> Scheduler:
        values = {"started_at": now - hour, "last_beat_at": now, **times}
        return Scheduler.objects.create(
            instance=instance, host=f"web-{instance}", pid=7, jobs=["tick"], **values
        )

    return {
        "alive": make("alive"),
        "stopped": make("stopped", last_beat_at=now - hour, stopped_at=now - hour),
        "gone": make("gone", last_beat_at=now - dt.timedelta(minutes=3)),
    }


def test_schedulers_page_shows_alive_stopped_and_gone_with_a_filter(
    superuser_client: Client, schedulers: dict[str, Scheduler]
) -> None:
    page = superuser_client.get(SCHEDULERS).content.decode()
    for state in ("alive", "stopped", "gone"):
        assert f"exclusive-jobs-scheduler-{state}" in page
    beat = schedulers["gone"].last_beat_at.strftime("%Y-%m-%d %H:%M:%S")
    assert f"no beat since {beat}, no clean stop" in page
    for state, shown in [("gone", ["web-gone"]), ("unacknowledged", ["web-gone"])]:
        listed = superuser_client.get(SCHEDULERS, {"state": state}).context["cl"].result_list
        assert [row.host for row in listed] == shown
    jobs_page = superuser_client.get(JOBS).content.decode()
    assert "scheduler web-gone:7: gone: no beat since" in jobs_page


def test_acknowledging_a_gone_scheduler_ends_the_problem_and_is_recorded(
    superuser_client: Client, schedulers: dict[str, Scheduler]
) -> None:
    from django.contrib.admin.models import LogEntry

    ids = [row.pk for row in schedulers.values()]
    done = superuser_client.post(
        SCHEDULERS, {"action": "acknowledge", "_selected_action": ids}, follow=True
    )
    assert "Acknowledged 1 gone scheduler." in done.content.decode()
    gone = Scheduler.objects.get(instance="gone")
    assert gone.acknowledged_by == "root (admin)"
    assert not Scheduler.objects.unacknowledged().exists()
    assert "scheduler web-gone" not in superuser_client.get(JOBS).content.decode()
    page = superuser_client.get(SCHEDULERS).content.decode()
    assert "acknowledged by root (admin) at " in page
    [entry] = LogEntry.objects.filter(object_id=str(gone.pk))
    assert entry.get_change_message().startswith("Acknowledged: gone since ")


def test_acknowledging_needs_the_change_permission(schedulers: dict[str, Scheduler]) -> None:
    viewer = client_for(make_user("viewer", perms=("view_scheduler",)))
    page = viewer.get(SCHEDULERS)
    assert page.status_code == 200 and b'value="acknowledge"' not in page.content
    viewer.post(SCHEDULERS, {"action": "acknowledge", "_selected_action": [schedulers["gone"].pk]})
    assert Scheduler.objects.unacknowledged().exists()
    operator = client_for(make_user("operator", perms=("view_scheduler", "change_scheduler")))
    assert b'value="acknowledge"' in operator.get(SCHEDULERS).content
    detail = operator.get(
        reverse("admin:django_exclusive_jobs_scheduler_change", args=[schedulers["gone"].pk])
    )
    assert detail.status_code == 200 and b'name="host"' not in detail.content  # read-only


# --- seconds, and running long ----------------------------------------------------------


def test_times_are_shown_to_the_second(superuser_client: Client, locks: dict[str, Any]) -> None:
    import re

    @exclusive_job("every-ten-seconds", using="default")
    def job() -> None:
        pass

    job()
    run = JobRun.objects.get(name="every-ten-seconds")
    started = run.started_at.strftime("%Y-%m-%d %H:%M:%S")
    assert started in superuser_client.get(RUNS).content.decode()
    detail = reverse("admin:django_exclusive_jobs_jobrun_change", args=[run.pk])
    assert started in superuser_client.get(detail).content.decode()
    acquired = locks["live"].acquired_at.strftime("%Y-%m-%d %H:%M:%S")
    assert acquired in superuser_client.get(LOCKS).content.decode()
    minutes_only = re.compile(r"\d{1,2}:\d{2} [ap]\.m\.")
    assert not minutes_only.search(superuser_client.get(LOCKS).content.decode())


def test_a_run_running_long_is_marked_on_its_lock_and_filtered(superuser_client: Client) -> None:
    now = database_now("default")
    hour = dt.timedelta(hours=1)
    with other_holder("default") as other:
        token = other.try_acquire("long-job", ttl=600)
        held = JobLock.objects.get(name="long-job")
        JobRun.objects.create(
            name="long-job", status="running", token=held.token, started_at=now - hour
        )
        for _ in range(3):
            JobRun.objects.create(
                name="long-job", status="succeeded", started_at=now - hour, duration=1.0
            )
        other.try_acquire("short-job", ttl=600)
        page = superuser_client.get(LOCKS).content.decode()
        assert "exclusive-jobs-running-long" in page
        assert "1.0 s" in page  # its median
        long_only = superuser_client.get(LOCKS, {"state": "running_long"}).content.decode()
        assert "long-job" in long_only and "short-job" not in long_only
        assert [lock.name for lock in JobLock.objects.running_long()] == ["long-job"]
        assert token is not None


# --- the jobs page: each job's next slots ------------------------------------------------


def job_row(html: str, name: str) -> str:
    start = html.index(f'<tr class="job-row" data-job="{name}">')
    return html[start : html.index("</tr>", start)]


def test_jobs_page_shows_each_jobs_next_slots_in_utc_and_its_zone(
    superuser_client: Client,
) -> None:
    job = get_job("summary:weekly")
    assert job is not None
    before = database_now("default")
    row = job_row(superuser_client.get(JOBS).content.decode(), job.name)
    after = database_now("default")
    shown = [dt.datetime.fromisoformat(slot) for slot in re.findall(r'data-slot="([^"]+)"', row)]
    slots = [[coming.slot for coming in upcoming(job, now, NEXT_SLOTS)] for now in (before, after)]
    assert shown in slots
    assert len(shown) == NEXT_SLOTS
    assert "Europe/Paris" in row
    for slot in shown:
        local = slot.astimezone(job.zone)
        assert f"{slot:%Y-%m-%d %H:%M:%S} UTC" in row
        assert f"{local:%Y-%m-%d %H:%M:%S %z}" in row


def test_a_job_without_a_schedule_has_no_next_slot(superuser_client: Client) -> None:
    row = job_row(superuser_client.get(JOBS).content.decode(), "quick")
    assert "data-slot=" not in row and '<td class="exclusive-jobs-next">—</td>' in row


def test_the_next_slots_cost_the_jobs_page_no_query(
    superuser_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slots are computed on the database time the page reads anyway: five cost the
    same queries as one."""

    def page(slots: int) -> int:
        monkeypatch.setattr(jobs_admin, "NEXT_SLOTS", slots)
        with CaptureQueriesContext(connections["default"]) as seen:
            response = superuser_client.get(JOBS)
        assert response.status_code == 200
        row = job_row(response.content.decode(), "tick")
        assert row.count("data-slot=") == slots
        return len(seen)

    page(1)  # its first look makes the declared jobs' lock rows
    assert page(NEXT_SLOTS) == page(1)


def test_a_jobs_groups_are_shown_and_its_groups_lock_is_no_job(superuser_client: Client) -> None:
    group = try_acquire("group:maintenance", ttl=60)  # a member's run holds the group
    assert group is not None
    try:
        page = superuser_client.get(JOBS).content.decode()
        row = job_row(page, "group_wait")
        assert '<small class="exclusive-jobs-groups">group maintenance, nightly</small>' in row
        assert "exclusive-jobs-groups" not in job_row(page, "quick")
        assert "group:maintenance" not in page  # listed with the locks, not as a job
        assert "group:maintenance" in superuser_client.get(LOCKS).content.decode()
        health = overview("default").as_dict()
        jobs = {job["name"]: job for job in health["jobs"]}
        assert jobs["group_wait"]["groups"] == ["maintenance", "nightly"]
        assert "group:maintenance" not in jobs and not health["undeclared"]
    finally:
        group.release()

"""The run-time schedules in the admin, through Django's test client: the form checks at
the one door (``run/runtime_schedules.py``) and writes through its API, so each add,
change, pause and delete is audited; the jobs page shows which job is which."""

from __future__ import annotations

import html
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from django_exclusive_jobs import add_schedule, try_acquire
from django_exclusive_jobs.admin.runtime_schedules import RunTimeScheduleForm
from django_exclusive_jobs.lock.errors import LockConfigurationError
from django_exclusive_jobs.models import JobChange, RunTimeSchedule
from django_exclusive_jobs.run import runtime_schedules
from django_exclusive_jobs.run.registry import get_job

from .test_admin import JOBS, client_for, job_row, make_user

ADD = reverse("admin:django_exclusive_jobs_runtimeschedule_add")
LIST = reverse("admin:django_exclusive_jobs_runtimeschedule_changelist")
NAME = "customer_report:acme"

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def superuser_client() -> Client:
    return client_for(User.objects.create_superuser("root", password="pw"))


def form(**given: Any) -> dict[str, Any]:
    """What the add form posts: every hour for acme, switched on, with a reason."""
    posted = {
        "job": "customer_report",
        "key": "acme",
        "cron": "",
        "timezone": "",
        "every": "1h",
        "kwargs": '{"customer": "acme"}',
        "starts_at": "",
        "ends_at": "",
        "enabled": "on",
        "reason": "acme signed",
    }
    posted.update(given)
    return {key: value for key, value in posted.items() if value is not None}


def change_url(name: str = NAME) -> str:
    pk = RunTimeSchedule.objects.get(name=name).pk
    return reverse("admin:django_exclusive_jobs_runtimeschedule_change", args=[pk])


def audit(name: str = NAME) -> list[tuple[str, str, str]]:
    rows = JobChange.objects.filter(name=name).order_by("id")
    return list(rows.values_list("action", "by", "reason"))


def added(**settings: Any) -> RunTimeSchedule:
    base = {"every": "1h", "kwargs": {"customer": "acme"}, **settings}
    return add_schedule("customer_report", "acme", by="python", reason="seeded", **base)


def test_adding_through_the_form_writes_the_row_and_audits_it(superuser_client: Client) -> None:
    page = superuser_client.get(ADD).content.decode()
    assert '<option value="customer_report">customer_report</option>' in page
    response = superuser_client.post(ADD, form())
    assert response.status_code == 302, response.content.decode()
    row = RunTimeSchedule.objects.get()
    assert (row.name, row.job, row.key, row.every) == (NAME, "customer_report", "acme", 3600)
    assert row.kwargs == {"customer": "acme"} and row.enabled and row.cron == ""
    assert (row.created_by, row.reason) == ("root (admin)", "acme signed")
    assert audit() == [("schedule_added", "root (admin)", "acme signed")]
    listed = superuser_client.get(LIST).content.decode()
    assert NAME in listed and "every 1h" in listed and "root (admin)" in listed
    assert html.escape('{"customer": "acme"}') in listed


def door_says(**given: Any) -> str:
    """What the door itself says of these settings: the form shows just that."""
    job = runtime_schedules.declared("customer_report")
    try:
        if "key" in given:
            runtime_schedules.name_of("customer_report", given.pop("key"))
        runtime_schedules.check(job, given)
    except LockConfigurationError as exc:
        return str(exc)
    raise AssertionError(f"the door took {given}")


@pytest.mark.parametrize(
    ("posted", "checked"),
    [
        ({"every": "", "cron": "61 * * * *"}, {"cron": "61 * * * *"}),
        ({"kwargs": '{"nope": 1}'}, {"every": "1h", "kwargs": {"nope": 1}}),
        (
            {"starts_at": "2030-01-02T00:00", "ends_at": "2030-01-01T00:00"},
            {"every": "1h", "starts_at": "2030-01-02T00:00", "ends_at": "2030-01-01T00:00"},
        ),
        ({"cron": "0 8 * * 1"}, {"cron": "0 8 * * 1", "every": "1h"}),
        ({"key": "a:b"}, {"key": "a:b"}),
    ],
    ids=["bad-cron", "bad-kwargs", "ends-before-starts", "cron-and-every", "bad-key"],
)
def test_what_the_door_refuses_is_one_line_on_the_form_and_nothing_is_written(
    superuser_client: Client, posted: dict[str, str], checked: dict[str, Any]
) -> None:
    said = door_says(**checked)
    response = superuser_client.post(ADD, form(**posted))
    assert response.status_code == 200
    page = response.content.decode()
    assert f'<ul class="errorlist nonfield"><li>{html.escape(said)}</li></ul>' in page
    assert not RunTimeSchedule.objects.exists()
    assert not JobChange.objects.exists()


def test_a_key_taken_and_a_missing_reason_are_refused(superuser_client: Client) -> None:
    added()
    taken = superuser_client.post(ADD, form()).content.decode()
    assert "A schedule named customer_report:acme exists already." in taken
    unsaid = superuser_client.post(ADD, form(key="globex", reason="")).content.decode()
    assert "This field is required." in unsaid
    assert list(RunTimeSchedule.objects.values_list("name", flat=True)) == [NAME]


def test_a_save_that_loses_a_race_says_so_and_writes_nothing_more(
    superuser_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another's add of the same name between the form's look and its save: the API
    refuses it (the table's unique name), and the admin says so in one line."""
    added()
    monkeypatch.setattr(RunTimeScheduleForm, "_not_taken", staticmethod(lambda name: None))
    response = superuser_client.post(ADD, form(), follow=True)
    assert "A schedule named customer_report:acme exists already." in response.content.decode()
    assert RunTimeSchedule.objects.count() == 1
    assert audit() == [("schedule_added", "python", "seeded")]


def test_editing_to_a_cron_is_audited_with_before_and_after(superuser_client: Client) -> None:
    added()
    url = change_url()
    page = superuser_client.get(url).content.decode()
    assert 'value="1h"' in page and "customer_report:acme" in page
    assert 'name="key"' not in page and 'name="job"' not in page  # only on add
    assert 'data-action="schedule_added"' in page  # its audit, under the form
    edit = form(cron="0 8 * * 1", timezone="Europe/Paris", every="", reason="mondays only")
    del edit["job"], edit["key"]
    response = superuser_client.post(url, edit)
    assert response.status_code == 302, response.content.decode()
    row = RunTimeSchedule.objects.get()
    assert (row.cron, row.timezone, row.every) == ("0 8 * * 1", "Europe/Paris", None)
    assert audit()[-1] == ("schedule_edited", "root (admin)", "mondays only")
    change = JobChange.objects.filter(name=NAME).latest("id")
    assert change.before["every"] == 3600 and change.after["cron"] == "0 8 * * 1"
    page = superuser_client.get(url).content.decode()
    assert page.index('data-action="schedule_edited"') < page.index('data-action="schedule_added"')


def test_unticking_enabled_pauses_it_and_a_refused_edit_writes_nothing(
    superuser_client: Client,
) -> None:
    added()
    url = change_url()
    edit = form(enabled=None, reason="acme on holiday")
    del edit["job"], edit["key"]
    bad = superuser_client.post(url, {**edit, "kwargs": '{"lines": "many", "x": 1}'})
    assert bad.status_code == 200 and "unknown argument" in bad.content.decode()
    assert RunTimeSchedule.objects.get().enabled
    assert superuser_client.post(url, edit).status_code == 302
    assert not RunTimeSchedule.objects.get().enabled
    assert audit()[-1] == ("schedule_edited", "root (admin)", "acme on holiday")
    change = JobChange.objects.filter(name=NAME).latest("id")
    assert (change.before, change.after) == ({"enabled": True}, {"enabled": False})
    row = job_row_of(superuser_client.get(JOBS).content.decode(), NAME)
    assert "switched off" in row and "data-slot=" not in row


def test_deleting_one_and_deleting_in_bulk_are_each_audited(superuser_client: Client) -> None:
    added()
    add_schedule("customer_report", "globex", every="2h", by="python")
    add_schedule("customer_report", "initech", every="3h", by="python")
    delete = change_url().replace("/change/", "/delete/")
    assert superuser_client.post(delete, {"post": "yes"}).status_code == 302
    assert audit()[-1] == ("schedule_gone", "root (admin)", "")
    others = list(RunTimeSchedule.objects.values_list("pk", flat=True))
    bulk = {"action": "delete_selected", "_selected_action": others, "post": "yes"}
    assert superuser_client.post(LIST, bulk).status_code == 302
    assert not RunTimeSchedule.objects.exists()
    for name in ("customer_report:globex", "customer_report:initech"):
        assert audit(name)[-1] == ("schedule_gone", "root (admin)", "")


def test_a_viewer_sees_but_cannot_add_change_or_delete() -> None:
    added()
    viewer = client_for(make_user("viewer", perms=("view_runtimeschedule", "view_jobstate")))
    assert NAME in viewer.get(LIST).content.decode()
    assert viewer.get(ADD).status_code == 403
    assert viewer.post(ADD, form(key="globex")).status_code == 403
    url = change_url()
    page = viewer.get(url).content.decode()
    assert 'name="_save"' not in page  # view only
    edit = form(every="2h")
    del edit["job"], edit["key"]
    assert viewer.post(url, edit).status_code == 403
    assert viewer.post(url.replace("/change/", "/delete/"), {"post": "yes"}).status_code == 403
    assert list(RunTimeSchedule.objects.values_list("name", "every")) == [(NAME, 3600)]
    assert [action for action, _by, _reason in audit()] == ["schedule_added"]
    jobs = viewer.get(JOBS).content.decode()
    assert "add-runtime-schedule" not in jobs and "View" in job_row_of(jobs, NAME)


def job_row_of(page: str, name: str) -> str:
    start = page.index(f'<tr class="runtime-row" data-job="{html.escape(name)}">')
    return page[start : page.index("</tr>", start)]


def test_the_jobs_page_says_which_job_is_in_the_code_and_which_is_run_time(
    superuser_client: Client,
) -> None:
    row = added()
    add_schedule("customer_report", "broken", every="1h", by="python")
    # A row the door would refuse today (written by SQL): misconfigured, shown as such.
    RunTimeSchedule.objects.filter(key="broken").update(kwargs={"nope": 1})
    lock = try_acquire(NAME, ttl=60)  # it has run: its lock row is known
    assert lock is not None
    lock.release()
    page = superuser_client.get(JOBS).content.decode()
    assert "in the code" in job_row(page, "customer_report")
    shown = job_row_of(page, NAME)
    assert "run-time" in shown and "every 1h" in shown
    assert reverse("admin:django_exclusive_jobs_runtimeschedule_change", args=[row.pk]) in shown
    assert shown.count("data-slot=") == 5
    assert html.escape('{"customer": "acme"}') in shown
    broken = job_row_of(page, "customer_report:broken")
    assert "misconfigured: its run-time schedule:" in broken and "data-slot=" not in broken
    assert "Not declared any more" not in page  # its lock is a run-time schedule's
    assert 'id="add-runtime-schedule"' in page
    job = get_job("customer_report")
    assert job is not None and job.schedule is None

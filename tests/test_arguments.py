"""Several schedules with arguments: one function, a job per schedule (``NAME:schedule``),
each run with its own JSON keyword arguments, checked at start-up, recorded on each run,
shown in the admin and the CLI."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from django_exclusive_jobs import LockConfigurationError, exclusive_job
from django_exclusive_jobs.models import JobRun
from django_exclusive_jobs.run import control
from django_exclusive_jobs.run.registry import get_job, schedules_of
from django_exclusive_jobs.run.scheduler import Scheduler
from django_exclusive_jobs.run.schedules import Cron

from .test_command import command_env, django_admin, manage, marker

__all__ = ["marker"]  # a fixture

DAY = {"period": "day"}
WEEK = {"period": "week"}


def test_each_schedule_is_a_job_of_its_own_with_its_arguments() -> None:
    daily, weekly = get_job("summary:daily"), get_job("summary:weekly")
    assert daily is not None and weekly is not None
    assert (daily.kwargs, weekly.kwargs) == (DAY, WEEK)
    assert daily.schedule == Cron(expression="0 6 * * *", timezone="UTC")
    assert weekly.schedule == Cron(expression="0 7 * * 1", timezone="Europe/Paris")
    assert daily.target == weekly.target == "tests.testapp.jobs.summary"
    assert get_job("summary") is None
    assert schedules_of("summary") == ["summary:daily", "summary:weekly"]


def test_the_shared_settings_apply_to_each_schedule() -> None:
    @exclusive_job(
        "shared",
        ttl="90s",
        catch_up="all",
        jitter="1m",
        schedules={"a": {"every": "1h", "kwargs": {"n": 1}}, "b": {"every": "10m"}},
    )
    def shared(n: int = 0) -> None:
        pass

    first, second = get_job("shared:a"), get_job("shared:b")
    assert first is not None and second is not None
    assert (first.ttl, first.catch_up.policy, first.kwargs) == ("90s", "all", {"n": 1})
    assert (second.ttl, second.catch_up.policy, second.kwargs) == ("90s", "all", {})
    assert first.jitter == second.jitter
    assert set(shared.jobs) == {"shared:a", "shared:b"}  # type: ignore[attr-defined]


def test_a_direct_call_of_a_function_with_several_schedules_says_which_to_run() -> None:
    from tests.testapp.jobs import summary

    with pytest.raises(
        TypeError, match="several schedules \\('summary:daily', 'summary:weekly'\\)"
    ):
        summary(period="day")


def test_a_job_calls_its_function_with_its_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MARKER", str(tmp_path / "marker"))
    job = get_job("digest")
    assert job is not None
    job.call(None)
    job.call(None)  # the declared arguments are not changed by a run
    assert (tmp_path / "marker").read_text().split()[:3] == ["digest", "ops@example.com", "5"]
    assert job.kwargs == {"recipients": ["ops@example.com"], "limit": 5}


def takes_period(period: str, slot: object = None) -> None:
    pass


def takes_anything(**options: object) -> None:
    pass


@pytest.mark.parametrize(
    ("declared", "says"),
    [
        ({"cron": "0 6 * * *", "kwargs": {"perod": "day"}}, "unknown argument 'perod'."),
        ({"cron": "0 6 * * *", "kwargs": {}}, "missing a required argument: 'period'."),
        ({"every": "1h", "kwargs": {"period": ("day",)}}, "are not JSON"),
        ({"every": "1h", "kwargs": {"period": {"day"}}}, "are not JSON"),
        ({"every": "1h", "kwargs": {"period": math.nan}}, "are not JSON"),
        ({"every": "1h", "kwargs": {"period": "day", "slot": "x"}}, "must not give 'slot'"),
        ({"every": "1h", "kwargs": ["day"]}, "kwargs must be a dict of argument names"),
        ({"kwargs": {"perod": "day"}}, "unknown argument 'perod'."),  # no schedule: still checked
        (
            {"schedules": {"daily": {"cron": "0 6 * * *"}}},
            "Schedule 'daily': kwargs {} do not fit takes_period(period, slot=None): missing",
        ),
        (
            {"schedules": {"daily": {"cron": "0 6 * * *", "every": "1d"}}},
            "Schedule 'daily': Give either every= or cron=, not both.",
        ),
        ({"schedules": {"daily": {"kwargs": DAY}}}, "Schedule 'daily' needs cron= or every=."),
        ({"schedules": {"daily": {"cron": "0 6 * * *", "ttl": 9}}}, "not 'ttl'"),
        ({"schedules": {"a:b": {"cron": "0 6 * * *"}}}, "without ':'"),
        ({"schedules": {}}, "schedules must be a dict of schedule names"),
        (
            {"cron": "0 6 * * *", "schedules": {"daily": {"cron": "0 6 * * *"}}},
            "With schedules=, give cron=, every=, timezone= and kwargs= in each schedule.",
        ),
    ],
)
def test_bad_arguments_are_one_clear_error_when_the_decorator_runs(
    declared: dict[str, object], says: str
) -> None:
    with pytest.raises(LockConfigurationError) as raised:
        exclusive_job("bad_arguments", **declared)(takes_period)  # type: ignore[arg-type]
    assert says in str(raised.value)
    assert "\n" not in str(raised.value)
    assert not schedules_of("bad_arguments")
    assert get_job("bad_arguments") is None


def test_a_scheduled_function_without_kwargs_may_take_arguments_from_direct_calls() -> None:
    # Called directly with its arguments, it keeps the slot's once-only run; kwargs={}
    # or schedules= say that its own starts call it, and are then checked.
    exclusive_job("direct_with_arguments", cron="0 6 * * *")(takes_period)
    job = get_job("direct_with_arguments")
    assert job is not None and job.kwargs == {}


def test_arguments_a_function_takes_through_double_star_kwargs_are_accepted() -> None:
    exclusive_job("takes_anything", every="1h", kwargs={"any": [1, 2]})(takes_anything)
    job = get_job("takes_anything")
    assert job is not None and job.kwargs == {"any": [1, 2]}


# --- start-up problems, as the commands say them -------------------------------------------


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        ("kwargs-unknown", "unknown argument 'perod'."),
        ("kwargs-missing", "Schedule 'weekly': kwargs {} do not fit report(period, slot=None)"),
        ("kwargs-json", "are not JSON"),
    ],
)
def test_manage_py_check_and_run_exclusive_say_bad_arguments_in_one_line(
    fault: str, says: str
) -> None:
    env = command_env(DJANGO_SETTINGS_MODULE="tests.settings_broken", BROKEN_JOBS=fault)
    check = django_admin("check", env=env, timeout=60)
    assert check.returncode == 1, check.stderr
    [line] = [line for line in check.stderr.splitlines() if "E014" in line]
    assert "Job 'report' (tests/brokenjobs/jobs.py:" in line and says in line
    run = django_admin("run_exclusive", "quick", env=env, timeout=60)
    assert run.returncode == 2
    [line] = run.stderr.splitlines()
    assert says in line and "(django_exclusive_jobs.E014)" in line


def test_run_exclusive_of_a_job_with_several_schedules_names_them_and_exits_2() -> None:
    result = manage("default", "summary")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "CommandError: Job 'summary' has several schedules, each a job of its own: run one "
        "of 'summary:daily', 'summary:weekly'."
    ]


# --- runs get and record their arguments ---------------------------------------------------


def test_each_schedule_runs_with_its_arguments_and_records_them(alias: str, marker: Path) -> None:
    for name in ("summary:daily", "summary:weekly", "digest"):
        result = manage(alias, name, env=command_env(marker))
        assert result.returncode == 0, result.stderr
    said = [line.rsplit(" ", 1)[0] for line in marker.read_text().splitlines()]
    assert said == ["summary day", "summary week", "digest ops@example.com 5"]
    recorded = dict(JobRun.objects.using(alias).values_list("name", "kwargs"))
    assert recorded == {
        "summary:daily": DAY,
        "summary:weekly": WEEK,
        "digest": {"recipients": ["ops@example.com"], "limit": 5},
    }
    # each schedule has its own slots: one run per schedule per slot
    again = manage(alias, "summary:daily", env=command_env(marker))
    assert again.returncode == 0 and "already run" in again.stdout
    assert JobRun.objects.using(alias).filter(name="summary:daily").count() == 1


def test_a_run_asked_for_now_runs_in_the_scheduler_with_the_schedules_arguments(
    alias: str, marker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MARKER", str(marker))
    job = get_job("summary:weekly")
    assert job is not None
    control.request_run("summary:weekly", by="operator", using=alias)
    scheduler = Scheduler(
        [], on_request=[job.but(using=alias)], using=alias, max_runs=1, run_for=60
    )
    assert scheduler.run() == 0
    assert marker.read_text().split()[:2] == ["summary", "week"]  # in the job's own process
    [run] = JobRun.objects.using(alias).filter(name="summary:weekly")
    assert (run.status, run.requested_by, run.kwargs) == ("succeeded", "operator", WEEK)


def test_a_manual_run_here_records_the_arguments(alias: str) -> None:
    result = control.run_now("summary:daily", by="operator", using=alias)
    assert result.status == "succeeded", result.exception
    [run] = JobRun.objects.using(alias).filter(name="summary:daily")
    assert (run.slot, run.kwargs) == (None, DAY)


# --- shown --------------------------------------------------------------------------------


def test_the_cli_shows_each_jobs_arguments(alias: str) -> None:
    out = io.StringIO()
    call_command("exclusive_jobs", "--database", alias, stdout=out)
    [line] = [line for line in out.getvalue().splitlines() if line.startswith("summary:weekly")]
    assert line.startswith('summary:weekly {"period": "week"}  ')
    out = io.StringIO()
    call_command("exclusive_jobs", "--json", "--database", alias, stdout=out)
    jobs = {job["name"]: job for job in json.loads(out.getvalue())["jobs"]}
    assert jobs["summary:daily"]["arguments"] == '{"period": "day"}'
    assert jobs["quick"]["arguments"] is None


@pytest.mark.django_db(transaction=True)
def test_the_admin_shows_a_runs_arguments_and_each_jobs_arguments() -> None:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    control.run_now("summary:weekly", by="operator", using="default")
    run = JobRun.objects.get(name="summary:weekly")
    shown = "{&quot;period&quot;: &quot;week&quot;}"
    detail = client.get(reverse("admin:django_exclusive_jobs_jobrun_change", args=[run.pk]))
    assert shown in detail.content.decode()
    listed = client.get(reverse("admin:django_exclusive_jobs_jobrun_changelist"))
    assert shown in listed.content.decode()
    jobs = client.get(reverse("admin:django_exclusive_jobs_jobstate_changelist")).content.decode()
    assert 'data-job="summary:daily"' in jobs
    assert '<small class="exclusive-jobs-arguments"' in jobs
    assert shown in jobs and "{&quot;period&quot;: &quot;day&quot;}" in jobs
    asked = client.post(
        reverse("admin:django_exclusive_jobs_jobstate_act", args=["run"]),
        {"job": "summary:daily", "confirm": "yes"},
    )
    assert asked.status_code == 302
    assert control.pending(["summary:daily"], using="default")[0].name == "summary:daily"


@pytest.mark.django_db(transaction=True)
def test_a_direct_call_gets_the_callers_arguments_and_records_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.testapp.jobs import digest

    monkeypatch.setenv("MARKER", str(tmp_path / "marker"))
    digest(["dev@example.com"], limit=2)
    assert (tmp_path / "marker").read_text().split()[:3] == ["digest", "dev@example.com", "2"]
    [run] = JobRun.objects.filter(name="digest")
    assert (run.status, run.kwargs) == ("succeeded", {})


# --- the fencing token, given to a function that takes `token` --------------------------


def test_a_function_with_a_token_parameter_gets_its_runs_fencing_token(
    alias: str, marker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a cron line (run_exclusive), from the scheduler's child process (a run asked
    for now), and in a direct call: the token the job is given is its run's."""
    result = manage(alias, "fenced", env=command_env(marker))
    assert result.returncode == 0, result.stderr
    monkeypatch.setenv("MARKER", str(marker))
    job = get_job("fenced")
    assert job is not None
    control.request_run("fenced", by="operator", using=alias)
    scheduler = Scheduler(
        [], on_request=[job.but(using=alias)], using=alias, max_runs=1, run_for=60
    )
    assert scheduler.run() == 0
    given = [int(line.split()[1]) for line in marker.read_text().splitlines()]
    recorded = list(
        JobRun.objects.using(alias)
        .filter(name="fenced")
        .order_by("pk")
        .values_list("token", flat=True)
    )
    assert given == recorded and len(given) == 2 and given[0] < given[1]


def test_a_direct_call_gets_the_token_unless_the_caller_gives_one(alias: str) -> None:
    seen: list[int] = []

    @exclusive_job("fenced_direct", using=alias)
    def fenced_direct(token: int) -> None:
        seen.append(token)

    fenced_direct()
    fenced_direct(token=7)  # type: ignore[call-arg]
    first, _ = JobRun.objects.using(alias).filter(name="fenced_direct").order_by("pk")
    assert seen == [first.token, 7]


def test_kwargs_may_not_give_the_token_a_run_gives() -> None:
    def takes_token(token: int) -> None:
        pass

    with pytest.raises(LockConfigurationError, match="must not give 'token'"):
        exclusive_job("fenced_bad", every="1h", kwargs={"token": 3})(takes_token)

"""Settings, system checks, transactions and the separate-alias set-up."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import transaction
from django.test import override_settings

from django_exclusive_jobs import LockConfigurationError, exclusive_lock, try_acquire
from django_exclusive_jobs.checks import check_settings
from django_exclusive_jobs.lock.durations import parse_duration

from .helpers import other_holder

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("90s", 90),
        ("15m", 900),
        ("1h", 3600),
        ("2d", 172800),
        ("1.5m", 90),
        ("250ms", 0.25),
        ("01:30:00", 5400),
        ("PT15M", 900),
        (45, 45),
        (0.5, 0.5),
        (dt.timedelta(minutes=2), 120),
    ],
)
def test_durations_people_write(text: object, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == seconds  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["", "soon", "15 minutes", "1h30", "-", "m", True])
def test_durations_that_are_not(text: object) -> None:
    with pytest.raises(ValueError, match=r"duration|bool") as info:
        parse_duration(text)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


CHECK_CASES = [
    pytest.param(["not", "a", "dict"], "django_exclusive_jobs.E001", id="not-a-dict"),
    pytest.param({"TTLS": 5}, "django_exclusive_jobs.E002", id="unknown-key"),
    pytest.param({"TTL": "soon"}, "django_exclusive_jobs.E003", id="bad-ttl"),
    pytest.param({"TTL": 0}, "django_exclusive_jobs.E004", id="zero-ttl"),
    pytest.param({"TTL": "50ms"}, "django_exclusive_jobs.E004", id="ttl-below-100ms"),
    pytest.param({"TTL": 10, "MIN_HOLD": 20}, "django_exclusive_jobs.E005", id="hold-gt-ttl"),
    pytest.param({"MIN_HOLD": -1}, "django_exclusive_jobs.E005", id="negative-hold"),
    pytest.param({"DATABASE": "nope"}, "django_exclusive_jobs.E006", id="unknown-alias"),
    pytest.param({"KEEPALIVE": "yes"}, "django_exclusive_jobs.E007", id="keepalive-not-bool"),
    pytest.param({"SLOT_TOLERANCE": -5}, "django_exclusive_jobs.E008", id="negative-tolerance"),
    pytest.param({"SLOT_TOLERANCE": "later"}, "django_exclusive_jobs.E003", id="bad-tolerance"),
    pytest.param({"KEEP_RUNS": 0}, "django_exclusive_jobs.E009", id="zero-keep-runs"),
    pytest.param({"RUNNING_LONG_FACTOR": 1}, "django_exclusive_jobs.E010", id="factor-one"),
    pytest.param({"RUNNING_LONG_FACTOR": "3"}, "django_exclusive_jobs.E010", id="factor-string"),
    pytest.param({"BUSY_TIMEOUT": -1}, "django_exclusive_jobs.E011", id="negative-busy-timeout"),
    pytest.param({"LISTEN": "yes"}, "django_exclusive_jobs.E018", id="listen-not-bool"),
    pytest.param({"PREPARE_STATEMENTS": True}, "django_exclusive_jobs.W002", id="gone-prepare"),
    pytest.param({"SQLITE_BUSY_TIMEOUT": 5}, "django_exclusive_jobs.W002", id="renamed-busy"),
]


def test_each_check_id_is_one_problem() -> None:
    """Cases that share an ID report the same setting; only E003 ("not a duration") spans
    several settings, because it is one problem wherever it happens."""
    settings_by_id: dict[str, set[str]] = {}
    for case in CHECK_CASES:
        value, check_id = case.values
        with override_settings(EXCLUSIVE_JOBS=value):
            (message,) = [m for m in check_settings() if m.id == check_id]
        settings_by_id.setdefault(check_id, set()).add(str(message.msg).split("]")[0])
    shared = {key: found for key, found in settings_by_id.items() if len(found) > 1}
    assert set(shared) <= {"django_exclusive_jobs.E003", "django_exclusive_jobs.W002"}


@pytest.mark.parametrize(("value", "check_id"), CHECK_CASES)
def test_system_check_reports_bad_setting(value: object, check_id: str) -> None:
    with override_settings(EXCLUSIVE_JOBS=value):
        ids = [message.id for message in check_settings()]
    assert check_id in ids


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_system_check_warns_about_atomic_requests_alias() -> None:
    databases = {**settings.DATABASES, "atomic": {**settings.DATABASES["default"]}}
    databases["atomic"]["ATOMIC_REQUESTS"] = True
    with override_settings(DATABASES=databases, EXCLUSIVE_JOBS={"DATABASE": "atomic"}):
        ids = [message.id for message in check_settings()]
    assert ids == ["django_exclusive_jobs.W001"]


def test_good_settings_pass_the_checks() -> None:
    good = {"TTL": "10m", "MIN_HOLD": 30, "KEEPALIVE": False, "DATABASE": "default"}
    with override_settings(EXCLUSIVE_JOBS=good):
        assert check_settings() == []


def test_manage_py_check_runs_our_checks() -> None:
    with (
        override_settings(EXCLUSIVE_JOBS={"TTL": -1}),
        pytest.raises(SystemCheckError, match="E004"),
    ):
        call_command("check")


def test_check_command_in_a_real_process_fails_on_bad_setting(tmp_path: Path) -> None:
    (tmp_path / "bad_settings.py").write_text(
        "from tests.settings import *\nEXCLUSIVE_JOBS = {'TTL': 'soon'}\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "django", "check", "--settings", "bad_settings"],
        cwd=ROOT,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "django_exclusive_jobs.E003" in result.stderr


def test_settings_are_read_at_each_use(alias: str) -> None:
    with override_settings(EXCLUSIVE_JOBS={"TTL": 42, "DATABASE": alias}):
        lock = try_acquire("configured")
        assert lock is not None
        assert lock.using == alias
        assert lock.ttl == dt.timedelta(seconds=42)
        lock.release()


def _needs_postgres_pair() -> None:
    if "postgres_locks" not in settings.DATABASES:
        pytest.skip("PostgreSQL: " + settings.UNAVAILABLE.get("postgres", "not configured"))


def test_separate_alias_lets_a_lock_be_taken_inside_a_transaction(
    django_db_setup: None, django_db_blocker: object
) -> None:
    """The documented fix: a second alias to the same database for the lock table."""
    _needs_postgres_pair()
    from .conftest import clean_tables

    with django_db_blocker.unblock():  # type: ignore[attr-defined]
        clean_tables("postgres")
        try:
            with (
                override_settings(EXCLUSIVE_JOBS={"DATABASE": "postgres_locks"}),
                transaction.atomic(using="postgres"),
            ):
                with exclusive_lock("in-transaction", ttl=30) as lock:
                    assert lock.using == "postgres_locks"
                    # committed on its own: another server sees it at once
                    with other_holder("postgres") as other:
                        assert other.try_acquire("in-transaction", ttl=30) is None
                with pytest.raises(LockConfigurationError, match="second alias"):
                    try_acquire("in-transaction", using="postgres")
        finally:
            clean_tables("postgres")


def test_use_tz_false_is_refused_by_the_checks() -> None:
    with override_settings(USE_TZ=False):
        ids = [message.id for message in check_settings()]
    assert ids == ["django_exclusive_jobs.E013"]


def test_a_lease_longer_than_a_year_is_refused() -> None:
    with pytest.raises(LockConfigurationError, match="at most 366 days"):
        try_acquire("forever", ttl="400d")
    with override_settings(EXCLUSIVE_JOBS={"TTL": "400d"}):
        assert "django_exclusive_jobs.E004" in [m.id for m in check_settings()]

"""``django_exclusive_jobs.values``: each kind of value a person gives, its bounds and its
one-line message; and the same message from two doors for the same value."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from typing import Any

import pytest

from django_exclusive_jobs import LockConfigurationError, exclusive_job, values
from django_exclusive_jobs.run import overrides
from django_exclusive_jobs.run.registry import _jobs, get_job
from django_exclusive_jobs.run.schedules import make_schedule


def refused(call: Any, *args: Any, **kwargs: Any) -> str:
    """The one line ``call`` refuses with."""
    with pytest.raises(LockConfigurationError) as caught:
        call(*args, **kwargs)
    message = str(caught.value)
    assert "\n" not in message and "\r" not in message
    return message


# --- name -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("", "Job name must not be empty."),
        ("x" * 256, "Job name is 256 characters long; the limit is 255."),
        ("a\nb", "Job name 'a\\nb' contains a control character or a format character."),
        ("a\u202eb", "Job name 'a\\u202eb' contains a control character or a format character."),
        ("a\u2028b", "Job name 'a\\u2028b' contains a control character or a format character."),
        ("a\u200bb", "Job name 'a\\u200bb' contains a control character or a format character."),
        ("a\x00b", "Job name 'a\\x00b' contains a control character or a format character."),
        (" a", "Job name ' a' must not start or end with white space."),
        (7, "Job name must be a string, not int."),
    ],
)
def test_a_name_is_refused_in_one_line(value: object, says: str) -> None:
    assert refused(values.name, value) == says


def test_a_name_may_be_255_characters_of_any_script() -> None:
    assert values.name("x" * 255) == "x" * 255
    assert values.name("rapport_été:日報") == "rapport_été:日報"


# --- reason -----------------------------------------------------------------------------


def test_a_reason_is_one_line_of_at_most_500_characters() -> None:
    assert values.reason("  vendor down  ") == "vendor down"
    assert values.reason(None) == ""
    assert values.reason("x" * 500) == "x" * 500
    assert refused(values.reason, "x" * 501) == (
        "The reason is 501 characters long; the limit is 500."
    )
    assert refused(values.reason, "", required=True) == "The reason must not be empty."
    assert refused(values.reason, "who" * 100, what="--by", limit=255) == (
        "--by is 300 characters long; the limit is 255."
    )


@pytest.mark.parametrize("char", ["\n", "\r", "\x1b", "\x07", "\u202e", "\u2066", "\u2029"])
def test_a_reason_with_a_control_or_format_character_is_refused(char: str) -> None:
    message = refused(values.reason, f"ok{char}finished X status=succeeded")
    assert message.startswith("The reason 'ok\\")
    assert "contains a control or format character" in message
    assert char not in message


# --- duration ---------------------------------------------------------------------------


def test_a_duration_is_at_most_ten_years() -> None:
    assert dt.timedelta(days=3653) == values.LONGEST
    assert values.duration("3653d") == values.LONGEST
    for given in ("3654d", "999999999d", "750000d", "P999999999D", 10**9):
        message = refused(values.duration, given, what="every")
        assert message.startswith("every must be at most 3653d, got "), message


def test_a_duration_s_lower_bounds() -> None:
    assert refused(values.duration, "-5", what="wait") == "wait must not be negative, got -5s."
    assert refused(values.duration, 0, what="ttl", positive=True) == "ttl must be positive, got 0s."
    second = dt.timedelta(seconds=1)
    assert refused(values.duration, "0.5", what="every", least=second) == (
        "every must be at least 1s, got 0.5s."
    )
    assert refused(values.duration, "soon", what="wait").startswith("wait 'soon' is not a duration")
    assert refused(values.duration, "9999999999d", what="ttl") == "ttl '9999999999d' is too long."
    assert refused(values.duration, float("nan"), what="ttl") == "ttl must be finite, got nan."


# --- moment -----------------------------------------------------------------------------


def test_a_moment_is_between_1970_and_9000() -> None:
    assert dt.datetime(1970, 1, 1, tzinfo=dt.UTC) == values.EARLIEST
    assert dt.datetime(9000, 1, 1, tzinfo=dt.UTC) == values.LATEST
    assert values.moment("2026-11-24T02:00") == dt.datetime(2026, 11, 24, 2, tzinfo=dt.UTC)
    paris = zoneinfo.ZoneInfo("Europe/Paris")
    assert values.moment("2026-11-24T02:00", zone=paris).utcoffset() == dt.timedelta(hours=1)
    assert values.moment("1970-01-01T00:00+00:00") == values.EARLIEST


@pytest.mark.parametrize(
    ("given", "zone"),
    [
        ("0001-01-01T00:00", "Europe/Paris"),
        ("9999-12-31T23:59", "America/New_York"),
        ("9999-12-31T23:59", "Pacific/Pago_Pago"),
        ("0001-01-01T00:00", "Asia/Tokyo"),
        ("1969-12-31T23:59:59+00:00", "UTC"),
        ("9000-01-01T00:00:01+00:00", "UTC"),
        ("0001-01-01T00:00-23:59", "UTC"),
        ("9999-12-31T23:59+23:59", "UTC"),
    ],
)
def test_a_moment_out_of_bounds_is_refused_in_every_zone(given: str, zone: str) -> None:
    message = refused(values.moment, given, what="--until", zone=zoneinfo.ZoneInfo(zone))
    assert message == (f"--until must be between 1970-01-01 and 9000-01-01 (UTC), got '{given}'.")


def test_a_moment_that_is_not_iso_8601_is_refused() -> None:
    assert refused(values.moment, "tomorrow", what="--from").startswith(
        "--from must be an ISO 8601 time such as 2026-11-24T02:00"
    )
    assert "is not an ISO 8601 time" in refused(values.moment, "2" * 65)
    assert refused(values.moment, 5) == "moment must be a time, not int."


# --- zone, cron -------------------------------------------------------------------------


def test_a_zone_is_an_iana_name() -> None:
    assert values.zone("Europe/Paris") == "Europe/Paris"
    assert refused(values.zone, "Mars/Olympus") == "Unknown time zone 'Mars/Olympus'."
    assert refused(values.zone, "../../etc/passwd") == "Unknown time zone '../../etc/passwd'."
    assert refused(values.zone, "Europe/" + "x" * 100).startswith("Unknown time zone ")
    assert refused(values.zone, "") == "Time zone must be a zone name such as Europe/Paris."


def test_a_cron_expression_is_at_most_1000_printable_ascii_characters() -> None:
    assert values.cron("0  */2 * *\t*") == "0 */2 * * *"
    long = "0 " + "1," * 600 + "2 * * *"
    assert refused(values.cron, long) == (
        f"Cron expression is {len(long)} characters long; the limit is 1000."
    )
    assert refused(values.cron, "0 * * * *\n0").endswith("may hold only printable ASCII.")
    assert refused(values.cron, "0 * * * \uff0a").endswith("may hold only printable ASCII.")
    assert refused(values.cron, 5) == "Cron expression must be a string like '0 * * * *'."


def test_cron_s_names_are_their_five_fields_in_any_case_and_reboot_is_refused() -> None:
    assert values.cron("@daily") == values.cron("@midnight") == "0 0 * * *"
    assert values.cron("  @Hourly ") == "0 * * * *"
    assert values.cron("@WEEKLY") == "0 0 * * 0"
    assert values.cron("@monthly") == "0 0 1 * *"
    assert values.cron("@yearly") == values.cron("@annually") == "0 0 1 1 *"
    names = "@yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly"
    assert refused(values.cron, "@reboot") == (
        f"Cron expression '@reboot' is not one of cron's names ({names}); @reboot is not a "
        "schedule: start the job with your process manager."
    )
    assert refused(values.cron, "@daily 0").startswith("Cron expression '@daily 0' is not one")


def test_a_cron_name_is_taken_alike_by_the_decorator_an_override_and_the_preview() -> None:
    from django_exclusive_jobs.run.preview import upcoming

    exclusive_job("door-weekly", cron="@weekly", timezone="Europe/Paris")(lambda: None)
    try:
        job = get_job("door-weekly")
        assert job is not None and job.schedule is not None
        assert job.schedule.describe() == "cron '0 0 * * 0' (Europe/Paris)"
        paris = zoneinfo.ZoneInfo("Europe/Paris")
        now = dt.datetime(2026, 3, 20, 12, tzinfo=dt.UTC)  # across the spring-forward
        slots = [shown.slot.astimezone(paris) for shown in upcoming(job, now, 3)]
        assert [slot.strftime("%a %d %H:%M") for slot in slots] == [
            "Sun 22 00:00",
            "Sun 29 00:00",
            "Sun 05 00:00",
        ]
        changed = overrides.check(job, {"schedule": {"cron": "@Monthly"}})
        assert changed["schedule"]["cron"] == "0 0 1 * *"
        by_decorator = refused(exclusive_job, "door-reboot", cron="@reboot")
        by_override = refused(overrides.check, job, {"schedule": {"cron": "@reboot"}})
        assert by_decorator == by_override
    finally:
        _jobs.pop("door-weekly", None)
    assert "door-reboot" not in _jobs


# --- JSON arguments ---------------------------------------------------------------------


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels - 1):
        value = [value]
    return {"a": value}


def test_arguments_are_at_most_20_levels_and_64_kib() -> None:
    assert values.json_arguments(nested(20)) == nested(20)
    assert refused(values.json_arguments, nested(21)) == (
        "The arguments are nested more than 20 levels deep."
    )
    deep_text = '{"a": ' + "[" * 100000 + "]" * 100000 + "}"
    assert refused(values.json_arguments, deep_text[: values.JSON_SIZE]).endswith(
        "nested more than 20 levels deep."
    )
    big = {"a": "x" * values.JSON_SIZE}
    assert refused(values.json_arguments, big).endswith("characters as JSON; the limit is 65536.")
    text = '{"a": "' + "x" * values.JSON_SIZE + '"}'
    assert refused(values.json_arguments, text) == (
        f"The arguments are {len(text)} characters long; the limit is 65536."
    )


def test_arguments_hold_no_decimal_number_a_database_gives_back_changed() -> None:
    """PostgreSQL's jsonb gives 4.810776117877146e+16 back as the int 48107761178771460
    (found by tests/test_fuzz_doors.py): refused at the door, on every database."""
    said = (
        "The arguments hold a decimal number of 1e16 or more, which a database gives back "
        "as another number: give it as an integer or as a string."
    )
    for given in ('{"limit": 4.810776117877146e+16}', {"a": [{"b": -1e16}]}, {"a": 1e300}):
        assert refused(values.json_arguments, given) == said
    kept = {"a": 9.999999999999998e15, "b": 1e-05, "c": 10**20, "d": 123456789012345.67}
    assert values.json_arguments(kept) == kept


def test_arguments_must_be_a_json_object_without_nul() -> None:
    assert values.json_arguments("") == {}
    assert values.json_arguments('{"day": "2026-11-24"}') == {"day": "2026-11-24"}
    assert refused(values.json_arguments, "[1]") == (
        "The arguments must be a dict of argument names to values, not [1]."
    )
    for given in ({"a": "x\x00"}, '{"a": "x\\u0000"}', {"a": "\ud800"}):
        assert refused(values.json_arguments, given) == (
            "The arguments hold a NUL character or a lone surrogate, which the database "
            "cannot store."
        )
    assert refused(values.json_arguments, "{").startswith("The arguments are not JSON (")


# --- text on its way out ----------------------------------------------------------------


def test_printable_escapes_and_cuts_and_storable_replaces() -> None:
    assert values.printable("a\nb\rc\x1b[2Jd\u202ee\u2028") == "a\\nb\\rc\\e[2Jd\\u202ee\\u2028"
    assert values.printable("x" * 10, limit=4) == "xxxx…"
    assert values.storable("a\x00b\ud800") == "a\ufffdb\ufffd"
    assert values.storable("plain") == "plain"


# --- the same message from two doors ----------------------------------------------------


def test_the_same_every_is_one_line_from_the_decorator_the_schedule_and_an_override() -> None:
    line = "every must be at most 3653d, got '999999999d'."
    assert refused(exclusive_job, "door-every", every="999999999d") == line
    assert refused(make_schedule, every="999999999d") == line
    digest = get_job("digest")
    assert digest is not None
    assert refused(overrides.check, digest, {"schedule": {"every": "999999999d"}}) == line
    assert "door-every" not in _jobs


def test_the_same_cron_and_zone_are_refused_alike_by_the_decorator_and_an_override() -> None:
    digest = get_job("digest")
    assert digest is not None
    long = "0 " + "1," * 600 + "2 * * *"
    for schedule in ({"cron": long}, {"cron": "0 * * * *", "timezone": "Mars/Olympus"}):
        by_decorator = refused(exclusive_job, "door-cron", **schedule)
        by_override = refused(overrides.check, digest, {"schedule": schedule})
        assert by_decorator == by_override
    assert "door-cron" not in _jobs


def test_the_same_name_is_refused_alike_by_the_decorator_and_the_lock() -> None:
    from django_exclusive_jobs.lock.validation import validate_name

    bidi = "report\u202egnp.exe"
    by_decorator = refused(exclusive_job(bidi), lambda: None)
    by_lock = refused(validate_name, bidi)
    assert by_decorator.replace("Job name", "Lock name") == by_lock
    assert "contains a control character or a format character" in by_lock


def test_the_same_arguments_are_refused_alike_by_the_decorator_run_now_and_an_override() -> None:
    digest = get_job("digest")
    assert digest is not None
    deep = {"recipients": nested(25)["a"], "limit": 1}
    line = "The arguments are nested more than 20 levels deep."
    assert refused(overrides.check, digest, {"kwargs": deep}) == line
    # Each door names the value as its caller knows it; the rule and its words are one.
    run_now = refused(digest.check_arguments, deep)
    assert run_now == line.replace(
        "The arguments", "The run's arguments (its declared kwargs updated by those given)"
    )
    by_decorator = refused(exclusive_job("door-kwargs", every="1h", kwargs=deep), lambda **_: 1)
    assert by_decorator == line.replace("The arguments", "kwargs")

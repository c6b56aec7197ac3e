"""Hostile values for the doors (tests/test_fuzz_doors.py), mixed with plausible ones, and
what each must give: accepted (VALID), refused (INVALID) or either (EITHER).

What must be refused is what ``django_exclusive_jobs.values`` (the one validator) refuses.
What must be accepted is a plausible value an operator types every day (the strategies
make those from a small grammar). A hostile value the validator lets through (``5s``
followed by U+2028, Arabic-Indic digits) may go either way, but the contract around it
holds all the same: one line and exit 2 if refused, nothing changed, nothing forged.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import re
import zoneinfo
from collections.abc import Callable

from hypothesis import strategies as st

from django_exclusive_jobs import values
from django_exclusive_jobs.lock.errors import LockConfigurationError


class Verdict(enum.Enum):
    VALID = "valid"
    INVALID = "invalid"
    EITHER = "either"


VALID, INVALID, EITHER = Verdict.VALID, Verdict.INVALID, Verdict.EITHER


def combine(*verdicts: Verdict) -> Verdict:
    """Several values at one door: refused if one must be, accepted if all must be."""
    if INVALID in verdicts:
        return INVALID
    if all(verdict is VALID for verdict in verdicts):
        return VALID
    return EITHER


def refused_by(check: Callable[[], object]) -> bool:
    """Whether the validator refuses (``check`` raises its one-line error)."""
    try:
        check()
    except LockConfigurationError:
        return True
    return False


# --- characters --------------------------------------------------------------------------

# Controls and format characters a line of output must never carry raw.
CONTROLS = [
    "\x00",  # NUL
    "\n",
    "\r",
    "\r\n",
    "\t",
    "\x07",  # BEL (ends an OSC title)
    "\x08",
    "\x1b[2J\x1b[H",  # clear the screen
    "\x1b]0;pwned\x07",  # set the window title
    "\x1b[31m",
    "\x7f",
    "\x85",  # C1 NEL
    "\x9b31m",  # C1 CSI
    "\u2028",  # line separator
    "\u2029",  # paragraph separator
    "\u202e",  # right-to-left override
    "\u2066",  # left-to-right isolate
    "\u200b",  # zero-width space
    "\u200d",  # zero-width joiner
    "\ufeff",  # BOM
    "\x1c",  # file separator (str.splitlines() splits on it)
]
FORGED_LINE = "\nfinished quick status=succeeded token=999\nok: 9 job(s), no problem"
UNICODE_NAMES = [
    "Ünïcødé-jöb",
    "ジョブ",
    "работа",
    "🚀job",
    "job\u0301",
    "\uff26\uff35\uff2c\uff2c",
]

controls = st.sampled_from(CONTROLS)


@st.composite
def with_controls(draw: st.DrawFn, base: st.SearchStrategy[str]) -> str:
    """A value with control or format characters put at its start, end or middle."""
    text = draw(base)
    where = draw(st.integers(0, len(text)))
    return text[:where] + draw(controls) + text[where:]


def half(
    plausible: st.SearchStrategy[str], hostile: st.SearchStrategy[str]
) -> st.SearchStrategy[str]:
    """Half plausible, half hostile (``st.one_of`` would flatten the hostile kinds into as
    many branches, each as likely as the plausible one)."""
    return st.booleans().flatmap(lambda bad: hostile if bad else plausible)


def mostly(
    plausible: st.SearchStrategy[str], hostile: st.SearchStrategy[str], odds: int = 4
) -> st.SearchStrategy[str]:
    """``plausible``, and about one time in ``odds + 1`` ``hostile``."""
    return st.integers(0, odds).flatmap(lambda n: hostile if n == 1 else plausible)


def huge(text: str, size: int) -> str:
    return (text * (size // max(1, len(text)) + 1))[:size]


# --- free text: reasons, --by, names -------------------------------------------------------

PLAUSIBLE_TEXT = re.compile(r"[A-Za-z0-9][A-Za-z0-9 .,:@()'_-]{0,98}[A-Za-z0-9.)]?")
plausible_text = st.from_regex(PLAUSIBLE_TEXT, fullmatch=True)
HOSTILE_TEXT = [
    "",
    " ",
    "\t \n",
    FORGED_LINE,
    "maintenance" + FORGED_LINE,
    "\x1b]0;pwned\x07\x1b[2J",
    "a" * 501,
    huge("why? ", 100_000),
    huge("\u202e", 10_000),
    "\ud800",  # a lone surrogate
    "ok\x00then",
    *UNICODE_NAMES,
]
# Each kind of value: half plausible, half hostile, so that both branches of a door run.
hostile_texts = st.one_of(
    st.sampled_from(HOSTILE_TEXT),
    with_controls(plausible_text),
    st.text(max_size=40),
    st.text(st.characters(codec="utf-8"), min_size=400, max_size=700),
)
texts = half(plausible_text, hostile_texts)


def reason_verdict(text: str, *, required: bool = False, stripped: bool = False) -> Verdict:
    """A reason (or ``--by``). ``stripped``: the door is a form field that strips white
    space before anything (Django's CharField), so only what is left counts."""
    if stripped:
        inner = text.strip()
        if refused_by(lambda: values.reason(inner, required=required)) or "\x00" in text:
            return INVALID
        return VALID if PLAUSIBLE_TEXT.fullmatch(inner) else EITHER
    if refused_by(lambda: values.reason(text, required=required)):
        return INVALID
    if not text and not required:
        return VALID
    return VALID if PLAUSIBLE_TEXT.fullmatch(text) else EITHER


def by_verdict(text: str) -> Verdict:
    """``--by``: who asks, as the audit records it (empty: user@host of the shell)."""
    if refused_by(lambda: values.reason(text)):
        return INVALID
    if not text:
        return VALID
    plausible = PLAUSIBLE_TEXT.fullmatch(text) and text == text.strip() and len(text) <= 100
    return VALID if plausible else EITHER


NAME_ALPHABET = st.characters(codec="utf-8")


names = st.one_of(
    st.sampled_from(
        [
            "",
            " quick",
            "quick ",
            "quick\n",
            "qu\u202eick",
            "quick\u2028",
            "quick\x00",
            "\x1b[2Jquick",
            "a" * 256,
            huge("n", 100_000),
            "-quick",
            "--database",
            "quick:schedule",
            *UNICODE_NAMES,
        ]
    ),
    with_controls(st.sampled_from(["quick", "digest", "live-lock"])),
    st.text(NAME_ALPHABET, min_size=1, max_size=30),
)


# --- durations -----------------------------------------------------------------------------

HOSTILE_DURATIONS = [
    "999999999d",
    "750000d",
    "P999999999D",
    "P99999999999999D",
    "1e308",
    "1e308s",
    "-1s",
    "-1",
    "-0.5",
    "PT-1S",
    "0",
    "0s",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "Infinity",
    "9" * 400,
    "9" * 20 + "d",
    "9" * 5000,
    "1" + "0" * 30 + "ms",
    "\u0661\u0662s",  # Arabic-Indic 12s
    "\u0663",  # Arabic-Indic 3
    "\U0001d7d7s",  # mathematical bold digit 9
    "\uff15s",  # fullwidth 5
    "5s\u2028",
    "5s\x00",
    "5s\n",
    "\x1b[2J5s",
    "",
    " ",
    "P",
    "PT",
    "1y",
    "1w",
    "3653d",
    "3654d",
    "87660h",
    "0.0000001s",
    "1ms",
    "+5s",
    "5 s",
    "P1Y",
    "99999999:00:00",
    "1 00:00:00",
    huge("9", 1_000_000),
]
PLAUSIBLE_DURATION = re.compile(r"(?P<n>[1-9][0-9]{0,3})(?P<unit>s|m|h|)|PT(?P<pt>[1-9][0-9]?)M")
plausible_durations = st.one_of(
    st.builds(
        lambda n, unit: f"{n}{unit}", st.integers(1, 9999), st.sampled_from(["s", "m", "h", ""])
    ),
    st.builds(lambda n: f"PT{n}M", st.integers(1, 99)),
)
hostile_durations = st.one_of(
    st.sampled_from(HOSTILE_DURATIONS),
    with_controls(plausible_durations),
    st.builds(
        lambda n, unit: f"{n}{unit}",
        st.integers(-(10**15), 10**15),
        st.sampled_from(["", "s", "ms", "m", "h", "d", "sec", "min"]),
    ),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=12),
)
durations = half(plausible_durations, hostile_durations)


def plausible_seconds(text: str) -> float | None:
    """Seconds of a duration of the plausible grammar; None for any other text."""
    match = PLAUSIBLE_DURATION.fullmatch(text)
    if match is None:
        return None
    if match["pt"]:
        return int(match["pt"]) * 60.0
    return int(match["n"]) * {"s": 1, "": 1, "m": 60, "h": 3600}[match["unit"]]


def duration_verdict(
    text: str,
    *,
    positive: bool = False,
    least: dt.timedelta = dt.timedelta(0),
    most_plausible: float = 86400,
    stripped: bool = False,
) -> Verdict:
    """A duration: refused if the validator refuses it (with the door's own lower bound);
    accepted if it is plausible and at most ``most_plausible`` seconds."""
    given = text.strip() if stripped else text
    if refused_by(lambda: values.duration(given, positive=positive, least=least)):
        return INVALID
    if "\x00" in text:  # NUL: no database stores it; typed, it is refused (item 4)
        return INVALID
    seconds = plausible_seconds(given)
    if seconds is None or seconds > most_plausible or (stripped and given != text):
        return EITHER
    return VALID


# --- moments -------------------------------------------------------------------------------

ZONES = ["UTC", "Europe/Paris", "America/St_Johns", "Pacific/Kiritimati", "America/Los_Angeles"]
OFFSETS = ["", "", "Z", "+00:00", "+01:00", "-03:30", "+14:00", "-12:00", "+05:45"]
FORMATS = ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"]
HOSTILE_MOMENTS = [
    "0001-01-01T00:00",
    "0001-01-01",
    "0001-01-01T00:00+14:00",
    "9999-12-31T23:59",
    "9999-12-31T23:59:59.999999",
    "9999-12-31T23:59-12:00",
    "1969-12-31T23:59",
    "1000-01-01T00:00",
    "9000-01-02T00:00",
    "10000-01-01T00:00",
    "0000-01-01T00:00",
    "2026-02-30T00:00",
    "2026-13-01T00:00",
    "2026-11-24T24:00",
    "2026-11-24T02:00+24:00",
    "2026-11-24T02:00+99:00",
    "2030-01-01T00:00\x00",
    "2030-01-01T00:00\n2030",
    "\u202e2030-01-01",
    "\uff12\uff10\uff13\uff10-01-01",
    "last night",
    "now",
    "",
    " ",
    "T",
    huge("2030-01-01", 100_000),
    "2030-01-01T00:00" + "0" * 10_000,
]
years = st.one_of(st.integers(1, 9999), st.integers(1960, 2100), st.integers(8990, 9010))


@st.composite
def extreme_moments(draw: st.DrawFn) -> str:
    """A moment anywhere in years 1-9999, in one of several formats, with or without an
    offset."""
    year = draw(years)
    moment = dt.datetime(
        year,
        draw(st.integers(1, 12)),
        draw(st.integers(1, 28)),
        draw(st.integers(0, 23)),
        draw(st.integers(0, 59)),
        draw(st.integers(0, 59)),
    )
    form = draw(st.sampled_from(FORMATS))
    text = moment.strftime(form).replace(f"{moment:%Y}", f"{year:04d}", 1)
    return text if form == "%Y-%m-%d" else text + draw(st.sampled_from(OFFSETS))


@st.composite
def near_moments(draw: st.DrawFn, now: dt.datetime, least: float, most: float) -> str:
    """A plausible moment: ``least`` to ``most`` hours from ``now``, to the minute, as
    a browser's datetime-local input sends it (no zone)."""
    hours = draw(st.floats(least, most))
    moment = now + dt.timedelta(hours=hours)
    return moment.strftime("%Y-%m-%dT%H:%M")


def moments(now: dt.datetime) -> st.SearchStrategy[str]:
    """Half plausible (days to a year ahead), half hostile."""
    return half(near_moments(now, 72, 24 * 400), hostile_moments(now))


def hostile_moments(now: dt.datetime) -> st.SearchStrategy[str]:
    return st.one_of(
        extreme_moments(),
        st.sampled_from(HOSTILE_MOMENTS),
        with_controls(near_moments(now, 72, 24 * 400)),
        st.text(max_size=20),
    )


PLAUSIBLE_MOMENT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d")


def moment_or_none(text: str, zone: dt.tzinfo, *, stripped: bool = False) -> dt.datetime | None:
    """The moment the validator reads, None if it refuses it."""
    try:
        return values.moment(text.strip() if stripped else text, zone=zone)
    except LockConfigurationError:
        return None


def until_verdict(text: str, zone: dt.tzinfo, now: dt.datetime, *, stripped: bool) -> Verdict:
    """A pause's end: a moment the validator takes, and not past (a pause that ended
    already is no pause). Accepted: a plausible one days ahead."""
    if "\x00" in text:  # NUL: no database stores it; typed, it is refused (item 4)
        return INVALID
    moment = moment_or_none(text, zone, stripped=stripped)
    if moment is None:
        return INVALID
    ahead = _utc(moment) - now
    if ahead < -dt.timedelta(days=2):
        return INVALID  # well in the past
    if ahead < dt.timedelta(days=2):
        return EITHER  # a zone's offset either way
    given = text.strip() if stripped else text
    return VALID if PLAUSIBLE_MOMENT.fullmatch(given) else EITHER


def _utc(moment: dt.datetime) -> dt.datetime:
    offset = moment.utcoffset() or dt.timedelta(0)
    return moment.replace(tzinfo=dt.UTC) - offset if offset else moment.replace(tzinfo=dt.UTC)


# --- time zones and cron -------------------------------------------------------------------

HOSTILE_ZONES = [
    "Mars/Olympus",
    "../../../../etc/passwd",
    "/etc/localtime",
    "Europe/Paris\x00",
    "Europe/Paris\n",
    "\u202eUTC",
    "UTC\u2028",
    "europe/paris",
    " UTC",
    huge("Europe/", 100_000),
    "Etc/GMT+99",
    "",
]
zones = half(
    st.sampled_from(ZONES), st.one_of(st.sampled_from(HOSTILE_ZONES), st.text(max_size=15))
)


def zone_verdict(text: str, *, stripped: bool = False) -> Verdict:
    """A cron schedule's zone; empty: the default one."""
    given = text.strip() if stripped else text
    if "\x00" in text:  # NUL: no database stores it; typed, it is refused (item 4)
        return INVALID
    if not given:
        return VALID if stripped else EITHER
    if refused_by(lambda: values.zone(given)):
        return INVALID
    return VALID if given in ZONES else EITHER


VALID_CRONS = ["0 */2 * * *", "*/5 * * * *", "30 6 * * 1-5", "0 0 * * *", "15,45 * * * *"]
BAD_CRONS = ["61 * * * *", "0 * * *", "* * * * * * * *", "0 25 * * *", "0 0 31 2 *x", "@never"]
HOSTILE_CRONS = [
    huge("* ", 2_000_000),
    huge("*/1,", 100_000) + " * * * *",
    "0 * * * *" + " " * 100_000,
    "0 * * * *\x00",
    "0 * * * *\n0 0 * * *",
    "\x1b[2J0 * * * *",
    "\uff10 * * * *",
    "0 * * * *\u202e",
    "0\u2028* * * *",
    "",
    " ",
    ",".join(str(n % 60) for n in range(2000)) + " * * * *",
]
hostile_crons = st.one_of(
    st.sampled_from(BAD_CRONS),
    st.sampled_from(HOSTILE_CRONS),
    with_controls(st.sampled_from(VALID_CRONS)),
    st.text(st.sampled_from("0123456789*/,-? LW#"), max_size=30),
)
crons = half(st.sampled_from(VALID_CRONS), hostile_crons)


def cron_verdict(text: str, *, stripped: bool = False) -> Verdict:
    given = text.strip() if stripped else text
    if "\x00" in text:  # NUL: no database stores it; typed, it is refused (item 4)
        return INVALID
    if not given.strip() or refused_by(lambda: values.cron(given)):
        return INVALID
    if given in VALID_CRONS and (not stripped or given == text):
        return VALID
    if given in BAD_CRONS:
        return INVALID
    return EITHER


# --- JSON arguments ------------------------------------------------------------------------

json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=10),
)
json_values = st.recursive(
    json_leaves,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
HOSTILE_JSON = [
    "[" * 1000 + "]" * 1000,
    '{"limit": ' + "[" * 5000 + "]" * 5000 + "}",
    '{"limit": ' + '{"a": ' * 1200 + "1" + "}" * 1200 + "}",
    '{"recipients": ["' + "a" * 1_000_000 + '"], "limit": 1}',
    '{"recipients": [' + ",".join(['"a@b.c"'] * 20_000) + '], "limit": 1}',
    '{"limit": NaN}',
    '{"limit": Infinity}',
    '{"limit": 1e999}',
    '{"limit": ' + "9" * 5000 + "}",
    '{"limit": "\\u0000"}',
    '{"limit": "\\ud800"}',
    '{"limit": "a\x1bb"}',
    '{"limit": "\x00"}',
    '{"limit": "\u202e\u2028"}',
    '{"limit": "\U0001f680 launch"}',  # beyond U+FFFF: every database stores it
    '{"limit": 1, "limit": 2}',
    '{"slot": "2026-11-24T00:00"}',
    '{"token": 1}',
    '{"recipients": ["a"], "limt": 1}',
    '{"": 1}',
    "[]",
    "null",
    '"limit"',
    "1",
    "{",
    "{'limit': 1}",
    "",
    "   ",
    "\x00",
    huge(" ", 70_000),
]


@st.composite
def plausible_arguments(draw: st.DrawFn) -> str:
    """digest's arguments, some or all, with any small JSON as their values."""
    given: dict[str, object] = {}
    if draw(st.booleans()):
        given["limit"] = draw(st.integers(0, 1000))
    if draw(st.booleans()):
        given["recipients"] = draw(st.lists(st.emails(), max_size=3))
    if draw(st.booleans()):
        given["limit"] = draw(json_values)
    return json.dumps(given, ensure_ascii=draw(st.booleans()))


hostile_arguments = st.one_of(
    st.sampled_from(HOSTILE_JSON),
    st.dictionaries(st.text(max_size=6), json_values, max_size=3).map(json.dumps),
    st.text(max_size=20),
)
arguments = half(plausible_arguments(), hostile_arguments)
DIGEST_ARGUMENTS = {"recipients", "limit"}


def arguments_verdict(text: str, *, all_needed: bool, stripped: bool = False) -> Verdict:
    """digest's arguments: JSON the validator takes, with only names digest takes (all
    of them for an override, which replaces the declared ones)."""
    given = text.strip() if stripped else text
    if "\x00" in text:  # NUL: no database stores it; typed, it is refused (item 4)
        return INVALID
    try:
        parsed = values.json_arguments(given)
    except LockConfigurationError as exc:
        if "lone surrogate" not in str(exc) or unstorable(json.loads(given)):
            return INVALID
        # A character beyond U+FFFF (an emoji) is stored by every database: the
        # validator's check of the escaped text took its surrogate pair for a lone one.
        parsed = json.loads(given)
    if not parsed.keys() <= DIGEST_ARGUMENTS:
        return INVALID
    if all_needed and parsed.keys() != DIGEST_ARGUMENTS:
        return INVALID
    return VALID


def unstorable(value: object) -> bool:
    """Whether JSON holds text no database stores: a NUL or a lone surrogate."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item or any("\ud800" <= char <= "\udfff" for char in item):
                return True
        elif isinstance(item, dict):
            stack.extend([*item.keys(), *item.values()])
        elif isinstance(item, list):
            stack.extend(item)
    return False


# --- counts (next -n) ----------------------------------------------------------------------

counts = half(
    st.integers(1, 1000).map(str),
    st.one_of(
        st.integers(-(10**30), 10**30).map(str),
        st.sampled_from(
            ["0", "1001", "9" * 5000, "1e3", "nan", "", " 5", "\u0665", "\uff15", "5\x00", "0x10"]
        ),
        st.text(max_size=5),
    ),
)


def count_verdict(text: str, most: int) -> Verdict:
    """``-n``: a whole number from 1 to ``most``; written as digits, it must be taken."""
    if re.fullmatch(r"[1-9][0-9]{0,5}", text):
        return VALID if int(text) <= most else INVALID
    try:
        number = int(text)
    except ValueError:
        return INVALID
    return INVALID if not 1 <= number <= most else EITHER


def zone_of(name: str) -> dt.tzinfo:
    return zoneinfo.ZoneInfo(name)

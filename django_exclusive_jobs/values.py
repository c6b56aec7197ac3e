"""Every value a person can give, checked at one door: one function per kind of value.

The decorator, the commands' options, the admin's forms, an operator's overrides, Run now
and backfill call these, and nothing downstream checks the same thing again. Each
raises :class:`LockConfigurationError` (a ``ValueError``) with one line naming the value
(``what``) and the bound it broke, the same line whichever door the value came in by.

The bounds keep every date the app derives inside what Python (years 1-9999) and all three
databases store (MariaDB's DATETIME: 1000-9999): a moment is within
[:data:`EARLIEST`, :data:`LATEST`], a duration at most :data:`LONGEST`, so a moment plus a
duration is still a date every layer can hold.

Two helpers make text safe on its way out, for text the app did not get from a form:
:func:`printable` (a line of text output cannot be forged) and :func:`storable` (the
database takes what a failure says).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import unicodedata
import zoneinfo
from typing import Any

from .lock.durations import DurationLike, parse_duration
from .lock.errors import LockConfigurationError

# The earliest and latest moment a person may give (a pause's end, a backfill's range).
EARLIEST = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
LATEST = dt.datetime(9000, 1, 1, tzinfo=dt.UTC)
# The longest duration (an interval, a timeout, a tolerance, a wait): ten years.
LONGEST = dt.timedelta(days=3653)
# Names (a job's, a lock's, a schedule's) and what a person writes.
NAME_LENGTH = 255
REASON_LENGTH = 500
CRON_LENGTH = 1000
ZONE_LENGTH = 64
# A run's arguments: stored on every run's row.
JSON_SIZE = 64 * 1024
JSON_DEPTH = 20
# A float this large or larger is written with an exponent, and PostgreSQL's jsonb gives
# it back as a whole number (4.8e16 comes back as the int 48107761178771460).
JSON_FLOAT_LIMIT = 1e16
# A line of text output: what it shows of one value given by a person or a job.
SHOWN_LENGTH = 1000

# Unicode categories a name or a reason must not hold: controls (C0, C1, DEL), format
# characters (bidi controls, zero-width joiners), lone surrogates, unassigned, and the
# line and paragraph separators (U+2028, U+2029).
REFUSED = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def _refused(char: str) -> bool:
    return unicodedata.category(char) in REFUSED


def _shown(value: object) -> str:
    """A value in a message: escaped and cut, so the message stays one line."""
    text = repr(value) if isinstance(value, str) else str(value)
    return printable(text, limit=60)


def name(value: object, *, what: str = "Job name") -> str:
    """A job's, a lock's or a schedule's name: 1-255 characters, no control or format
    character, no white space at its ends."""
    if not isinstance(value, str):
        raise LockConfigurationError(f"{what} must be a string, not {type(value).__name__}.")
    if not value:
        raise LockConfigurationError(f"{what} must not be empty.")
    if len(value) > NAME_LENGTH:
        raise LockConfigurationError(
            f"{what} is {len(value)} characters long; the limit is {NAME_LENGTH}."
        )
    if any(_refused(char) for char in value):
        raise LockConfigurationError(
            f"{what} {_shown(value)} contains a control character or a format character."
        )
    if value != value.strip():
        raise LockConfigurationError(
            f"{what} {_shown(value)} must not start or end with white space."
        )
    return value


GROUP_PREFIX = "group:"  # a concurrency group's lock: ``group:NAME`` (``run/groups.py``)


def groups(value: object) -> tuple[str, ...]:
    """A job's concurrency groups (``group=``): one name, or a list of names, each a
    name as a job's is but short enough for its lock; sorted, each once."""
    given = [value] if isinstance(value, str) else value
    if not isinstance(given, list | tuple | set | frozenset) or not given:
        raise LockConfigurationError(
            f"group must be a name or a list of names, not {_shown(value)}."
        )
    longest = NAME_LENGTH - len(GROUP_PREFIX)
    for each in given:
        name(each, what="Group name")
        if len(each) > longest:
            raise LockConfigurationError(
                f"Group name {_shown(each)} is {len(each)} characters long; the limit is {longest}."
            )
    return tuple(sorted(set(given)))


def reason(
    value: object, *, what: str = "The reason", required: bool = False, limit: int = REASON_LENGTH
) -> str:
    """What a person writes (a reason, ``--by``): at most 500 characters (``limit``) on
    one line, no control or format character."""
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise LockConfigurationError(f"{what} must be text, not {type(value).__name__}.")
    value = value.strip()
    if required and not value:
        raise LockConfigurationError(f"{what} must not be empty.")
    if len(value) > limit:
        raise LockConfigurationError(
            f"{what} is {len(value)} characters long; the limit is {limit}."
        )
    if any(_refused(char) for char in value):
        raise LockConfigurationError(
            f"{what} {_shown(value)} contains a control or format character (one line of "
            "text, please)."
        )
    return value


def duration(
    value: DurationLike,
    *,
    what: str = "duration",
    least: dt.timedelta = dt.timedelta(0),
    most: dt.timedelta = LONGEST,
    positive: bool = False,
) -> dt.timedelta:
    """A duration (``90``, ``90s``, ``15m``, ``PT15M``, a timedelta) from ``least`` (not
    negative by default; ``positive``: more than zero) to ``most`` (ten years by default)."""
    parsed = parse_duration(value, what=what)
    if positive and parsed <= dt.timedelta(0):
        raise LockConfigurationError(f"{what} must be positive, got {parsed.total_seconds():g}s.")
    if parsed < least:
        if least == dt.timedelta(0):
            raise LockConfigurationError(
                f"{what} must not be negative, got {parsed.total_seconds():g}s."
            )
        raise LockConfigurationError(
            f"{what} must be at least {_seconds(least)}, got {parsed.total_seconds():g}s."
        )
    if parsed > most:
        raise LockConfigurationError(
            f"{what} must be at most {_seconds(most)}, got {_shown(value)}."
        )
    return parsed


def moment(
    value: dt.datetime | str,
    *,
    what: str = "moment",
    zone: dt.tzinfo | None = None,
) -> dt.datetime:
    """A moment (an ISO 8601 string or a datetime), aware: one without a zone is read in
    ``zone`` (UTC when None). From 1970-01-01 to 9000-01-01 UTC."""
    if isinstance(value, str):
        text = value.strip()
        # fromisoformat reads past a trailing NUL: a control character is never a time
        if len(text) > 64 or any(_refused(char) for char in text):
            raise LockConfigurationError(f"{what} {_shown(value)} is not an ISO 8601 time.")
        try:
            parsed = dt.datetime.fromisoformat(text)
        except ValueError:
            raise LockConfigurationError(
                f"{what} must be an ISO 8601 time such as 2026-11-24T02:00 or "
                f"2026-11-24T02:00+01:00, got {_shown(value)}."
            ) from None
    elif isinstance(value, dt.datetime):
        parsed = value
    else:
        raise LockConfigurationError(f"{what} must be a time, not {type(value).__name__}.")
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        parsed = parsed.replace(tzinfo=zone or dt.UTC)
    # Compared on naive UTC wall times: an aware datetime near year 1 or 9999 cannot
    # always be moved to UTC (OverflowError).
    offset = parsed.utcoffset() or dt.timedelta(0)
    wall = parsed.replace(tzinfo=None)
    earliest = EARLIEST.replace(tzinfo=None) + offset
    latest = LATEST.replace(tzinfo=None) + offset
    if not earliest <= wall <= latest:
        raise LockConfigurationError(
            f"{what} must be between {EARLIEST:%Y-%m-%d} and {LATEST:%Y-%m-%d} (UTC), got "
            f"{_shown(value if isinstance(value, str) else value.isoformat())}."
        )
    return parsed


def zone(value: object, *, what: str = "Time zone") -> str:
    """An IANA time zone name, such as ``Europe/Paris``."""
    if not isinstance(value, str) or not value.strip():
        raise LockConfigurationError(f"{what} must be a zone name such as Europe/Paris.")
    if len(value) > ZONE_LENGTH or any(_refused(char) for char in value):
        raise LockConfigurationError(f"Unknown time zone {_shown(value)}.")
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise LockConfigurationError(f"Unknown time zone {_shown(value)}.") from None
    return value


# Debian cron's and Kubernetes' names of a schedule, any case: their five fields.
CRON_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def cron(value: object, *, what: str = "Cron expression") -> str:
    """A cron expression's text, before its fields are read: at most 1,000 characters of
    printable ASCII. Returned with its fields separated by one space; an alias
    (:data:`CRON_ALIASES`) as its five fields."""
    if not isinstance(value, str):
        raise LockConfigurationError(f"{what} must be a string like '0 * * * *'.")
    if len(value) > CRON_LENGTH:
        raise LockConfigurationError(
            f"{what} is {len(value)} characters long; the limit is {CRON_LENGTH}."
        )
    if not value.isascii() or any(_refused(char) for char in value.replace("\t", " ")):
        raise LockConfigurationError(f"{what} {_shown(value)} may hold only printable ASCII.")
    text = " ".join(value.split())
    if text.startswith("@"):
        if text.lower() not in CRON_ALIASES:
            names = ", ".join(CRON_ALIASES)
            raise LockConfigurationError(
                f"{what} {_shown(text)} is not one of cron's names ({names}); "
                "@reboot is not a schedule: start the job with your process manager."
            )
        return CRON_ALIASES[text.lower()]
    return text


def json_arguments(value: object, *, what: str = "The arguments") -> dict[str, Any]:
    """A run's keyword arguments: a JSON object (names to values) of at most 64 KiB and
    20 levels. A string is read as JSON first (blank: none)."""
    if isinstance(value, str):
        if len(value) > JSON_SIZE:
            raise LockConfigurationError(
                f"{what} are {len(value)} characters long; the limit is {JSON_SIZE}."
            )
        if not value.strip():
            return {}
        if _depth_of_text(value) > JSON_DEPTH:
            raise LockConfigurationError(f"{what} are nested more than {JSON_DEPTH} levels deep.")
        try:
            value = json.loads(value)
        except (ValueError, RecursionError) as exc:
            said = printable(str(exc), limit=120)
            raise LockConfigurationError(
                f"{what} are not JSON ({said}): give an object of names to values, such "
                'as {"day": "2026-11-24"}.'
            ) from None
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise LockConfigurationError(
            f"{what} must be a dict of argument names to values, not {_shown(value)}."
        )
    if _depth(value) > JSON_DEPTH:
        raise LockConfigurationError(f"{what} are nested more than {JSON_DEPTH} levels deep.")
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        raise LockConfigurationError(
            f"{what} {_shown(value)} are not JSON: the run history stores them, so use only "
            "str, int, float, bool, None, lists and dicts with str keys."
        ) from None
    if len(text) > JSON_SIZE:
        raise LockConfigurationError(
            f"{what} are {len(text)} characters as JSON; the limit is {JSON_SIZE}."
        )
    if any("\x00" in each or _has_lone_surrogate(each) for each in _strings(value)):
        raise LockConfigurationError(
            f"{what} hold a NUL character or a lone surrogate, which the database cannot store."
        )
    if json.loads(text) != value:  # a tuple comes back a list
        raise LockConfigurationError(
            f"{what} {_shown(value)} are not JSON: the run history stores them, so use only "
            "str, int, float, bool, None, lists and dicts with str keys."
        )
    if any(abs(number) >= JSON_FLOAT_LIMIT for number in _floats(value)):
        raise LockConfigurationError(
            f"{what} hold a decimal number of 1e16 or more, which a database gives back as "
            "another number: give it as an integer or as a string."
        )
    return value


def _depth(value: object, level: int = 1) -> int:
    """How deeply ``value`` nests, counted without recursion (stops past the limit)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, level)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if deepest > JSON_DEPTH:
                return deepest
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _depth_of_text(text: str) -> int:
    """How deeply JSON text nests, without parsing it (brackets in strings aside)."""
    depth = deepest = 0
    for token in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', text):
        char = token.group()
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _strings(value: object) -> list[str]:
    """Every string in ``value``, keys included (without recursion)."""
    return [item for item in _leaves(value) if isinstance(item, str)]


def _floats(value: object) -> list[float]:
    """Every float in ``value`` (without recursion)."""
    return [item for item in _leaves(value) if isinstance(item, float)]


def _leaves(value: object) -> list[object]:
    """Everything in ``value`` that is not a dict or a list, keys included (without
    recursion)."""
    found: list[object] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        else:
            found.append(item)
    return found


def _seconds(delta: dt.timedelta) -> str:
    seconds = delta.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size:g}{unit}"
    return f"{seconds:g}s"


# --- text on its way out ------------------------------------------------------------------

_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\e"}


def printable(text: object, *, limit: int = SHOWN_LENGTH) -> str:
    """``text`` as one line that cannot pass for another: newlines, CR, ESC and the other
    C0 and C1 controls, U+2028/U+2029, bidi and other format characters escaped
    (``\\n``, ``\\x1b``, ``\\u202e``); cut to ``limit`` characters with ``…`` after."""
    value = str(text)
    cut = len(value) > limit
    if cut:
        value = value[:limit]
    shown = "".join(_escape(char) for char in value)
    return f"{shown}…" if cut else shown


def _escape(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    if not _refused(char):
        return char
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def storable(text: str) -> str:
    """``text`` as every database stores it: NUL and lone surrogates (which PostgreSQL and
    MariaDB refuse) replaced by U+FFFD."""
    if "\x00" not in text and not _has_lone_surrogate(text):
        return text
    return re.sub("[\x00\ud800-\udfff]", "\ufffd", text)


def _has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False

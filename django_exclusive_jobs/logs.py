"""The lines the app prints: one sentence for people, the same facts as fields for machines.

Every decision is one line (``acquired report token=42 holder=web-1:812:5f0c2a9e ...``),
logged on the ``django_exclusive_jobs`` logger and printed by the commands. Each line
also carries its facts as fields, named as the metrics' labels are: ``event`` (what
happened, one of :data:`EVENTS`), ``job_name`` (not ``job``, which Prometheus and Loki
give the scrape target), ``status``, ``slot``, ``token``, ``holder``, ``attempt``,
``duration``, ``scheduler`` (``host:pid``)... (a field that does not apply is left out):

- on the log record, as ``record.exclusive_jobs`` (a dict) and as attributes of their
  own, for a formatter's ``%(job_name)s``;
- :class:`JSONFormatter` writes each record as one JSON object;
- ``EXCLUSIVE_JOBS["LOG_FORMAT"] = "json"`` makes the commands print those objects
  instead of the sentences.

A sentence carries text the app did not write: a job's exception message, a reason and
who gave it, a name. As people read it (the commands' text mode, the log record's
message) it is :attr:`Line.shown`: one line that cannot pass for another, control and
format characters escaped (``values.printable``). :func:`given` cuts such a value to
``values.SHOWN_LENGTH`` characters where the sentence is made. The JSON form keeps the
sentence as it was made (JSON escapes what it must).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable
from typing import Any

from .values import SHOWN_LENGTH, printable

logger = logging.getLogger("django_exclusive_jobs")

# What a line says happened: stable names, for alerts and dashboards.
EVENTS = {
    "acquired": "a server won the job's lock and claimed its slot: the job starts",
    "finished": "a run ended (status, duration, attempt)",
    "skipped": "a start ran nothing: the lock is held, the slot has a run, it is paused...",
    "missed": "slots no server ran were recorded missed",
    "overlapped": "slots that came during a run were recorded skipped (overlap)",
    "waiting": "a start waits for its slot's start (fired early, jitter) or for a retry (retry_at)",
    "cancelling": "a newer slot asked the running run to stop (overlap='cancel_other')",
    "stopping": "a run is being stopped: a newer slot, its timeout, a lost lock, shutdown",
    "lost": "runs whose server died or lost the lock were marked lost",
    "retry_given_up": "a newer slot began before a slot's retry: that retry never runs",
    "unrecorded": "a run's end could not be written (written later, or never)",
    "database": "the database stopped or started answering",
    "scheduler": "a scheduler started, is stopping, or stopped",
    "not_started": "a due job could not be started",
    "backfill": "a backfill's plan, progress or result",
    "override": "a scheduler runs a job as an operator overrode it, or back as its code says",
    "paused": "a job was paused by the app: its last runs failed (pause_after=N)",
    "misconfigured": "a job's operator row cannot be used: its runs wait until it is put right",
    "running_long": "a run has lasted its job's warn_after: it goes on",
    "schedule": "a scheduler serves a run-time schedule as added or changed, or no longer",
}

# EXCLUSIVE_JOBS["LOG_FORMAT"]: what the commands print.
FORMATS = ("text", "json")

# The keys a line's fields may have.
FIELDS = (
    "event",
    "job_name",
    "status",
    "slot",
    "token",
    "holder",
    "attempt",
    "duration",
    "scheduler",
    "lock",
    "slots",
    "retry_at",
    "until",
    "error",
)


class Line(str):
    """A line as people read it, with its :attr:`fields` for machines (a ``str``, so
    whatever takes a line takes one)."""

    fields: dict[str, Any]

    def __new__(cls, text: str, fields: dict[str, Any]) -> Line:
        line = super().__new__(cls, text)
        line.fields = fields
        return line

    @property
    def shown(self) -> str:
        """The sentence as a line of text output: control and format characters escaped,
        so that no text it carries can end it or start another (nothing cut: each value
        given by a person or a job was cut by :func:`given`)."""
        return one_line(self)

    def as_json(self) -> str:
        """The JSON form: the fields, the time, the sentence as ``message``."""
        now = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
        return json.dumps({"time": now, **self.fields, "message": str(self)}, default=str)


def line(event: str, text: str, **fields: Any) -> Line:
    """The line ``text`` with its fields (those given as None are left out)."""
    assert event in EVENTS, event
    values = {key: _plain(value) for key, value in fields.items() if value is not None}
    unknown = set(values) - set(FIELDS)
    assert not unknown, unknown
    return Line(text, {"event": event, **values})


def one_line(text: str) -> str:
    """``text`` with its control and format characters escaped (``values.printable``),
    not cut. Most lines have none: ``str.isprintable`` (C, 50 times quicker) says so."""
    return str(text) if text.isprintable() else printable(text, limit=len(text))


def given(value: object) -> str:
    """A value given by a person or a job (an exception's message, a reason), as a
    sentence carries it: at most ``values.SHOWN_LENGTH`` characters, ``…`` after a cut."""
    text = str(value)
    return text if len(text) <= SHOWN_LENGTH else f"{text[:SHOWN_LENGTH]}…"


def shown(text: str) -> str:
    """Any line as text output shows it: a :class:`Line`'s :attr:`~Line.shown`, other text
    escaped and cut as a value given by a person or a job is."""
    return text.shown if isinstance(text, Line) else printable(text)


def extra(event: str, **fields: Any) -> dict[str, Any]:
    """``logger.warning(..., extra=extra("lost", job_name=name))``: a log call's fields."""
    fields_of = line(event, "", **fields).fields
    return {"exclusive_jobs": fields_of, **fields_of}


def send_robustly(signal: Any, name: str, log_fields: dict[str, Any], /, **kwargs: Any) -> None:
    """Send ``signal`` (named ``name``) with ``kwargs`` to every receiver: one that raises
    is an ERROR line with its traceback and ``log_fields`` (:func:`extra`), never the
    sender's exception (what it reports has happened already)."""
    for receiver, answer in signal.send_robust(**kwargs):
        if isinstance(answer, Exception):
            logger.error("%s receiver %r raised", name, receiver, exc_info=answer, extra=log_fields)


def say(report: Callable[[str, bool], None] | None, said: Line, *, normal: bool = True) -> None:
    """Log ``said`` (INFO, or WARNING when not ``normal``) with its fields, and hand it to
    ``report`` (a command's output)."""
    fields = said.fields
    logger.log(
        logging.INFO if normal else logging.WARNING,
        said.shown,
        extra={"exclusive_jobs": fields, **fields, "exclusive_jobs_sentence": str(said)},
    )
    if report is not None:
        report(said, normal)


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, float):
        return round(value, 3)
    return value


class JSONFormatter(logging.Formatter):
    """One JSON object per record: ``time``, ``level``, ``logger``, the app's fields (for
    its own records), ``message``, and ``exception`` when there is one. For LOGGING::

        "formatters": {"json": {"()": "django_exclusive_jobs.logs.JSONFormatter"}}
    """

    def format(self, record: logging.LogRecord) -> str:
        created = dt.datetime.fromtimestamp(record.created, dt.UTC)
        data: dict[str, Any] = {
            "time": created.isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            **getattr(record, "exclusive_jobs", {}),
            # A decision line's sentence as it was made (its message is escaped for text).
            "message": getattr(record, "exclusive_jobs_sentence", None) or record.getMessage(),
        }
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)

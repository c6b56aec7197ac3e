"""The admin's pictures as SVG geometry: each job's strip of its last runs (the jobs
page) and a job's durations over the last 30 days (the job's page).

Pure Python, rows in and shapes out; the templates draw them, autoescaped. Each run's
status has a look (:data:`LOOKS`): a colour and also a shape or pattern, so the pictures
read without telling colours apart.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..run.status import RunStatus
from .display import duration as duration_text

STRIP_RUNS = 50  # runs in a job's strip on the jobs page
CHART_DAYS = 30  # the span of a job's chart of durations
CHART_RUNS = 500  # at most this many runs (the newest) in that chart

# Each status's look: its CSS class (``ej-<look>``), its pattern and its marker in the
# page's definitions (pictures_defs.html).
LOOKS = {
    RunStatus.SUCCEEDED: "ok",
    RunStatus.ENQUEUED: "ok",
    RunStatus.FAILED: "failed",
    RunStatus.TIMED_OUT: "timed-out",
    RunStatus.LOST: "lost",
    RunStatus.INTERRUPTED: "stopped",
    RunStatus.CANCELLED: "stopped",
    RunStatus.RUNNING: "running",
    RunStatus.MISSED: "missed",
    RunStatus.SKIPPED: "skipped",
    RunStatus.PAUSED: "skipped",
}
# The legend: each look, and how it shows besides its colour.
LEGEND = [
    ("ok", _("succeeded or enqueued: a solid bar")),
    ("failed", _("failed: cross-hatched, a cross below")),
    ("timed-out", _("timed out: striped, a cap on top")),
    ("lost", _("lost: dotted, ▲ below")),
    ("stopped", _("interrupted or cancelled: a hollow bar")),
    ("running", _("running: a dashed bar, • below")),
    ("missed", _("missed: a gap with a dashed outline")),
    ("skipped", _("skipped or paused: a small circle")),
]

BAR_WIDTH = 5
BAR_STEP = 6  # a bar and the space after it
BAR_AREA = 24  # the tallest bar, in px
LOWEST = 2  # the shortest bar: a run of a few milliseconds still shows
MARK_ROW = 8  # the row of markers under the bars


class Run(Protocol):
    """What a picture reads of a run (a ``JobRun``)."""

    pk: int
    status: str
    slot: dt.datetime | None
    started_at: dt.datetime
    duration: float | None


@dataclass(frozen=True)
class Bar:
    """One run in a strip: a rectangle, and a marker under it for some looks."""

    run_id: int
    look: str
    x: float
    y: float
    height: float
    title: str

    @property
    def middle(self) -> float:
        return self.x + BAR_WIDTH / 2

    @property
    def marked(self) -> bool:
        return self.look in ("failed", "lost", "running")


@dataclass(frozen=True)
class Strip:
    """A job's last runs, oldest on the left, the newest at the right end."""

    bars: list[Bar]
    label: str  # what a screen reader says of it: the counts per status
    width: int = STRIP_RUNS * BAR_STEP

    height = BAR_AREA + MARK_ROW
    bar_width = BAR_WIDTH
    baseline = BAR_AREA + 0.5  # the axis under the bars, on a pixel's middle
    dot_y = BAR_AREA - 3  # a skipped slot's circle
    mark_y = BAR_AREA + MARK_ROW / 2


def title(run: Run, zone: dt.tzinfo | None = None) -> str:
    """A run's tooltip: its slot (or start) to the second in the current time zone (as
    ``display.moment``, which is too slow for fifty thousand bars), status and duration."""
    when = run.slot if run.slot is not None else run.started_at
    if timezone.is_aware(when):
        when = when.astimezone(zone or timezone.get_current_timezone())
    what = RunStatus(run.status).label
    took = "" if run.duration is None else f", {duration_text(run.duration)}"
    return f"{when:%Y-%m-%d %H:%M:%S}: {what}{took}"


def strip(runs: Sequence[Run]) -> Strip:
    """The strip of ``runs`` (newest first, as :meth:`JobRunQuerySet.last_runs` reads
    them): a bar's height is its duration against the longest of them, linear, at least
    ``LOWEST``; a run without a duration (running, missed) is a full-height outline."""
    shown = list(reversed(runs[:STRIP_RUNS]))
    zone = timezone.get_current_timezone()
    longest = max((run.duration or 0 for run in shown), default=0)
    start = STRIP_RUNS - len(shown)
    bars = []
    for index, run in enumerate(shown):
        look = LOOKS.get(RunStatus(run.status), "ok")
        if look == "skipped":
            height = 0.0  # drawn as a circle on the baseline
        elif run.duration is None or look in ("missed", "running"):
            height = float(BAR_AREA)
        else:
            scaled = run.duration / longest * BAR_AREA if longest else 0
            height = round(max(LOWEST, scaled), 1)
        x = float((start + index) * BAR_STEP)
        bars.append(Bar(run.pk, look, x, round(BAR_AREA - height, 1), height, title(run, zone)))
    counts = Counter(RunStatus(run.status) for run in shown)
    said = ", ".join(f"{counts[status]} {status.label}" for status in RunStatus if counts[status])
    return Strip(bars, gettext("the last %(n)d runs: %(said)s") % {"n": len(shown), "said": said})


def draw(strip: Strip, runs_url: str) -> SafeString:
    """The strip as an SVG element, every value escaped; a bar links to its run (its
    change page under ``runs_url``, the run history's address). Drawn here, not in a
    template: the jobs page of a thousand jobs draws fifty thousand bars."""
    return format_html(
        '<svg class="ej-strip" width="{}" height="{}" viewBox="0 0 {} {}" role="img" '
        'aria-label="{}"><line class="ej-baseline" x1="0" x2="{}" y1="{}" y2="{}"/>{}</svg>',
        strip.width,
        strip.height,
        strip.width,
        strip.height,
        strip.label,
        strip.width,
        strip.baseline,
        strip.baseline,
        format_html_join("", "{}", ((_draw_bar(bar, runs_url),) for bar in strip.bars)),
    )


def _draw_bar(bar: Bar, runs_url: str) -> SafeString:
    if bar.look == "skipped":
        shape = format_html('<circle cx="{}" cy="{}" r="2"/>', bar.middle, Strip.dot_y)
    else:
        shape = format_html(
            '<rect x="{}" y="{}" width="{}" height="{}"/>', bar.x, bar.y, BAR_WIDTH, bar.height
        )
    if bar.look == "timed-out":
        cap = '<rect class="ej-cap" x="{}" y="{}" width="{}" height="1.5"/>'
        shape += format_html(cap, bar.x, bar.y, BAR_WIDTH)
    if bar.marked:
        mark = '<use href="#ej-mark-{}" x="{}" y="{}"/>'
        shape += format_html(mark, bar.look, bar.middle, Strip.mark_y)
    if not bar.run_id:  # a legend's sample
        return format_html('<g class="ej-bar ej-{}">{}</g>', bar.look, shape)
    return format_html(
        '<a href="{}{}/change/" class="ej-bar ej-{}"><title>{}</title>{}</a>',
        runs_url,
        bar.run_id,
        bar.look,
        bar.title,
        shape,
    )


def legend() -> list[tuple[Strip, str]]:
    """Each look as a strip of one bar (a run of two thirds of the longest one's
    duration; missed and running at full height), and what it means."""
    samples = []
    for look, meaning in LEGEND:
        height = float(BAR_AREA) if look in ("missed", "running") else BAR_AREA * 2 / 3
        height = 0.0 if look == "skipped" else height
        bar = Bar(0, look, 0.0, BAR_AREA - height, height, str(meaning))
        samples.append((Strip([bar], str(meaning), width=BAR_WIDTH), str(meaning)))
    return samples


# The chart of durations, in px: the plot and the margins for the axes' labels.
CHART_WIDTH = 720
CHART_HEIGHT = 240
LEFT = 70
RIGHT = 130
TOP = 24  # room for the axis's name
Y_TICKS = 4
BOTTOM = 28
# A timeout over this many times the longest run is said, not drawn: drawn, it would
# squash every run against the axis.
TIMEOUT_SHOWN_UP_TO = 3


@dataclass(frozen=True)
class Point:
    run_id: int
    look: str
    x: float
    y: float
    title: str


@dataclass(frozen=True)
class Level:
    """A horizontal line across the plot (the median, the timeout) or a y-axis tick."""

    y: float
    seconds: float

    @property
    def text(self) -> str:
        return duration_text(self.seconds)


@dataclass(frozen=True)
class Tick:
    """A mark on the time axis."""

    x: float
    when: dt.datetime


@dataclass(frozen=True)
class Chart:
    points: list[Point]
    line: str  # the points joined, as an SVG polyline's ``points``
    y_ticks: list[Level]
    x_ticks: list[Tick]
    median: Level | None
    timeout: Level | None
    timeout_above: float | None  # a timeout too long to draw, in seconds

    width = CHART_WIDTH
    height = CHART_HEIGHT
    left = LEFT
    right = CHART_WIDTH - RIGHT
    top = TOP
    bottom = CHART_HEIGHT - BOTTOM

    @property
    def timeout_above_text(self) -> str:
        return "" if self.timeout_above is None else duration_text(self.timeout_above)


def chart(
    runs: Sequence[Run],
    *,
    now: dt.datetime,
    median: float | None,
    timeout: float | None,
    days: int = CHART_DAYS,
) -> Chart:
    """Each run's duration (runs oldest first, each with a duration) against its start,
    over the ``days`` up to ``now``; the median and the timeout as lines. The y axis is
    linear from 0 to a little over the longest of the runs, the median and the timeout
    (unless the timeout is over ``TIMEOUT_SHOWN_UP_TO`` times the longest run)."""
    since = now - dt.timedelta(days=days)
    longest = max((run.duration or 0 for run in runs), default=0)
    drawn = timeout if timeout and timeout <= TIMEOUT_SHOWN_UP_TO * max(longest, 1e-9) else None
    peak = _round_up(max(longest, median or 0, drawn or 0) * 1.05)
    span = (now - since).total_seconds()
    plot_width = CHART_WIDTH - LEFT - RIGHT
    plot_height = CHART_HEIGHT - TOP - BOTTOM

    def x_of(when: dt.datetime) -> float:
        return round(LEFT + (when - since).total_seconds() / span * plot_width, 1)

    def y_of(seconds: float) -> float:
        return round(TOP + plot_height - seconds / peak * plot_height, 1)

    points = [
        Point(
            run.pk,
            LOOKS.get(RunStatus(run.status), "ok"),
            x_of(run.started_at),
            y_of(run.duration or 0),
            title(run),
        )
        for run in runs
    ]
    y_ticks = [Level(y_of(peak * k / Y_TICKS), peak * k / Y_TICKS) for k in range(Y_TICKS + 1)]
    x_ticks = [
        Tick(x_of(since + (now - since) * k / 6), since + (now - since) * k / 6) for k in range(7)
    ]
    return Chart(
        points=points,
        line=" ".join(f"{p.x},{p.y}" for p in points),
        y_ticks=y_ticks,
        x_ticks=x_ticks,
        median=None if median is None else Level(y_of(median), median),
        timeout=None if drawn is None else Level(y_of(drawn), drawn),
        timeout_above=timeout if timeout and drawn is None else None,
    )


def _round_up(seconds: float) -> float:
    """The top of the y axis: the smallest 1, 2, 2.5 or 5 times a power of ten, times
    ``Y_TICKS``, at or over ``seconds``, so that every tick reads round."""
    if seconds <= 0:
        return float(Y_TICKS)
    power = 10 ** math.floor(math.log10(seconds / Y_TICKS))
    step = next(k * power for k in (1, 2, 2.5, 5, 10) if k * power * Y_TICKS >= seconds)
    return float(step * Y_TICKS)

"""The jobs one scheduler serves, as they run now: each as declared, with its
operators' override (read at each poll, see overrides.py), or misconfigured (a row that
cannot be used: its runs are not started until it is put right, the others go on); the
schedules added at run time to those jobs (runtime_schedules.py), each a job of its
own; and the jobs whose "run now" requests it serves, with or without a schedule."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import logs
from ..logs import Line, line
from . import overrides, runtime_schedules

if TYPE_CHECKING:
    from ..models import JobState, RunTimeSchedule
    from .registry import Job


class ServedJobs:
    def __init__(
        self,
        jobs: list[Job],
        on_request: list[Job] | None,
        say: Callable[[Line, bool], None],
        *,
        schedules: bool = True,
    ) -> None:
        self.declared = {job.name: job for job in jobs}
        self.jobs = dict(self.declared)
        self.on_request = {
            job.name: job for job in (on_request if on_request is not None else jobs)
        }
        # The code's jobs, which run-time schedules may be added to; their slots are
        # served unless ``schedules`` is False (SKIP_SCHEDULES: only run now).
        self.code = {**self.on_request, **self.declared}
        self.schedules = schedules
        self.added: dict[str, tuple[Any, ...]] = {}  # each run-time schedule's row, as taken
        self.applied: dict[str, dict[str, Any]] = {}  # the override each job runs with
        self.misconfigured: dict[str, str] = {}  # why each misconfigured job is
        self.say = say

    @property
    def names(self) -> list[str]:
        """Every job it serves, with a schedule or only on request."""
        return sorted(set(self.declared) | set(self.on_request))

    def follow(
        self,
        states: dict[str, JobState],
        now: dt.datetime,
        misconfigure: Callable[[str, str], None],
    ) -> list[str]:
        """Take each job as its operators override it now (``states``: their rows); a
        row that cannot be used goes to ``misconfigure`` until it changes, and one put
        right is served again. Each run reads the override again itself, with the pause
        (``Run._in_force``): it is given the job as declared. The declared jobs whose
        schedule changed, or that were put right: due again from their schedule."""
        moved = []
        for name in self.names:
            state = states.get(name)
            override = state.override if state is not None else {}
            if override == self.applied.get(name, {}):
                continue
            before = self.applied.get(name, {})
            self.applied[name] = override
            what = overrides.describe_all(override) if isinstance(override, dict) else "?"
            said = (
                f"{name}: overridden ({logs.given(what)})"
                if override
                else f"{name}: back to its code"
            )
            self.say(line("override", said, job_name=name), True)
            declared = self.declared.get(name) or self.on_request[name]
            try:
                job = overrides.tried(overrides.in_force(declared, state), now)
            except overrides.Misconfigured as exc:
                misconfigure(name, exc.reason)
                continue
            was_misconfigured = self.misconfigured.pop(name, None) is not None
            if was_misconfigured:
                said = f"{name}: fixed, served again"
                self.say(line("misconfigured", said, job_name=name, status="fixed"), True)
            if name in self.declared:
                self.jobs[name] = job
                if override.get("schedule") != before.get("schedule") or was_misconfigured:
                    moved.append(name)
        return moved

    def take_added(
        self,
        rows: list[RunTimeSchedule],
        now: dt.datetime,
        misconfigure: Callable[[str, str], None],
    ) -> tuple[list[str], list[str]]:
        """Serve the run-time schedules in force (``rows``: those of its jobs) as they
        are now: the names added or changed (due again from their schedule), and those
        gone (deleted, switched off, ended: served no more; a run under way ends)."""
        rows = [row for row in rows if row.job in self.code and row.name not in self.code]
        wanted = {row.name: row for row in runtime_schedules.in_force(rows, now)}
        gone = [name for name in self.added if name not in wanted]
        for name in gone:
            del self.added[name]
            for served in (self.declared, self.jobs, self.on_request, self.applied):
                served.pop(name, None)
            self.misconfigured.pop(name, None)
            self.say(line("schedule", f"{name}: no longer scheduled", job_name=name), True)
        moved = []
        for name, row in wanted.items():
            seen = tuple(runtime_schedules.settings_of(row).values())
            if self.added.get(name) == seen:
                continue
            self.added[name] = seen
            self.applied.pop(name, None)  # its override, if any, applied again (follow)
            try:
                job = runtime_schedules.job_of(row, self.code[row.job])
            except overrides.Misconfigured as exc:
                misconfigure(name, exc.reason)
                continue
            self.misconfigured.pop(name, None)
            self.on_request[name] = job
            if self.schedules:
                self.declared[name] = self.jobs[name] = job
                moved.append(name)
            said = f"{name}: scheduled at run time, {runtime_schedules.describe(row)}"
            self.say(line("schedule", said, job_name=name), True)
        return moved, gone

    def misconfigure(self, name: str, reason: str) -> None:
        """One line, once, for a job whose row cannot be used (or whose schedule cannot
        be computed)."""
        if name in self.misconfigured:
            return
        self.misconfigured[name] = reason
        said = f"misconfigured {name}: {reason}; its runs are not started until it is fixed"
        self.say(line("misconfigured", said, job_name=name, status="misconfigured"), False)

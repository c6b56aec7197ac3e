"""What a run says: one line per decision (to the log and the command's output), and
the signals receivers are sent for a skip, missed slots and a run's end."""

from __future__ import annotations

import datetime as dt

from .. import logs, signals
from ..lock.lock import Lock
from ..logs import line
from . import history
from .catchup import Replaced
from .ending import RunResult
from .run_state import RunState
from .status import RunStatus


class Saying(RunState):
    """The run's lines and signals (the floor above :class:`RunState`)."""

    def _say_missed(
        self, lock: Lock, missed: list[dt.datetime], replaced: Replaced | None = None
    ) -> None:
        """One line for the slots this start found missed (one more for those of a
        schedule an operator replaced), and a signal for each slot recorded on its own
        (not for those of a missed-range record)."""
        old = replaced.slots if replaced is not None else []
        new = missed[len(old) :]
        if replaced is not None and replaced.total:
            oldest = replaced.first or old[0]
            first, last = oldest.isoformat(), old[-1].isoformat()
            span = first if replaced.total == 1 else f"{first} .. {last}"
            changed = replaced.changed.isoformat(timespec="seconds")
            said = (
                f"missed {self.name}: {replaced.how_many()} slot(s) of its replaced schedule "
                f"({replaced.schedule}) no server ran, {span}, before its schedule changed at "
                f"{changed}; recorded"
            )
            if replaced.earlier:
                said += f" (the newest {len(old)} one by one, the others as one range)"
            self._say(line("missed", said, job_name=self.name, slots=old), normal=False)
        if new:
            first, last = new[0].isoformat(), new[-1].isoformat()
            span = first if len(new) == 1 else f"{first} .. {last}"
            said = f"missed {self.name}: {len(new)} slot(s) no server ran, {span}; recorded"
            self._say(line("missed", said, job_name=self.name, slots=new), normal=False)
        for slot in missed:
            # Robust: the rows are written; a receiver that raises must not undo the run.
            logs.send_robustly(
                signals.slot_missed,
                "slot_missed",
                logs.extra("missed", job_name=self.name, slot=slot),
                sender=self.name,
                name=self.name,
                slot=slot,
                noticed_by=lock.holder,
            )

    def _say_skipped(self, skipped: list[dt.datetime]) -> None:
        """One line for the slots that came during the previous run and were skipped."""
        if skipped:
            first, last = skipped[0].isoformat(), skipped[-1].isoformat()
            span = first if len(skipped) == 1 else f"{first} .. {last}"
            said = (
                f"skipped {self.name}: {len(skipped)} slot(s) came while its previous run "
                f"still ran (overlap={self.job.overlap}), {span}; recorded"
            )
            self._say(line("overlapped", said, job_name=self.name, slots=skipped))

    def _skipped(self, why: str, holder: str, until: dt.datetime | None) -> RunResult:
        fields = {"holder": holder or None, "until": until, "slot": self.slot}
        said = f"skipped {self.name}: {logs.given(why)}"  # a pause's reason is in ``why``
        self._say(line("skipped", said, job_name=self.name, **fields))
        extra = {"slot": self.slot} if self.slot is not None else {}
        signals.job_skipped.send(
            sender=self.name, name=self.name, holder=holder, expires_at=until, **extra
        )
        return RunResult(
            self.name, RunStatus.SKIPPED, holder=holder, held_until=until, retry_at=self.retry_at
        )

    def _say(self, said: logs.Line, *, normal: bool = True) -> None:
        """One line per decision: to the log, and to ``report`` (the command's output)."""
        for key, value in self.context.items():
            said.fields.setdefault(key, value)
        logs.say(self.report, said, normal=normal)

    def _say_finished(self, lock: Lock, result: RunResult) -> None:
        detail = ""
        if result.returncode not in (None, 0):
            detail = f" exit={result.returncode}"
        if result.enqueued is not None:
            detail += f" task={result.enqueued.result_id} backend={result.enqueued.backend}"
        if result.exception is not None:
            exc = result.exception
            message = getattr(exc, "message", None) or exc
            detail += f" error={history.error_type(exc)}: {logs.given(message)}"
        if self.slot is not None and self.job.retries and not self.backfilled:
            # "attempt 1 of 3 failed; retry at T" (a backfill's attempts are not counted)
            ended = self.job.retry.describe(result.attempt, result.status.value, result.retry_at)
            detail += f" ({ended})"
        said = (
            f"finished {self.name} status={result.status.value} "
            f"duration={result.duration:.3f}s token={lock.token}{detail}"
        )
        fields = {
            "status": result.status.value,
            "duration": result.duration,
            "token": lock.token,
            "slot": self.slot,
            "attempt": result.attempt,
            "retry_at": result.retry_at,
            "error": history.error_type(result.exception) if result.exception else None,
        }
        self._say(
            line("finished", said, job_name=self.name, **fields),
            normal=result.status in (RunStatus.SUCCEEDED, RunStatus.ENQUEUED),
        )
        signals.job_finished.send(
            sender=self.name,
            name=self.name,
            lock=lock,
            status=result.status.value,
            duration=result.duration,
            exception=result.exception,
            attempt=result.attempt,
            final=result.final,
            slot=self.slot,
            backfill=self.backfilled,
        )

"""How a scheduler starts its jobs: each due slot in its own order, handed off to the
first choice among the live schedulers (``spread.py``), superseded (``cancel_other``),
or started as a cron line would (a :class:`Run`: take the lock, claim the slot)."""

from __future__ import annotations

import datetime as dt

from ..lock.errors import JobLockError, LockDatabaseError
from ..lock.lock import process
from ..logs import line
from ..models import JobRun, RunRequest
from . import groups, overrides, spread, when
from .catchup import CANCEL_WAIT
from .registry import Job
from .runner import Run, RunResult
from .running import Active
from .start import Start
from .upkeep import Upkeep

CANCEL_LOOK = 1.0  # seconds between two looks for a lock whose run was asked to stop


class Starts(Upkeep):
    """Starting the jobs due: the floor above :class:`Upkeep`."""

    def _first_due(self, names: list[str] | None = None) -> None:
        """Each job's first due time (``when.first_due``), from its newest run: one
        query. ``names``: only these (their schedule was overridden), else every job."""
        chosen = list(self.served.jobs) if names is None else names
        names = [name for name in chosen if name not in self.served.misconfigured]
        for name in names:
            self.handoffs.handed.pop(name, None)
        latest = {run.name: run for run in JobRun.objects.using(self.using).newest_attempts(names)}
        now = self.clock.now()
        for name in names:
            job = self.served.jobs[name]
            assert job.schedule is not None
            due = self._computed(job, when.first_due, job, now, latest.get(name))
            if due is not None:
                self.due[name] = due

    def _start_due(self) -> None:
        """Start the jobs due now, in this scheduler's own order; a slot this one is not
        the first choice for waits its handoff first (spread.py)."""
        if self.outage.ongoing:
            return
        now = self.clock.now()
        me = process.instance
        looks = self._handoffs(now)
        waited: dict[str, dt.datetime] = {}  # handed-off jobs whose wait is over
        # Only those due by now are put in order (a hash each): the loop comes back here
        # after every run that ends, and most of a scheduler's jobs wait for later.
        ready = [(name, due) for name, due in self.due.items() if due <= now]
        for name, due in sorted(ready, key=lambda i: (i[1], spread.turn(me, *i))):
            if self.stopping:
                break
            if name in self.running:
                self._supersede(self.running[name], due)
                continue  # it starts again once its run ends
            if len(self.running) >= self.max_concurrent:
                break  # stays due: started when a run ends, unless another server has it
            if name in self.handoffs.handed:
                waited[name] = self.handoffs.handed.pop(name)
                continue
            job = self.served.jobs[name]
            if job.added and self._outside_window(job, due):
                continue
            if name in looks:
                look = looks[name]
                if look is None:  # not among its slot's first three choices
                    self._next(job, None, self._following(job, due))
                else:
                    self.handoffs.handed[name], self.due[name] = due, look
                continue
            self._start(job, due)
            now = self.clock.now()
        if waited:
            self._take_over(waited)

    def _outside_window(self, job: Job, due: dt.datetime) -> bool:
        """A run-time schedule's slot before its ``starts_at`` waits for the first slot
        from then; one from its ``ends_at`` on is not started, nor any after it."""
        found = self._computed(job, when.slot_and_start, job, due)
        if found is None:
            return True
        slot = found[0]
        if job.ends_at is not None and slot >= job.ends_at:
            del self.due[job.name]
            return True
        if job.starts_at is not None and slot < job.starts_at:
            first = self._following(job, job.starts_at - dt.timedelta(microseconds=1))
            self._next(job, None, first)
            return True
        return False

    def _wait_turn(self, job: Job, why: str, now: dt.datetime, request: RunRequest | None) -> None:
        """Another member of ``job``'s concurrency group runs: look again in a moment
        (a request stays in its table for the next poll), said once per wait."""
        if self.waiting.get(job.name) != why:
            self.waiting[job.name] = why
            said = f"waiting for {job.name}: {why}"
            self.say(line("waiting", said, job_name=job.name))
        if request is None:
            self.due[job.name] = now + dt.timedelta(seconds=groups.LOOK)

    def _not_its_turn(self, job: Job, request: RunRequest | None) -> bool:
        """``job`` waits its turn in a group still held (one read): look again later."""
        if job.name not in self.waiting or groups.free(job):
            return False
        if request is None:
            self.due[job.name] = self.clock.now() + dt.timedelta(seconds=groups.LOOK)
        return True

    def _its_turn(self, ended: Job) -> None:
        """A run of ``ended`` ended here: the jobs waiting their turn in one of its
        groups look again at once."""
        for name in self.waiting:
            job = self.served.jobs.get(name)
            if job is not None and set(job.groups) & set(ended.groups) and name in self.due:
                self.due[name] = min(self.due[name], self.clock.now())

    def _handoffs(self, now: dt.datetime) -> dict[str, dt.datetime | None]:
        """When to look again at each slot due by ``now`` that this scheduler is not the
        first choice for (spread.py; None: never, it is not among the first three), and,
        in ``self.handoffs.heads``, the slot whose run shows that its first choice is at
        work. A start that is not a slot's (a catch-up, a retry, a recheck) is not
        handed off."""
        if not self.handoffs.shared:
            return {}
        bursts: dict[dt.datetime, dict[str, dt.datetime]] = {}
        running: dict[dt.datetime, dict[str, dt.datetime]] = {}  # due here, running here
        for name, due in list(self.due.items()):
            job = self.served.jobs[name]
            if due > now or name in self.handoffs.handed or job.schedule is None:
                continue
            if self.handoffs.first_for.get(name) == due:  # placed already (it waits for room)
                continue
            found = self._computed(job, when.slot_and_start, job, due)
            if found is None:
                continue
            slot, start = found
            if start == due:
                (running if name in self.running else bursts).setdefault(due, {})[name] = slot
        return self.handoffs.later(process.instance, self.served.jobs, bursts, running)

    def _take_over(self, waited: dict[str, dt.datetime]) -> None:
        """One query for the slots this scheduler waited for and the heads of their first
        choices' shares; then each slot's verdict (``Handoffs.verdict``): start it, look
        again later, or leave it to the scheduler at work."""
        slots = {}
        for name, due in list(waited.items()):
            job = self.served.jobs[name]
            found = self._computed(job, when.slot_and_start, job, due)
            if found is None:
                del waited[name]
                continue
            slots[name] = found[0]
        heads = self.handoffs.take_heads(slots)
        looked = {head: slot for head, slot, _ in heads.values()}
        try:
            claimed = spread.claimed({**looked, **slots}, using=self.using)
        except LockDatabaseError as exc:
            self.handoffs.put_back(waited, heads)  # looked at again once it answers
            self._database_down(exc)
            return
        for name, due in waited.items():
            job = self.served.jobs[name]
            full = self.stopping or len(self.running) >= self.max_concurrent
            verdict, at = self.handoffs.verdict(
                name, due, heads[name], slots[name], claimed, rechecks=job.rechecks, full=full
            )
            if verdict == spread.START:
                self._start(job, due)
            elif verdict == spread.LEAVE:
                self._next(job, None, self._following(job, due))
            elif at is not None:
                self.due[name] = at

    def _supersede(self, active: Active, due: dt.datetime) -> None:
        """``overlap="cancel_other"``: a newer slot of a job running here is due: its
        run is stopped (``Running.supersede``)."""
        job, schedule = active.job, active.job.schedule
        if not job.overlap.stops_older_run or schedule is None or active.run.cancelled_by:
            return
        slot = self._computed(job, lambda: schedule.latest_at_or_before(due)[0])
        if slot is not None:
            self.running.supersede(active, slot, self.say)

    def _stop_asked(self, request: RunRequest) -> None:
        """A newer slot's start asks a run to stop (``Running.stop_asked``)."""
        try:
            self.running.stop_asked(request, self.using, self.say)
        except LockDatabaseError as exc:
            self._database_down(exc)

    def _start(self, job: Job, due: dt.datetime, request: RunRequest | None = None) -> None:
        """Start ``job`` as a cron line would at ``due``: win the slot, or skip it.

        With ``request``: the run asked for now, outside the schedule (due unchanged).
        Whatever goes wrong (a signal receiver that raises, say) stays with this start.
        """
        try:
            self._start_one(job, due, request)
        except overrides.Misconfigured as exc:  # its row changed since the poll: its own
            self._misconfigure(job.name, exc.reason)
        except Exception as exc:
            said = f"{job.name} not started: {type(exc).__name__}: {exc}"
            self.say(line("not_started", said, job_name=job.name, error=type(exc).__name__), False)
            self._next(job, request, self._following(job, max(self.clock.now(), due)))
        finally:
            self.starting = None

    def _start_one(self, job: Job, due: dt.datetime, request: RunRequest | None) -> None:
        if self._not_its_turn(job, request):
            return
        run = Run(
            # Never wait for a held lock: the loop must keep every other job's slots. The
            # next try is the next slot (or the lease's end, with retries). As declared:
            # the run applies the override in force when it claims its slot.
            self.served.declared.get(job.name, job).but(wait=0),
            report=self.report,
            on_lost=self.running.lost,
            # Never serve a slot before its time on the database's clock (ours is an
            # estimate); a request (run now, a backfill's slot) is served at once.
            start=Start.slot(due) if request is None else Start.run_now(request=request),
            # cancel_other: ask an older slot's run to stop, but wait for it here.
            cancel_wait=0.0 if request is None else None,
            context={"scheduler": self.name},
        )
        self.starting = run
        try:
            started = run.start()
        except LockDatabaseError as exc:
            self._database_down(exc)  # still due: started once the database answers
            return
        except overrides.Misconfigured:
            raise  # see _start
        except JobLockError as exc:
            said = f"{job.name} not started: {exc}"
            self.say(line("not_started", said, job_name=job.name, error=type(exc).__name__), False)
            self._next(job, request, self._following(job, due))
            return
        self.outage.ended()
        now = self.clock.now()
        if run.early:  # our estimate of the database's clock was off: read it again
            self.clock_doubtful, self.next_beat = True, 0.0
        if isinstance(started, RunResult) and started.waiting:  # its group's turn
            self._wait_turn(job, started.waiting, now, request)
            return
        self.waiting.pop(job.name, None)
        if isinstance(started, RunResult):  # skipped, or stopped before the claim
            again = self._after_skip(job, started, max(now, due)) if request is None else None
            if again is not None:
                self.due[job.name] = again
            if run.stop_asked and job.schedule is not None:
                # cancel_other: the older run was asked to stop; look again in a moment.
                slot = job.schedule.latest_at_or_before(due)[0]
                if (now - job.start_of(slot)).total_seconds() < CANCEL_WAIT:
                    self.due[job.name] = now + dt.timedelta(seconds=CANCEL_LOOK)
            return
        child = run.start_child(started, grace=self.grace)
        if isinstance(child, RunResult):  # the lease ran out, or no process could start
            self._keep_unwritten(run)
            self._next(job, request, self._following(job, max(now, due)))
            return
        self.running[started.name] = Active(job, run, child)  # allow_all: a slot's lock
        if started.lost:  # lost before it was registered: _lost found nothing to stop
            self.running.lost(started)
        self.started_runs += 1
        slot = run.slot or due
        # catch_up="all" with more missed slots: the next one as soon as this one ends.
        self._next(job, request, slot if run.more_due else self._following(job, slot))

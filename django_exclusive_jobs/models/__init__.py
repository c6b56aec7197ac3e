"""The database floor: the app's tables, the one definition of every state, and every
statement the layers above send, each a named QuerySet method.

A lock held / cooldown / stale / free, a run running long, a job's median duration, a
scheduler alive / stopped / gone, a run request pending: each is defined once here, as a
QuerySet method (or the ``Q`` it filters on), judged on the database's clock. The admin,
``health.py`` (the jobs page, ``exclusive_jobs``, the health view), the commands and the
run's modules ask these by name; none builds its own queryset chain.

==========================  ========================================================
``fields.py``               the custom fields: a job's name, a pause's end
``locks.py``                ``JobLock`` and the lock states
``runs.py``                 ``JobRun`` and ``RunTotal``: run history and what pruning summed
``schedulers.py``           ``Scheduler`` and the scheduler states
``jobs.py``                 ``JobState`` (pauses, overrides) and ``JobChange`` (the audit)
``requests.py``             ``RunRequest``: run now, backfills, stops
``runtime_schedules.py``    ``RunTimeSchedule``: schedules added at run time
``statements.py``           the history's hot-path statements, sent through Django's cursor
``beats.py``                the scheduler's own statements: its beat, its look for changes
==========================  ========================================================

Everything here imports nothing above it: the clock, the run states, the base.
"""

from __future__ import annotations

from ..run.status import RunStatus
from .fields import JobNameField, PauseEndField, in_range_sql
from .jobs import (
    JobChange,
    JobChangeQuerySet,
    JobState,
    JobStateQuerySet,
    pause_in_force,
    record_change,
)
from .locks import JobLock, JobLockQuerySet, LockState, lock_states, running_long
from .requests import RunRequest, RunRequestQuerySet
from .runs import (
    DURATION_BUCKETS,
    INF,
    LATENESS_BUCKETS,
    MEDIAN_DAYS,
    MEDIAN_SAMPLE,
    JobRun,
    JobRunQuerySet,
    RunTotal,
    RunTotalQuerySet,
    bucket_key,
)
from .runtime_schedules import RunTimeSchedule, RunTimeScheduleQuerySet
from .schedulers import (
    Scheduler,
    SchedulerQuerySet,
    SchedulerState,
    scheduler_states,
    unacknowledged,
)

__all__ = [
    "DURATION_BUCKETS",
    "INF",
    "LATENESS_BUCKETS",
    "MEDIAN_DAYS",
    "MEDIAN_SAMPLE",
    "JobChange",
    "JobChangeQuerySet",
    "JobLock",
    "JobLockQuerySet",
    "JobNameField",
    "JobRun",
    "JobRunQuerySet",
    "JobState",
    "JobStateQuerySet",
    "LockState",
    "PauseEndField",
    "RunRequest",
    "RunRequestQuerySet",
    "RunStatus",
    "RunTimeSchedule",
    "RunTimeScheduleQuerySet",
    "RunTotal",
    "RunTotalQuerySet",
    "Scheduler",
    "SchedulerQuerySet",
    "SchedulerState",
    "bucket_key",
    "in_range_sql",
    "lock_states",
    "pause_in_force",
    "record_change",
    "running_long",
    "scheduler_states",
    "unacknowledged",
]

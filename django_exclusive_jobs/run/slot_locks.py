"""``overlap="allow_all"``: each slot takes a lock of its own, so slots run side by side.

Every other policy serves a job under one lock, the job's name: one run at a time. Under
``allow_all`` a run that serves a slot takes the lock ``NAME@SLOT`` instead (the slot in
UTC, e.g. ``report@2026-11-25T10:00:00Z``): the servers racing for one slot still meet
in one ``take`` and one of them wins, while the next slot's lock is free whatever the
last run is doing. A slot's retries, its backfill and its run asked for from the admin
take the same lock; a run with no slot (run now) takes the job's own.

A slot's row is made quietly ahead of its first take (:func:`prepare_locks`: no error in
the database's log when servers race), with its first token above every token in the
job's run history: a fenced resource keyed by the job sees each new slot's runs with a
higher token than the slots before. Runs of slots that overlap may share a token.
:func:`prune` deletes the free rows of slots older than the history kept.
"""

from __future__ import annotations

import datetime as dt

from ..lock.acquire import prepare_locks
from ..lock.retry import run_statement

# How a slot's lock is named is defined below the tables (models.py reads it too).
from ..naming import FORMAT as FORMAT
from ..naming import LENGTH as LENGTH
from ..naming import SEPARATOR as SEPARATOR
from ..naming import job_of as job_of
from ..naming import lock_name as lock_name


def prepare(name: str, slot: dt.datetime, *, using: str) -> str:
    """The lock name of ``slot``, its row made if missing (one query when it exists)."""
    lock = lock_name(name, slot)
    prepare_locks([lock], using=using, tokens_of=name)
    return lock


def prune(names: list[str], before: dt.datetime, *, using: str) -> int:
    """Delete the free slot locks of the jobs ``names`` taken before ``before``."""
    from ..models import JobLock  # models: not before apps are ready

    if not names:
        return 0
    rows = JobLock.objects.using(using).old_slot_locks(names, before)
    return int(run_statement(using, lambda: rows.delete()[0]))

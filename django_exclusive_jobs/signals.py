"""Signals for metrics and alerts. Connect receivers as with any Django signal.

Every signal is sent with ``sender`` set to the job's name (a str), except
``lock_lost``, whose sender is the ``Lock`` class.
"""

from django.dispatch import Signal

# A held lock was found lost: its lease ran out before keep-alive could renew it, or it
# was force-released or taken over.
# Arguments: sender (the Lock class), lock (the Lock), reason (str).
lock_lost = Signal()

# A job won its lock and is about to run.
# Arguments: sender (job name), name (str), lock (the Lock), slot (datetime | None: the
# slot it serves, UTC; None for a run asked for now), attempt (int: 1 for a slot's first
# run, one more for each retry), backfill (bool: it runs a past slot a backfill asked
# for) and in_process (bool: the job executes in this process and thread, between this
# signal and job_finished; False in the scheduler, whose jobs run in a process of their own).
job_started = Signal()

# A job did not run because another holder has its lock.
# Arguments: sender (job name), name (str), holder (str: host:pid:instance),
# expires_at (datetime | None: when the holder's lease ends, on database time), and
# slot (datetime) when the skip is because that scheduled slot already has a run.
job_skipped = Signal()

# A job that started has ended (once per job_started).
# Arguments: sender (job name), name (str), lock (the Lock), status (str, a RunStatus:
# "succeeded", "failed", "interrupted", "lost", "timed_out", "cancelled" or "enqueued"),
# duration (float seconds), exception (the exception that ended it, or None), attempt
# (int: 1 for a slot's first run, one more for each retry) and final (bool: False when
# the slot will be retried (retries=N); alert on a failure only when final), slot
# (datetime | None) and backfill (bool), as job_started sent them.
job_finished = Signal()

# A scheduled slot passed and no server ran it. Sent once per slot, by the start that
# noticed it (and recorded it in the history with status "missed").
# Arguments: sender (job name), name (str), slot (datetime, UTC), noticed_by (str: the
# holder that noticed, host:pid:instance).
slot_missed = Signal()

# A job was paused by the app itself: its last runs failed (``pause_after=N``). An
# operator's pause sends nothing (it is in the audit). Health reports it until resumed.
# Arguments: sender (job name), name (str), reason (str), by (str).
job_paused = Signal()

# A run has lasted its job's warn_after (``@exclusive_job(warn_after=...)``) and goes on.
# Sent once per run, from a thread of the process that holds its lock (the scheduler, or
# the command or call that runs it). Arguments: sender (job name), name (str), lock (the
# Lock), slot (datetime | None), running_for (float seconds) and warn_after (float seconds).
job_running_long = Signal()

"""The one vocabulary for how a run went, shared by history, results, signals and logs."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.utils.translation import gettext_lazy as _


class RunStatus(models.TextChoices):
    """The one vocabulary for runs: history rows, run results, signals, logs and exit codes.

    ``running`` while a run goes on (or when its server died before anyone noticed);
    ``interrupted`` is a run stopped by a signal (a scheduler's graceful stop in a deploy);
    ``lost`` is a run whose lock was lost while it ran; ``timed_out`` is a run stopped
    because it outlasted its job's ``timeout``; ``cancelled`` is a run stopped so that a
    newer slot could run (``overlap="cancel_other"``); ``missed`` is a scheduled slot no
    server ran (recorded by the first start that notices); ``enqueued`` is a run that
    handed a ``django.tasks`` Task to its backend's workers; ``skipped``: the job did not
    run here because another server held the lock or had already run the slot (a result,
    never stored), or, stored, a scheduled slot that came while the job's previous run
    still ran, and that its ``overlap`` policy skipped; ``paused`` is a scheduled slot
    that came while an operator had paused the job (recorded by the start that skips it).
    """

    RUNNING = "running", _("running")
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")
    INTERRUPTED = "interrupted", _("interrupted")
    LOST = "lost", _("lost")
    MISSED = "missed", _("missed")
    ENQUEUED = "enqueued", _("enqueued")
    TIMED_OUT = "timed_out", _("timed out")
    CANCELLED = "cancelled", _("cancelled")
    SKIPPED = "skipped", _("skipped")
    PAUSED = "paused", _("paused")

    @classmethod
    def stored(cls) -> list[tuple[str, Any]]:
        """The statuses a history row can have: all of them."""
        return list(cls.choices)

    @classmethod
    def not_runs(cls) -> list[str]:
        """Slots recorded without a run: missed, skipped (overlap) and paused."""
        return [cls.MISSED, cls.SKIPPED, cls.PAUSED]

    @classmethod
    def failures(cls) -> list[str]:
        """The ends that make a job "failing" until a run succeeds: failed, timed out and
        lost. An interrupted run is a stop, not a failure: a problem only when it repeats."""
        return [cls.FAILED, cls.TIMED_OUT, cls.LOST]

    @classmethod
    def done(cls) -> list[str]:
        """The ends that leave nothing to run for a slot: succeeded, enqueued (a backfill
        runs every other slot again)."""
        return [cls.SUCCEEDED, cls.ENQUEUED]

    @classmethod
    def unsuccessful(cls) -> list[str]:
        """The ends a slot may be retried after (``retries=``): failed, timed out,
        interrupted, lost."""
        return [cls.FAILED, cls.TIMED_OUT, cls.INTERRUPTED, cls.LOST]

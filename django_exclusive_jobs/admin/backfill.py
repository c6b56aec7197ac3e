"""The jobs page's **Backfill…**: a range of a job's past slots, previewed, then asked for.

GET shows the form (from, to); with a range it also shows the slots the backfill would
run and those it leaves (succeeded), a warning when the job's function takes no
``slot``, and one when no live scheduler serves the job. The POST (CSRF, change
permission: the jobs page's ``action_view`` checks both) makes one run request per slot,
oldest first (``run/backfill.py``); the schedulers serve them like "run now".
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..lock.errors import LockConfigurationError
from ..run import backfill
from ..run.registry import Job


class BackfillForm(forms.Form):
    """The range of a backfill; valid once :func:`backfill.plan` accepts it (``plan``)."""

    start = forms.CharField(
        label=gettext_lazy("From"),
        help_text=gettext_lazy("The oldest slot, ISO 8601, e.g. 2026-11-24T01:00."),
    )
    end = forms.CharField(
        label=gettext_lazy("To"),
        required=False,
        help_text=gettext_lazy("The newest slot, as From; empty: now."),
    )

    def __init__(self, job: Job, using: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.job, self.using = job, using
        self.plan: backfill.Backfill | None = None
        zone = str(job.zone)
        for name in ("start", "end"):
            said = _("A time without a zone is in %(zone)s, the job's time zone.")
            self.fields[name].help_text += " " + said % {"zone": zone}

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if "start" in data and "end" in data:
            # Each moment passes values.moment there, in the job's zone.
            names = (str(_("From")), str(_("To")))
            end = data["end"].strip() or None
            try:
                self.plan = backfill.plan(
                    self.job, data["start"], end, using=self.using, names=names
                )
            except LockConfigurationError as exc:
                raise ValidationError(str(exc)) from None
        return data

"""The job page's **Override…**, **Pause…** and **Back to the code**: their forms.

The override form shows what is in force (the code's values, or an operator's override
of them) and checks what is typed as the decorator checks its arguments
(``overrides.check``). The first POST shows the next slots of the schedule typed and
what changes; only the second (``confirm=yes``) saves. Every form asks why: the reason
goes into the audit with the change.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from .. import values
from ..lock.errors import LockConfigurationError
from ..run import overrides
from ..run.arguments import parse_kwargs
from ..run.catchup import OVERLAPS
from ..run.registry import Job

REASON = forms.CharField(
    label=gettext_lazy("Why"),
    widget=forms.TextInput(attrs={"size": 60, "maxlength": values.REASON_LENGTH}),
    help_text=gettext_lazy("Recorded in the job's audit, with your name."),
)


class WhyForm(forms.Form):
    """A form that asks why: the reason passes ``values.reason`` (one line, at most 500
    characters, no control or format character)."""

    def clean_reason(self) -> str:
        try:
            return values.reason(self.cleaned_data.get("reason", ""))
        except LockConfigurationError as exc:
            raise ValidationError(str(exc)) from None


class ReasonForm(WhyForm):
    """Resume, back to the code: only why (optional); back to the code also carries the
    version of the override it was opened on (``overrides.version``)."""

    reason = forms.CharField(label=gettext_lazy("Why"), required=False, widget=REASON.widget)
    version = forms.CharField(label="", required=False, widget=forms.HiddenInput)

    def __init__(self, *args: Any, version: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["version"].initial = version


class PauseForm(WhyForm):
    """A pause: why, and optionally when it ends by itself (on the job's clock)."""

    reason = REASON
    until = forms.CharField(
        label=gettext_lazy("Until"),
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        help_text=gettext_lazy(
            "Empty: until resumed. Else the pause ends by itself then (database time), in "
            "the job's time zone."
        ),
    )

    # The pause state it was opened on (``control.pause_version``): a save over another
    # is refused, with who paused or resumed the job, when.
    version = forms.CharField(label="", required=False, widget=forms.HiddenInput)

    def __init__(self, job: Job, *args: Any, version: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.job = job
        self.fields["version"].initial = version

    def clean_until(self) -> dt.datetime | None:
        text = self.cleaned_data["until"].strip()
        if not text:
            return None
        # Typed on the job's clock: the admin's active zone would be the browser user's.
        try:
            return values.moment(text, what=str(_("Until")), zone=self.job.zone)
        except LockConfigurationError as exc:
            raise ValidationError(str(exc)) from None


class OverrideForm(WhyForm):
    """The settings in force, editable; what differs from the code is overridden."""

    cron = forms.CharField(
        label=gettext_lazy("Cron"),
        required=False,
        widget=forms.TextInput(attrs={"size": 30, "spellcheck": "false"}),
        help_text=gettext_lazy(
            "Five fields, such as 0 */2 * * *, or @daily; or give an interval instead."
        ),
    )
    timezone = forms.CharField(
        label=gettext_lazy("Time zone"),
        required=False,
        help_text=gettext_lazy("Of the cron schedule, such as Europe/Paris."),
    )
    every = forms.CharField(
        label=gettext_lazy("Every"),
        required=False,
        help_text=gettext_lazy("An interval such as 90s, 15m or 2h, instead of a cron schedule."),
    )
    arguments = forms.CharField(
        label=gettext_lazy("Arguments"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60, "spellcheck": "false"}),
        help_text=gettext_lazy("A JSON object of the keyword arguments its runs call it with."),
    )
    timeout = forms.CharField(
        label=gettext_lazy("Timeout"),
        required=False,
        help_text=gettext_lazy(
            "Such as 30m; a run that lasts longer is stopped. Empty: the TIMEOUT setting's."
        ),
    )
    overlap = forms.ChoiceField(
        label=gettext_lazy("Overlap"),
        choices=[(value, value) for value in OVERLAPS],
        help_text=gettext_lazy("What a slot that comes while a run goes on does."),
    )
    reason = REASON
    # The state the form was opened on (``overrides.version``): a save over another is
    # refused (overrides.Stale), with who changed what, when.
    version = forms.CharField(label="", required=False, widget=forms.HiddenInput)

    def __init__(
        self, job: Job, in_force: Job, *args: Any, version: str = "", **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.job = job
        self.fields["version"].initial = version
        now = overrides.code_of(in_force)
        schedule = now["schedule"] or {}
        self.fields["cron"].initial = schedule.get("cron", "")
        self.fields["timezone"].initial = schedule.get("timezone", "")
        every = schedule.get("every")
        self.fields["every"].initial = overrides.describe("timeout", every) if every else ""
        self.fields["arguments"].initial = json.dumps(now["kwargs"], ensure_ascii=False)
        timeout = now["timeout"]
        self.fields["timeout"].initial = overrides.describe("timeout", timeout) if timeout else ""
        self.fields["overlap"].initial = now["overlap"]
        if job.schedule is None:  # only its arguments and timeout
            for name in ("cron", "timezone", "every", "overlap"):
                del self.fields[name]
        if not job.overlap.may_be_overridden:  # its locks are per slot: not changed here
            del self.fields["overlap"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        changes: dict[str, Any] = {}
        if "cron" in self.fields:
            cron, every = data.get("cron", "").strip(), data.get("every", "").strip()
            if bool(cron) == bool(every):
                raise ValidationError(gettext_lazy("Give a cron schedule or an interval."))
            if cron:
                changes["schedule"] = {"cron": cron, "timezone": data.get("timezone") or None}
            else:
                changes["schedule"] = {"every": every}
        if "overlap" in self.fields and data.get("overlap"):
            changes["overlap"] = data["overlap"]
        try:
            changes["kwargs"] = parse_kwargs(data.get("arguments", ""))
            timeout = data.get("timeout", "").strip()
            changes["timeout"] = timeout or None
            self.changes = overrides.check(self.job, changes)
        except LockConfigurationError as exc:
            raise ValidationError(str(exc)) from None
        return data

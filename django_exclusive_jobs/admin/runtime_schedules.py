"""The admin's run-time schedules: add, change, pause (untick **enabled**) and delete the
schedules staff add to a declared job (``run/runtime_schedules.py``), and the jobs page's
section of them.

Every value passes that module's one door (``declared``, ``name_of`` on add, ``check``):
what it refuses comes back on the form as one line, and nothing is written. Saving and
deleting (one row or the bulk action) go through its API, so each is audited
(``JobChange``) under the schedule's name, with the user and the reason; the change page
lists them, newest first. Django's model permissions on "run-time schedule" apply: add,
change, delete, view.
"""

from __future__ import annotations

import datetime as dt
import json
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from .. import values
from ..health import Overview
from ..job_health import JobHealth
from ..lock.errors import LockConfigurationError
from ..models import JobLock, JobRun, RunTimeSchedule
from ..run import audit, overrides, runtime_schedules
from ..run.arguments import describe as describe_arguments
from ..run.arguments import parse_kwargs
from ..run.preview import Upcoming, upcoming
from ..run.registry import all_jobs, get_job
from .display import timestamp
from .override import REASON

# The settings the form gives the door (the arguments are parsed first).
GIVEN = ("cron", "timezone", "every", "starts_at", "ends_at", "enabled")
APP, PERMS = "django_exclusive_jobs", ("add", "change", "view")


def _moment_field(label: Any, help_text: Any) -> forms.CharField:
    widget = forms.TextInput(attrs={"size": 30, "spellcheck": "false"})
    return forms.CharField(label=label, required=False, widget=widget, help_text=help_text)


def _shown_moment(value: dt.datetime | None, zone: dt.tzinfo) -> str:
    """A start or an end as the form shows it: on the schedule's clock, with its offset
    (read back as the same moment)."""
    return value.astimezone(zone).isoformat() if value is not None else ""


class RunTimeScheduleForm(forms.ModelForm):  # type: ignore[type-arg]
    """A run-time schedule's settings as typed; valid once the door takes them
    (``self.checked``: as stored). The reason goes to the audit, with the user."""

    job = forms.ChoiceField(
        label=gettext_lazy("Job"), help_text=gettext_lazy("The declared job it runs.")
    )
    every = forms.CharField(
        label=gettext_lazy("Every"),
        required=False,
        help_text=gettext_lazy("An interval such as 90s, 15m or 2h, instead of a cron schedule."),
    )
    kwargs = forms.CharField(
        label=gettext_lazy("Arguments"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60, "spellcheck": "false"}),
        help_text=gettext_lazy(
            'A JSON object, such as {"customer": "acme"}: they update the job\'s declared '
            "arguments (a name given here wins)."
        ),
    )
    starts_at = _moment_field(
        gettext_lazy("Starts at"),
        gettext_lazy(
            "Empty: from now. An ISO 8601 time such as 2026-11-24T08:00; without an offset, "
            "on the schedule's clock (its cron's time zone, else the job's)."
        ),
    )
    ends_at = _moment_field(
        gettext_lazy("Ends at"),
        gettext_lazy("Empty: never. No slot from then on is started."),
    )
    reason = forms.CharField(
        label=gettext_lazy("Why"),
        widget=REASON.widget,
        help_text=gettext_lazy("Recorded in the schedule's audit, with your name."),
    )

    class Meta:
        model = RunTimeSchedule
        fields = ["job", "key", "cron", "timezone", "every", "kwargs", "starts_at", "ends_at"]
        fields += ["enabled", "reason"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.checked: dict[str, Any] = {}
        choice = self.fields.get("job")
        if isinstance(choice, forms.ChoiceField):  # on add: the declared jobs
            choice.choices = [(job.name, job.name) for job in all_jobs()]
        row = self.instance
        if row.pk is None:
            return
        base = get_job(row.job)
        zone = _clock(row.timezone) or (base.zone if base is not None else dt.UTC)
        self.initial.update(
            every=overrides.describe("timeout", row.every) if row.every else "",
            kwargs=json.dumps(row.kwargs, ensure_ascii=False) if row.kwargs else "",
            starts_at=_shown_moment(row.starts_at, zone),
            ends_at=_shown_moment(row.ends_at, zone),
            reason="",  # why this change: the row's reason is why it was added
        )

    def clean_reason(self) -> str:
        try:
            return values.reason(self.cleaned_data.get("reason", ""), required=True)
        except LockConfigurationError as exc:
            raise ValidationError(str(exc)) from None

    def clean(self) -> dict[str, Any]:
        """The door's three looks, in order; its refusal as the form's one line."""
        data = super().clean() or {}
        adding = self.instance.pk is None
        job = data.get("job") if adding else self.instance.job
        if job is None or (adding and "key" not in data):
            return data  # the field says what is missing
        try:
            base = runtime_schedules.declared(job)
            if adding:
                self._not_taken(runtime_schedules.name_of(job, data["key"]))
            given = {key: data.get(key) for key in GIVEN}
            given["kwargs"] = parse_kwargs(data.get("kwargs") or "")
            self.checked = runtime_schedules.check(base, given)
        except LockConfigurationError as exc:
            raise ValidationError(str(exc)) from None
        return data

    @staticmethod
    def _not_taken(name: str) -> None:
        """As the API says it (a save racing another's is refused there, in the same
        words, and the admin says so)."""
        if RunTimeSchedule.objects.filter(name=name).exists():
            raise LockConfigurationError(f"A schedule named {name} exists already.")

    def _post_clean(self) -> None:
        """No model validation: the door's (above) is the one; the API writes the row."""


def _clock(name: str) -> dt.tzinfo | None:
    try:
        return zoneinfo.ZoneInfo(name) if name else None
    except (ValueError, zoneinfo.ZoneInfoNotFoundError):  # a row written by SQL
        return None


def _who(request: HttpRequest) -> str:
    return f"{request.user.get_username()} (admin)"


@admin.register(RunTimeSchedule)
class RunTimeScheduleAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """The schedules added at run time: each runs as the job ``JOB:KEY``."""

    form = RunTimeScheduleForm
    change_form_template = "admin/django_exclusive_jobs/runtimeschedule/change_form.html"
    list_display = ["name", "job", "schedule", "arguments", "starts", "ends", "enabled"]
    list_display += ["changed_by", "changed"]
    list_filter = ["job", "enabled"]
    search_fields = ["name"]
    ordering = ["name"]

    starts = timestamp("starts_at", gettext_lazy("starts at"))
    ends = timestamp("ends_at", gettext_lazy("ends at"))
    changed = timestamp("changed_at", gettext_lazy("changed at"))

    @admin.display(description=gettext_lazy("schedule"))
    def schedule(self, row: RunTimeSchedule) -> str:
        return runtime_schedules.describe(row)

    @admin.display(description=gettext_lazy("arguments"))
    def arguments(self, row: RunTimeSchedule) -> str:
        return describe_arguments(row.kwargs) or "—"

    def get_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        fields = tuple(RunTimeScheduleForm.Meta.fields)
        return ("name", *fields) if obj is not None else fields

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return ("name", "job", "key") if obj is not None else ()

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """The change page, with the schedule's audit under the form."""
        row = self.get_object(request, unquote(object_id))
        if row is not None:
            using = row._state.db or "default"
            extra_context = {
                **(extra_context or {}),
                "changes": audit.changes(row.name, using=using),
                "job_page": _job_page(row.name) if _has_run(row.name, using) else "",
                "audit_shown": True,
            }
        return super().change_view(request, object_id, form_url, extra_context)

    def changeform_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return super().changeform_view(request, *args, **kwargs)
        except LockConfigurationError as exc:  # another's save came first (its name taken,
            self.message_user(request, str(exc), messages.ERROR)  # the row deleted)
            return HttpResponseRedirect(
                reverse("admin:django_exclusive_jobs_runtimeschedule_changelist")
            )

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """Through the API: checked at the door again, audited with the user and why."""
        reason, who = form.cleaned_data["reason"], _who(request)
        if change:
            row = runtime_schedules.change_schedule(
                obj.name, reason=reason, by=who, using=obj._state.db, **form.checked
            )
        else:
            job, key = form.cleaned_data["job"], form.cleaned_data["key"]
            row = runtime_schedules.add_schedule(job, key, reason=reason, by=who, **form.checked)
        for each in obj._meta.concrete_fields:  # the admin's messages and log name it
            setattr(obj, each.attname, getattr(row, each.attname))
        obj._state.adding, obj._state.db = False, row._state.db

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        runtime_schedules.delete_schedule(obj.name, by=_who(request), using=obj._state.db)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        """The bulk delete: each schedule through the API, so each is audited."""
        for row in queryset:
            runtime_schedules.delete_schedule(row.name, by=_who(request), using=queryset.db)


def _has_run(name: str, using: str) -> bool:
    """Whether the jobs page knows it (its lock row: it has run, or was looked at)."""
    return JobLock.objects.using(using).filter(name=name).exists()


def _job_page(name: str) -> str:
    return f"{reverse('admin:django_exclusive_jobs_jobstate_job')}?{urlencode({'job': name})}"


# --- the jobs page's section ---------------------------------------------------------


@dataclass
class Shown:
    """A run-time schedule as the jobs page shows it."""

    row: RunTimeSchedule
    schedule: str  # in words
    arguments: str  # over the declared ones, as one line of JSON
    upcoming: list[Upcoming] = field(default_factory=list)
    said: str = ""  # why no slot comes: switched off, ended, misconfigured: ...
    health: JobHealth | None = None  # its runs' (None before its first)
    strip: str = ""


def jobs_page(
    request: HttpRequest,
    seen: Overview,
    using: str,
    *,
    slots: int,
    strip: Callable[[list[JobRun]], str],
) -> dict[str, Any]:
    """The jobs page's run-time schedules (one query): ``runtime_rows``; and the jobs
    only the history knows, without them (``undeclared_rows``)."""
    rows = runtime_schedules.list_schedules(using=using)
    names = {row.name for row in rows}
    known = {job.name: job for job in [*seen.jobs, *seen.undeclared]}
    shown = [_shown(row, seen.now, known.get(row.name), slots) for row in rows]
    for each in shown:
        each.strip = strip(each.health.recent) if each.health is not None else ""
    user = request.user
    perms = {what: user.has_perm(f"{APP}.{what}_runtimeschedule") for what in PERMS}
    return {
        "runtime_rows": shown,
        "runtime_perms": perms,
        "undeclared_rows": [
            (job, strip(job.recent)) for job in seen.undeclared if job.name not in names
        ],
    }


def _shown(row: RunTimeSchedule, now: dt.datetime, health: JobHealth | None, slots: int) -> Shown:
    """Its next ``slots`` slots (from ``starts_at``, before ``ends_at``), or why none."""
    words = runtime_schedules.describe(row)
    shown = Shown(row, words, describe_arguments(row.kwargs), health=health)
    base = get_job(row.job)
    try:
        if base is None:
            raise overrides.Misconfigured(row.name, f"no job named {row.job} is declared")
        job = overrides.tried(runtime_schedules.job_of(row, base), now)
    except overrides.Misconfigured as exc:
        return _misconfigured(shown, exc)
    if not row.enabled:
        shown.said = _("switched off")
    elif row.ends_at is not None and row.ends_at <= now:
        shown.said = _("ended")
    else:
        after = max(now, row.starts_at) if row.starts_at is not None else now
        try:
            coming = upcoming(job, after, slots)
        except Exception as exc:  # a slot out of range, a few slots on
            return _misconfigured(shown, overrides.uncomputable(row.name, exc))
        shown.upcoming = [each for each in coming if row.ends_at is None or each.slot < row.ends_at]
        shown.said = "" if shown.upcoming else _("ended")
    return shown


def _misconfigured(shown: Shown, exc: overrides.Misconfigured) -> Shown:
    shown.said = _("misconfigured: %(reason)s") % {"reason": exc.reason}
    return shown

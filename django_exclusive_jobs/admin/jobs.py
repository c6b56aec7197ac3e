"""The admin's jobs page: every job, its health, and pause / resume / run now.

Viewing needs the view permission on "job"; pausing, resuming and asking for a run need
the change permission. Every action is a POST with CSRF, after a page that says what
it will do. The job's name travels as a form field, never in the URL path.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..health import OK, overview
from ..lock.validation import resolve_alias
from ..models import JobState, Scheduler
from ..run import control
from ..run.registry import get_job

ACTIONS = {
    "pause": gettext_lazy("Pause"),
    "resume": gettext_lazy("Resume"),
    "run": gettext_lazy("Run now"),
}


def what_happens(action: str, name: str) -> str:
    if action == "pause":
        return _(
            "Every server's starts of %(name)s will skip it (a cron line exits 0, a "
            "scheduler moves on) until it is resumed. A run going on now is not stopped. "
            "Slots that pass while it is paused are not counted as missed."
        ) % {"name": name}
    if action == "resume":
        return _(
            "%(name)s runs again from its next slot. The slots that passed while it was "
            "paused are not run."
        ) % {"name": name}
    return _(
        "%(name)s will run once, outside its schedule, on the next scheduler that looks "
        "(within seconds), under its lock, recorded as a manual run asked for by you. "
        "If no scheduler is running, run 'manage.py exclusive_jobs run %(name)s' instead."
    ) % {"name": name}


@admin.register(JobState)
class JobsAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """The jobs page in place of a list of ``JobState`` rows."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        act = path(
            "act/<str:action>/",
            self.admin_site.admin_view(self.action_view),
            name="django_exclusive_jobs_jobstate_act",
        )
        return [act, *super().get_urls()]

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        jobs = overview(self._using())
        context = {
            **self.admin_site.each_context(request),
            "title": _("All jobs"),
            "opts": self.model._meta,
            "overview": jobs,
            "ok": OK,
            "can_change": self.has_change_permission(request),
            "actions": ACTIONS,
        }
        return TemplateResponse(request, "admin/django_exclusive_jobs/jobstate/jobs.html", context)

    def change_view(
        self, request: HttpRequest, object_id: str, *args: Any, **kwargs: Any
    ) -> HttpResponse:
        return HttpResponseRedirect(reverse("admin:django_exclusive_jobs_jobstate_changelist"))

    def action_view(self, request: HttpRequest, action: str) -> HttpResponse:
        """GET: what the action will do, and a button; POST: do it."""
        if action not in ACTIONS:
            raise PermissionDenied
        if not self.has_change_permission(request):
            raise PermissionDenied
        name = (request.POST if request.method == "POST" else request.GET).get("job", "")
        if get_job(name) is None:
            messages.error(request, _("No job named %(name)r is declared.") % {"name": name})
            return self._back()
        if request.method == "POST" and request.POST.get("confirm") == "yes":
            self._do(request, action, name)
            return self._back()
        context = {
            **self.admin_site.each_context(request),
            "title": _("%(action)s %(name)s?") % {"action": ACTIONS[action], "name": name},
            "opts": self.model._meta,
            "job": name,
            "action": action,
            "action_label": ACTIONS[action],
            "what_happens": what_happens(action, name),
        }
        return TemplateResponse(
            request, "admin/django_exclusive_jobs/jobstate/confirm.html", context
        )

    def _do(self, request: HttpRequest, action: str, name: str) -> None:
        user = request.user
        who = f"{user.get_username()} (admin)"
        using = self._using()
        if action == "pause":
            control.pause(name, by=who, using=using)
            messages.success(request, _("Paused %(name)s.") % {"name": name})
        elif action == "resume":
            control.resume(name, by=who, using=using)
            messages.success(request, _("Resumed %(name)s.") % {"name": name})
        else:
            control.request_run(name, by=who, using=using)
            asked = _("Asked for a run of %(name)s: a scheduler will start it.")
            messages.success(request, asked % {"name": name})
            if not Scheduler.objects.using(using).alive().exists():
                alone = _(
                    "No scheduler is running: the request waits for one. To run it now, "
                    "run 'manage.py exclusive_jobs run %(name)s' on a server."
                )
                messages.warning(request, alone % {"name": name})

    def _back(self) -> HttpResponse:
        return HttpResponseRedirect(reverse("admin:django_exclusive_jobs_jobstate_changelist"))

    @staticmethod
    def _using() -> str:
        return resolve_alias(None)


@admin.register(Scheduler)
class SchedulerAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Running (and recently gone) schedulers: their heartbeat rows, read-only."""

    list_display = ["host", "pid", "version", "served", "started_at", "last_beat_at", "stopped_at"]
    list_filter = ["host"]
    ordering = ["-last_beat_at"]

    @admin.display(description=gettext_lazy("jobs"))
    def served(self, row: Scheduler) -> str:
        return ", ".join(row.jobs or [])

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

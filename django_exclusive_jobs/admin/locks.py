"""Admin pages: see every lock and run; force-release locks safely.

Rows are read-only. Force-releasing a lock marks it released on database time; the old
holder's next renew or ``ensure_held()`` raises ``LockLost``. Force-releasing a *held*
lock (lease not over) needs an extra confirmation, because its job may still be running.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from ..models import JobLock, JobLockQuerySet, JobRun, LockState, running_long
from ..run.registry import get_job, warn_afters
from .display import duration, span, timestamp

MEANING = {
    LockState.HELD: gettext_lazy("a holder has it and its lease has not run out"),
    LockState.COOLDOWN: gettext_lazy("released by its holder, closed until min_hold ends"),
    LockState.STALE: gettext_lazy("its lease ran out and its holder never released it"),
    LockState.FREE: gettext_lazy("anyone may take it"),
}
RUNNING_LONG = "running_long"


class LockStateFilter(admin.SimpleListFilter):
    title = gettext_lazy("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [*LockState.choices, (RUNNING_LONG, gettext_lazy("held, running long"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        assert isinstance(queryset, JobLockQuerySet)
        value = self.value()
        if value == RUNNING_LONG:
            return queryset.running_long(warn_after=warn_afters())
        if value in LockState.values:
            result: QuerySet[Any] = getattr(queryset, str(value))()
            return result
        return queryset


class LockChangeList(ChangeList):
    """Reads each job's median duration once per page (one query), for the run time."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        medians = JobRun.objects.using(self.queryset.db).medians()
        for lock in self.result_list:
            lock.median = medians.get(lock.name)


@admin.register(JobLock)
class JobLockAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = [
        "name",
        "state_badge",
        "holder",
        "acquired",
        "expires_in",
        "token",
        "run_time",
    ]
    list_display_links = ["name"]
    list_filter = [LockStateFilter]
    search_fields = ["name", "host"]
    ordering = ["name"]
    actions = ["force_release_selected", "force_release_stale"]
    _detail_fields = (
        "name",
        "state_badge",
        "token",
        "host",
        "pid",
        "instance",
        "thread",
        "acquired",
        "expires",
        "expires_in",
        "released",
        "run_time",
        "first_seen",
    )
    fields = _detail_fields
    readonly_fields = _detail_fields
    list_per_page = 100

    acquired = timestamp("acquired_at", gettext_lazy("acquired at"))
    expires = timestamp("expires_at", gettext_lazy("lease expires at"))
    released = timestamp("released_at", gettext_lazy("released at"))
    first_seen = timestamp("created_at", gettext_lazy("first seen"))

    # Read-only rows: nobody adds or edits locks by hand. Deleting a row would lose its
    # token, so the delete permission is used only for the force-release actions.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None:
            return False
        return super().has_delete_permission(request)

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # Django 6.1 says where the actions are shown (list or form); 5.2 and 6.0 do not.
        where = {} if action_location is None else {"action_location": action_location}
        actions = super().get_actions(request, **where)
        actions.pop("delete_selected", None)
        return actions

    def get_queryset(self, request: HttpRequest) -> QuerySet[JobLock]:
        queryset = super().get_queryset(request)
        assert isinstance(queryset, JobLockQuerySet)
        return queryset.with_state().with_runs()

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return LockChangeList

    # columns ------------------------------------------------------------------

    @admin.display(description=gettext_lazy("state"), ordering="state")
    def state_badge(self, lock: JobLock) -> str:
        state = LockState(getattr(lock, "state", None) or LockState.FREE)
        return format_html(
            '<span class="exclusive-jobs-badge exclusive-jobs-{}" title="{}">{}</span>',
            state.value,
            MEANING[state],
            state.label,
        )

    @admin.display(description=gettext_lazy("holder"), ordering="host")
    def holder(self, lock: JobLock) -> str:
        if not lock.host:
            return "—"
        return format_html("{} <small>pid {}</small>", lock.host, lock.pid)

    @admin.display(description=gettext_lazy("lease"), ordering="expires_at")
    def expires_in(self, lock: JobLock) -> str:
        if lock.expires_at is None:
            return "—"
        now = lock.db_now  # type: ignore[attr-defined]
        if lock.expires_at > now:
            return _("ends in %(time)s") % {"time": span(lock.expires_at, now)}
        return _("ended %(time)s ago") % {"time": span(now, lock.expires_at)}

    @admin.display(description=gettext_lazy("run time / median"))
    def run_time(self, lock: JobLock) -> str:
        elapsed = lock.running_for
        if elapsed is None:
            return "—"
        median: float | None = getattr(lock, "median", None)
        if not hasattr(lock, "median"):  # the detail page: the list reads them all at once
            median = JobRun.objects.using(lock._state.db).medians().get(lock.name)
        shown = format_html(
            "{} / {}", duration(elapsed), "—" if median is None else duration(median)
        )
        job = get_job(lock.name)
        if running_long(elapsed, median, warn_after=job.warn_seconds if job else None):
            badge = '<span class="exclusive-jobs-badge exclusive-jobs-running-long">{}</span>'
            return format_html("{} " + badge, shown, _("running long"))
        return shown

    # actions ------------------------------------------------------------------

    @admin.action(description=gettext_lazy("Force-release selected locks…"), permissions=["delete"])
    def force_release_selected(
        self, request: HttpRequest, queryset: QuerySet[JobLock]
    ) -> HttpResponse | None:
        assert isinstance(queryset, JobLockQuerySet)
        locks = list(queryset.with_state().order_by("name"))
        for lock in locks:
            lock.state_label = LockState(lock.state).label  # type: ignore[attr-defined]
        held = [lock for lock in locks if lock.state == LockState.HELD]  # type: ignore[attr-defined]
        if request.POST.get("post") == "yes":
            release_held = request.POST.get("release_held") == "yes"
            names = [
                lock.name
                for lock in locks
                if lock.state != LockState.HELD or release_held  # type: ignore[attr-defined]
            ]
            chosen = queryset.named(names)
            # Held a moment ago is checked again in the UPDATE: a lock taken since stays.
            released = self._force_release(request, chosen if release_held else chosen.not_held())
            if released:
                self.message_user(
                    request,
                    ngettext("Force-released %(n)d lock.", "Force-released %(n)d locks.", released)
                    % {"n": released},
                    messages.SUCCESS,
                )
            refused = [lock.name for lock in held if not release_held]
            if refused:
                self.message_user(
                    request,
                    _(
                        "Not released, still held: %(names)s. Their jobs may be running; "
                        "tick “Also force-release held locks” to force-release them."
                    )
                    % {"names": ", ".join(refused)},
                    messages.WARNING,
                )
            if not released and not refused:
                self.message_user(request, _("Nothing to force-release."), messages.INFO)
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": _("Force-release locks?"),
            "opts": self.model._meta,
            "locks": locks,
            "held": held,
            "queryset": queryset,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "action": "force_release_selected",
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request, "admin/django_exclusive_jobs/joblock/force_release_confirmation.html", context
        )

    @admin.action(description=gettext_lazy("Force-release stale locks"), permissions=["delete"])
    def force_release_stale(self, request: HttpRequest, queryset: QuerySet[JobLock]) -> None:
        assert isinstance(queryset, JobLockQuerySet)
        released = self._force_release(request, queryset.stale())
        skipped = queryset.count() - released
        self.message_user(
            request,
            ngettext(
                "Force-released %(n)d stale lock.", "Force-released %(n)d stale locks.", released
            )
            % {"n": released}
            + (" " + _("%(m)d not stale, left alone.") % {"m": skipped} if skipped else ""),
            messages.SUCCESS if released else messages.INFO,
        )

    def _force_release(self, request: HttpRequest, queryset: QuerySet[JobLock]) -> int:
        assert isinstance(queryset, JobLockQuerySet)
        locks = list(queryset.closed() | queryset.stale())
        who = f"{request.user.get_username()} (admin)"
        released = queryset.rows([lock.pk for lock in locks]).force_release(by=who)
        for lock in locks:
            # The admin's own history ("History" on the lock), version-independent.
            self.log_change(
                request,
                lock,
                f"Force-released lock (token {lock.token}, holder {lock.holder or '-'})",
            )
        return released

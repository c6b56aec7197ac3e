"""Admin pages: see every lock and run; force-release locks safely.

Rows are read-only. Force-releasing a lock marks it released on database time; the old
holder's next renew or ``ensure_held()`` raises ``LockLost``. Force-releasing a *held*
lock (lease not over) needs an extra confirmation, because its job may still be running.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.utils.timesince import timeuntil
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from ..conf import app_settings
from ..lock.clock import DatabaseNow, database_now
from ..models import JobLock, JobLockQuerySet, JobRun, LockState
from ..run.status import RunStatus

STATE_STYLE = {
    LockState.HELD: "held",
    LockState.COOLDOWN: "cooldown",
    LockState.STALE: "stale",
    LockState.FREE: "free",
}


class LockStateFilter(admin.SimpleListFilter):
    title = gettext_lazy("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            ("held", gettext_lazy("held")),
            ("suspect", gettext_lazy("held, suspect (running long)")),
            ("cooldown", gettext_lazy("released, kept for min_hold")),
            ("stale", gettext_lazy("stale: lease ran out, never released")),
            ("free", gettext_lazy("free")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        assert isinstance(queryset, JobLockQuerySet)
        value = self.value()
        if value in ("held", "suspect", "cooldown", "stale", "free"):
            result: QuerySet[Any] = getattr(queryset, value)()
            return result
        return queryset


@admin.register(JobLock)
class JobLockAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = [
        "name",
        "state_badge",
        "holder",
        "acquired_at",
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
        "acquired_at",
        "expires_at",
        "expires_in",
        "released_at",
        "run_time",
    )
    fields = _detail_fields
    readonly_fields = _detail_fields
    list_per_page = 100

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
        current_run = JobRun.objects.filter(
            name=OuterRef("name"), token=OuterRef("token"), status=RunStatus.RUNNING
        ).values("started_at")[:1]
        queryset = super().get_queryset(request)
        assert isinstance(queryset, JobLockQuerySet)
        return queryset.with_state().annotate(
            db_now=DatabaseNow(), run_started_at=Subquery(current_run)
        )

    # columns ------------------------------------------------------------------

    @admin.display(description=gettext_lazy("state"), ordering="state")
    def state_badge(self, lock: JobLock) -> str:
        state = getattr(lock, "state", None) or LockState.FREE
        label = str(LockState(state).label)
        if state == LockState.HELD and self._is_suspect(lock):
            state, label = "suspect", _("held, suspect: running long")
        return format_html(
            '<span class="exclusive-jobs-badge exclusive-jobs-{}">{}</span>',
            STATE_STYLE.get(state, state),
            label,
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
        now = getattr(lock, "db_now", None) or database_now(lock._state.db or "default")
        if lock.expires_at > now:
            return _("ends in %(time)s") % {"time": _span(lock.expires_at, now)}
        return _("ended %(time)s ago") % {"time": _span(now, lock.expires_at)}

    @admin.display(description=gettext_lazy("run time / median"))
    def run_time(self, lock: JobLock) -> str:
        started = getattr(lock, "run_started_at", None)
        if started is None or getattr(lock, "state", None) != LockState.HELD:
            return "—"
        elapsed = (lock.db_now - started).total_seconds()  # type: ignore[attr-defined]
        median = self._median(lock)
        if median is None:
            return format_html("{} / —", _seconds(elapsed))
        return format_html("{} / {}", _seconds(elapsed), _seconds(median))

    def _median(self, lock: JobLock) -> float | None:
        cache: dict[str, float | None] = getattr(self, "_median_cache", {})
        if lock.name not in cache:
            cache[lock.name] = JobRun.objects.using(lock._state.db).median_duration(lock.name)
            self._median_cache = cache
        return cache[lock.name]

    def _is_suspect(self, lock: JobLock) -> bool:
        started = getattr(lock, "run_started_at", None)
        if started is None:
            return False
        median = self._median(lock)
        if not median:
            return False
        elapsed = (lock.db_now - started).total_seconds()  # type: ignore[attr-defined]
        return bool(elapsed > float(app_settings.SUSPECT_FACTOR) * median)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        self._median_cache = {}
        return super().changelist_view(request, extra_context)

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
            chosen = queryset.filter(name__in=names)
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
        released = queryset.filter(pk__in=[lock.pk for lock in locks]).force_release()
        for lock in locks:
            # The admin's own history ("History" on the lock), version-independent.
            self.log_change(
                request,
                lock,
                f"Force-released lock (token {lock.token}, holder {lock.holder or '-'})",
            )
        return released


def _span(later: dt.datetime, earlier: dt.datetime) -> str:
    """How long from ``earlier`` to ``later``: in seconds under two minutes (a lease of a
    few seconds must not read "0 minutes"), else as Django says it."""
    seconds = (later - earlier).total_seconds()
    if seconds < 120:
        whole = int(seconds)
        return ngettext("%(n)d second", "%(n)d seconds", whole) % {"n": whole}
    return timeuntil(later, earlier)


def _seconds(value: float) -> str:
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"

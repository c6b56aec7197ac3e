"""The admin's schedulers page: running, stopped and gone schedulers (their heartbeat
rows, read-only); acknowledge the gone."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from ..models import Scheduler, SchedulerQuerySet, SchedulerState
from ..run import control
from .display import moment, timestamp


class SchedulerStateFilter(admin.SimpleListFilter):
    title = gettext_lazy("state")
    parameter_name = "state"
    PROBLEM = "unacknowledged"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [*SchedulerState.choices, (self.PROBLEM, gettext_lazy("gone, not acknowledged"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        assert isinstance(queryset, SchedulerQuerySet)
        value = self.value()
        if value in SchedulerState.values or value == self.PROBLEM:
            result: QuerySet[Any] = getattr(queryset, str(value))()
            return result
        return queryset


@admin.register(Scheduler)
class SchedulerAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Running, stopped and gone schedulers: their heartbeat rows, read-only. A gone one
    (no beat, no clean stop) is a problem until acknowledged here or back on its host."""

    list_display = ["host", "pid", "state_badge", "last_beat", "served", "started", "version"]
    list_filter = [SchedulerStateFilter, "host"]
    ordering = ["-last_beat_at"]
    actions = ["acknowledge"]
    _detail_fields = (
        "host",
        "pid",
        "instance",
        "version",
        "state_badge",
        "served",
        "started",
        "last_beat",
        "stopped",
        "acknowledged",
    )
    fields = _detail_fields
    readonly_fields = _detail_fields

    started = timestamp("started_at", gettext_lazy("started at"))
    stopped = timestamp("stopped_at", gettext_lazy("stopped at"))

    def get_queryset(self, request: HttpRequest) -> QuerySet[Scheduler]:
        queryset = super().get_queryset(request)
        assert isinstance(queryset, SchedulerQuerySet)
        return queryset.with_state()

    @admin.display(description=gettext_lazy("state"), ordering="state")
    def state_badge(self, row: Scheduler) -> str:
        state = SchedulerState(row.state)  # type: ignore[attr-defined]
        problem = " exclusive-jobs-problem-badge" if row.unacknowledged else ""  # type: ignore[attr-defined]
        return format_html(
            '<span class="exclusive-jobs-badge exclusive-jobs-scheduler-{}{}">{}</span>',
            state.value,
            problem,
            state.label,
        )

    @admin.display(description=gettext_lazy("last heartbeat"), ordering="last_beat_at")
    def last_beat(self, row: Scheduler) -> str:
        when = moment(row.last_beat_at)
        if row.state != SchedulerState.GONE:  # type: ignore[attr-defined]
            return when
        if row.acknowledged_at is not None:
            said = _("no beat since %(when)s; acknowledged by %(who)s at %(at)s")
            return said % {
                "when": when,
                "who": row.acknowledged_by,
                "at": moment(row.acknowledged_at),
            }
        if row.unacknowledged:  # type: ignore[attr-defined]
            return _("no beat since %(when)s, no clean stop") % {"when": when}
        said = _("no beat since %(when)s; a scheduler started on %(host)s since")
        return said % {"when": when, "host": row.host}

    @admin.display(description=gettext_lazy("acknowledged"))
    def acknowledged(self, row: Scheduler) -> str:
        if row.acknowledged_at is None:
            return "—"
        return f"{row.acknowledged_by} {moment(row.acknowledged_at)}"

    @admin.display(description=gettext_lazy("jobs"))
    def served(self, row: Scheduler) -> str:
        if row.skips_schedules:
            return _("none: it skips schedules (only runs asked for now)")
        return ", ".join(row.jobs or [])

    @admin.action(
        description=gettext_lazy("Acknowledge gone schedulers"), permissions=["acknowledge"]
    )
    def acknowledge(self, request: HttpRequest, queryset: QuerySet[Scheduler]) -> None:
        assert isinstance(queryset, SchedulerQuerySet)
        using = queryset.db
        gone = list(queryset.unacknowledged())
        who = f"{request.user.get_username()} (admin)"
        done = control.acknowledge(queryset, by=who, using=using)
        for row in gone:
            self.log_change(request, row, f"Acknowledged: gone since {moment(row.last_beat_at)}")
        said = ngettext(
            "Acknowledged %(n)d gone scheduler.", "Acknowledged %(n)d gone schedulers.", done
        )
        self.message_user(request, said % {"n": done}, messages.SUCCESS if done else messages.INFO)

    def has_acknowledge_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_exclusive_jobs.change_scheduler")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

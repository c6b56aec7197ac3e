"""Admin pages for run history: every run, how it ended, and its error."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.translation import gettext_lazy

from ..models import JobRun, JobRunQuerySet
from ..run.arguments import describe as describe_arguments
from ..run.pruning import delete_runs
from ..run.status import RunStatus
from .display import duration, timestamp


class RunStatusFilter(admin.SimpleListFilter):
    title = gettext_lazy("status")
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return RunStatus.stored()

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        status = self.value()
        if status:
            assert isinstance(queryset, JobRunQuerySet)
            return queryset.with_status(status)
        return queryset


@admin.register(JobRun)
class JobRunAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = [
        "name",
        "status_badge",
        "started",
        "duration_text",
        "host",
        "slot_time",
        "token",
        "attempt",
        "arguments",
    ]
    list_filter = [RunStatusFilter, ("name", admin.AllValuesFieldListFilter)]
    date_hierarchy = "started_at"
    search_fields = ["name", "host", "error_type", "error"]
    ordering = ["-started_at", "-id"]
    list_per_page = 100
    _detail_fields = (
        "name",
        "status_badge",
        "slot_time",
        "started",
        "finished",
        "duration_text",
        "host",
        "pid",
        "instance",
        "token",
        "attempt",
        "retry_time",
        "arguments",
        "returncode",
        "requested_by",
        "task_result_id",
        "task_backend",
        "error_type",
        "error_text",
    )
    fields = _detail_fields
    readonly_fields = _detail_fields
    change_list_template = "admin/django_exclusive_jobs/jobrun/change_list.html"

    started = timestamp("started_at", gettext_lazy("started at"))
    finished = timestamp("finished_at", gettext_lazy("finished at"))
    slot_time = timestamp("slot", gettext_lazy("slot"))
    retry_time = timestamp("retry_at", gettext_lazy("retry at"))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    # Deleted runs still count in the metrics: through the same path as pruning.
    def delete_model(self, request: HttpRequest, obj: JobRun) -> None:
        delete_runs([obj.pk], using=obj._state.db or "default")

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        delete_runs(list(queryset.values_list("pk", flat=True)), using=queryset.db)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description=gettext_lazy("status"), ordering="status")
    def status_badge(self, run: JobRun) -> str:
        return format_html(
            '<span class="exclusive-jobs-badge exclusive-jobs-{}">{}</span>',
            run.status,
            RunStatus(run.status).label,
        )

    @admin.display(description=gettext_lazy("duration"), ordering="duration")
    def duration_text(self, run: JobRun) -> str:
        return "—" if run.duration is None else duration(run.duration)

    @admin.display(description=gettext_lazy("arguments"))
    def arguments(self, run: JobRun) -> str:
        return describe_arguments(run.kwargs) or "—"

    @admin.display(description=gettext_lazy("error and traceback"))
    def error_text(self, run: JobRun) -> str:
        if not run.error:
            return "—"
        return format_html('<pre class="exclusive-jobs-traceback">{}</pre>', run.error)

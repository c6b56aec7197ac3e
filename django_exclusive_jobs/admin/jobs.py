"""The admin's jobs page: every job, its health; pause / resume / run now / backfill,
cancel a waiting run (the schedulers' page is schedulers.py).

Viewing needs the view permission on "job"; pausing, resuming, asking for a run and
cancelling one need the change permission. Every action is a POST with CSRF, after a
page that says what it will do. The job's name travels as a form field, never in the
URL path (a name may hold any character): the job's own page is ``job/?job=<name>``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from ..health import Health, overview
from ..lock.clock import database_now
from ..lock.errors import LockConfigurationError
from ..lock.validation import resolve_alias
from ..models import JobRun, JobState, RunRequest, Scheduler
from ..run import audit, backfill, control, overrides
from ..run.arguments import describe as describe_arguments
from ..run.preview import upcoming
from ..run.registry import get_job
from . import pictures, runtime_schedules
from .backfill import BackfillForm
from .display import moment
from .override import OverrideForm, PauseForm, ReasonForm
from .run_now import RunNowForm

ACTIONS = {
    "pause": gettext_lazy("Pause"),
    "resume": gettext_lazy("Resume"),
    "run": gettext_lazy("Run now"),
    "cancel": gettext_lazy("Cancel the waiting run"),
    "backfill": gettext_lazy("Backfill"),
    "override": gettext_lazy("Override"),
    "back": gettext_lazy("Back to the code"),
}
# How many of each job's next slots the jobs page shows.
NEXT_SLOTS = 5


def what_happens(action: str, name: str, request: RunRequest | None = None) -> str:
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
    if action == "cancel":
        assert request is not None
        return _(
            "The run of %(name)s asked for by %(who)s at %(when)s will not start. If a "
            "scheduler has taken it already, it runs and is not stopped."
        ) % {"name": name, "who": request.requested_by, "when": moment(request.requested_at)}
    if action == "override":
        return _(
            "What differs from the code below overrides it on every server, within seconds "
            "and without a restart: the schedulers wake at the new slots, cron lines serve "
            "them. Slots already run are not run again; the slots of the old schedule that "
            "have not come are not run. The jobs page shows it as drift from the code until "
            "you go back to the code."
        ) % {"name": name}
    if action == "back":
        return _(
            "%(name)s runs as its code says again, on every server within seconds: every "
            "override of it is dropped."
        ) % {"name": name}
    if action == "backfill":
        return _(
            "Each slot of %(name)s in the range that has no run that succeeded (missed, "
            "skipped, failed...) will run once, oldest first, one at a time, on the "
            "schedulers that serve it, under its lock, recorded as backfilled and asked "
            "for by you. A slot that succeeds meanwhile is not run again."
        ) % {"name": name}
    return _(
        "%(name)s will run once, outside its schedule, on the next scheduler that looks "
        "(within seconds), under its lock, with the arguments below, recorded as a manual "
        "run asked for by you. "
        "If no scheduler serves it, run 'manage.py exclusive_jobs run %(name)s' instead."
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
        job = path(
            "job/",
            self.admin_site.admin_view(self.job_view),
            name="django_exclusive_jobs_jobstate_job",
        )
        return [act, job, *super().get_urls()]

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        seen = overview(self._using(), slots=NEXT_SLOTS, recent=pictures.STRIP_RUNS)
        context = {
            **self._picture_context(request),
            "title": _("All jobs"),
            "overview": seen,
            # The code's jobs; the run-time schedules have their own section, below.
            "rows": [(job, self._strip(job.recent)) for job in seen.jobs if not job.added],
            # The run-time schedules, and the jobs only the history knows without them.
            **runtime_schedules.jobs_page(
                request, seen, self._using(), slots=NEXT_SLOTS, strip=self._strip
            ),
        }
        return TemplateResponse(request, "admin/django_exclusive_jobs/jobstate/jobs.html", context)

    def job_view(self, request: HttpRequest) -> HttpResponse:
        """One job: its health, its last runs and its durations over the last 30 days."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        name = request.GET.get("job", "")
        using = self._using()
        seen = overview(using, slots=NEXT_SLOTS, recent=pictures.STRIP_RUNS)
        found = [job for job in seen.jobs + seen.undeclared if job.name == name]
        if not found:
            messages.error(request, _("No job named %(name)r is known.") % {"name": name})
            return self._back()
        [job] = found
        declared = get_job(name)
        timeout = declared.time_limit if declared is not None else None
        since = seen.now - dt.timedelta(days=pictures.CHART_DAYS)
        runs = JobRun.objects.using(using).durations_since(name, since, pictures.CHART_RUNS)
        context = {
            **self._picture_context(request),
            "title": name,
            "overview": seen,
            "job": job,
            "strip": self._strip(job.recent),
            "chart": pictures.chart(runs, now=seen.now, median=job.median, timeout=timeout),
            "chart_runs": len(runs),
            "changes": audit.changes(name, using=using),
        }
        return TemplateResponse(request, "admin/django_exclusive_jobs/jobstate/job.html", context)

    @staticmethod
    def _strip(runs: list[JobRun]) -> str:
        """A job's strip of its last runs, drawn; "" for a job with none."""
        runs_url = reverse("admin:django_exclusive_jobs_jobrun_changelist")
        return pictures.draw(pictures.strip(runs), runs_url) if runs else ""

    def _picture_context(self, request: HttpRequest) -> dict[str, Any]:
        """What the jobs page and a job's page share: the admin's, the pictures'."""
        return {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "ok": Health.OK,
            "can_change": self.has_change_permission(request),
            "legend": [(pictures.draw(sample, ""), said) for sample, said in pictures.legend()],
            "strip_runs": pictures.STRIP_RUNS,
            "chart_days": pictures.CHART_DAYS,
            "chart_limit": pictures.CHART_RUNS,
        }

    def change_view(
        self, request: HttpRequest, object_id: str, *args: Any, **kwargs: Any
    ) -> HttpResponse:
        return HttpResponseRedirect(reverse("admin:django_exclusive_jobs_jobstate_changelist"))

    def action_view(self, request: HttpRequest, action: str) -> HttpResponse:
        """GET: what the action will do, and a button; POST: do it."""
        if action not in ACTIONS or not self.has_change_permission(request):
            raise PermissionDenied
        data = request.POST if request.method == "POST" else request.GET
        name = data.get("job", "")
        if get_job(name) is None:
            messages.error(request, _("No job named %(name)r is declared.") % {"name": name})
            return self._back()
        waiting = None
        if action == "cancel":
            waiting = self._waiting(name, data.get("request", ""))
            if waiting is None:
                messages.info(request, _("That run request no longer waits."))
                return self._back()
        if action == "backfill":
            return self._backfill(request, name, data)
        if action == "override":
            return self._override(request, name, data)
        job = get_job(name)
        assert job is not None
        posted = data if request.method == "POST" else None
        form: forms.Form | None = None
        if action in ("run", "pause"):  # from the job in force (an operator's override)
            in_force = overrides.job_in_force(name, using=self._using())
            # Run now: its arguments, checked before anything is asked for.
            if action == "run":
                form = RunNowForm(in_force, posted)
            else:  # over the pause state it was opened on
                version = control.pause_version_of(name, using=self._using())
                form = PauseForm(in_force, posted, version=version)
        elif action == "back":  # over the override it was opened on
            form = ReasonForm(posted, version=overrides.version_of(name, using=self._using()))
        elif action == "resume":
            form = ReasonForm(posted)
        confirmed = request.method == "POST" and data.get("confirm") == "yes"
        if confirmed and (form is None or form.is_valid()):
            given = form.cleaned_data if form is not None else {}
            try:
                self._do(request, action, name, waiting, given)
            except LockConfigurationError as exc:  # a pause's end now past, a stale form
                if form is None:
                    raise
                form.add_error(None, str(exc))
            else:
                return self._back()
        title = _("%(action)s %(name)s?") % {"action": ACTIONS[action], "name": name}
        context = {
            **self._action_context(request, action, name, title, form, waiting),
            "run_request": waiting,
        }
        return TemplateResponse(
            request, "admin/django_exclusive_jobs/jobstate/confirm.html", context
        )

    def _backfill(self, request: HttpRequest, name: str, data: Any) -> HttpResponse:
        """GET: the form, and with a range the slots it would run; POST: ask for them."""
        job = get_job(name)
        assert job is not None
        using = self._using()
        form = BackfillForm(job, using, data if "start" in data else None)
        plan = form.plan if form.is_valid() else None
        if request.method == "POST" and data.get("confirm") == "yes" and plan is not None:
            self._ask_backfill(request, plan, using)
            return self._back()
        title = _("Backfill %(name)s") % {"name": name}
        context = {
            **self._action_context(request, "backfill", name, title, form),
            "plan": plan,
            "warning": backfill.warning(job),
            "done": sorted(plan.done.items()) if plan else [],
            "unserved": not self._served(name, using),
        }
        return TemplateResponse(
            request, "admin/django_exclusive_jobs/jobstate/backfill.html", context
        )

    def _ask_backfill(self, request: HttpRequest, plan: backfill.Backfill, using: str) -> None:
        name = plan.job.name
        if not plan.slots:
            messages.info(request, _("%(name)s has no slot to backfill there.") % {"name": name})
            return
        who = f"{request.user.get_username()} (admin)"
        made = backfill.request_slots(plan, by=who, using=using)
        line = f"Backfill of {name}: {len(made)} slot(s), {backfill.span(plan.slots)}"
        self.log_addition(request, made[0], line)
        said = ngettext(
            "Asked for a backfill of %(n)d slot of %(name)s: the schedulers will run it.",
            "Asked for a backfill of %(n)d slots of %(name)s: the schedulers will run them, "
            "oldest first.",
            len(made),
        )
        messages.success(request, said % {"n": len(made), "name": name})
        if not self._served(name, using):
            alone = _(
                "No live scheduler serves %(name)s: the requests wait for one. To run them "
                "now, run 'manage.py exclusive_jobs backfill %(name)s --from ...' on a server."
            )
            messages.warning(request, alone % {"name": name})

    @staticmethod
    def _served(name: str, using: str) -> bool:
        return any(row.serves(name) for row in Scheduler.objects.using(using).alive())

    def _waiting(self, name: str, request_id: str) -> RunRequest | None:
        requests = RunRequest.objects.using(self._using())
        return requests.run_waiting(name, int(request_id)).first() if request_id.isdigit() else None

    def _do(
        self,
        request: HttpRequest,
        action: str,
        name: str,
        waiting: RunRequest | None,
        given: dict[str, Any],
    ) -> None:
        who = f"{request.user.get_username()} (admin)"
        using = self._using()
        reason = given.get("reason", "")
        if action == "pause":
            until = given.get("until")
            expected = given.get("version") or None
            control.pause(name, by=who, using=using, reason=reason, until=until, expected=expected)
            ends = f" until {until.isoformat()}" if until else ""
            self._log(request, name, f"Paused {name}{ends}: {reason}")
            messages.success(request, _("Paused %(name)s.") % {"name": name})
        elif action == "resume":
            control.resume(name, by=who, using=using, reason=reason)
            self._log(request, name, f"Resumed {name}" + (f": {reason}" if reason else ""))
            messages.success(request, _("Resumed %(name)s.") % {"name": name})
        elif action == "back":
            job = get_job(name)
            assert job is not None
            expected = given.get("version") or None
            if overrides.back_to_code(job, by=who, using=using, reason=reason, expected=expected):
                self._log(request, name, f"Back to the code: {name}")
                messages.success(request, _("%(name)s runs as its code says.") % {"name": name})
            else:
                messages.info(request, _("%(name)s had no override.") % {"name": name})
        elif action == "cancel":
            assert waiting is not None
            if control.cancel(waiting.pk, by=who, using=using):
                self.log_change(request, waiting, f"Cancelled run request {waiting.pk} of {name}")
                messages.success(request, _("Cancelled the run of %(name)s.") % {"name": name})
            else:
                messages.warning(request, _("A run took the request first: it was not cancelled."))
        else:
            given = given.get("arguments", {})
            made = control.request_run(name, by=who, using=using, kwargs=given)
            arguments = describe_arguments(given)
            line = f"Run now of {name}" + (f" with arguments {arguments}" if arguments else "")
            self.log_addition(request, made, line)
            if arguments:
                asked = _(
                    "Asked for a run of %(name)s with arguments %(arguments)s: a scheduler "
                    "will start it."
                )
            else:
                asked = _("Asked for a run of %(name)s: a scheduler will start it.")
            messages.success(request, asked % {"name": name, "arguments": arguments})
            if not self._served(name, using):
                alone = _(
                    "No live scheduler serves %(name)s: the request waits for one. To run it "
                    "now, run 'manage.py exclusive_jobs run %(name)s' on a server."
                )
                messages.warning(request, alone % {"name": name})

    def _override(self, request: HttpRequest, name: str, data: Any) -> HttpResponse:
        """GET: the settings in force; POST: the next slots and what changes; POST with
        ``confirm=yes``: override (recorded in the audit and the admin's log)."""
        job = get_job(name)
        assert job is not None
        using = self._using()
        in_force = overrides.job_in_force(name, using=using)
        version = overrides.version_of(name, using=using)
        posted = data if request.method == "POST" else None
        form = OverrideForm(job, in_force, posted, version=version)
        preview: list[Any] = []
        if form.is_valid():
            proposed = overrides.apply(job, form.changes)
            if request.method == "POST" and data.get("confirm") == "yes":
                who = f"{request.user.get_username()} (admin)"
                reason = form.cleaned_data["reason"]
                # Only over the state the form was opened on (its version, if it has one).
                expected = form.cleaned_data.get("version") or None
                try:
                    after = overrides.override(
                        job, form.changes, reason=reason, by=who, using=using, expected=expected
                    )
                except LockConfigurationError as exc:
                    form.add_error(None, str(exc))
                    return self._override_page(request, name, form, job, [])
                said = overrides.describe_all(after)
                self._log(request, name, f"Overrode {name}: {said or 'as the code'}: {reason}")
                messages.success(
                    request,
                    _("%(name)s overridden: %(what)s.") % {"name": name, "what": said}
                    if said
                    else _("%(name)s runs as its code says.") % {"name": name},
                )
                return self._back(name)
            if proposed.schedule is not None:
                now = database_now(using)
                preview = upcoming(proposed, now, NEXT_SLOTS)
        return self._override_page(request, name, form, job, preview)

    def _override_page(
        self, request: HttpRequest, name: str, form: OverrideForm, job: Any, preview: list[Any]
    ) -> HttpResponse:
        title = _("Override %(name)s") % {"name": name}
        context = {
            **self._action_context(request, "override", name, title, form),
            "preview": preview,
            "code": [
                (setting, overrides.describe(setting, value))
                for setting, value in overrides.code_of(job).items()
            ],
        }
        return TemplateResponse(
            request, "admin/django_exclusive_jobs/jobstate/override.html", context
        )

    def _action_context(
        self,
        request: HttpRequest,
        action: str,
        name: str,
        title: str,
        form: Any,
        waiting: RunRequest | None = None,
    ) -> dict[str, Any]:
        """What every action's page (confirm, backfill, override) shows of the action."""
        return {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": self.model._meta,
            "job": name,
            "action": action,
            "action_label": ACTIONS[action],
            "what_happens": what_happens(action, name, waiting),
            "form": form,
        }

    def _log(self, request: HttpRequest, name: str, message: str) -> None:
        """A line in Django's admin log, on the job's row (made if missing)."""
        state = JobState.objects.using(self._using()).ensure(name)
        self.log_change(request, state, message)

    def _back(self, name: str = "") -> HttpResponse:
        if name:
            job_page = reverse("admin:django_exclusive_jobs_jobstate_job")
            return HttpResponseRedirect(f"{job_page}?{urlencode({'job': name})}")
        return HttpResponseRedirect(reverse("admin:django_exclusive_jobs_jobstate_changelist"))

    @staticmethod
    def _using() -> str:
        return resolve_alias(None)

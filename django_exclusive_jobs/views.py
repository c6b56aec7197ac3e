"""The optional health view: every job's health as JSON; HTTP 200 when all is well, 503
when anything is wrong (or the database cannot be read).

Off by default: it answers only where a project routes it. It lets in staff users who
may view jobs, or a monitor that sends ``Authorization: Bearer <HEALTH_TOKEN>`` when
``EXCLUSIVE_JOBS["HEALTH_TOKEN"]`` is set; everyone else gets 403.
"""

from __future__ import annotations

import hmac

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache

from .conf import app_settings
from .health import overview
from .lock.errors import JobLockError
from .lock.retry import run_statement
from .lock.validation import resolve_alias


@never_cache
def health(request: HttpRequest) -> JsonResponse:
    if not _allowed(request):
        return JsonResponse({"error": "forbidden"}, status=403)
    try:
        using = resolve_alias(None)
        jobs = run_statement(using, lambda: overview(using))
    except JobLockError as exc:
        return JsonResponse({"ok": False, "problems": [f"database: {exc}"]}, status=503)
    return JsonResponse(jobs.as_dict(), status=503 if jobs.problems else 200)


def _allowed(request: HttpRequest) -> bool:
    token = app_settings.HEALTH_TOKEN
    sent = request.headers.get("Authorization", "")
    if token and sent.startswith("Bearer "):
        return hmac.compare_digest(sent[len("Bearer ") :].encode(), str(token).encode())
    user = getattr(request, "user", None)
    return bool(
        user is not None
        and user.is_active
        and user.is_staff
        and user.has_perm("django_exclusive_jobs.view_jobstate")
    )

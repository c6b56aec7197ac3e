"""The optional views: every job's health as JSON (HTTP 200 when all is well, 503 when
anything is wrong or the database cannot be read), and the Prometheus metrics.

Off by default: they answer only where a project routes them. They let in staff users
who may view jobs, or a monitor that sends ``Authorization: Bearer <HEALTH_TOKEN>`` when
``EXCLUSIVE_JOBS["HEALTH_TOKEN"]`` is set; everyone else gets 403.
"""

from __future__ import annotations

import hmac

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache

from .conf import app_settings
from .health import overview
from .lock.errors import JobLockError
from .lock.retry import run_statement
from .lock.validation import resolve_alias


@never_cache
def health(request: HttpRequest) -> JsonResponse:
    if not allowed(request):
        return JsonResponse({"error": "forbidden"}, status=403)
    try:
        using = resolve_alias(None)
        jobs = run_statement(using, lambda: overview(using))
    except JobLockError as exc:
        return JsonResponse({"ok": False, "problems": [f"database: {exc}"]}, status=503)
    return JsonResponse(jobs.as_dict(), status=503 if jobs.problems else 200)


@never_cache
def metrics(request: HttpRequest) -> HttpResponse:
    """Every job's and scheduler's metrics in Prometheus' text format (OpenMetrics when
    the scraper asks for it); 503 and one line when the database cannot be read."""
    # Imported here: a project that does not route this view needs no prometheus-client
    # (without it, .metrics raises ImproperlyConfigured saying what to install).
    from .metrics import Families, metric_families  # noqa: I001

    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import choose_encoder

    if not allowed(request):
        return HttpResponse("forbidden\n", status=403, content_type="text/plain")
    try:
        families = metric_families()
    except JobLockError as exc:
        return HttpResponse(f"database: {exc}\n", status=503, content_type="text/plain")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families(families))
    encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encode(registry), content_type=content_type)


def allowed(request: HttpRequest) -> bool:
    """A monitor with the ``HEALTH_TOKEN`` as its Bearer token, or an active staff user
    who may view jobs: the access rule of every view here."""
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

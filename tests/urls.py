from django.contrib import admin
from django.urls import path

from django_exclusive_jobs.views import health, metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("jobs/health", health),
    path("jobs/metrics", metrics),
]

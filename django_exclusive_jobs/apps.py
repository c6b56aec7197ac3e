from django.apps import AppConfig
from django.core import checks
from django.db.models.signals import post_migrate
from django.utils.translation import gettext_lazy as _


class ExclusiveJobsConfig(AppConfig):
    name = "django_exclusive_jobs"
    label = "django_exclusive_jobs"
    verbose_name = _("Exclusive jobs")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .checks import check_jobs, check_settings
        from .conf import app_settings
        from .management import prepare_job_locks
        from .run.registry import autodiscover

        checks.register(check_settings)
        checks.register(check_jobs)
        post_migrate.connect(prepare_job_locks, sender=self)
        autodiscover()
        # Monitoring integrations: not even imported unless one is on.
        if app_settings.OPENTELEMETRY is True or app_settings.SENTRY_MONITORS is True:
            from .integrations import connect_enabled

            connect_enabled()

"""yourapp/signals.py: alerts and metrics from the job signals.

Import this module from your AppConfig.ready() so the receivers are connected in every
process that runs jobs.
"""

import logging

from django.dispatch import receiver

from django_exclusive_jobs.signals import job_finished, job_skipped, lock_lost

alerts = logging.getLogger("ops.alerts")
metrics = logging.getLogger("ops.metrics")


@receiver(job_finished, dispatch_uid="ops_job_finished")
def alert_on_failure(sender, name, lock, status, duration, exception, **kwargs):
    metrics.info("job=%s status=%s duration=%.3f", name, status, duration)
    if status in ("failed", "lost"):
        alerts.error(
            "job %s %s after %.1fs (token %s): %r", name, status, duration, lock.token, exception
        )


@receiver(job_skipped, dispatch_uid="ops_job_skipped")
def count_skip(sender, name, holder, expires_at, **kwargs):
    metrics.info("job=%s status=skipped holder=%s", name, holder)


@receiver(lock_lost, dispatch_uid="ops_lock_lost")
def alert_on_lost_lock(sender, lock, reason, **kwargs):
    alerts.error("lock %s (token %s) lost: %s", lock.name, lock.token, reason)

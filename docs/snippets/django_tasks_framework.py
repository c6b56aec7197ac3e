"""reports/tasks.py: a task of Django's tasks framework (Django 6.0+), run on one worker.

The framework enqueues and runs tasks but does not schedule them; whatever enqueues this
one every hour (cron on every server, say) may enqueue it several times. The lock and
the slot make one worker run it per hour; the other copies return None.
"""

from django.tasks import task

from django_exclusive_jobs import exclusive_job


@task
@exclusive_job("hourly_digest", cron="0 * * * *", ttl="10m")
def hourly_digest() -> str:
    return "digest sent"

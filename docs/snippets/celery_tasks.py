"""reports/tasks.py: a Celery beat task that runs once per slot, whatever beat does.

Two beat processes (say, one per data centre) both enqueue the task at 02:30; two
workers pick it up. The lock and the slot make one of them run it and the other skip.
"""

from celery import shared_task

from django_exclusive_jobs import exclusive_job


@shared_task
@exclusive_job("nightly_invoices", cron="30 2 * * *", ttl="15m")
def nightly_invoices() -> str:
    return "invoices sent"

"""reports/jobs.py: every installed app's ``jobs`` module is imported at start-up."""

import datetime as dt
import logging

from django.contrib.auth import get_user_model
from django.utils import timezone

from django_exclusive_jobs import exclusive_job

logger = logging.getLogger(__name__)


@exclusive_job("hourly_report", cron="0 * * * *", ttl="10m")
def hourly_report() -> int:
    """Count the users who joined in the last hour. Runs once per hourly slot."""
    since = timezone.now() - dt.timedelta(hours=1)
    joined = get_user_model().objects.filter(date_joined__gte=since).count()
    logger.info("hourly report: %d new users", joined)
    return joined

"""A Django management command as a scheduled job."""

from django.core.management import call_command

from django_exclusive_jobs import exclusive_job


@exclusive_job("clear_sessions", cron="0 3 * * *", ttl="30m")
def clear_sessions() -> None:
    """Delete expired sessions every night at 03:00 (TIME_ZONE), on one server."""
    call_command("clearsessions")

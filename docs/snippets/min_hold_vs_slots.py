"""Two ways to stop a quick job from running twice when servers start a little apart."""

from django_exclusive_jobs import exclusive_job


# Preferred: declare the schedule. Each 15-minute slot runs once, however late a
# server's cron fires, and the lock is free again as soon as the run ends.
@exclusive_job("refresh_rates", every="15m", ttl="2m")
def refresh_rates() -> str:
    return "refreshed"


# Without a schedule: min_hold keeps the lock closed for 60 s after the start, even
# though the job ends sooner, so a server whose cron fired late still finds it taken.
@exclusive_job("send_digest", min_hold="60s", ttl="5m")
def send_digest() -> str:
    return "sent"

"""Jobs of the demo app. `manage.py run_exclusive hourly_report` finds them by name."""

import os
import socket
import time

from django_exclusive_jobs import exclusive_job


@exclusive_job("hourly_report", cron="0 * * * *", ttl="5m")
def hourly_report() -> None:
    """Pretend to build and send the hourly report: each hour's slot runs once."""
    time.sleep(float(os.environ.get("DEMO_JOB_SECONDS", "1")))
    print(f"hourly_report sent by {socket.gethostname()} pid {os.getpid()}", flush=True)


@exclusive_job("cleanup_sessions", cron="0 3 * * *", ttl="30m", in_process=True)
def cleanup_sessions() -> None:
    """Nightly at 03:00 (TIME_ZONE): each night's slot runs once, however many servers.
    A light job: the scheduler runs it in a thread of its own process (in_process)."""
    from django.core.management import call_command

    call_command("clearsessions")


@exclusive_job("noop")
def noop() -> None:
    """Does nothing: benchmarks/bench_command.py times `run_exclusive noop` with it."""

"""The campaign's app: tells a job's process which process holds its lock."""

from __future__ import annotations

import os
import sys

from django.apps import AppConfig


class CampaignConfig(AppConfig):
    name = "campaign_project"

    def ready(self) -> None:
        # The scheduler's fork server gets this environment, and so does every job's
        # process it forks: a job finds its run row by (job, slot, this pid). In
        # run_exclusive the job runs in this very process.
        if any(word in sys.argv for word in ("exclusive_scheduler", "run_exclusive")):
            os.environ["CAMPAIGN_HOLDER_PID"] = str(os.getpid())

"""The admin: the jobs page (pause, resume, run now), locks (force-release) and runs."""

from . import jobs, locks, runs

__all__ = ["jobs", "locks", "runs"]

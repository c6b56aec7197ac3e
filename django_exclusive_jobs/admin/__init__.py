"""The admin: the jobs page (pause, resume, run now), locks (force-release), runs and
schedulers (acknowledge the gone)."""

from . import jobs, locks, runs, schedulers

__all__ = ["jobs", "locks", "runs", "schedulers"]

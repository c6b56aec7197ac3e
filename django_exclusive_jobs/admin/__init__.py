"""The admin: the jobs page (pause, resume, run now), locks (force-release), runs,
schedulers (acknowledge the gone) and the schedules added at run time."""

from . import jobs, locks, runs, runtime_schedules, schedulers

__all__ = ["jobs", "locks", "runs", "runtime_schedules", "schedulers"]

"""settings.py: every key of EXCLUSIVE_JOBS, each set to its default.

Leave out what you do not change. Durations are seconds or strings such as "90s",
"15m", "1h", "2d" (or a datetime.timedelta).
"""

EXCLUSIVE_JOBS = {
    "TTL": "5m",  # lease length; keep-alive renews it every TTL / 3
    "MIN_HOLD": 0,  # keep a released lock closed until acquired_at + MIN_HOLD
    "KEEPALIVE": True,  # renew the lease from a background thread while a job runs
    "DATABASE": None,  # alias of the lock tables; None asks the database routers
    "SLOT_TOLERANCE": "30s",  # how early a start may be and still serve the coming slot
    "KEEP_RUNS": "30d",  # run history kept by prune_job_runs
    "SUSPECT_FACTOR": 3,  # "suspect" once a run lasts 3 x the job's median duration
    "BUSY_TIMEOUT": "30s",  # retry "database is locked" and MySQL deadlocks this long
}

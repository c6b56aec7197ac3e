"""A small Django project for ``benchmarks/bench_scheduler.py``: settings, N jobs, a counter.

Nothing here is part of the app. ``jobs.py`` registers ``$BENCH_JOBS`` scheduled jobs
(``bench_000``, ``bench_001``, ...) every ``$BENCH_EVERY``; each appends one line to
``$BENCH_RUNS_FILE`` when it really runs. ``counting.py`` counts the statements a
scheduler process sends through Django's cursor.
"""

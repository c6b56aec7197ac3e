"""Imported once by the scheduler's fork server, so each job's process starts warm.

Django is set up here, before any child forks: no thread or database connection exists
yet to be inherited. If set-up fails, every child reports the error (a half-set-up
Django cannot be set up again in the same process).
"""

import signal

# A SIGTERM sent to the whole process group (kill -- -PGID, tini -g, supervisord's
# stopasgroup) must not take the fork server down: its children would die with it
# before the scheduler's grace. It ends when the scheduler and its children are gone.
signal.signal(signal.SIGTERM, signal.SIG_IGN)

failure = ""  # why Django could not be set up here; each child then reports it
try:
    from django.apps import apps

    if not apps.ready:
        import django

        django.setup()
except Exception:
    import traceback

    failure = traceback.format_exc()

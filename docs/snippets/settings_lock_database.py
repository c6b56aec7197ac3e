"""settings.py: locks on a second alias when the main one has ATOMIC_REQUESTS.

A lock taken inside a transaction would stay invisible to other servers until the
transaction commits, so the lock refuses to be taken there. A second alias for the same
database, without ATOMIC_REQUESTS, commits each lock statement at once.
"""

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "app",
        "HOST": "db.internal",
        "ATOMIC_REQUESTS": True,
    },
}
DATABASES["locks"] = {**DATABASES["default"], "ATOMIC_REQUESTS": False}

EXCLUSIVE_JOBS = {"DATABASE": "locks"}

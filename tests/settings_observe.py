"""The test settings with both monitoring integrations on, for real command processes:
what they send goes to the file named by $OBSERVED (see tests/observers.py)."""

import os

from .settings import *  # noqa: F403

EXCLUSIVE_JOBS = {"OPENTELEMETRY": True, "SENTRY_MONITORS": True}

if os.environ.get("OBSERVED"):
    from .observers import install

    install(os.environ["OBSERVED"])

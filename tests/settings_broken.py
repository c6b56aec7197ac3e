"""The test settings plus tests.brokenjobs, whose jobs.py fails at start-up."""

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.brokenjobs"]  # noqa: F405

"""A jobs module that fails when Django starts, in the way $BROKEN_JOBS names
(tests/test_error_contract.py runs every command against it)."""

from __future__ import annotations

import os

from django_exclusive_jobs import exclusive_job

FAULT = os.environ.get("BROKEN_JOBS", "import")


@exclusive_job("broken_module_job")  # registered, then taken out when the module fails
def fine() -> None:
    pass


if FAULT == "import":
    raise ImportError("No module named 'reportlab'")

if FAULT == "cron":

    @exclusive_job("nightly_report", cron="61 * * * *")
    def nightly_report() -> None:
        pass


if FAULT == "every":

    @exclusive_job("ticker", every="often")
    def ticker() -> None:
        pass


if FAULT == "ttl":

    @exclusive_job("report", ttl=-1)
    def report() -> None:
        pass


if FAULT == "duplicate":

    @exclusive_job("quick")  # tests.testapp.jobs declares a job of that name
    def quick() -> None:
        pass


def report(period: str, slot: object = None) -> None:
    pass


if FAULT == "kwargs-unknown":
    exclusive_job("report", cron="0 6 * * *", kwargs={"perod": "day"})(report)

if FAULT == "kwargs-missing":
    exclusive_job("report", schedules={"weekly": {"cron": "0 7 * * 1"}})(report)

if FAULT == "kwargs-json":
    exclusive_job("report", every="1d", kwargs={"period": ("day", "week")})(report)

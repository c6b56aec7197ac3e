"""docs/observe.md, Prometheus: the samples run, and every metric the alert rules and the
Grafana dashboard ask for is one a real scrape has."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from django.test import Client, override_settings
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.metrics import JobsCollector
from django_exclusive_jobs.models import JobRun, RunStatus, Scheduler

from .test_docs import DOCS, fenced_blocks, load_sample, sqlite

__all__ = ["sqlite"]  # a fixture

PAGE = DOCS / "observe.md"
DASHBOARD = DOCS / "_static" / "grafana-dashboard.json"
TOKEN = "docs-s3cret"
METRIC = re.compile(r"\bexclusive_jobs_[a-z0-9_]+")


def scraped_names(sqlite: str) -> set[str]:
    """Every sample name of a real scrape of the documented URL, with a run and a
    scheduler in the database (so no family is empty)."""
    now = database_now(sqlite)
    JobRun.objects.using(sqlite).create(
        name="quick", status=RunStatus.SUCCEEDED, started_at=now, finished_at=now, duration=1
    )
    Scheduler.objects.using(sqlite).create(
        instance="c" * 32, host="web-1", pid=1, jobs=["quick"], started_at=now, last_beat_at=now
    )
    module = load_sample("metrics_urls")
    with override_settings(ROOT_URLCONF=module.__name__, EXCLUSIVE_JOBS={"HEALTH_TOKEN": TOKEN}):
        answer = Client().get("/jobs/metrics/", headers={"Authorization": f"Bearer {TOKEN}"})
        assert Client().get("/jobs/health/").status_code == 403  # routed too, closed
    assert answer.status_code == 200
    return {
        sample.name
        for family in text_string_to_metric_families(answer.content.decode())
        for sample in family.samples
    }


def rule_expressions() -> list[str]:
    [rules] = [
        yaml.safe_load(body)
        for info, body in fenced_blocks(PAGE.read_text())
        if info == "yaml" and body.lstrip().startswith("# exclusive-jobs.rules.yml")
    ]
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    return exprs + [variable["query"] for variable in dashboard["templating"]["list"]]


def test_alert_rules_and_dashboard_ask_only_for_metrics_a_scrape_has(sqlite: str) -> None:
    names = scraped_names(sqlite)
    rules, panels = rule_expressions(), dashboard_expressions()
    assert len(rules) >= 5 and len(panels) >= 10
    for expr in [*rules, *panels]:
        wanted = set(METRIC.findall(expr))
        assert wanted, expr
        assert wanted <= names, f"{expr}: {sorted(wanted - names)} not in a scrape"
    # The rules cover what the page promises: missed slots, failures, schedulers, locks.
    asked = " ".join(rules)
    for promise in ("missed", "failing", "exclusive_jobs_scheduler_alive", "stale_lock"):
        assert promise in asked


def test_the_metrics_table_lists_exactly_the_scraped_families(sqlite: str) -> None:
    names = scraped_names(sqlite)
    listed = set(re.findall(r"^\| `(exclusive_jobs_[a-z0-9_]+)`", PAGE.read_text(), re.M))
    suffixes = ("_bucket", "_count", "_sum")
    families = {n for n in names if not n.endswith(suffixes)}
    families |= {n.rsplit("_", 1)[0] for n in names if n.endswith("_bucket")}
    assert listed == families


@pytest.fixture
def unregister() -> Iterator[None]:
    before = set(REGISTRY._collector_to_names)
    yield
    for collector in set(REGISTRY._collector_to_names) - before:
        REGISTRY.unregister(collector)


@pytest.mark.usefixtures("unregister")
def test_collector_sample_adds_the_jobs_to_the_projects_registry(sqlite: str) -> None:
    load_sample("metrics_collector")
    ours = [c for c in REGISTRY._collector_to_names if isinstance(c, JobsCollector)]
    assert len(ours) == 1
    text = generate_latest(REGISTRY).decode()
    assert "exclusive_jobs_database_up 1.0" in text
    assert 'exclusive_jobs_runs_total{job_name="quick",status="failed"} 0.0' in text


def test_the_observe_page_lists_every_field_and_event_and_its_logging_sample_works(
    tmp_path: Path,
) -> None:
    import logging.config

    from django_exclusive_jobs.logs import EVENTS, FIELDS, line, say

    from .test_docs import settings_of

    page = PAGE.read_text()
    part = page[page.index("## Structured logs") :]
    fields_table = part[part.index("| field |") : part.index("| `event` | the line says")]
    events_table = part[part.index("| `event` | the line says") : part.index("**In your logging**")]

    def first_column(table: str) -> list[str]:
        rows = [row for row in table.splitlines() if row.startswith("| `")]
        return [row.split("|")[1].strip().strip("`") for row in rows]

    assert first_column(fields_table) == list(FIELDS)
    assert first_column(events_table)[1:] == list(EVENTS)  # after the header's `event`
    config = settings_of("observe_logging")["LOGGING"]
    out = tmp_path / "log.jsonl"
    config["handlers"]["stdout"] = {
        "class": "logging.FileHandler",
        "filename": str(out),
        "formatter": "json",
    }
    logger = logging.getLogger("django_exclusive_jobs")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    try:
        logging.config.dictConfig({**config, "disable_existing_loggers": False})
        say(None, line("missed", "missed x: 1 slot(s)", job_name="x", slots=[]))
    finally:
        for handler in logger.handlers:
            handler.close()
        logger.handlers[:], logger.level, logger.propagate = saved
    [data] = [json.loads(text) for text in out.read_text().splitlines()]
    assert (data["event"], data["job_name"], data["level"]) == ("missed", "x", "INFO")

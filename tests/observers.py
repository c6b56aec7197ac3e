"""What the monitoring integrations send, caught in this process (no network): an
OpenTelemetry exporter and a Sentry transport that keep what they get in a list, and
append it as JSON lines to a file for a test to read from another process."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport


def span_record(span: ReadableSpan) -> dict[str, Any]:
    assert span.context is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": span.context.trace_id,
        "span_id": span.context.span_id,
        "parent_id": span.parent.span_id if span.parent else None,
        "attributes": dict(span.attributes or {}),
        "events": [event.name for event in span.events],
        "status": span.status.status_code.name,
        "start": span.start_time,
        "end": span.end_time,
    }


class FileSpanExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a") as out:
            for span in spans:
                out.write(json.dumps({"span": span_record(span)}) + "\n")
        return SpanExportResult.SUCCESS


class CapturingTransport(Transport):
    """Keeps each envelope's check-ins (and writes them to ``path``, if given)."""

    def __init__(self, options: dict[str, Any] | None = None, path: str | None = None) -> None:
        super().__init__(options)
        self.path = path
        self.check_ins: list[dict[str, Any]] = []

    def capture_envelope(self, envelope: Envelope) -> None:
        for item in envelope.items:
            if item.type == "check_in":
                check_in = json.loads(item.get_bytes())
                self.check_ins.append(check_in)
                if self.path:
                    with open(self.path, "a") as out:
                        out.write(json.dumps({"check_in": check_in}) + "\n")


def install(path: str) -> None:
    """Send this process's spans and check-ins to ``path`` (a test's file)."""
    import sentry_sdk
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileSpanExporter(path)))
    trace.set_tracer_provider(provider)
    sentry_sdk.init(
        dsn="https://public@sentry.invalid/1",
        transport=CapturingTransport(path=path),
        default_integrations=False,
    )


def read(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The spans and the check-ins written to ``path``."""
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [x["span"] for x in lines if "span" in x], [
        x["check_in"] for x in lines if "check_in" in x
    ]

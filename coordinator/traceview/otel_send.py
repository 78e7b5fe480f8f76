"""Sending finished spans to an OTLP/HTTP collector, and saying plainly what it took.

:func:`send_spans` exports in chunks and checks each result, so the caller learns how
many spans the collector accepted, or gets :class:`ExportFailed` naming the endpoint,
the reason and what to do. The SDK's batch processor would only log a failure and
retry in the background, and its exporter logs every retry to stderr ("Transient
error ... retrying"): here those records are kept instead and boiled down to one
reason. A request gives up after :data:`EXPORT_TIMEOUT_S` (retries included) unless
the standard ``OTEL_EXPORTER_OTLP_*TIMEOUT`` variables say otherwise: enough to ride
out a collector restart, short enough that a wrong URL does not hang the command.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from urllib.parse import urlsplit

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult


def otlp_traces_url(url: str) -> str:
    """A base endpoint (``http://host:4318``) gets the OTLP/HTTP traces path appended."""
    return url.rstrip("/") + "/v1/traces" if urlsplit(url).path in ("", "/") else url


EXPORT_TIMEOUT_S = 5.0
"""Seconds one OTLP request may take, retries included, unless the environment sets one."""
_CHUNK = 512
"""Spans per request: well under the exporter's request-size limit even with content."""
_TIMEOUT_ENV = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")


def _env_endpoint() -> str:
    """The endpoint the exporter takes from the environment, as it will use it."""
    if traces := os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip():
        return traces
    if base := os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip():
        return otlp_traces_url(base)
    return "$OTEL_EXPORTER_OTLP_ENDPOINT"


class ExportFailed(Exception):
    """The OTLP endpoint did not accept the spans; the message says where, why and what to do."""

    def __init__(self, endpoint: str, reason: str, accepted: int, total: int) -> None:
        self.endpoint, self.reason, self.accepted, self.total = endpoint, reason, accepted, total
        super().__init__(
            f"OTLP export to {endpoint} failed: {reason}; {accepted} of {total} spans accepted. "
            "Check that an OpenTelemetry collector is running there and receives OTLP/HTTP "
            "(usually http://HOST:4318; the gRPC port 4317 will not do)."
        )


def send_spans(spans: Sequence[ReadableSpan], endpoint: str | None) -> int:
    """Send finished spans to an OTLP/HTTP endpoint; the count accepted, or :class:`ExportFailed`."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    url = otlp_traces_url(endpoint) if endpoint else None
    timeout = None if any(os.environ.get(v) for v in _TIMEOUT_ENV) else EXPORT_TIMEOUT_S
    target = OTLPSpanExporter(endpoint=url, timeout=timeout)
    where = url or _env_endpoint()
    accepted = 0
    with _kept_exporter_logs() as records:
        try:
            for i in range(0, len(spans), _CHUNK):
                chunk = spans[i : i + _CHUNK]
                if target.export(chunk) is not SpanExportResult.SUCCESS:
                    raise ExportFailed(where, _failure_reason(records), accepted, len(spans))
                accepted += len(chunk)
        finally:
            target.shutdown()
    return accepted


class _Keep(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__()
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def _kept_exporter_logs() -> Iterator[list[logging.LogRecord]]:
    """Keep the OTLP exporter's log records instead of letting them reach stderr."""
    logger = logging.getLogger("opentelemetry.exporter")
    records: list[logging.LogRecord] = []
    handler, propagate = _Keep(records), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _failure_reason(records: list[logging.LogRecord]) -> str:
    """One short reason from the exporter's records (which wrap the real cause deeply)."""
    texts = [r.getMessage() for r in records]
    for text in texts:
        # requests nests the OS error in three layers of repr; the errno text is the news.
        if found := re.search(r"\[Errno -?\d+\] ([^'\")]+)", text):
            return found.group(1).strip().lower()
    transient = ""
    for record in records:
        args = record.args if isinstance(record.args, tuple) else ()
        if str(record.msg).startswith("Failed to export") and len(args) == 3:
            _, code, why = args
            return f"HTTP {code} {why}" if code else str(why)[:200]
        if str(record.msg).startswith("Transient error") and args:
            transient = str(args[0])[:200]
    if transient:
        return f"{transient} (still failing when the export timed out)"
    return texts[-1][:200] if texts else "the exporter reported a failure"

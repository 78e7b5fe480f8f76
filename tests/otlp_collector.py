"""A tiny OTLP/HTTP trace collector on 127.0.0.1 for tests: it keeps what it is sent."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Collector:
    """Accepts ``POST /v1/traces`` (protobuf) and decodes the spans it received.

    ``status`` is the HTTP status every post gets (a collector that refuses, e.g. 404).
    """

    def __init__(self, status: int = 200) -> None:
        self.posts: list[tuple[str, str, bytes]] = []
        posts = self.posts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                posts.append((self.path, self.headers.get("Content-Type", ""), body))
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _resource_spans(self) -> list[Any]:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        return [
            rs
            for _, _, body in self.posts
            for rs in ExportTraceServiceRequest.FromString(body).resource_spans
        ]

    def spans(self) -> list[Any]:
        """Every span received, decoded from the OTLP protobuf bodies."""
        return [span for rs in self._resource_spans() for ss in rs.scope_spans for span in ss.spans]

    def resources(self) -> list[dict[str, Any]]:
        """The resource attributes of every batch received (plain values)."""
        return [attributes(rs.resource.attributes) for rs in self._resource_spans()]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def attributes(pairs: Any) -> dict[str, Any]:
    """OTLP key-value pairs as a plain dict (strings, ints, floats, bools, lists)."""
    return {kv.key: _plain(kv.value) for kv in pairs}


def _plain(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_plain(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None

"""``fleet view RUN``: the run's page and its files, served on 127.0.0.1 only.

The page is rendered per request (so a running run shows its latest state on reload)
with links pointing at ``/files/``, which serves files from inside the run directory
only: paths are resolved and must stay under it, so ``..`` cannot reach the host.
``/full/<file>:<line>`` answers the full text of one trace event (a tool result, a
tool input, a model reply, a compaction summary) that the page shows cut; the page
fetches it only when the user asks, so a 16 x 200-turn run still opens at once.
"""

from __future__ import annotations

import itertools
import mimetypes
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pydantic import TypeAdapter, ValidationError

from coordinator.traceview.html import render_page
from coordinator.traceview.load import load_run
from coordinator.traceview.rollup import compact_json
from subagents.trace import (
    Compaction,
    ErrorEvent,
    ModelCall,
    Todos,
    ToolCall,
    ToolResult,
    TraceEvent,
)

_ADAPTER: TypeAdapter[Any] = TypeAdapter(TraceEvent)
MAX_FULL = 4_000_000
"""Bytes of one full text answered by ``/full/`` (a bigger offload is cut, with a note)."""


def _inside(root: Path, rel: str) -> Path | None:
    target = (root / rel).resolve()
    return target if target.is_relative_to(root) and target.is_file() else None


def _event_text(ev: Any) -> str:
    """The full text a view cut from ``ev`` (the same field the view showed)."""
    if isinstance(ev, ToolResult):
        return ev.output
    if isinstance(ev, ToolCall):
        return compact_json(ev.input)
    if isinstance(ev, ModelCall):
        return "\n".join(b.get("text", "") for b in ev.content if b.get("type") == "text")
    if isinstance(ev, Compaction):
        return ev.summary
    if isinstance(ev, ErrorEvent):
        return f"{ev.error}: {ev.message}"
    if isinstance(ev, Todos):
        return compact_json(ev.todos)
    return ev.model_dump_json(indent=2)


def full_text(root: Path, ref: str) -> str | None:
    """The full text behind ``ref`` (``members/<id>/trace.jsonl:<line>`` or a file path)."""
    head, sep, tail = ref.rpartition(":")
    path, line = (head, int(tail)) if sep and tail.isdigit() else (ref, 0)
    target = _inside(root, path)
    if target is None:
        return None
    if line <= 0:
        with target.open("rb") as fh:
            data = fh.read(MAX_FULL + 1)
        text = data[:MAX_FULL].decode("utf-8", errors="replace")
        return text + (
            f"\n[cut at {MAX_FULL} bytes; the file is {target}]" if len(data) > MAX_FULL else ""
        )
    with target.open("rb") as fh:
        raw = next(itertools.islice(fh, line - 1, None), None)
    if raw is None:
        return None
    try:
        ev = _ADAPTER.validate_json(raw)
    except ValidationError:
        return raw.decode("utf-8", errors="replace")
    return _event_text(ev)


def make_server(run_dir: Path, port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server for one run, bound to 127.0.0.1 (port 0 picks a free one)."""
    root = run_dir.resolve()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = unquote(urlsplit(self.path).path)
            if path in ("/", "/index.html"):
                body = render_page(load_run(str(root)), link_base="/files/", served=True).encode(
                    "utf-8"
                )
                self._send(200, "text/html; charset=utf-8", body)
                return
            if path.startswith("/full/"):
                text = full_text(root, path[len("/full/") :])
                if text is not None:
                    self._send(200, "text/plain; charset=utf-8", text.encode("utf-8"))
                    return
            if path.startswith("/files/"):
                target = _inside(root, path[len("/files/") :])
                if target is not None:
                    mime = mimetypes.guess_type(target.name)[0] or "text/plain; charset=utf-8"
                    self._send(200, mime, target.read_bytes())
                    return
            self._send(404, "text/plain; charset=utf-8", b"not found\n")

        def _send(self, code: int, mime: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", mime)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # keep the terminal for the URL line

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


def serve_forever(run_dir: Path, *, port: int) -> int:
    """Serve until Ctrl-C (the CLI maps the interrupt to exit code 130)."""
    try:
        server = make_server(run_dir, port)
    except OSError as exc:
        from coordinator.errors import UsageError

        raise UsageError(
            f"cannot listen on 127.0.0.1:{port} ({exc.strerror}); try --port 0."
        ) from None
    bound = server.server_address[1]
    print(
        f"serving run {run_dir.name} on http://127.0.0.1:{bound}/ (Ctrl-C to stop)", file=sys.stderr
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        thread.join()
    finally:
        server.shutdown()
        server.server_close()
    return 0

"""``fleet view RUN``: the run's page and its files, served on 127.0.0.1 only.

The page is rendered per request (so a running run shows its latest state on reload)
with links pointing at ``/files/``, which serves files from inside the run directory
only: paths are resolved and must stay under it, so ``..`` cannot reach the host.
``/full/<file>:<line>`` answers the full text of one trace event (a tool result, a
tool input, a model reply, a compaction summary) that the page shows cut; the page
fetches it only when the user asks, so a 16 x 200-turn run still opens at once.

Any web page the person has open can make their browser ask this server, and a page
whose name is rebound to 127.0.0.1 (DNS rebinding) would even be its same origin and
read the answers. So a request is answered only when its ``Host`` names the server
itself (``127.0.0.1``, ``localhost`` or ``[::1]`` with the port): anything else gets
403, the check the Jupyter and webpack dev servers make. No answer carries CORS
headers; every one says ``nosniff`` and may not be framed or loaded by another site
(``Cross-Origin-Resource-Policy``). The page's script runs under a CSP naming its
hash; run files are served as images (by their type) or as plain text under a
sandboxing CSP, so a file a box wrote (``.html``, ``.svg``) never runs as this origin.
"""

from __future__ import annotations

import itertools
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pydantic import TypeAdapter, ValidationError

from coordinator.traceview.html import render_page, script_source
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
LOCAL_NAMES = ("127.0.0.1", "localhost", "[::1]")
"""The names a ``Host`` header may give (with the server's port)."""
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
               ".webp": "image/webp", ".gif": "image/gif"}  # fmt: skip
"""Run files answered with their own type; every other file is plain text."""
FILE_CSP = "default-src 'none'; sandbox"
"""A run file opened on its own: no script, no requests, an origin of its own."""
_SAME_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}
"""Sent with every answer."""


def page_csp() -> str:
    """The served page's policy: its own inline script only, data from this server."""
    return (
        "default-src 'none'; img-src data: 'self'; connect-src 'self'; "
        f"style-src 'unsafe-inline'; script-src {script_source()}; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


def host_allowed(host: str | None, port: int) -> bool:
    """``host`` (a request's ``Host`` header) names this server on loopback."""
    if host is None:
        return False
    host = host.strip().lower()
    names = {f"{name}:{port}" for name in LOCAL_NAMES}
    if port == 80:
        names |= set(LOCAL_NAMES)
    return host in names


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
        port = 0
        """The port the server listens on (known once it is bound)."""

        def do_GET(self) -> None:
            hosts = self.headers.get_all("Host") or []
            port = self.port
            if len(hosts) != 1 or not host_allowed(hosts[0], port):
                body = f"fleet view answers only http://127.0.0.1:{port}/ (or localhost)\n"
                self._send(403, "text/plain; charset=utf-8", body.encode(), FILE_CSP)
                return
            path = unquote(urlsplit(self.path).path)
            if path in ("/", "/index.html"):
                page = render_page(load_run(str(root)), link_base="/files/", served=True)
                self._send(200, "text/html; charset=utf-8", page.encode("utf-8"), page_csp())
                return
            if path.startswith("/full/"):
                text = full_text(root, path[len("/full/") :])
                if text is not None:
                    self._send(200, "text/plain; charset=utf-8", text.encode("utf-8"), FILE_CSP)
                    return
            if path.startswith("/files/"):
                target = _inside(root, path[len("/files/") :])
                if target is not None:
                    mime = IMAGE_TYPES.get(target.suffix.lower(), "text/plain; charset=utf-8")
                    self._send(200, mime, target.read_bytes(), FILE_CSP)
                    return
            self._send(404, "text/plain; charset=utf-8", b"not found\n", FILE_CSP)

        def _send(self, code: int, mime: str, body: bytes, csp: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", mime)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Security-Policy", csp)
            for name, value in _SAME_HEADERS.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # keep the terminal for the URL line

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    Handler.port = server.server_port
    return server


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

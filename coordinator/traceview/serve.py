"""``fleet view [RUN]``: a run's live page and its files, or every run, on 127.0.0.1 only.

Routes of a run (at ``/`` for ``fleet view RUN``; at ``/run/<id>/`` under the list of
runs that ``fleet view`` serves at ``/``, with ``/runs.json`` for its updates; an id
names a run directly under the runs directory, nothing else):

* ``""`` - the page, rendered per request, holding what it needs to follow the run
  (``live``: the routes' prefix, the run's change stamp, its asks and answer token);
* ``data?since=STAMP`` - the page's data again when the run changed, else 204
  (:mod:`coordinator.traceview.live` says why the page polls);
* ``files/<path>`` - a file from inside the run directory only: paths are resolved
  and must stay under it, so ``..`` cannot reach the host;
* ``full/<file>:<line>`` - the full text of one trace event (a tool result, a tool
  input, a model reply, a compaction summary) the page shows cut; fetched only when
  the user asks, so a 16 x 200-turn run still opens at once;
* ``POST answer`` - a person's answer to a pending ask (:func:`post_refusal` says
  what it must carry), recorded by the approval queue as ``fleet approve`` does.

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

import hmac
import itertools
import json
import secrets
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from pydantic import TypeAdapter, ValidationError

from coordinator.traceview.html import (
    INDEX_SCRIPTS,
    PAGE_SCRIPTS,
    page_data,
    render_index,
    render_page,
    script_source,
)
from coordinator.traceview.live import AnswerRefused, RunIndex, answer_ask, pending_asks, stamp
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


def page_csp(scripts: tuple[str, ...] = PAGE_SCRIPTS) -> str:
    """The served page's policy: its own inline script only, data from this server."""
    return (
        "default-src 'none'; img-src data: 'self'; connect-src 'self'; "
        f"style-src 'unsafe-inline'; script-src {script_source(scripts)}; "
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


MAX_POST = 65_536
"""Bytes of an answer's body (an id, a verdict, a sha256 and a token)."""


class _Target:
    """What one server shows: a run (``fleet view RUN``) or every run under a root."""

    def __init__(self, path: Path, *, index: bool) -> None:
        self.path = path.resolve()
        self.runs = RunIndex(self.path) if index else None
        self._tokens: dict[Path, str] = {}
        self._lock = threading.Lock()

    def token(self, run_dir: Path) -> str:
        """The run's answer token: random per run and per server, given only to its page."""
        with self._lock:
            return self._tokens.setdefault(run_dir, secrets.token_urlsafe(32))

    def route(self, path: str) -> tuple[Path, str, str] | None:
        """(run directory, the route's prefix, the rest) for a run route; None otherwise."""
        if self.runs is None:
            return self.path, "/", path[1:]
        if not path.startswith("/run/"):
            return None
        run_id, _, rest = path[len("/run/") :].partition("/")
        run_dir = self.runs.run_dir(run_id)
        if run_dir is None:
            return None
        return run_dir.resolve(), "/run/" + quote(run_id, safe="") + "/", rest

    def live(self, run_dir: Path, api: str) -> dict[str, Any]:
        return {"api": api, "stamp": stamp(run_dir), "token": self.token(run_dir),
                "asks": pending_asks(run_dir)}  # fmt: skip


def _json(value: Any) -> bytes:
    # ASCII only: a lone surrogate in a result stays a \ud800 escape, valid UTF-8.
    return json.dumps(value, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def make_server(run_dir: Path, port: int = 0, *, index: bool = False) -> ThreadingHTTPServer:
    """An HTTP server for one run (or, with ``index``, for every run under ``run_dir``),
    bound to 127.0.0.1 (port 0 picks a free one)."""
    target = _Target(run_dir, index=index)

    class Handler(BaseHTTPRequestHandler):
        port = 0
        """The port the server listens on (known once it is bound)."""

        def _host_ok(self) -> bool:
            hosts = self.headers.get_all("Host") or []
            if len(hosts) != 1 or not host_allowed(hosts[0], self.port):
                body = f"fleet view answers only http://127.0.0.1:{self.port}/ (or localhost)\n"
                self._send(403, "text/plain; charset=utf-8", body.encode(), FILE_CSP)
                return False
            return True

        def do_GET(self) -> None:
            if not self._host_ok():
                return
            url = urlsplit(self.path)
            path = unquote(url.path)
            if target.runs is not None and path in ("/", "/index.html"):
                page = render_index(target.runs.rows(), str(target.path))
                self._send(
                    200, "text/html; charset=utf-8", page.encode("utf-8"), page_csp(INDEX_SCRIPTS)
                )
                return
            if target.runs is not None and path == "/runs.json":
                self._send(200, "application/json", _json(target.runs.rows()), FILE_CSP)
                return
            routed = target.route(path)
            if routed is None:
                return self._not_found()
            root, api, rest = routed
            if rest in ("", "index.html"):
                live = target.live(root, api)
                page = render_page(
                    load_run(str(root)), link_base=api + "files/", served=True, live=live
                )
                self._send(200, "text/html; charset=utf-8", page.encode("utf-8"), page_csp())
                return
            if rest == "data":
                since = parse_qs(url.query).get("since", [""])[0]
                mark = stamp(root)
                if since == mark:
                    self._send(204, "application/json", b"", FILE_CSP)
                    return
                live = target.live(root, api) | {"stamp": mark}
                data = page_data(
                    load_run(str(root)), link_base=api + "files/", served=True, live=live
                )
                self._send(200, "application/json", _json(data), FILE_CSP)
                return
            if rest.startswith("full/"):
                text = full_text(root, rest[len("full/") :])
                if text is not None:
                    self._send(200, "text/plain; charset=utf-8", text.encode("utf-8"), FILE_CSP)
                    return
            if rest.startswith("files/"):
                file = _inside(root, rest[len("files/") :])
                if file is not None:
                    mime = IMAGE_TYPES.get(file.suffix.lower(), "text/plain; charset=utf-8")
                    self._send(200, mime, file.read_bytes(), FILE_CSP)
                    return
            self._not_found()

        def do_POST(self) -> None:
            """An answer to an ask, from the run's own page only (see :func:`post_refusal`)."""
            if not self._host_ok():
                return
            routed = target.route(unquote(urlsplit(self.path).path))
            if routed is None or routed[2] != "answer":
                return self._not_found()
            root = routed[0]
            length_field = self.headers.get("Content-Length") or "0"
            length = int(length_field) if length_field.isdigit() else 0
            raw = self.rfile.read(length) if 0 < length <= MAX_POST else b""
            why = post_refusal(
                client=self.client_address[0],
                host=self.headers.get("Host", ""),
                origins=self.headers.get_all("Origin") or [],
                content_type=self.headers.get("Content-Type", ""),
                body=raw,
                token=target.token(root),
            )
            if why:
                return self._send(403, "text/plain; charset=utf-8", why.encode() + b"\n", FILE_CSP)
            try:
                line = answer_ask(root, json.loads(raw))
            except AnswerRefused as exc:
                return self._send(
                    exc.code, "application/json", _json({"error": str(exc)}), FILE_CSP
                )
            print(f"fleet view: {line}", file=sys.stderr)
            self._send(200, "application/json", _json({"told": line}), FILE_CSP)

        def _not_found(self) -> None:
            self._send(404, "text/plain; charset=utf-8", b"not found\n", FILE_CSP)

        def _send(self, code: int, mime: str, body: bytes, csp: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", mime)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Security-Policy", csp)
            for name, value in _SAME_HEADERS.items():
                self.send_header(name, value)
            self.end_headers()
            if body:
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # keep the terminal for the URL line

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    Handler.port = server.server_port
    return server


def post_refusal(
    *, client: str, host: str, origins: list[str], content_type: str, body: bytes, token: str
) -> str:
    """Why an answer may not be taken ("" when it may).

    The page itself is the only sender: from loopback, with an ``Origin`` that is this
    server as the ``Host`` names it (a browser always sends it on a POST, and no page
    can forge it), as JSON (which no HTML form can send, so a cross-site post needs a
    preflight this server never grants), holding the run's token (compared in constant
    time), which only the run's page was given."""
    if client != "127.0.0.1":
        return "answers are taken from 127.0.0.1 only"
    if len(origins) != 1 or origins[0].strip().lower() != "http://" + host.strip().lower():
        return "answers are taken only from the run's own page (Origin)"
    if content_type.split(";")[0].strip().lower() != "application/json":
        return "an answer is JSON (Content-Type: application/json)"
    try:
        given = json.loads(body).get("token", "")
    except (ValueError, AttributeError):
        return "an answer is a JSON object with id, answer, sha256 and token"
    if not isinstance(given, str) or not hmac.compare_digest(
        given.encode("utf-8", "surrogateescape"), token.encode("ascii")
    ):
        return "the answer's token is not this run's"
    return ""


def serve_forever(run_dir: Path, *, port: int, index: bool = False) -> int:
    """Serve until Ctrl-C (the CLI maps the interrupt to exit code 130)."""
    try:
        server = make_server(run_dir, port, index=index)
    except OSError as exc:
        from coordinator.errors import UsageError

        raise UsageError(
            f"cannot listen on 127.0.0.1:{port} ({exc.strerror}); try --port 0."
        ) from None
    bound = server.server_address[1]
    what = f"the runs under {run_dir}" if index else f"run {run_dir.name}"
    print(f"serving {what} on http://127.0.0.1:{bound}/ (Ctrl-C to stop)", file=sys.stderr)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        thread.join()
    finally:
        server.shutdown()
        server.server_close()
    return 0

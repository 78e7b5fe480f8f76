"""``fleet view RUN``: the run's page and its files, served on 127.0.0.1 only.

The page is rendered per request (so a running run shows its latest state on reload)
with links pointing at ``/files/``, which serves files from inside the run directory
only: paths are resolved and must stay under it, so ``..`` cannot reach the host.
"""

from __future__ import annotations

import mimetypes
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from coordinator.traceview.html import render_page
from coordinator.traceview.load import load_run


def make_server(run_dir: Path, port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server for one run, bound to 127.0.0.1 (port 0 picks a free one)."""
    root = run_dir.resolve()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = unquote(urlsplit(self.path).path)
            if path in ("/", "/index.html"):
                body = render_page(load_run(str(root)), link_base="/files/").encode("utf-8")
                self._send(200, "text/html; charset=utf-8", body)
                return
            if path.startswith("/files/"):
                target = (root / path[len("/files/") :]).resolve()
                if target.is_relative_to(root) and target.is_file():
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
        from coordinator.cli import UsageError

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

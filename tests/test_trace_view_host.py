"""``fleet view`` against DNS rebinding and cross-site reads, over raw HTTP: the real
process listens on 127.0.0.1 only, answers only requests whose ``Host`` names it on
loopback with its port, and sends no CORS headers, ``nosniff`` and a CSP that lets
only the page's own script run."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import pytest
import tracegen
from test_trace_html import fleet_view


@pytest.fixture(scope="module")
def view(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The port of a real ``fleet view`` process serving a small run."""
    made = tracegen.make_run(tmp_path_factory.mktemp("runs"), members=2, turns=2, failed=None)
    with fleet_view(made.run_dir) as base:
        yield int(base.rsplit(":", 1)[1].rstrip("/"))


def ask(
    port: int, *hosts: str, path: str = "/", address: str = "127.0.0.1"
) -> tuple[int, dict[str, str], bytes]:
    """GET ``path`` with exactly these ``Host`` lines (none: no Host at all) and a
    cross-site ``Origin``; return the status, the headers (lower-case names) and the body."""
    lines = [f"GET {path} HTTP/1.1", *(f"Host: {h}" for h in hosts),
             "Origin: http://evil.example", "Connection: close", "", ""]  # fmt: skip
    with socket.create_connection((address, port), timeout=10) as sock:
        sock.sendall("\r\n".join(lines).encode("latin-1"))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *fields = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}
    return int(status_line.split()[1]), headers, body


def test_view_answers_only_a_host_naming_itself_on_loopback(view: int) -> None:
    port = view
    hostile = [
        ("evil.com",), (f"evil.com:{port}",), (f"127.0.0.1.evil.com:{port}",),
        ("localhost:1@evil",), (f"localhost:{port}@evil.com",), (f"[::1]:{port}.evil.com",),
        (f"127.0.0.1:{port + 1}",), ("127.0.0.1",), ("localhost",), (f"127.0.0.2:{port}",),
        (f"0.0.0.0:{port}",), (f"127.0.0.1:{port}", "evil.com"), (),
    ]  # fmt: skip
    for hosts in hostile:
        for path in ("/", "/files/members/m01/result.json", "/full/members/m01/trace.jsonl:1"):
            status, headers, body = ask(port, *hosts, path=path)
            assert status in (403, 421), (hosts, path, status)
            assert b"fleet-data" not in body and b"member_start" not in body, (hosts, path)
            assert b"answers only" in body
            assert not [h for h in headers if h.startswith("access-control-")]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"LocalHost:{port}"):
        status, headers, body = ask(port, host)
        assert status == 200 and b'id="fleet-data"' in body, host
        assert headers["content-type"].startswith("text/html")
        assert headers["x-content-type-options"] == "nosniff"
        csp = headers["content-security-policy"]
        script_src = re.search(r"script-src ([^;]*)", csp)
        assert script_src and re.fullmatch(r"'sha256-[A-Za-z0-9+/]+=*'", script_src.group(1)), csp
        assert "frame-ancestors 'none'" in csp
        assert not [h for h in headers if h.startswith("access-control-")]
        status, headers, body = ask(port, host, path="/files/members/m01/result.json")
        assert status == 200 and b'"status"' in body
        assert headers["content-type"].startswith("text/plain")
        assert headers["x-content-type-options"] == "nosniff"
        assert "sandbox" in headers["content-security-policy"]
        assert headers["cross-origin-resource-policy"] == "same-origin"
    # Listening on 127.0.0.1 alone: another loopback address is refused outright.
    with pytest.raises(ConnectionRefusedError):
        ask(port, f"127.0.0.1:{port}", address="127.0.0.2")

"""Answering an ask through ``fleet view``, over raw HTTP against the real process: an
answer is taken only as a POST from the run's own page - loopback, a ``Host`` naming
the server, an ``Origin`` that is the server, JSON, the run's token - and only for
the text the page was shown; every other request leaves the ask pending. The token
is given only to the served page, never written into an exported one."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tracegen
from test_trace_html import fleet_view

from coordinator.oversight.approvals import ApprovalQueue, shown_sha256
from coordinator.traceview import load_run
from coordinator.traceview.html import write_page
from subagents.rules.policy import ApprovalRequest


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[int, ApprovalQueue, str]]:
    """(port, queue, ask id) of a real ``fleet view`` serving a run with one ask pending."""
    made = tracegen.make_run(tmp_path / "runs", members=2, turns=2, failed=None)
    queue = ApprovalQueue(made.run_dir / "approvals")
    rid = queue.request(
        ApprovalRequest(member="m01", call_id="c1", tool="shell",
                        input={"command": "rm -rf build"}, rule="shell:rm *")
    )  # fmt: skip
    with fleet_view(made.run_dir) as base:
        yield int(base.rsplit(":", 1)[1].rstrip("/")), queue, rid


def http(port: int, method: str, path: str, headers: list[tuple[str, str]], body: bytes = b""):  # type: ignore[no-untyped-def]
    """One raw request with exactly ``headers``; (status, body)."""
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers),
             f"Content-Length: {len(body)}", "Connection: close", "", ""]  # fmt: skip
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall("\r\n".join(lines).encode("latin-1") + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest


def page_live(port: int) -> dict[str, Any]:
    """What the served page was given to follow the run and answer its asks."""
    status, body = http(port, "GET", "/", [("Host", f"127.0.0.1:{port}")])
    assert status == 200
    data = re.search(rb'id="fleet-data">(.*?)</script>', body, re.S)
    assert data
    return json.loads(data.group(1))["live"]


def test_an_answer_is_taken_only_from_the_runs_own_page(
    served: tuple[int, ApprovalQueue, str],
) -> None:
    port, queue, rid = served
    live = page_live(port)
    token, (ask,) = live["token"], live["asks"]
    assert len(token) >= 40 and ask["id"] == rid
    assert ask["sha256"] == shown_sha256({"command": "rm -rf build"})
    me = f"127.0.0.1:{port}"
    good = {"id": rid, "answer": "yes", "sha256": ask["sha256"], "token": token}
    headers = [("Host", me), ("Origin", f"http://{me}"), ("Content-Type", "application/json")]

    def post(hdrs: list[tuple[str, str]], body: dict[str, Any] | bytes, path: str = "/answer"):  # type: ignore[no-untyped-def]
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return http(port, "POST", path, hdrs, raw)

    refused = [
        ([("Host", "evil.com"), *headers[1:]], good),
        ([headers[0], ("Origin", "http://evil.example"), headers[2]], good),
        ([headers[0], ("Origin", f"http://127.0.0.1:{port + 1}"), headers[2]], good),
        ([headers[0], ("Origin", "null"), headers[2]], good),
        ([headers[0], headers[2]], good),  # no Origin
        ([*headers[:2], ("Origin", f"http://{me}"), headers[2]], good),  # two
        ([*headers[:2], ("Content-Type", "text/plain")], good),  # what a form can send
        ([*headers[:2], ("Content-Type", "application/x-www-form-urlencoded")], good),
        (headers, good | {"token": token[:-1] + ("A" if token[-1] != "A" else "B")}),
        (headers, {k: v for k, v in good.items() if k != "token"}),
        (headers, good | {"token": 0}),
        (headers, b"not json"),
        (headers, b"[1, 2]"),
    ]
    for hdrs, body in refused:
        status, text = post(hdrs, body)
        assert status == 403, (hdrs, body, status, text)
        assert queue.pending() and queue.answer_of(rid) is None
    # The page's own request, but for another text than the one shown, or no verdict.
    assert post(headers, good | {"sha256": "0" * 64})[0] == 409
    assert post(headers, good | {"answer": "maybe"})[0] == 400
    assert post(headers, good | {"id": "../../etc"})[0] == 409
    assert http(port, "GET", "/answer", [("Host", me)])[0] == 404
    assert queue.answer_of(rid) is None
    status, text = post(headers, good)
    assert status == 200 and b"rm -rf build" in text
    answer = queue.answer_of(rid)
    assert answer and answer["allowed"] and answer["by"] == "fleet view"
    assert answer["sha256"] == ask["sha256"]
    assert post(headers, good)[0] == 409  # answered: the first answer stands


def test_the_written_page_holds_no_token_and_a_new_server_gives_a_new_one(
    tmp_path: Path,
) -> None:
    made = tracegen.make_run(tmp_path / "runs", members=2, turns=2, failed=None)
    out = tmp_path / "page.html"
    write_page(load_run(made.run_dir), out)
    data = re.search(r'id="fleet-data">(.*?)</script>', out.read_text(), re.S)
    assert data and json.loads(data.group(1))["live"] is None
    tokens = set()
    for _ in range(2):
        with fleet_view(made.run_dir) as base:
            tokens.add(page_live(int(base.rsplit(":", 1)[1].rstrip("/")))["token"])
    assert len(tokens) == 2

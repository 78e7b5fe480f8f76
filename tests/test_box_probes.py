"""A box's readiness probes (DevTools of a browser box, the corpus's health) read what
the box answers: the answer is the box's to make. One that never ends, or that claims a
compressed body, costs the host at most ``PROBE_BYTES`` and the probe's time."""

from __future__ import annotations

import gzip
import socket
import threading
import time
from collections.abc import Iterator

import anyio
import pytest

from sandbox.docker.boxops import PROBE_BYTES, probe, probe_client, wait_cdp


class EndlessServer:
    """An HTTP server on 127.0.0.1 that answers every request with ``head`` and then
    ``filler`` for ever; counts what it managed to send."""

    def __init__(self, head: bytes, filler: bytes = b"x" * 65536) -> None:
        self.head, self.filler = head, filler
        self.sent = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(self.head)
                while not self.stop.is_set():
                    conn.sendall(self.filler)
                    self.sent += len(self.filler)
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture
def endless() -> Iterator[list[EndlessServer]]:
    servers: list[EndlessServer] = []
    yield servers
    for server in servers:
        server.close()


def test_an_endless_devtools_answer_is_read_only_up_to_the_bound(endless) -> None:
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n"
        b'{"webSocketDebuggerUrl": "ws://127.0.0.1/devtools/browser/x", "pad": "'
    )
    server = EndlessServer(head)
    endless.append(server)
    started = time.monotonic()
    assert anyio.run(wait_cdp, f"http://127.0.0.1:{server.port}", 20.0) is True
    took = time.monotonic() - started
    assert took < 12, f"{took:.1f} s: read until the probe's whole 20 s, not up to its bound"


def test_a_probe_reads_no_more_than_its_bound_and_does_not_decompress(endless) -> None:
    bomb = gzip.compress(b"\0" * (64 * 2**20))  # 64 MiB of zeros in about 64 KiB
    head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n\r\n" + bomb
    server = EndlessServer(head)
    endless.append(server)

    async def once() -> tuple[int, bytes]:
        async with probe_client() as client:
            return await probe(client, f"http://127.0.0.1:{server.port}/healthz")

    status, body = anyio.run(once)
    assert status == 200
    assert len(body) == PROBE_BYTES
    assert body == (bomb + server.filler)[:PROBE_BYTES]  # as sent, not inflated


def test_a_devtools_answer_without_the_endpoint_is_not_ready(endless) -> None:
    server = EndlessServer(b"HTTP/1.1 200 OK\r\n\r\n")  # 200, then filler that never names it
    endless.append(server)
    started = time.monotonic()
    assert anyio.run(wait_cdp, f"http://127.0.0.1:{server.port}", 1.5) is False
    took = time.monotonic() - started
    assert took < 10, f"{took:.1f} s: kept reading past the probe's 1.5 s"


def test_a_probe_is_plain_http_only() -> None:
    async def once() -> None:
        async with probe_client() as client:
            await probe(client, "https://127.0.0.1:9/")

    with pytest.raises(ValueError, match="plain HTTP"):
        anyio.run(once)

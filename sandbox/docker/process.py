"""A long-lived process in a Docker box (:class:`sandbox.process.BoxProcess`): its own
``docker exec -i``, not the box agent - the agent's stream carries framed requests, and
a server that talks for an hour must not share it with every ``exec``. The exec's
hijacked socket is the process's stdin; Docker's multiplexed frames on it are its
stdout and stderr, split here: stdout is handed over as it arrives, stderr kept as a
tail for the error a caller shows when the process dies.
"""

from __future__ import annotations

import socket
from typing import Any

import anyio

from ..process import BoxProcess, ProcessEnded
from .agent_client import Demuxer


class DockerProcess(BoxProcess):
    """stdin/stdout of one process in a box, over the socket of its ``docker exec``."""

    def __init__(self, sock: Any, name: str) -> None:
        self._keep = sock  # the SDK's wrapper holds the HTTP response open
        self._sock: socket.socket = getattr(sock, "_sock", sock)
        self._sock.setblocking(False)
        self.name = name
        self._demux = Demuxer()
        self._send_lock = anyio.Lock()
        self.ended: ProcessEnded | None = None

    @property
    def stderr_tail(self) -> str:
        return self._demux.stderr.decode("utf-8", "replace")

    async def send(self, data: bytes) -> None:
        """Write to the process's stdin."""
        async with self._send_lock:
            view = memoryview(data)
            while view:
                if self.ended:
                    raise self.ended
                try:
                    view = view[self._sock.send(view) :]
                except BlockingIOError:
                    await anyio.wait_writable(self._sock)
                except OSError as exc:
                    raise self._end(f"cannot write to {self.name} ({exc})") from None

    async def receive(self) -> bytes:
        """The next stdout bytes (never empty); :class:`ProcessEnded` at its end."""
        while True:
            out = self._take_stdout()
            if out:
                return out
            if self.ended:
                raise self.ended
            try:
                data = self._sock.recv(262144)
            except BlockingIOError:
                await anyio.wait_readable(self._sock)
                continue
            except OSError as exc:
                raise self._end(f"cannot read from {self.name} ({exc})") from None
            if not data:
                # Keep what is buffered for the caller; the end is raised after it.
                self.ended = ProcessEnded(f"{self.name} ended", self.stderr_tail)
                self._close_socket()
                continue
            self._demux.feed(data)

    def _take_stdout(self) -> bytes:
        out = bytes(self._demux.stdout)
        self._demux.stdout.clear()
        return out

    def _end(self, message: str) -> ProcessEnded:
        self.ended = ProcessEnded(message, self.stderr_tail)
        self._close_socket()
        return self.ended

    def _close_socket(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass

    async def close(self) -> None:
        """Close stdin and the stream: the process sees end of input (and is killed with
        its box in any case)."""
        if self.ended is None:
            self.ended = ProcessEnded(f"{self.name} was closed", self.stderr_tail)
        self._close_socket()

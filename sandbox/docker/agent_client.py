"""The host side of the in-box agent (:mod:`sandbox.inbox.boxagent`): one framed stream per box.

The Docker backend reaches the agent through the container's stdio, attached before the
box started (its PID 1 runs the agent), or with ``exec_create`` +
``exec_start(socket=True)``, and hands the hijacked socket to :class:`AgentStream`
(:mod:`sandbox.docker.transport` says which when). Docker multiplexes the
process's stdout and stderr on that socket behind 8-byte headers (stream type, three
zero bytes, big-endian length); stdin is written raw. Inside stdout the agent speaks
the frames of :mod:`sandbox.inbox.wire`, each tagged with the request id.

The socket is non-blocking and driven from the event loop (``anyio.wait_readable``):
no thread per box and no thread hop per request, which is what makes an exec round
trip cost about a millisecond. Reading is cancel-safe: bytes go into a buffer that
outlives any one caller, and whichever waiter holds the read lock parses whole frames
and files every response under its id, so concurrent requests share the stream.

Bounds. The agent runs as the box's user, so what arrives on its stdout is the box's
to write: a frame's length prefix is believed only up to :data:`wire.MAX_FRAME` (a
longer one breaks the stream at once, before its bytes are waited for, and the agent
is restarted), so one box makes the host hold at most one frame of that size. A whole
frame that is not a JSON object (:class:`BadFrame`) breaks the stream the same way,
and a one-shot call ends with the reason, never with the parser's own error. A frame
of :data:`THREAD_DECODE_BYTES` or more is decoded on a worker thread, so a large
reply (a file read, a tree downloaded) does not stall the other boxes' requests.
"""

from __future__ import annotations

import io
import itertools
import math
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any, BinaryIO, cast

import anyio

from ..aside import parse_aside
from ..inbox import wire

_DOCKER_HEADER = struct.Struct(">BxxxI")
THREAD_DECODE_BYTES = 1024 * 1024
"""Frames at least this long are decoded off the event loop."""
_PEEK_BYTES = 4096
"""What :meth:`AgentStream.alive` looks at of what waits unread (an idle box's stream
holds nothing, or PID 1's one line)."""


class FrameTooLarge(Exception):
    """A frame's length prefix is past :data:`wire.MAX_FRAME`: the stream is not the agent's."""

    def __init__(self, size: int) -> None:
        super().__init__(
            f"the box agent's stream announced a frame of {size} bytes, over the "
            f"{wire.MAX_FRAME}-byte limit (something in the box wrote on the agent's stdout)"
        )


class BadFrame(Exception):
    """A whole frame whose body is not a JSON object: the stream is not the agent's."""

    def __init__(self, why: str) -> None:
        super().__init__(
            f"the box agent's stream carried a frame that is {why} (something in the box "
            f"wrote on the agent's stdout)"
        )


def decode_reply(body: bytes) -> wire.Reply:
    """A frame's body as a reply; :class:`BadFrame` for anything but a JSON object
    (bytes that are not UTF-8 or not JSON, JSON nested past the parser's depth, a list
    or a number), so what a box writes there never escapes as another error."""
    try:
        reply = wire.decode(body)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise BadFrame(f"not JSON ({type(e).__name__})") from None
    if not isinstance(reply, dict):
        raise BadFrame(f"not a JSON object but {type(reply).__name__}")
    return reply


class StreamBroken(Exception):
    """The agent's stream ended or failed; ``stderr`` holds its last words."""

    def __init__(self, message: str, stderr: str = "") -> None:
        super().__init__(message + (f": {stderr.strip()[-500:]}" if stderr.strip() else ""))
        self.stderr = stderr


def raw_socket(sock: Any) -> socket.socket:
    """The real socket under what ``exec_start(socket=True)`` returns."""
    return getattr(sock, "_sock", sock)


class Demuxer:
    """Splits Docker's multiplexed stream into stdout frames and a stderr tail."""

    def __init__(self) -> None:
        self._raw = bytearray()
        self.stdout = bytearray()
        self.stderr = bytearray()

    def feed(self, data: bytes) -> None:
        self._raw += data
        while len(self._raw) >= 8:
            kind, size = _DOCKER_HEADER.unpack_from(self._raw)
            if len(self._raw) < 8 + size:
                return
            payload = self._raw[8 : 8 + size]
            del self._raw[: 8 + size]
            if kind == 2:
                self.stderr += payload
                del self.stderr[:-4096]
            else:
                self.stdout += payload

    def stderr_ahead(self, data: bytes) -> bytes:
        """What of stderr ``data`` (bytes not fed yet, after those buffered) holds, without
        consuming anything: a command's output on stdout is never read as stderr."""
        raw, out, at = bytes(self._raw) + data, bytearray(), 0
        while len(raw) - at >= 8:
            kind, size = _DOCKER_HEADER.unpack_from(raw, at)
            if kind == 2:
                out += raw[at + 8 : at + 8 + size]
            at += 8 + size
        return bytes(out)

    def frame_size(self) -> int | None:
        """The next frame's body length once it is all there (else None);
        :class:`FrameTooLarge` as soon as a length prefix says it could never be."""
        head = wire.HEADER.size
        if len(self.stdout) < head:
            return None
        (size,) = wire.HEADER.unpack_from(self.stdout)
        if size > wire.MAX_FRAME:
            raise FrameTooLarge(size)
        return size if len(self.stdout) >= head + size else None

    def next_body(self) -> bytes | None:
        """The next whole frame's body, taken out of the buffer (None: not all there)."""
        size = self.frame_size()
        if size is None:
            return None
        head = wire.HEADER.size
        body = bytes(self.stdout[head : head + size])
        del self.stdout[: head + size]
        return body

    def next_frame(self) -> wire.Reply | None:
        """The next whole frame as a reply (None: not all there); :class:`BadFrame`."""
        body = self.next_body()
        return None if body is None else decode_reply(body)


class AgentStream:
    """Requests and responses over one long-lived agent process."""

    def __init__(self, sock: Any) -> None:
        self._keep = sock  # holds the SDK's wrapper (and its response) alive
        self._sock = raw_socket(sock)
        self._sock.setblocking(False)
        self._demux = Demuxer()
        self._ids = itertools.count(1)
        self._done: dict[int, wire.Reply] = {}
        self._waiting: set[int] = set()
        # fast_acquire: taking a free lock does not pass through the event loop (the
        # default yields on every acquire: two trips a request, bench/README.md).
        self._read_lock = anyio.Lock(fast_acquire=True)
        self._send_lock = anyio.Lock(fast_acquire=True)
        self.broken: StreamBroken | None = None

    def new_id(self) -> int:
        return next(self._ids)

    async def request(
        self,
        msg: wire.Request,
        rid: int | None = None,
        *,
        watch: Callable[[], Awaitable[None]] | None = None,
        every: float = 5.0,
    ) -> wire.Reply:
        """Send one request and wait for its response; :class:`StreamBroken` on failure.

        ``watch`` is awaited every ``every`` seconds while the response is outstanding:
        a frozen (paused) box keeps the stream open and silent, so only a look from the
        outside can end the wait; ``watch`` ends it by raising.
        """
        rid = rid if rid is not None else self.new_id()
        self._waiting.add(rid)
        try:
            await self._send(wire.encode({**msg, "id": rid}))
            while rid not in self._done:
                with anyio.move_on_after(every if watch else math.inf) as scope:
                    async with self._read_lock:
                        if rid in self._done:
                            break
                        await self._read_some()
                if scope.cancelled_caught and watch is not None:
                    await watch()
            return self._done.pop(rid)
        finally:
            self._waiting.discard(rid)
            self._done.pop(rid, None)

    async def kill(self, target: int) -> None:
        """Best effort: have the agent kill the process group of request ``target``."""
        try:
            kill: wire.KillRequest = {"op": wire.KILL, "target": target, "id": self.new_id()}
            await self._send(wire.encode(kill))
        except StreamBroken:
            pass

    async def _send(self, data: bytes) -> None:
        if self.broken:
            raise self.broken
        async with self._send_lock:
            view = memoryview(data)
            while view:
                try:
                    sent = self._sock.send(view)
                except BlockingIOError:
                    await anyio.wait_writable(self._sock)
                    continue
                except OSError as e:
                    raise self._break(f"cannot write to the box agent ({e})") from None
                view = view[sent:]

    async def _read_some(self) -> None:
        if self.broken:
            raise self.broken
        while True:
            try:
                data = self._sock.recv(262144)
            except BlockingIOError:
                await anyio.wait_readable(self._sock)
                continue
            except OSError as e:
                raise self._break(f"cannot read from the box agent ({e})") from None
            break
        if not data:
            raise self._break("the box agent's stream ended")
        self._demux.feed(data)
        while True:
            try:
                body = self._demux.next_body()
            except FrameTooLarge as e:
                raise self._break(str(e)) from None
            if body is None:
                if wire.AGENT_ENDED in self._demux.stderr:  # its box's PID 1 says so
                    raise self._break("the box agent ended")
                return
            try:
                frame = await parse_aside(decode_reply, body, THREAD_DECODE_BYTES)
            except BadFrame as e:
                raise self._break(str(e)) from None
            rid = frame.get("id")
            if type(rid) is int and rid in self._waiting:
                self._done[rid] = frame

    def alive(self) -> bool:
        """Cheap, non-blocking: False once the stream has ended (the box or agent died),
        or once the box's PID 1 has said that the agent ended (an attached stream stays
        open after its agent: :data:`wire.AGENT_ENDED`, waiting unread on the socket)."""
        if self.broken:
            return False
        if wire.AGENT_ENDED in self._demux.stderr:
            return False
        try:
            waiting = self._sock.recv(_PEEK_BYTES, socket.MSG_PEEK)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return waiting != b"" and wire.AGENT_ENDED not in self._demux.stderr_ahead(waiting)

    def _break(self, message: str) -> StreamBroken:
        self.broken = StreamBroken(message, self._demux.stderr.decode("utf-8", "replace"))
        self.close()
        return self.broken

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass


class SocketWriter(io.RawIOBase):
    """A blocking socket as a writable file, for a body written straight onto it."""

    def __init__(self, raw: socket.socket) -> None:
        self._raw = raw

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._raw.sendall(data)
        return len(data)


def one_shot(
    sock: Any,
    msg: wire.Request,
    *,
    timeout: float | None,
    body: Callable[[BinaryIO], None] | None = None,
) -> tuple[wire.Reply | None, str]:
    """Blocking: send one request to an agent started with ``--once``; (response, stderr).

    ``body``, when given, writes the request's payload as raw bytes after it (the
    agent reads them from its stdin up to the end): how a large upload streams in.
    ``timeout`` bounds each send and receive, so a box that stops reading ends it.
    Reading stops once the reply's frame is whole or could no longer be a frame (its
    prefix past :data:`wire.MAX_FRAME`): whatever else the box writes is not held.
    """
    raw = raw_socket(sock)
    raw.settimeout(timeout)
    demux = Demuxer()
    try:
        raw.sendall(wire.encode({**msg, "id": 1}))
        if body is not None:
            with io.BufferedWriter(SocketWriter(raw), buffer_size=1 << 20) as out:
                body(cast(BinaryIO, out))
                out.flush()
        raw.shutdown(socket.SHUT_WR)
        while True:
            data = raw.recv(262144)
            if not data:
                break
            demux.feed(data)
            if demux.frame_size() is not None:
                break
    except FrameTooLarge as e:
        return None, str(e)
    finally:
        raw.close()
    try:
        reply = demux.next_frame()
    except BadFrame as e:
        return None, str(e)
    if reply is not None and reply.get("id") != 1:
        return None, f"the box agent answered request 1 with id {str(reply.get('id'))[:40]!r}"
    return reply, demux.stderr.decode("utf-8", "replace")

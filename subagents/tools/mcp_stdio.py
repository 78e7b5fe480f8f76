"""An MCP server's stdio inside a box as the SDK's message streams, read with a bound.

The stdio transport frames one JSON-RPC message per line. The bytes come from a
process in the member's box, so a line may be anything the box writes, as long as it
likes: a member with ``shell`` can write a 200 MB line into its own server's stdout.
So the reader here holds at most :data:`MAX_MESSAGE_BYTES` of an unfinished line
(:class:`LineSplitter`), looks for the end of a line only in the bytes just received
(no re-scan of what is held: linear, not quadratic, in the line's length), and gives
the event loop a turn after every chunk. A line past the bound ends the server: its
stream is closed, the box stops being read, and ``on_fail`` gets the reason, which
the server's calls then answer with. Messages past :data:`THREAD_PARSE_BYTES` are
parsed on a worker thread, so a large but legal message does not stall the members
that share the loop.

Why 8 MiB: the largest legitimate message is a tool result carrying an image, and
the Messages API takes images up to 5 MB (about 6.7 MB as base64); anything a model
reads as text is clipped far below that by the context manager. The bound is what
one server may make the coordinator hold, whatever it writes.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.lowlevel

from sandbox.aside import parse_aside
from sandbox.process import BoxProcess, ProcessEnded

MAX_MESSAGE_BYTES = 8 * 1024 * 1024
"""The longest line (one JSON-RPC message) a stdio server may write."""
THREAD_PARSE_BYTES = 256 * 1024
"""Messages at least this long are parsed off the event loop."""


class MessageTooLarge(Exception):
    """A line went past the bound before it ended; ``size``: bytes seen of it so far."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"a message of more than {limit} bytes")
        self.size, self.limit = size, limit


class LineSplitter:
    """Whole lines out of a byte stream, holding at most ``limit`` bytes of an open one."""

    def __init__(self, limit: int = MAX_MESSAGE_BYTES) -> None:
        self.limit = limit
        self._parts: list[bytes] = []
        self._held = 0

    def feed(self, data: bytes) -> list[bytes]:
        """The lines ``data`` completes (without their newline); raises
        :class:`MessageTooLarge` as soon as an unfinished line passes the limit."""
        lines: list[bytes] = []
        start = 0
        while (end := data.find(b"\n", start)) != -1:
            line = data[start:end]
            if self._parts:
                line = b"".join([*self._parts, line])
                self._parts.clear()
                self._held = 0
            if len(line) > self.limit:
                raise MessageTooLarge(len(line), self.limit)
            lines.append(line)
            start = end + 1
        if start < len(data):
            self._held += len(data) - start
            if self._held > self.limit:
                raise MessageTooLarge(self._held, self.limit)
            self._parts.append(data[start:])
        return lines


def too_large_reason(name: str, exc: MessageTooLarge) -> str:
    return (
        f"MCP server {name!r} wrote a message of more than {exc.limit // (1024 * 1024)} MiB "
        f"({exc.limit} bytes) on its stdout, so it was stopped and its tools fail from now "
        "on; a server must keep each JSON-RPC message (one line) under that size"
    )


@contextlib.asynccontextmanager
async def box_streams(
    process: BoxProcess, name: str, on_fail: Callable[[str], None]
) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's read and write streams over a box process's stdout and stdin."""
    from mcp import types
    from mcp.shared.message import SessionMessage

    read_in, read_out = anyio.create_memory_object_stream[Any](16)
    write_in, write_out = anyio.create_memory_object_stream[Any](16)

    def parse(line: bytes) -> Any:
        return types.jsonrpc_message_adapter.validate_json(line, by_name=False)

    async def deliver(line: bytes) -> None:
        try:
            msg = await parse_aside(parse, line, THREAD_PARSE_BYTES)
        except ValueError as exc:
            await read_in.send(exc)
            return
        await read_in.send(SessionMessage(msg))

    async def reader() -> None:
        lines = LineSplitter()
        async with read_in:
            try:
                while True:
                    for line in lines.feed(await process.receive()):
                        if line.strip():
                            await deliver(line)
                    # receive() returns without waiting while bytes are there: a server
                    # writing as fast as it can must not keep the loop to itself.
                    await anyio.lowlevel.checkpoint()
            except MessageTooLarge as exc:
                on_fail(too_large_reason(name, exc))
                await process.close()
            except (ProcessEnded, anyio.ClosedResourceError, anyio.BrokenResourceError):
                return

    async def writer() -> None:
        async with write_out:
            async for item in write_out:
                data = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                try:
                    await process.send(data.encode() + b"\n")
                except ProcessEnded:
                    return

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(writer)
        try:
            yield read_out, write_in
        finally:
            tg.cancel_scope.cancel()
            await process.close()

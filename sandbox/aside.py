"""Reading what a box (or a server in one) sent without stalling the event loop.

A frame or a line from a box is hostile and may be large (up to the frame limit of
:mod:`sandbox.docker.agent_client`, a whole MCP message of :mod:`subagents.tools.mcp_stdio`):
parsing one of many megabytes in the event loop would hold up every other box's
requests for that long, while a thread hop for each small one would cost more than the
parse. So a reader parses what is at least its threshold on a worker thread, the rest
where it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio

T = TypeVar("T")


async def parse_aside(parse: Callable[[bytes], T], data: bytes, at_least: int) -> T:
    """``parse(data)``, on a worker thread when ``data`` is ``at_least`` bytes or more."""
    if len(data) >= at_least:
        return await anyio.to_thread.run_sync(parse, data)
    return parse(data)

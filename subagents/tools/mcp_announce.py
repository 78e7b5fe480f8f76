"""What an MCP server may announce as tools: names the API takes, and a bounded amount.

A server's ``tools/list`` answer is the server's word, and the server is not trusted:
it may be a program the member itself rewrote. Each announced tool becomes part of
every model request of the member, so the answer is checked before any of it is
offered:

* the full name ``mcp__<server>__<tool>`` must match the Messages API's
  ``^[a-zA-Z0-9_-]{1,64}$``; a tool whose name does not is skipped (the API would
  refuse the whole request, ending the member on a name it never chose);
* a tool whose input schema is past :data:`MAX_SCHEMA_BYTES` of JSON, or is not a
  JSON object, is skipped; its description is cut at :data:`MAX_DESCRIPTION_CHARS`;
* past :data:`MAX_TOOLS`, the rest of the server's tools are skipped;
* a name announced twice is :class:`AnnouncementRefused`: which of the two the model
  would get is the server's choice to make, not ours, so the server does not start.

Skipping rather than refusing the server: one unusable tool should not take the
others with it, and each skip has its reason, which the member's trace records.
"""

from __future__ import annotations

import json
import re
from typing import Any

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""A tool name the Messages API accepts."""
MAX_TOOLS = 128
"""Most tools one server may offer (deferred behind tool_search past ten)."""
MAX_SCHEMA_BYTES = 16 * 1024
"""Largest input schema of one tool, as compact JSON."""
MAX_DESCRIPTION_CHARS = 2000
"""Longest description of one tool the model is shown (the rest is cut)."""


class AnnouncementRefused(Exception):
    """The server's tool list cannot be offered at all (a name twice)."""


def full_name(server: str, tool: str) -> str:
    return f"mcp__{server}__{tool}"


def _shown(name: str) -> str:
    return repr(name if len(name) <= 80 else name[:77] + "...")


def vet_tools(server: str, listed: list[Any]) -> tuple[list[Any], list[str]]:
    """The announced tools that may be offered, in order, and why each other one is not."""
    kept: list[Any] = []
    skipped: list[str] = []
    seen: set[str] = set()
    for i, tool in enumerate(listed):
        if len(kept) == MAX_TOOLS:
            skipped.append(
                f"MCP server {server!r}: {len(listed) - i} tool(s) from {_shown(str(tool.name))} "
                f"on are not offered: the server announces more than {MAX_TOOLS} tools"
            )
            break
        name = str(tool.name)
        if name in seen:
            raise AnnouncementRefused(
                f"MCP server {server!r} announces the tool {_shown(name)} twice; a server's "
                "tool names must be unique"
            )
        seen.add(name)
        why = _refusal(server, name, tool)
        if why is None:
            kept.append(tool)
        else:
            skipped.append(f"MCP server {server!r}: tool {_shown(name)} is not offered: {why}")
    return kept, skipped


def _refusal(server: str, name: str, tool: Any) -> str | None:
    if not TOOL_NAME.match(full_name(server, name)):
        return (
            f"its full name {_shown(full_name(server, name))} must match "
            f"{TOOL_NAME.pattern} (letters, digits, '_' and '-', at most 64 characters "
            "with the prefix)"
        )
    schema = tool.input_schema
    if schema is not None and not isinstance(schema, dict):
        return "its input schema is not a JSON object"
    size = len(json.dumps(schema or {}, separators=(",", ":"), default=str))
    if size > MAX_SCHEMA_BYTES:
        return f"its input schema is {size} bytes of JSON, over the {MAX_SCHEMA_BYTES}-byte limit"
    return None

"""Reading a fake Messages API request as a scripted policy does: how far the member got."""

from __future__ import annotations

from typing import Any


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every ``tool_result`` block of the request's messages, in order."""
    return [
        b
        for m in body.get("messages") or []
        if isinstance(m.get("content"), list)
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]

"""The one local token estimate: about 4 characters a token.

Every place that needs a token count before the API has given one - the context
budget (:mod:`subagents.context.tokens`, which anchors it to the API's usage), a
member's result cap, the offline models' usage, the deferred tools' size, the rate
governor's and the budget's reservations, the fake Messages API's usage - counts with
these functions, so they agree with each other. About 4 characters per token is the
ratio the Messages API shows for English prose and code; images count as a flat 1,600
tokens.
"""

from __future__ import annotations

import json
from typing import Any

CHARS_PER_TOKEN = 4
IMAGE_TOKENS = 1_600
MESSAGE_OVERHEAD = 4
"""Role markers and block framing, per message."""


def estimate_text(text: str) -> int:
    """Local estimate of the tokens of a piece of text."""
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def estimate_block(block: Any) -> int:
    """Local estimate of one content block (text, tool_use, tool_result, image)."""
    if isinstance(block, str):
        return estimate_text(block)
    kind = block.get("type")
    if kind == "text":
        return estimate_text(block.get("text", ""))
    if kind == "tool_use":
        return 8 + estimate_text(json.dumps(block.get("input", {}), ensure_ascii=False))
    if kind == "tool_result":
        content = block.get("content", "")
        if isinstance(content, str):
            return 8 + estimate_text(content)
        return 8 + sum(estimate_block(b) for b in content)
    if kind == "image":
        return IMAGE_TOKENS
    # thinking, compaction and other blocks: size of their JSON form.
    return estimate_text(json.dumps(block, ensure_ascii=False, default=str))


def estimate_message(message: dict[str, Any]) -> int:
    """Local estimate of one ``MessageParam``."""
    content = message.get("content", "")
    if isinstance(content, str):
        return MESSAGE_OVERHEAD + estimate_text(content)
    return MESSAGE_OVERHEAD + sum(estimate_block(b) for b in content)


def estimate_json(value: Any) -> int:
    """Local estimate of a value as compact JSON (a string as it is)."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return estimate_text(text)


def estimate_bytes(size: int) -> int:
    """Tokens of ``size`` bytes of a request's JSON, in whole tokens (rounded down),
    and at least one: what a reservation is made for before the call."""
    return max(1, size // CHARS_PER_TOKEN)

"""Token accounting: the API's usage as ground truth, a local estimate for new content.

The loop asks for the context size every turn, so this must be cheap at 200 turns.
Two ideas keep it cheap and honest:

- Each message's estimate is cached by identity (plus its block count, which
  catches blocks appended in place). The mechanisms that rewrite a message call
  :meth:`TokenCounter.forget`, so the cache never serves a stale size.
- The sum over the messages is kept too, as a running prefix total: the list
  only grows at its end between rewrites, so each call adds the messages appended
  since the last one instead of walking the whole conversation (constant work
  per turn, however long the run). ``forget`` and ``reset`` drop the prefix; so
  does a list whose message at the prefix's end is another object or has other
  blocks now.
- After every model call the API reports exactly how many input tokens the sent
  context had. That number anchors the next estimate: the size of the context is
  the anchored prefix (exact) plus the local estimate of the messages appended
  since. When the prefix is rewritten (offload, clip, compaction) the anchor is
  dropped, and the full local estimate is scaled by the ratio last observed
  between the API's count and ours, so a tokenizer that counts differently from
  our rule of thumb is corrected on the next turn.

The local rule is about 4 characters per token (the ratio the Messages API shows
for English prose and code); images count as a flat 1,600 tokens.
"""

from __future__ import annotations

import json
from typing import Any

# The estimate itself is the model seam's (one rule for every count before the API's).
from ..model.tokens import (
    CHARS_PER_TOKEN,
    IMAGE_TOKENS,
    MESSAGE_OVERHEAD,
    estimate_block,
    estimate_message,
    estimate_text,
)

__all__ = [
    "CHARS_PER_TOKEN",
    "IMAGE_TOKENS",
    "MESSAGE_OVERHEAD",
    "TokenCounter",
    "estimate_block",
    "estimate_message",
    "estimate_text",
    "usage_input_total",
]


def usage_input_total(usage: Any) -> int:
    """All input tokens of a call: uncached + cache read + cache write."""

    def get(name: str) -> int:
        value = usage.get(name) if isinstance(usage, dict) else getattr(usage, name, None)
        return int(value or 0)

    return get("input_tokens") + get("cache_read_input_tokens") + get("cache_creation_input_tokens")


class TokenCounter:
    """Incremental context size: cached per-message estimates plus the API anchor."""

    def __init__(self) -> None:
        # id(message) -> (message, block count, tokens). Holding the message keeps its
        # id from being reused by another object while the entry exists.
        self._cache: dict[int, tuple[dict[str, Any], int, int]] = {}
        self._fixed: dict[tuple[int, int], tuple[Any, int]] = {}
        self._prefix: tuple[int, dict[str, Any], int, int] | None = None
        """(length, its last message, that message's block count, sum of estimates)."""
        self._anchor: tuple[int, int, int] | None = None
        """(number of messages sent, id of the last one, API input tokens)."""
        self.ratio = 1.0
        """API count / local estimate of the last observed call (clamped)."""

    def message(self, message: dict[str, Any]) -> int:
        """Estimate of one message, from the cache when it has not changed."""
        content = message.get("content")
        blocks = len(content) if isinstance(content, list) else -1
        hit = self._cache.get(id(message))
        if hit is not None and hit[0] is message and hit[1] == blocks:
            return hit[2]
        tokens = estimate_message(message)
        self._cache[id(message)] = (message, blocks, tokens)
        return tokens

    def forget(self, message: dict[str, Any]) -> None:
        """A message was rewritten in place: drop its cached size, the anchor and the
        running total (the message may lie anywhere in it)."""
        self._cache.pop(id(message), None)
        self._anchor = None
        self._prefix = None

    def reset(self) -> None:
        """The context was replaced (compaction): forget everything about the old one."""
        self._cache.clear()
        self._anchor = None
        self._prefix = None

    def fixed(self, system: Any, tools: list[dict[str, Any]]) -> int:
        """Estimate of the system prompt and tool definitions (cached by identity)."""
        key = (id(system), id(tools))
        hit = self._fixed.get(key)
        if hit is not None and hit[0] == (system, len(tools)):
            return hit[1]
        text = system if isinstance(system, str) else json.dumps(system, default=str)
        tokens = estimate_text(text) + sum(
            estimate_text(json.dumps(t, ensure_ascii=False)) for t in tools
        )
        if len(self._fixed) > 8:
            self._fixed.clear()
        self._fixed[key] = ((system, len(tools)), tokens)
        return tokens

    def local(self, messages: list[dict[str, Any]], system: Any, tools: list[dict]) -> int:
        """Pure local estimate, unscaled."""
        return self.fixed(system, tools) + self.messages_total(messages)

    def messages_total(self, messages: list[dict[str, Any]]) -> int:
        """Sum of the messages' estimates: the running prefix plus what came after it."""
        start = total = 0
        prefix = self._prefix
        if prefix is not None:
            n, last, blocks, subtotal = prefix
            if len(messages) >= n and messages[n - 1] is last and _blocks(last) == blocks:
                start, total = n, subtotal
        for m in messages[start:]:
            total += self.message(m)
        if messages:
            self._prefix = (len(messages), messages[-1], _blocks(messages[-1]), total)
        return total

    def observe(
        self, usage: Any, sent: list[dict[str, Any]], system: Any, tools: list[dict]
    ) -> int:
        """Record the API's count for the context just sent; returns that count."""
        actual = usage_input_total(usage)
        if actual <= 0 or not sent:
            return actual
        local = self.local(sent, system, tools)
        if local > 0:
            self.ratio = min(2.0, max(0.5, actual / local))
        self._anchor = (len(sent), id(sent[-1]), actual)
        return actual

    def count(self, messages: list[dict[str, Any]], system: Any, tools: list[dict]) -> int:
        """Tokens of this context: anchored prefix + estimate of what came after."""
        anchor = self._anchor
        if anchor is not None:
            n, last_id, actual = anchor
            if len(messages) >= n and id(messages[n - 1]) == last_id:
                return actual + sum(self.message(m) for m in messages[n:])
        return int(self.local(messages, system, tools) * self.ratio)


def _blocks(message: dict[str, Any]) -> int:
    content = message.get("content")
    return len(content) if isinstance(content, list) else -1

"""Usage accounting for the fake server: a token estimate and a simulated prompt cache.

Tokens are estimated as characters / 4 of each block's JSON (the same rule of
thumb the harness uses locally), so tests can predict them. The prompt is a
sequence of blocks in the API's cache order (tools, system, messages); a
``cache_control`` block marks a breakpoint. Like the real cache, a request reads
the longest cached prefix that ends at one of its blocks up to 20 blocks before a
breakpoint (that lookback is what makes a moving "latest turn" breakpoint hit the
previous turn's entry), then writes every breakpoint prefix past that point.
Prefixes shorter than ``min_tokens`` are never cached, as in the real API.
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any

from subagents.model.tokens import estimate_json

LOOKBACK_BLOCKS = 20


estimate_tokens = estimate_json
"""Characters / 4 (rounded up) of a string, or of the compact JSON of anything else."""


def prompt_blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's blocks in cache order; string contents become one text block."""
    blocks: list[dict[str, Any]] = [dict(t) for t in body.get("tools") or []]
    system = body.get("system")
    if isinstance(system, str) and system:
        blocks.append({"type": "text", "text": system})
    elif isinstance(system, list):
        blocks += system
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        for block in content or []:
            blocks.append({"role": message.get("role"), **block})
    return blocks


def _strip(block: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k != "cache_control"}


class PromptCache:
    """Thread-safe prefix cache keyed by a hash chain over the model and blocks."""

    def __init__(self, *, min_tokens: int = 1024) -> None:
        self.min_tokens = min_tokens
        self._entries: set[str] = set()
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def account(self, body: dict[str, Any], *, write: bool = True) -> dict[str, int]:
        """``input_tokens``, ``cache_read_input_tokens``, ``cache_creation_input_tokens``."""
        blocks = prompt_blocks(body)
        chain: list[str] = []
        cumulative: list[int] = []
        digest = hashlib.sha256(str(body.get("model")).encode()).hexdigest()
        total = 0
        for block in blocks:
            clean = _strip(block)
            digest = hashlib.sha256(
                (digest + json.dumps(clean, sort_keys=True)).encode()
            ).hexdigest()
            total += estimate_tokens(clean)
            chain.append(digest)
            cumulative.append(total)
        points = [i for i, b in enumerate(blocks) if b.get("cache_control")]
        with self._lock:
            hit = self._longest_hit(chain, points)
            read = cumulative[hit] if hit >= 0 else 0
            created_to = read
            for p in points:
                if p > hit and cumulative[p] >= self.min_tokens:
                    if write:
                        self._entries.add(chain[p])
                    created_to = max(created_to, cumulative[p])
        return {
            "input_tokens": total - created_to,
            "cache_read_input_tokens": read,
            "cache_creation_input_tokens": created_to - read,
        }

    def _longest_hit(self, chain: list[str], points: list[int]) -> int:
        best = -1
        for p in points:
            for i in range(p, max(-1, p - LOOKBACK_BLOCKS - 1), -1):
                if i <= best:
                    break
                if chain[i] in self._entries:
                    best = i
                    break
        return best

"""Aging: results the model has moved past shrink, in batches, so fewer tokens are re-sent.

Every turn re-sends the whole conversation. A result the model read several tool
calls ago is still re-sent in full each turn: 60 results of 15,000 tokens (just
under the offload line) made a member send 6M input tokens. Aging shrinks what the
model has moved past - results older than the ``keep_recent_results`` newest:

- an inline result of at least ``old_result_min_tokens`` is offloaded like a large
  one (saved where the member can read it back) and becomes a pointer *without* a
  preview: the model has read all of it, the path and size are what it needs now;
  this waits until the context is past ``age_from_fraction`` of the budget, so a
  small context keeps what the model read;
- a pointer that still shows its 10-line preview (an offload on arrival) loses the
  preview, at any size: the preview was for deciding what to read, and that was
  decided when the pointer was new.

Batches, not a trickle: rewriting an old block makes the prompt cache miss from that
block on, so aging acts only when what it frees is at least ``age_fraction`` of the
context (the same reason as the API's ``clear_at_least``): the rewrite is paid back
within a few turns of smaller requests, and most turns remain pure appends whose
history is a cache read. The model adapter also puts a cache breakpoint just before
the first rewritten block, so the history before it is still read from the cache.

Tracking is incremental: new messages are scanned once, and what the candidates
would free is a running sum, so a turn without aging costs a few list operations.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..model.wire import replace_block
from ..trace import Clip, Offload, TraceWriter
from .offload import OFFLOAD_MARK, Offloader, result_text, tool_names
from .tokens import estimate_text

POINTER_HEAD_TOKENS = 60
"""About what a pointer without its preview costs (mark, size, path, how to read)."""
_PREVIEW = re.compile(r"\nFirst \d+ lines:\n")


def without_preview(pointer: str) -> str | None:
    """The pointer without its preview lines, or None if it has none."""
    if not pointer.startswith(OFFLOAD_MARK):
        return None
    found = _PREVIEW.search(pointer)
    return pointer[: found.start()] if found else None


@dataclass
class Candidate:
    """One result the model has moved past, and what aging it would free."""

    index: int
    """Its message's index in the conversation."""
    call_id: str
    tokens: int
    """Tokens it frees (its size minus a pointer's, or its preview's)."""
    inline: bool
    """Whole content inline (offloaded when aged), else a pointer with a preview."""


@dataclass
class AgingTracker:
    """Results seen so far, and which of them aging would shrink; see the module doc."""

    keep_recent: int
    min_tokens: int
    scanned: int = 0
    """Messages scanned (the conversation only grows at its end between resets)."""
    results: list[tuple[int, str]] = field(default_factory=list)
    """(message index, tool_use_id) of every tool result seen, oldest first."""
    judged: int = 0
    """Results that left the recent window and were judged (counted in ``pending``)."""
    pending: list[Candidate] = field(default_factory=list)
    deferred: list[tuple[int, str]] = field(default_factory=list)
    """Inline results too early to age (context under ``age_from``): judged again later."""

    def reset(self) -> None:
        """The conversation was rewritten (compaction, offload, clip): rescan it."""
        self.scanned, self.judged = 0, 0
        self.results, self.pending, self.deferred = [], [], []

    def update(self, messages: list[dict[str, Any]], *, inline_allowed: bool) -> int:
        """Scan what is new and judge results that left the recent window; returns the
        tokens aging would free now."""
        if len(messages) < self.scanned:
            self.reset()
        for index in range(self.scanned, len(messages)):
            message = messages[index]
            content = message.get("content")
            if message.get("role") != "user" or not isinstance(content, list):
                continue
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    self.results.append((index, block.get("tool_use_id", "")))
        self.scanned = len(messages)
        leaving = self.results[self.judged : max(self.judged, len(self.results) - self.keep_recent)]
        self.judged += len(leaving)
        if inline_allowed:
            leaving, self.deferred = [*self.deferred, *leaving], []
        for index, call_id in leaving:
            candidate = self._judge(messages, index, call_id, inline_allowed)
            if candidate is not None:
                self.pending.append(candidate)
        return sum(c.tokens for c in self.pending)

    def _judge(
        self, messages: list[dict[str, Any]], index: int, call_id: str, inline_allowed: bool
    ) -> Candidate | None:
        block = find_result(messages[index], call_id)
        text = result_text(block) if block is not None else None
        if text is None:
            return None
        shorter = without_preview(text)
        if shorter is not None:
            return Candidate(index, call_id, estimate_text(text) - estimate_text(shorter), False)
        size = estimate_text(text)
        if text.startswith(OFFLOAD_MARK) or size < self.min_tokens:
            return None
        if not inline_allowed:
            self.deferred.append((index, call_id))
            return None
        return Candidate(index, call_id, size - POINTER_HEAD_TOKENS, True)

    def take(self) -> list[Candidate]:
        """The candidates, to be aged now (oldest first); the tracker starts over."""
        taken, self.pending = self.pending, []
        return taken


def find_result(message: dict[str, Any], call_id: str) -> dict[str, Any] | None:
    """The tool_result block answering ``call_id`` in ``message``."""
    for block in message.get("content") or []:
        if (
            isinstance(block, dict)
            and block.get("type") == "tool_result"
            and block.get("tool_use_id") == call_id
        ):
            return block
    return None


async def shrink(
    messages: list[dict[str, Any]],
    candidates: list[Candidate],
    *,
    offloader: Offloader,
    trace: TraceWriter,
    forget: Callable[[dict[str, Any]], None],
    turn: int,
) -> tuple[int, int]:
    """Age ``candidates`` (replacing their messages); returns (results aged, of which
    offloaded). ``forget`` is told each message replaced (the token counter's)."""
    names: dict[str, str] | None = None
    dropped: list[str] = []
    aged = offloaded = saved_tokens = 0
    for candidate in candidates:
        block = find_result(messages[candidate.index], candidate.call_id)
        text = result_text(block) if block is not None else None
        if block is None or text is None:
            continue
        if candidate.inline:
            names = names or tool_names(messages)
            tool = names.get(candidate.call_id, "tool")
            pointer, saved, size = await offloader.offload(
                candidate.call_id, tool, text, preview=False
            )
            offloaded += 1
            trace.emit(
                Offload(
                    call_id=candidate.call_id,
                    path=saved.for_model,
                    tokens=size,
                    reason="aged",
                    turn=turn,
                )
            )
        else:
            pointer = without_preview(text) or text
            dropped.append(candidate.call_id)
            saved_tokens += candidate.tokens
        forget(messages[candidate.index])
        replace_block(messages, candidate.index, block, {**block, "content": pointer})
        aged += 1
    if dropped:  # previews cut from pointers: a clip of the pointer, no file written
        trace.emit(Clip(call_ids=dropped, tokens_saved=saved_tokens, turn=turn))
    return aged, offloaded

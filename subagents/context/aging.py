"""Aging: results the model has moved past shrink, so fewer tokens are re-sent.

Every turn re-sends the whole conversation. A result the model read several tool
calls ago is still re-sent in full each turn: 60 results of 15,000 tokens (just
under the offload line) made a member send 6M input tokens. Aging shrinks what the
model has moved past - results outside the *recent window*:

- the recent window is the newest results: at most ``keep_recent_results`` of them,
  and, beyond the newest, only while they total at most ``keep_recent_tokens``;
  results of the message about to be sent are always in it (the model has not seen
  them yet). By count alone, three 15,000-token pages stayed whole, so each page
  was sent at least three times in full (2.7M of a 60-page member's input tokens,
  whatever else was done); by tokens, a page the model has read once and acted on
  (it made its next call after it) is re-sent as its pointer, while small results -
  a coding member's command outputs - keep the three newest as before;
- an inline result of at least ``old_result_min_tokens`` that leaves the window is
  offloaded like a large one (saved where the member can read it back) and becomes
  a pointer *without* a preview: the model has read all of it, the path and size are
  what it needs now; this waits until the context is past ``age_from_fraction`` of
  the budget, so a small context keeps what the model read;
- a pointer that still shows its 10-line preview (an offload on arrival) loses the
  preview once it leaves the window, at any size: the preview was for deciding what
  to read, and that was decided when the pointer was new.

When, and what it costs the prompt cache: rewriting an old block makes the cache miss
from that block on, so what a rewrite costs is the *tail* - the tokens from the first
rewritten block to the end, written to the cache again - not the whole context.
Aging acts when what it frees is at least ``age_fraction`` (half) of that tail (the
same idea as the API's ``clear_at_least``). A page aged as it leaves the window sits
just before it, so its tail is the window itself and it ages at once: the history
before it stays a cache read, and every later turn sends its pointer instead of its
text (measured on 60 pages, ``bench/context_total.py``: waiting for batches that
free a quarter of the *whole* context re-sent each page several more times). Results
far back (the first time the context passes ``age_from_fraction``) have the whole
context as their tail, so they still age in one batch, rarely. The model adapter
puts a cache breakpoint just before the first rewritten block, so the history
before it is still read from the cache.

Why half of the tail and not less: the tokens re-sent are one measure, what the API
bills another. A rewritten tail is billed as a cache write (1.25x an input token) where
it would have been a cache read (0.1x), so a rule that rewrites for a small gain sends
fewer tokens and costs more. On 60 pages of 25,000 tokens (offloaded on arrival: only
previews age) a tenth of the tail sent 233,793 input tokens and billed the equivalent
of 99,925 (uncached + 1.25 x cache writes + 0.1 x cache reads), against 334,074 and
72,520 before this rule; half of the tail sends 265,800 and bills 66,680, below both.
On 60 pages of 15,000 tokens the two rules are the same (1,557,984 sent, 1,217,495
billed, against 3,370,832 and 2,390,336 before).

Tracking is incremental: new messages are scanned once, and what the candidates
would free is a running sum, so a turn without aging costs a few list operations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..model.wire import replace_block
from ..trace import Clip, Offload, TraceWriter
from .offload import Offloader, result_text, tool_names
from .tokens import estimate_text

POINTER_HEAD_TOKENS = 30
"""About what a brief pointer costs (mark, size, path)."""


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
    keep_tokens: int = 1 << 62
    """The recent results beyond the newest stay only while they total at most this."""
    briefs: dict[str, str] = field(default_factory=dict)
    """The offloader's call id -> brief pointer (shared): which results are pointers."""
    scanned: int = 0
    """Messages scanned (the conversation only grows at its end between resets)."""
    results: list[tuple[int, str]] = field(default_factory=list)
    """(message index, tool_use_id) of every tool result seen, oldest first."""
    sizes: list[int] = field(default_factory=list)
    """Tokens of each of ``results`` when it was scanned."""
    judged: int = 0
    """Results that left the recent window and were judged (counted in ``pending``)."""
    pending: list[Candidate] = field(default_factory=list)
    deferred: list[tuple[int, str]] = field(default_factory=list)
    """Inline results too early to age (context under ``age_from``): judged again later."""

    def reset(self) -> None:
        """The conversation was rewritten (compaction, offload, clip): rescan it."""
        self.scanned, self.judged = 0, 0
        self.results, self.sizes, self.pending, self.deferred = [], [], [], []

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
                    text = result_text(block)
                    self.sizes.append(estimate_text(text) if text is not None else 0)
        self.scanned = len(messages)
        end = len(self.results) - self._recent(len(messages) - 1)
        leaving = self.results[self.judged : max(self.judged, end)]
        self.judged += len(leaving)
        if inline_allowed:
            leaving, self.deferred = [*self.deferred, *leaving], []
        for index, call_id in leaving:
            candidate = self._judge(messages, index, call_id, inline_allowed)
            if candidate is not None:
                self.pending.append(candidate)
        return sum(c.tokens for c in self.pending)

    def _recent(self, last: int) -> int:
        """How many of the newest results are in the recent window (see the module doc)."""
        count, total = 0, 0
        for (index, _), size in zip(reversed(self.results), reversed(self.sizes), strict=True):
            unseen = index >= last  # in the message about to be sent
            within = count < self.keep_recent and (count == 0 or total + size <= self.keep_tokens)
            if not (unseen or within):
                break
            count, total = count + 1, total + size
        return count

    def tail_from(self) -> int | None:
        """Message index of the oldest pending candidate (where a rewrite would start)."""
        return min((c.index for c in self.pending), default=None)

    def _judge(
        self, messages: list[dict[str, Any]], index: int, call_id: str, inline_allowed: bool
    ) -> Candidate | None:
        block = find_result(messages[index], call_id)
        text = result_text(block) if block is not None else None
        if text is None:
            return None
        brief = self.briefs.get(call_id)
        if brief is not None:  # a pointer: it drops its preview and how-to if it has them
            saves = estimate_text(text) - estimate_text(brief)
            return Candidate(index, call_id, saves, False) if saves > 0 else None
        size = estimate_text(text)
        if size < self.min_tokens:
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
            pointer = offloader.briefs.get(candidate.call_id, text)
            dropped.append(candidate.call_id)
            saved_tokens += candidate.tokens
        forget(messages[candidate.index])
        replace_block(messages, candidate.index, block, {**block, "content": pointer})
        aged += 1
    if dropped:  # previews cut from pointers: a clip of the pointer, no file written
        trace.emit(Clip(call_ids=dropped, tokens_saved=saved_tokens, turn=turn))
    return aged, offloaded

"""The closing call: when a limit stops a member, one last forced ``submit_result``.

A member stopped by its turn, token or deadline limit has usually learnt something
worth keeping. Rather than return only a list of its last actions, the loop makes
ONE more model call, bounded in output tokens and in time, with ``tool_choice``
forcing ``submit_result`` and a note saying the limit was reached and what is
unfinished must be said. The submission is validated like any other, cut to the
result cap without the usual "condense" round trip (there is no second chance),
finished by the kind's ``finalize`` when time allows (a coding member's patch of
its partial work), and returned as ``MemberOutcome.partial_result`` - never as
``result``: the status stays ``incomplete``, so nobody mistakes it for an answer.

Room for it is reserved, not hoped for:

* deadline - the turns run until ``deadline - reserve`` (10% of the deadline, at
  most 30 s); the closing call gets what is left, and is skipped when nothing is;
* tokens - a regular turn starts only if it and a closing call after it both fit
  under ``max_tokens`` (estimated from the current context); the closing call's
  output is bounded by the room left and skipped below ``MIN_OUTPUT_TOKENS``;
* turns - ``max_turns`` regular turns, then the closing call.

The closing call goes out without ``context.prepare``: the context just fitted the
previous call, and a compaction (another model call) is not worth it now.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anyio

from .model.base import ModelError
from .result import SUBMIT_TOOL, estimate_tokens
from .trace import Messages, ToolCall, ToolResult

if TYPE_CHECKING:
    from .loop import AgentLoop
    from .member import LimitName

RESERVE_FRACTION = 0.1
RESERVE_MAX_S = 30.0
MIN_OUTPUT_TOKENS = 256
"""Below this much output room a useful result cannot be written: skip the call."""
EXTRA_OUTPUT_TOKENS = 1_000
"""Output allowed beyond the result cap (tool-call framing, a short thought)."""
FORCE_SUBMIT = {"type": "tool", "name": SUBMIT_TOOL}
TRACE_OUTPUT_CHARS = 2_000
"""ToolResult events keep a preview; the full text is in the Messages event."""

_WHAT = {
    "turns": "turn limit",
    "tokens": "token limit",
    "deadline": "time limit",
}


def deadline_reserve(deadline_s: float) -> float:
    """Seconds kept back from the deadline for the closing call."""
    return min(RESERVE_MAX_S, deadline_s * RESERVE_FRACTION)


def output_tokens(result_tokens: int, max_output: int) -> int:
    """Output bound of the closing call (the result cap plus framing)."""
    return min(result_tokens + EXTRA_OUTPUT_TOKENS, max_output)


def note(limit: LimitName) -> str:
    return (
        f"The {_WHAT.get(limit, 'limit')} of this task has been reached: no more tools will "
        f"run. Call {SUBMIT_TOOL} now with your best partial result - what you found or did "
        "so far - and state plainly in it what is unfinished or unverified."
    )


def closing_message(messages: list[dict[str, Any]], text: str) -> dict[str, Any] | None:
    """Prepare the conversation for the closing call.

    Tool calls the limit interrupted get an error result (the API refuses a
    ``tool_use`` without one) and the note goes at the end of the last user
    message; returns a new user message to append, or None when the note was
    added to the existing last user message in place.
    """
    block = {"type": "text", "text": text}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "user":
        last["content"].append(block)
        return None
    pending = [
        b["id"]
        for b in (last["content"] if last is not None else [])
        if isinstance(b, dict) and b.get("type") == "tool_use"
    ]
    results: list[dict[str, Any]] = [
        {
            "type": "tool_result",
            "tool_use_id": call_id,
            "content": [{"type": "text", "text": "Not run: the limit was reached."}],
            "is_error": True,
        }
        for call_id in pending
    ]
    return {"role": "user", "content": [*results, block]}


def submitted(content: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first ``submit_result`` call of a response, if any."""
    for block in content:
        if block.get("type") == "tool_use" and block.get("name") == SUBMIT_TOOL:
            return block
    return None


class Closer:
    """Makes the closing call for one :class:`subagents.loop.AgentLoop`."""

    def __init__(self, loop: AgentLoop) -> None:
        self.loop = loop
        self.why_none = ""
        """Why the closing call gave no partial result (empty when it gave one)."""

    def next_context_tokens(self) -> int:
        """Tokens the next call would send: the manager's estimate, else a local one."""
        loop = self.loop
        estimate = getattr(loop.context, "estimate", None)
        if estimate is not None:
            return int(estimate(loop.messages, loop.system, loop.tool_defs))
        return estimate_tokens(
            json.dumps([loop.system, loop.tool_defs, loop.messages], default=str)
        )

    def output_bound(self) -> int:
        limits = self.loop.limits
        return output_tokens(
            limits.result_tokens, min(limits.max_output_tokens, self.loop.model.profile.max_output)
        )

    async def run(self, limit: LimitName, deadline_at: float) -> dict[str, Any] | None:
        """One bounded, forced submit_result call; the partial result or None."""
        loop = self.loop
        max_tokens = self.output_bound()
        if loop.limits.max_tokens is not None:
            room = loop.limits.max_tokens - loop.usage.total - self.next_context_tokens()
            max_tokens = min(max_tokens, room)
        remaining = deadline_at - anyio.current_time()
        if remaining <= 0:
            self.why_none = "the deadline had passed"
            return None
        if max_tokens < MIN_OUTPUT_TOKENS:
            self.why_none = "the token limit left no room for a closing call"
            return None
        with anyio.move_on_after(remaining):
            try:
                return await self._call(limit, max_tokens)
            except ModelError as exc:
                self.why_none = f"the closing call failed: {exc}"
                return None
        self.why_none = "the deadline passed during the closing call"
        return None

    async def _call(self, limit: LimitName, max_tokens: int) -> dict[str, Any] | None:
        loop = self.loop
        loop.turn += 1
        message = closing_message(loop.messages, note(limit))
        if message is None:  # the note went into the last user message: trace it alone
            added = {"role": "user", "content": [loop.messages[-1]["content"][-1]]}
            loop.trace.emit(
                Messages(span=loop.turn_span, parent=loop.spec.id, turn=loop.turn, messages=[added])
            )
        else:
            loop.append(message)
        content, _ = await loop.call_model(
            tool_choice=FORCE_SUBMIT, max_tokens=max_tokens, prepare=False
        )
        block = submitted(content)
        if block is None:
            self.why_none = "the model did not call submit_result"
            return None
        out = loop.gate.take_partial(block.get("input"))
        self._trace_submit(block, out.text, out.is_error)
        if out.is_error or loop.gate.partial is None:
            self.why_none = "the closing submission was invalid"
            return None
        return await self._finish(dict(loop.gate.partial))

    async def _finish(self, data: dict[str, Any]) -> dict[str, Any]:
        """The kind's finalize on the partial result when it works; else it as is."""
        try:
            return await self.loop.finalize(dict(data))
        except Exception:  # best effort: the partial result stands without it
            return data

    def _trace_submit(self, block: dict[str, Any], text: str, is_error: bool) -> None:
        loop = self.loop
        span, parent, turn = f"{loop.turn_span}/{block.get('id', '')}", loop.turn_span, loop.turn
        call_id, raw = str(block.get("id", "")), block.get("input")
        loop.calls.count += 1
        loop.trace.emit(
            ToolCall(
                span=span,
                parent=parent,
                turn=turn,
                call_id=call_id,
                tool=SUBMIT_TOOL,
                input=raw if isinstance(raw, dict) else {},
            )
        )
        loop.trace.emit(
            ToolResult(
                span=span,
                parent=parent,
                turn=turn,
                call_id=call_id,
                tool=SUBMIT_TOOL,
                is_error=is_error,
                output=text[:TRACE_OUTPUT_CHARS],
                output_chars=len(text),
            )
        )

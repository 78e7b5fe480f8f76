"""The closing call: when a limit stops a member, one last forced ``submit_result``.

A member stopped by its turn, token or deadline limit has usually learnt something
worth keeping. Rather than return only a list of its last actions, the loop makes
ONE more model call, bounded in output tokens and in time, with ``tool_choice``
forcing ``submit_result`` and a note saying the limit was reached and what is
unfinished must be said. The submission is validated like any other, cut to the
result cap without the usual "condense" round trip (there is no second chance),
finished by the kind's ``finalize`` when time allows (a coding member's patch of
its partial work), and returned as ``MemberOutcome.partial_result`` - never as
``result``: the status stays ``incomplete`` (``timed_out`` for the deadline), so
nobody mistakes it for an answer.

Room for it is reserved, not hoped for:

* deadline - the turns run until ``deadline - reserve`` (10% of the deadline, at
  most 30 s); the closing call gets what is left, and is skipped when nothing is;
* tokens - a regular turn starts only if it and a closing call after it both fit
  under ``max_tokens`` (estimated from the current context); the closing call's
  output is bounded by the room left and skipped below ``MIN_OUTPUT_TOKENS``;
* turns - ``max_turns`` regular turns, then the closing call.

The closing call goes out without ``context.prepare``: the context just fitted the
previous call, and a compaction (another model call) is not worth it now.

The loop makes the call - it is the member's last turn, in the loop's conversation -
and this module decides everything about it, as values: whether there is room and
how much (:func:`room`), the note and where it goes (:func:`closing_message`), and
what the answer gave (:func:`read_answer`). It knows nothing of the loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..results.outcome import LimitName
from ..results.result import SUBMIT_TOOL, ResultGate

RESERVE_FRACTION = 0.1
RESERVE_MAX_S = 30.0
MIN_OUTPUT_TOKENS = 256
"""Below this much output room a useful result cannot be written: skip the call."""
EXTRA_OUTPUT_TOKENS = 1_000
"""Output allowed beyond the result cap (tool-call framing, a short thought)."""
FORCE_SUBMIT = {"type": "tool", "name": SUBMIT_TOOL}


def force(tool: str = SUBMIT_TOOL) -> dict[str, str]:
    """``tool_choice`` forcing the member's result tool (``submit_result`` unless its
    kind names it otherwise)."""
    return {"type": "tool", "name": tool}


_WHAT = {
    "turns": "turn limit",
    "tokens": "token limit",
    "deadline": "time limit",
    "budget": "run's budget",
}


def deadline_reserve(deadline_s: float) -> float:
    """Seconds kept back from the deadline for the closing call."""
    return min(RESERVE_MAX_S, deadline_s * RESERVE_FRACTION)


def output_tokens(result_tokens: int, max_output: int) -> int:
    """Output bound of the closing call (the result cap plus framing)."""
    return min(result_tokens + EXTRA_OUTPUT_TOKENS, max_output)


@dataclass(frozen=True)
class Room:
    """What the closing call may take."""

    max_tokens: int
    """Its output bound."""
    seconds: float
    """Time left before the deadline."""


def room(
    *,
    output_bound: int,
    token_cap: int | None,
    used_tokens: int,
    context_tokens: int,
    remaining_s: float,
) -> Room | str:
    """The closing call's room, or why there is none (then it is skipped).

    ``output_bound`` is :func:`output_tokens` for the member; ``token_cap`` its
    ``max_tokens`` limit, of which ``used_tokens`` are spent; ``context_tokens`` what
    the call would send.
    """
    max_tokens = output_bound
    if token_cap is not None:
        max_tokens = min(max_tokens, token_cap - used_tokens - context_tokens)
    if remaining_s <= 0:
        return "the deadline had passed"
    if max_tokens < MIN_OUTPUT_TOKENS:
        return "the token limit left no room for a closing call"
    return Room(max_tokens=max_tokens, seconds=remaining_s)


def note(limit: LimitName, tool: str = SUBMIT_TOOL) -> str:
    return (
        f"The {_WHAT.get(limit, 'limit')} of this task has been reached: no more tools will "
        f"run. Call {tool} now with your best partial result - what you found or did "
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


def submitted(content: list[dict[str, Any]], tool: str = SUBMIT_TOOL) -> dict[str, Any] | None:
    """The first call of the result tool (``submit_result``) in a response, if any."""
    for block in content:
        if block.get("type") == "tool_use" and block.get("name") == tool:
            return block
    return None


@dataclass(frozen=True)
class Answer:
    """What the closing call's response gave."""

    call: dict[str, Any] | None
    """Its ``submit_result`` call (None: the model made none)."""
    text: str = ""
    """The gate's answer to that call, as a tool result would carry it."""
    is_error: bool = False
    """The submission was refused."""
    partial: dict[str, Any] | None = None
    """The accepted partial result, before the kind's ``finalize``."""
    why_none: str = ""
    """Why there is no partial result (empty when there is one)."""


def read_answer(content: list[dict[str, Any]], gate: ResultGate) -> Answer:
    """The closing call's ``submit_result``, checked by ``gate`` (cut to the cap, never
    sent back to be condensed: there is no second chance)."""
    call = submitted(content, gate.name)
    if call is None:
        return Answer(call=None, why_none=f"the model did not call {gate.name}")
    out = gate.take_partial(call.get("input"))
    if out.is_error or gate.partial is None:
        return Answer(
            call=call,
            text=out.text,
            is_error=out.is_error,
            why_none="the closing submission was invalid",
        )
    return Answer(call=call, text=out.text, partial=dict(gate.partial))

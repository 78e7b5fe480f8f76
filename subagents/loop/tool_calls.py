"""Running one response's tool calls: concurrently, each answered, each traced.

The loop hands over the ``tool_use`` blocks of one model response; :class:`ToolCalls`
runs them *concurrently* in one task group (the model asked for them together
because they are independent, and a slow shell command should not hold up three
file reads) and returns one ``tool_result`` per call, in the order asked - the API
refuses a ``tool_use`` left without its result.

What happens to one call, in order: ``ToolCall`` traced; the member's policy checked
(:mod:`subagents.rules.policy`: a denied call, or an ask answered no, is an ``is_error``
result counted as refused, and the tool never runs; an ask waits here, holding up this
call only);
arguments validated and the tool run by the registry (whose failures - bad arguments, ``ToolError``, any
exception, a timeout - come back as ``is_error`` results the model can act on);
a successful result other than ``submit_result`` passes ``context.admit_tool_result``
(large ones are offloaded); files written are reported to the context; ``ToolResult``
traced. Each call runs inside its own trace scope, so events emitted on its behalf
(an offload, a sandbox event) carry its span.

The one failure that stops the lot is :data:`~subagents.tools.registry.BOX_GONE`: a
dead box fails every sibling too, so the group is cancelled and the error re-raised
for the member to end ``crashed``.
"""

from __future__ import annotations

import json
import time
from collections import deque
from typing import Any

import anyio

from sandbox.errors import SandboxError

from ..context.base import ContextLike
from ..rules.policy import PolicyGate
from ..tools.base import CALL_ID, ToolContext, ToolOutput
from ..tools.registry import BOX_GONE, ToolRegistry
from ..trace import ToolCall, ToolResult, TraceWriter

TRACE_OUTPUT_CHARS = 2_000
"""ToolResult events keep a preview; the full text is in the Messages event."""


class ToolCalls:
    """Runs the tool calls of one member's responses; counts them and keeps the last few."""

    def __init__(
        self,
        registry: ToolRegistry,
        ctx: ToolContext,
        *,
        context: ContextLike,
        trace: TraceWriter,
        gate: PolicyGate | None = None,
        result_tool: str = "submit_result",
    ) -> None:
        self.registry, self.ctx, self.context, self.trace = registry, ctx, context, trace
        self.gate = gate
        """The member's tool policy; None: every call runs."""
        self.result_tool = result_tool
        """The member's result tool: its answer is never offloaded."""
        self.count = 0
        """Tool calls made so far (the closing call's submission included)."""
        self.recent: deque[str] = deque(maxlen=8)
        """The latest calls as ``tool(args) -> ok|error``, oldest first (for progress)."""
        self.work = 0
        """Calls of the member's own tools (not ``submit_result``) that came back."""
        self.refused: list[str] = []
        """The messages of those a policy refused: the member's tool policy (a deny, an
        ask answered no) or the tool's own (:class:`~subagents.tools.base.Blocked`)."""

    def all_refused(self) -> str | None:
        """Why the member achieved nothing when every tool call it made was refused
        (each one blocked by a policy), else None."""
        if not self.work or len(self.refused) < self.work:
            return None
        return (
            f"every tool call was refused by policy ({self.work} of {self.work}), e.g. "
            f"{self.refused[0][:300]}"
        )

    async def run(
        self, tool_uses: list[dict[str, Any]], *, turn: int, turn_span: str
    ) -> list[dict[str, Any]]:
        """Every call concurrently; their ``tool_result`` blocks in the order asked."""
        results: list[dict[str, Any]] = [{} for _ in tool_uses]
        crashes: list[SandboxError] = []
        if len(tool_uses) == 1:  # most turns: no task to start, no trip through the loop
            with anyio.CancelScope() as alone:
                await self._one(0, tool_uses[0], results, crashes, alone, turn, turn_span)
        else:
            async with anyio.create_task_group() as tg:
                for i, block in enumerate(tool_uses):
                    tg.start_soon(
                        self._one, i, block, results, crashes, tg.cancel_scope, turn, turn_span
                    )
        if crashes:
            raise crashes[0]
        return results

    async def _one(
        self,
        i: int,
        block: dict[str, Any],
        results: list[dict[str, Any]],
        crashes: list[SandboxError],
        group: anyio.CancelScope,
        turn: int,
        turn_span: str,
    ) -> None:
        call_id, name, raw = block["id"], block.get("name", ""), block.get("input")
        span = f"{turn_span}/{call_id}"
        ids = self._called(block, turn, turn_span)
        started = time.monotonic()
        token = CALL_ID.set(call_id)
        with self.trace.scope(span, turn_span, turn):
            refused = await self.gate.admit(call_id, name, raw) if self.gate else None
            try:
                if refused is not None:
                    out = ToolOutput(text=refused, is_error=True, blocked=True)
                else:
                    out = await self.registry.call(name, raw, self.ctx)
            except BOX_GONE as exc:
                # The box is gone: the siblings cannot succeed either.
                crashes.append(exc)
                group.cancel()
                return
            finally:
                CALL_ID.reset(token)
            text, offloaded = out.text or "(no output)", None
            if not out.is_error and name != self.result_tool:
                text, offloaded = await self.context.admit_tool_result(call_id, name, text)
            if out.files_written:
                self.context.note_files_written(out.files_written)
        result: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": call_id,
            "content": [{"type": "text", "text": text}, *out.attachments],
        }
        if out.is_error:
            result["is_error"] = True
        if name != self.result_tool:
            self.work += 1
            if out.blocked:
                self.refused.append(out.text)
        results[i] = result
        self.recent.append(f"{name}({short(raw)}) -> {'error' if out.is_error else 'ok'}")
        self.trace.emit(
            ToolResult(
                **ids,
                is_error=out.is_error,
                duration_s=round(time.monotonic() - started, 4),
                output=text[:TRACE_OUTPUT_CHARS],
                output_chars=len(text),
                truncated=out.truncated,
                offloaded=offloaded,
            )
        )

    def record(
        self, block: dict[str, Any], text: str, *, is_error: bool, turn: int, turn_span: str
    ) -> None:
        """Count and trace a call answered outside a response's batch: the closing
        call's ``submit_result``, checked by the result gate (see subagents/loop/closing.py)."""
        ids = self._called(block, turn, turn_span)
        self.trace.emit(
            ToolResult(
                **ids, is_error=is_error, output=text[:TRACE_OUTPUT_CHARS], output_chars=len(text)
            )
        )

    def _called(self, block: dict[str, Any], turn: int, turn_span: str) -> dict[str, Any]:
        """Count the call and trace its ``ToolCall``; the ids its ``ToolResult`` shares."""
        call_id, raw = str(block.get("id", "")), block.get("input")
        self.count += 1
        ids = {
            "span": f"{turn_span}/{call_id}",
            "parent": turn_span,
            "turn": turn,
            "call_id": call_id,
            "tool": block.get("name", ""),
        }
        self.trace.emit(ToolCall(**ids, input=raw if isinstance(raw, dict) else {"_raw": raw}))
        return ids


def short(raw: Any, limit: int = 80) -> str:
    """A tool call's arguments as one short line."""
    text = json.dumps(raw, ensure_ascii=False, default=str) if raw is not None else ""
    return text if len(text) <= limit else text[: limit - 3] + "..."

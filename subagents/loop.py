"""The agent loop: one member's turns, from the task to a result or a limit.

Each turn is the same five steps, small enough to hold in one's head:

1. ``context.prepare`` - the context mechanisms (offload, clip, compaction, todo
   recitation) shape what is sent;
2. ``model.complete`` - one Messages API call, traced as ``ModelCall`` plus the new
   assistant message (``Messages`` events carry only new messages, so a trace grows
   linearly with turns);
3. every ``tool_use`` of the response runs *concurrently*
   (:mod:`subagents.tool_calls`: validation, errors as results, offloading);
4. all results go back as one user message, every ``tool_use`` answered, in order;
5. stop when ``submit_result`` was accepted.

Token and cost sums and the ``ModelCall`` event live in :mod:`subagents.usage`; the
rules of the closing call after a limit in :mod:`subagents.closing` (the loop makes
that call: it is the member's last turn).

Failure policy: a tool's own failure (bad arguments, ``ToolError``, any exception)
is an ``is_error`` result the model can act on, never the end of the run and never
the member's answer. A model that ends its turn without ``submit_result`` is
reminded once, then the member ends ``incomplete``. Limits (turns, total tokens,
wall-clock deadline) end the member ``incomplete`` (``timed_out`` for the deadline)
with what it did, not with an exception, after one closing call forcing ``submit_result`` whose answer becomes the
outcome's ``partial_result`` (room for it is reserved: :mod:`subagents.closing`).
``SandboxCrashed`` and ``ModelError`` propagate to :func:`run_member`,
which turns them into ``crashed`` / ``failed`` outcomes using :meth:`AgentLoop.outcome`.

Span ids: member ``<id>``, turn ``<id>/t<n>``, model call ``<id>/t<n>/model``, tool
call ``<id>/t<n>/<tool_use id>``; each event's ``parent`` is the enclosing span.
Each is also a :meth:`TraceWriter.scope`, so events emitted by code that does not
know the span (the adapter's retries, offloads, compaction) still carry it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
from pydantic import ValidationError

from sandbox.base import Sandbox

from . import closing
from .context.base import ContextLike
from .kinds import Kind
from .model.base import Model, ModelError, ModelRequest
from .outcome import LimitName, MemberOutcome, Progress, Status
from .result import ResultGate, estimate_tokens
from .result_schema import extend_model, job_field_names
from .spec import MemberSpec
from .tool_calls import ToolCalls
from .tools.base import ToolContext
from .tools.registry import ToolRegistry, build_custom_tool
from .trace import Messages, TraceWriter
from .usage import Usage, model_call_event

HARNESS_RULES = """\
How you work here:
- You work alone; nobody will answer questions. Decide, act with the tools, verify.
- Independent tool calls can go in one response: they run at the same time.
- A tool result marked as an error says what was wrong; fix the call and go on.
- Finish by calling submit_result exactly once with your final result. It is checked \
against its schema and must stay under about {cap} tokens: distilled, not a log.
- If you cannot finish, still call submit_result and say what is missing."""

NUDGE = (
    "You ended your turn without calling submit_result. This task only ends through "
    "submit_result: call it now with your result (if something is unfinished, say so "
    "in the result)."
)


class AgentLoop:
    """Runs one member's turns; :meth:`run` returns its :class:`MemberOutcome`."""

    def __init__(
        self,
        spec: MemberSpec,
        kind: Kind,
        *,
        model: Model,
        sandbox: Sandbox | None,
        run_dir: Path,
        trace: TraceWriter,
        context: ContextLike,
    ) -> None:
        self.spec, self.kind, self.model, self.trace, self.context = (
            spec,
            kind,
            model,
            trace,
            context,
        )
        self.limits = spec.limits
        job_schema = spec.job_result_schema()
        submit_model, self.result_model = kind.submit_schema, kind.result_model
        if job_schema is not None:
            # The job's fields extend the kind's (subagents.result_schema says why).
            submit_model = extend_model(submit_model, job_schema)
            self.result_model = extend_model(self.result_model, job_schema)
        self.job_fields = job_field_names(kind.submit_schema, job_schema)
        """Job-only fields: kept aside while the kind finishes the result."""
        self.gate = ResultGate(submit_model, cap_tokens=self.limits.result_tokens)
        self.tool_ctx = ToolContext(
            sandbox=sandbox,
            run_dir=run_dir,
            trace=trace,
            member=spec.id,
            settings=spec.settings,
        )
        tools = [
            *kind.tools(spec.settings),
            *context.tools(),
            *(build_custom_tool(t) for t in spec.tools),
            self.gate.tool(kind.submit_description),
        ]
        self.registry = ToolRegistry(tools, timeout_s=spec.tool_timeout_s)
        self.tool_defs = self.registry.definitions()
        self.system = (
            kind.system_prompt.rstrip()
            + "\n\n"
            + HARNESS_RULES.format(cap=self.limits.result_tokens)
        )
        self.messages: list[dict[str, Any]] = []
        self.turn = 0
        self.usage = Usage()
        self._summaries_counted = 0
        """How many of the context's compaction summary calls are in ``usage``."""
        self.calls = ToolCalls(self.registry, self.tool_ctx, context=context, trace=trace)
        self.last_text = ""
        self.nudged = False
        self.offline = model.offline
        """Labelled from the model itself too: a member that failed before its first
        call was still an offline member."""

    @property
    def turn_span(self) -> str:
        return f"{self.spec.id}/t{self.turn}"

    @property
    def tool_calls(self) -> int:
        return self.calls.count

    async def run(self) -> MemberOutcome:
        """Turns until a result or a limit; raises only SandboxCrashed, ModelError, cancel."""
        deadline = self.limits.deadline_s
        deadline_at = anyio.current_time() + deadline
        try:
            ended: MemberOutcome | tuple[LimitName, str] | None = None
            # Part of the deadline is kept back for the closing call (subagents.closing).
            with anyio.move_on_after(deadline - closing.deadline_reserve(deadline)):
                ended = await self._run()
            limit: LimitName
            if isinstance(ended, MemberOutcome):
                return ended
            if ended is None:
                limit, reason = (
                    "deadline",
                    (
                        f"wall-clock deadline of {deadline:g} s reached after {self.turn} turns "
                        f"and {self.tool_calls} tool calls"
                    ),
                )
            else:
                limit, reason = ended
            partial, why_none = await self._close(limit, deadline_at)
            if partial is None:
                reason += f"; no partial result ({why_none})"
            # The deadline is its own status, the same one the coordinator gives a member
            # it has to stop: one event, one word in every record (result, trace, journal).
            status: Status = "timed_out" if limit == "deadline" else "incomplete"
            return self.outcome(status, reason, limit=limit, partial=partial)
        finally:
            if self.kind.teardown is not None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                    await self.kind.teardown(self.tool_ctx)

    async def _run(self) -> MemberOutcome | tuple[LimitName, str]:
        """The turns; a limit is returned as (limit, reason) for the closing call."""
        await self._start()
        while True:
            limit = self._limit_reached()
            if limit is not None:
                return limit
            self.turn += 1
            content, stop_reason = await self.call_model()
            tool_uses = [b for b in content if b.get("type") == "tool_use"]
            if not tool_uses:
                if stop_reason == "pause_turn":
                    continue
                if self.nudged:
                    return self.outcome(
                        "incomplete",
                        "the model stopped without calling submit_result, even after a reminder",
                        limit="no_result",
                    )
                self.nudged = True
                self.append({"role": "user", "content": [{"type": "text", "text": NUDGE}]})
                continue
            results = await self.calls.run(tool_uses, turn=self.turn, turn_span=self.turn_span)
            self.append({"role": "user", "content": results})
            if self.gate.accepted is not None:
                return await self._accept()

    async def _start(self) -> None:
        if self.kind.setup is not None:
            await self.kind.setup(self.tool_ctx)
        memory = await self.context.start()
        blocks = [{"type": "text", "text": self.spec.task}]
        brief = self.kind.brief(self.spec.settings) if self.kind.brief is not None else None
        if brief:
            blocks.append({"type": "text", "text": brief})
        # The job's result schema reaches the model as submit_result's schema.
        shown = {k: v for k, v in self.spec.inputs.items() if k != "result_schema"}
        if shown:
            inputs = json.dumps(shown, indent=1, ensure_ascii=False, default=str)
            blocks.append({"type": "text", "text": f"Inputs (JSON):\n{inputs}"})
        if memory:
            blocks.append({"type": "text", "text": memory})
        self.append({"role": "user", "content": blocks})

    def _limit_reached(self) -> tuple[LimitName, str] | None:
        done = f"after {self.turn} turns and {self.tool_calls} tool calls"
        if self.turn >= self.limits.max_turns:
            return "turns", f"reached the limit of {self.limits.max_turns} turns ({done})"
        cap = self.limits.max_tokens
        if cap is not None and self.turn > 0:
            # This turn and the closing call after it must both fit under the cap.
            need = 2 * self._next_context_tokens() + self._closing_output_bound()
            if self.usage.total + need > cap:
                return "tokens", (
                    f"used {self.usage.total} tokens of the {cap}-token limit; another turn "
                    f"(about {need // 2} tokens) and the closing call would not fit ({done})"
                )
        return None

    async def _close(
        self, limit: LimitName, deadline_at: float
    ) -> tuple[dict[str, Any] | None, str]:
        """The closing call after a limit, as :mod:`subagents.closing` rules it: one
        bounded turn forcing submit_result. The partial result, or None and why."""
        room = closing.room(
            output_bound=self._closing_output_bound(),
            token_cap=self.limits.max_tokens,
            used_tokens=self.usage.total,
            context_tokens=self._next_context_tokens(),
            remaining_s=deadline_at - anyio.current_time(),
        )
        if isinstance(room, str):
            return None, room
        with anyio.move_on_after(room.seconds):
            self.turn += 1
            message = closing.closing_message(self.messages, closing.note(limit))
            if message is None:  # the note went into the last user message: trace it alone
                self._trace_messages(
                    {"role": "user", "content": [self.messages[-1]["content"][-1]]}
                )
            else:
                self.append(message)
            try:
                content, _ = await self.call_model(
                    tool_choice=closing.FORCE_SUBMIT, max_tokens=room.max_tokens, prepare=False
                )
            except ModelError as exc:
                return None, f"the closing call failed: {exc}"
            answer = closing.read_answer(content, self.gate)
            if answer.call is not None:
                self.calls.record(
                    answer.call,
                    answer.text,
                    is_error=answer.is_error,
                    turn=self.turn,
                    turn_span=self.turn_span,
                )
            if answer.partial is None:
                return None, answer.why_none
            try:
                return await self.finalize(dict(answer.partial)), ""
            except Exception:  # best effort: the partial result stands without it
                return answer.partial, ""
        return None, "the deadline passed during the closing call"

    def _next_context_tokens(self) -> int:
        """Tokens the next call would send: the context's estimate, else a local one."""
        estimate = getattr(self.context, "estimate", None)
        if estimate is not None:
            return int(estimate(self.messages, self.system, self.tool_defs))
        return estimate_tokens(
            json.dumps([self.system, self.tool_defs, self.messages], default=str)
        )

    def _closing_output_bound(self) -> int:
        max_output = min(self.spec.max_output_tokens, self.model.profile.max_output)
        return closing.output_tokens(self.limits.result_tokens, max_output)

    def append(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        self._trace_messages(message)

    def _trace_messages(self, message: dict[str, Any]) -> None:
        self.trace.emit(
            Messages(span=self.turn_span, parent=self.spec.id, turn=self.turn, messages=[message])
        )

    async def call_model(
        self,
        *,
        tool_choice: dict[str, Any] | None = None,
        max_tokens: int | None = None,
        prepare: bool = True,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One model call; appends and traces the assistant message."""
        sent = self.messages
        if prepare:
            with self.trace.scope(self.turn_span, self.spec.id, self.turn):
                sent = await self.context.prepare(
                    self.messages, turn=self.turn, system=self.system, tools=self.tool_defs
                )
            self._count_summary_calls()
        profile = self.model.profile
        # model_construct: the messages were built by this loop (already valid); not
        # re-validating hundreds of dicts keeps harness CPU per turn flat.
        request = ModelRequest.model_construct(
            system=self.system,
            messages=sent,
            tools=self.tool_defs,
            max_tokens=max_tokens or min(self.spec.max_output_tokens, profile.max_output),
            temperature=None,
            tool_choice=tool_choice,
            context_management=self._context_management(),
        )
        span = f"{self.turn_span}/model"
        with self.trace.scope(span, self.turn_span, self.turn):  # the adapter's retries
            response = await self.model.complete(request)
        message = response.message
        self.offline = self.offline or response.offline
        self.usage.add(message.usage, profile)
        self.context.observe_usage(message.usage, sent)
        content = [b.model_dump(mode="json", exclude_none=True) for b in message.content]
        self.trace.emit(
            model_call_event(
                response,
                content,
                span=span,
                parent=self.turn_span,
                turn=self.turn,
                default_model=profile.name,
            )
        )
        texts = [b["text"] for b in content if b.get("type") == "text" and b.get("text")]
        if texts:
            self.last_text = texts[-1][-1_000:]
        # The API refuses an empty assistant message later in the conversation.
        self.append(
            {"role": "assistant", "content": content or [{"type": "text", "text": "(no output)"}]}
        )
        return content, message.stop_reason

    def _count_summary_calls(self) -> None:
        """Add the context's compaction summary calls to the member's usage.

        They are model calls of this member like any other: they count toward the
        token limit and the cost, and the outcome's totals match the traced calls."""
        calls = getattr(self.context, "summary_usage", None) or []
        for usage in calls[self._summaries_counted :]:
            self.usage.add(usage, self.model.profile)
        self._summaries_counted = len(calls)

    def _context_management(self) -> dict[str, Any] | None:
        """Server-side edits, as the context manager builds them (with their triggers).

        The manager owns the budget, so it alone knows where the server should
        compact or clear; a context without server-side support sends none."""
        build = getattr(self.context, "context_management", None)
        return build() if build is not None else None

    async def _accept(self) -> MemberOutcome:
        """The accepted submission, finished by the kind (e.g. the coding patch), and
        judged by it: ``failed`` with the result kept when the kind says it is not a
        success (a coding member's test failing after its edit)."""
        data = await self.finalize(dict(self.gate.accepted or {}))
        if not self.gate.truncated:
            # A cut result may break length constraints; an uncut one must fit exactly.
            try:
                data = self.result_model.model_validate(data).model_dump(mode="json")
            except ValidationError as exc:
                raise RuntimeError(
                    f"kind {self.kind.name!r} built an invalid result: {exc}"
                ) from exc
        why = self.kind.judge(data) if self.kind.judge is not None else None
        if why:
            return self.outcome("failed", why, result=data)
        return self.outcome("ok", "", result=data)

    async def finalize(self, data: dict[str, Any]) -> dict[str, Any]:
        """The kind's ``finalize`` on a submission (e.g. add the coding patch)."""
        if self.kind.finalize is None:
            return data
        # A kind finishes its own fields only; the job's fields skip its hook.
        job_values = {k: data.pop(k) for k in self.job_fields if k in data}
        data = await self.kind.finalize(data, self.tool_ctx)
        for key, value in job_values.items():
            data.setdefault(key, value)
        return data

    def outcome(
        self,
        status: Status,
        reason: str,
        *,
        limit: LimitName | None = None,
        retryable: bool = False,
        result: dict[str, Any] | None = None,
        partial: dict[str, Any] | None = None,
    ) -> MemberOutcome:
        """The member's outcome as of now (also used for crashed / failed ends)."""
        progress = None
        if status != "ok":
            progress = Progress(
                turns=self.turn,
                last_actions=list(self.calls.recent),
                todos=self._todos(),
                last_text=self.last_text,
            )
        self._count_summary_calls()  # a compaction may precede a crash or a limit
        u = self.usage
        return MemberOutcome(
            member=self.spec.id,
            kind=self.kind.name,
            status=status,
            reason=reason,
            result=result,
            partial_result=partial,
            limit=limit,
            progress=progress,
            result_truncated=self.gate.truncated and result is not None,
            retryable=retryable,
            turns=self.turn,
            input_tokens=u.input,
            output_tokens=u.output,
            cache_read_tokens=u.cache_read,
            cache_write_tokens=u.cache_write,
            cost_usd=round(u.cost_usd, 6),
            offline=self.offline,
        )

    def _todos(self) -> list[dict[str, Any]]:
        state = getattr(self.context, "todos", None)
        items = getattr(state, "items", None) or []
        return [i.model_dump() if hasattr(i, "model_dump") else dict(i) for i in items]

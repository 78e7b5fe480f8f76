"""ContextManager: the one object the loop talks to about its context window.

The loop owns the conversation (a list of ``MessageParam`` dicts whose first user
message holds the task verbatim) and calls, per member: :meth:`start` once,
:meth:`admit_tool_result` for every tool result, :meth:`observe_usage` after every
model call, :meth:`prepare` before every model call, and :meth:`finish` at the end
(failure included). :meth:`prepare` works on the loop's list in place and returns
it: offloads and clips replace old messages with rewritten copies, compaction
replaces the list's content, recitation replaces the last user message with one that
has the list appended. A message object is never changed in place (the model
adapter serializes each message once and relies on it: :mod:`subagents.model.wire`).
When the context is small, :meth:`prepare` costs one cached estimate and nothing else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from sandbox.base import Sandbox

from ..model.base import Model, ModelProfile, ModelResponse
from ..model.wire import replace_block
from ..spend.usage import answered_by
from ..tools.base import Tool
from ..trace import Clip, Compaction, ModelCall, Offload, TraceWriter
from . import compaction as comp
from .aging import AgingTracker, shrink
from .budget import Budget
from .clip import clip_old_writes
from .config import ContextConfig
from .memory import MemoryStore, cap_text, wrap_memory
from .memory_tool import MemoryTool
from .offload import Offloader, old_results, result_text, tool_names
from .saved import ReadSaved
from .todos import TodoState, WriteTodos
from .tokens import TokenCounter, estimate_text


class ContextManager:
    """Budget, offload, clip, compaction, todos and memory for one member."""

    def __init__(
        self,
        config: ContextConfig,
        *,
        profile: ModelProfile,
        model: Model,
        sandbox: Sandbox | None,
        run_dir: Path,
        trace: TraceWriter,
        task: str,
        memory_dir: Path | None,
        todos_enabled: bool,
        box_tools: bool = True,
    ) -> None:
        """``box_tools``: the member reads box files with its own tools (coding); when
        False it gets ``read_saved`` for what this context saves for it (browser)."""
        self.config = config
        self.model = model
        self.sandbox = sandbox
        self.run_dir = Path(run_dir)
        self.trace = trace
        self.task = task
        self.limits = Budget.from_config(config, profile.context_window)
        self.budget = self.limits.tokens
        self.counter = TokenCounter()
        self.aging = AgingTracker(
            keep_recent=config.keep_recent_results,
            min_tokens=config.old_result_min_tokens,
            keep_tokens=config.keep_recent_tokens,
        )
        self.aged = 0
        """Results the model had moved past that were shrunk (offloaded, or a preview dropped)."""
        self.offloader = Offloader(config, sandbox, self.run_dir, box_tools=box_tools)
        self.aging.briefs = self.offloader.briefs
        self.todos = TodoState(trace) if todos_enabled else None
        self.memory = (
            MemoryStore(
                config,
                host_dir=Path(memory_dir),
                work_dir=self.run_dir / "memory",
                sandbox=sandbox,
                trace=trace,
            )
            if memory_dir is not None
            else None
        )
        self.files_written: list[str] = []
        """Paths the member wrote, most recent last, without repeats."""
        self.compactions = 0
        self.offloads = 0
        """Results offloaded (as they arrived, or later for being over budget)."""
        self.clips = 0
        """Write/edit inputs clipped to pointers."""
        self.summary_usage: list[Any] = []
        """API usage of the compaction summary calls (the loop adds them to the member's)."""
        self._compact_floor = 0
        """No new compaction below this many tokens (set when one could not get under
        the trigger, so an oversized task or memory cannot make every turn compact)."""
        self.peak_tokens = 0
        """Largest context :meth:`prepare` let through (for benches and traces)."""
        self._server_compactions_seen: set[int] = set()
        self._sent_with: tuple[Any, list[dict]] = ("", [])
        """System prompt and tools of the last :meth:`prepare`, for :meth:`observe_usage`."""

    # -- setup and teardown ---------------------------------------------------------

    def tools(self) -> list[Tool]:
        """The context tools this member gets: write_todos (if enabled), memory (if any),
        and read_saved when it has no file tools of its own to read back what is saved."""
        tools: list[Tool] = []
        if not self.offloader.box_tools:
            tools.append(ReadSaved(self.run_dir, max_chars=self.config.offload_result_tokens * 2))
        if self.todos is not None:
            tools.append(WriteTodos(self.todos))
        if self.memory is not None:
            tools.append(MemoryTool(self.memory))
        return tools

    async def start(self) -> str:
        """Load the memory; returns the wrapped, capped text for the first message."""
        if self.memory is None:
            return ""
        return await self.memory.start()

    async def finish(self) -> None:
        """Merge memory edits into the profile. Call it whatever the member's outcome."""
        if self.memory is not None:
            await self.memory.save()

    # -- per tool result ------------------------------------------------------------

    async def admit_tool_result(self, call_id: str, tool: str, text: str) -> tuple[str, str | None]:
        """(text for the model, offload path or None): large results become pointers."""
        if not self.offloader.too_large(text):
            return text, None
        pointer, saved, tokens = await self.offloader.offload(call_id, tool, text)
        self.offloads += 1
        self.trace.emit(Offload(call_id=call_id, path=saved.for_model, tokens=tokens))
        return pointer, saved.for_model

    def note_files_written(self, paths: list[str]) -> None:
        """Remember files the member changed (for clipping and post-compaction re-reads)."""
        for path in paths:
            if path in self.files_written:
                self.files_written.remove(path)
            self.files_written.append(path)

    # -- accounting -----------------------------------------------------------------

    def observe_usage(
        self, usage: Any, sent_messages: list[dict], system: Any = "", tools: list | None = None
    ) -> None:
        """Record the API's input count for the context just sent (call it before
        appending the response). System and tools default to those of the last prepare."""
        if tools is None:
            system, tools = self._sent_with
        self.counter.observe(usage, sent_messages, system, tools)

    def todo_items(self) -> list[dict[str, Any]]:
        """The todo list now, as JSON (empty when the member keeps none)."""
        return [] if self.todos is None else [i.model_dump() for i in self.todos.items]

    def estimate(self, messages: list[dict], system: Any, tools: list[dict]) -> int:
        """Tokens of this context: API-anchored prefix plus local estimate of the rest."""
        return self.counter.count(messages, system, tools)

    def context_management(self) -> dict[str, Any] | None:
        """Server-side context management edits for the request, when the config asks."""
        mode = self.config.server_side
        if mode == "compact":
            edit: dict[str, Any] = {
                "type": "compact_20260112",
                "trigger": {"type": "input_tokens", "value": self.limits.trigger},
            }
            if self.config.compaction_instructions:
                edit["instructions"] = self.config.compaction_instructions
            return {"edits": [edit]}
        if mode == "clear_tool_uses":
            return {
                "edits": [
                    {
                        "type": "clear_tool_uses_20250919",
                        "trigger": {"type": "input_tokens", "value": self.limits.clip_at},
                        "keep": {"type": "tool_uses", "value": self.config.keep_recent_results},
                    }
                ]
            }
        return None

    # -- before every model call ----------------------------------------------------

    async def prepare(
        self, messages: list[dict], *, turn: int, system: Any, tools: list[dict]
    ) -> list[dict]:
        """Make the context fit (clip, age, offload, compact, in that order) and recite todos."""
        self._sent_with = (system, tools)
        self._note_server_compaction(messages, turn)
        tokens = self.estimate(messages, system, tools)
        if tokens > self.limits.clip_at:
            tokens = self._clip(messages, turn, system, tools, tokens)
        tokens = await self._age(messages, turn, system, tools, tokens)
        if tokens > self.limits.trigger:
            tokens = await self._offload_old(messages, turn, system, tools, tokens)
        if (
            tokens > self.limits.trigger
            and tokens > self._compact_floor
            and self.config.server_side != "compact"
        ):
            tokens = await self.compact(messages, turn=turn, system=system, tools=tools)
            over = tokens > self.limits.trigger
            self._compact_floor = tokens + self.budget // 10 if over else 0
        if self.todos is not None and self.todos.due(turn, self.config.recite_every):
            recited = self.todos.recite(messages, turn)
            if recited is not None:
                tokens += estimate_text(recited["content"][-1]["text"])
        self.peak_tokens = max(self.peak_tokens, tokens)
        return messages

    def _clip(self, messages: list[dict], turn: int, system: Any, tools: list, tokens: int) -> int:
        """Old write/edit inputs -> pointers; superseded todo recitations -> one line."""
        report = clip_old_writes(messages, self.config)
        changed, saved = list(report.messages), report.tokens_saved
        if self.todos is not None:
            retired, retired_saved = self.todos.retire_old_recitals(messages)
            changed += retired
            saved += retired_saved
        if not changed:
            return tokens
        for message in changed:
            self.counter.forget(message)
        self.aging.reset()
        self.clips += len(report.call_ids)
        self.trace.emit(Clip(call_ids=report.call_ids, tokens_saved=saved, turn=turn))
        return self.estimate(messages, system, tools)

    async def _age(
        self, messages: list[dict], turn: int, system: Any, tools: list, tokens: int
    ) -> int:
        """Shrink results the model has moved past, when it frees enough of what the
        rewrite sends to the cache again (the tail from the first rewritten block)."""
        free = self.aging.update(messages, inline_allowed=tokens > self.limits.age_from)
        start = self.aging.tail_from()
        if start is None:
            return tokens
        tail = sum(self.counter.message(m) for m in messages[start:])
        if free < self.config.age_fraction * tail:
            return tokens
        aged, offloaded = await shrink(
            messages,
            self.aging.take(),
            offloader=self.offloader,
            trace=self.trace,
            forget=self.counter.forget,
            turn=turn,
        )
        self.aged += aged
        self.offloads += offloaded
        return self.estimate(messages, system, tools)

    async def _offload_old(
        self, messages: list[dict], turn: int, system: Any, tools: list, tokens: int
    ) -> int:
        """Offload older results, oldest first, until under ``limits.offload_to``."""
        names: dict[str, str] | None = None
        for index, block in old_results(messages, self.config.keep_recent_results):
            if tokens <= self.limits.offload_to:
                break
            text = result_text(block)
            if text is None or block.get("tool_use_id", "") in self.offloader.briefs:
                continue
            size = estimate_text(text)
            if size < self.config.old_result_min_tokens:
                continue
            if names is None:
                names = tool_names(messages)
            call_id = block.get("tool_use_id", "")
            pointer, saved, size = await self.offloader.offload(
                call_id, names.get(call_id, "tool"), text
            )
            self.counter.forget(messages[index])
            replace_block(messages, index, block, {**block, "content": pointer})
            self.offloads += 1
            self.trace.emit(
                Offload(
                    call_id=call_id,
                    path=saved.for_model,
                    tokens=size,
                    reason="over_budget",
                    turn=turn,
                )
            )
            tokens = self.estimate(messages, system, tools)
        if names is not None:
            self.aging.reset()
        return tokens

    async def compact(
        self, messages: list[dict], *, turn: int, system: Any = "", tools: list | None = None
    ) -> int:
        """Summarize and replace ``messages`` in place; returns the new context's tokens."""
        tools = tools or []
        before = self.estimate(messages, system, tools)
        self.compactions += 1
        name = f"compaction-{self.compactions:03d}.jsonl"
        saved = await self.offloader.save("transcripts", name, comp.transcript_jsonl(messages))
        span = f"{self.trace.member}/t{turn}"
        with self.trace.scope(f"{span}/compaction", span, turn):  # the summary call's retries
            summary, response = await comp.summarize(self.model, messages, self.config)
        if response is not None:
            self._trace_summary_call(response, turn)
        trigger = self.limits.trigger
        files = await comp.reread_files(
            self.sandbox,
            list(reversed(self.files_written))[: self.config.reread_files],
            per_file=self.config.reread_file_tokens,
            total=min(self.config.reread_total_tokens, int(trigger * 0.3)),
        )
        new = comp.build_context(
            task=self.task,
            memory=await self._current_memory(),
            summary=summary,
            transcript_path=saved.for_model,
            number=self.compactions,
            how_to_read=saved.how_to_read or "It is outside your sandbox: you cannot read it.",
            todos=self.todos.render() if self.todos and self.todos.items else "",
            files=files,
        )
        messages[:] = new
        self.counter.reset()
        self.aging.reset()
        if self.todos is not None:
            # The list is in the new context already: count from here.
            self.todos.recitals = []
            self.todos.changed = False
            self.todos.last_recited_turn = turn
        after = self.estimate(messages, system, tools)
        self.trace.emit(
            Compaction(
                tokens_before=before,
                tokens_after=after,
                summary=summary,
                transcript_path=saved.for_model,
                turn=turn,
            )
        )
        return after

    def _trace_summary_call(self, response: ModelResponse, turn: int) -> None:
        """The summary call costs tokens like any other: trace it and count it."""
        usage = response.message.usage
        self.summary_usage.append(usage)
        span = f"{self.trace.member}/t{turn}"
        self.trace.emit(
            ModelCall(
                span=f"{span}/compaction",
                parent=span,
                turn=turn,
                model=response.message.model or self.model.profile.name,
                stop_reason=response.message.stop_reason,
                input_tokens=usage.input_tokens or 0,
                output_tokens=usage.output_tokens or 0,
                cache_read_tokens=usage.cache_read_input_tokens or 0,
                cache_write_tokens=usage.cache_creation_input_tokens or 0,
                latency_s=round(response.latency_s, 4),
                retries=response.retries,
                offline=response.offline,
                # The summary's words, so replay:<trace> gives the same summary back.
                content=[
                    b.model_dump(mode="json", exclude_none=True) for b in response.message.content
                ],
                **answered_by(response),
            )
        )

    async def _current_memory(self) -> str:
        if self.memory is None:
            return ""
        body = await anyio.to_thread.run_sync(self.memory.load_body)
        if not body.strip():
            return ""
        text, note = cap_text(body, self.config.memory_max_lines, self.config.memory_max_bytes)
        return wrap_memory(text, note)

    def _note_server_compaction(self, messages: list[dict], turn: int) -> None:
        """Trace a compaction the API did (server-side passthrough), once per block."""
        if self.config.server_side != "compact" or len(messages) < 2:
            return
        content = messages[-2].get("content")
        if not isinstance(content, list):
            return
        for block in content:
            if isinstance(block, dict) and block.get("type") == "compaction":
                if id(block) in self._server_compactions_seen:
                    continue
                self._server_compactions_seen.add(id(block))
                self.trace.emit(
                    Compaction(
                        tokens_before=0,
                        tokens_after=self.estimate(messages, "", []),
                        summary=str(block.get("content", ""))[:4_000],
                        transcript_path="",
                        server_side=True,
                        turn=turn,
                    )
                )

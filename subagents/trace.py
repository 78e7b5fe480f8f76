"""Per-member traces: typed, append-only JSONL events.

Each member writes ``trace.jsonl`` in its run subdirectory. Events carry span ids
(run > member > turn > call) so a viewer can rebuild the tree, and each turn
records only its *new* messages (deltas, never the whole context again), so a
trace grows linearly with turns. Every event is a pydantic model with a ``type``
discriminator; :func:`read_trace` parses a file back into those models.

Every event carries its span ids, including events emitted by code that does not
know where in the member it runs (the model adapter's retries, the context
mechanisms, the coordinator's sandbox events): the loop opens a
:meth:`TraceWriter.scope` for each turn, model call and tool call, and
:meth:`TraceWriter.emit` fills an event's empty ``span``/``parent``/``turn`` from
the innermost scope - or, outside every scope, with the member span (parent: the
run). A context variable carries the scope, so concurrent tool calls (each its own
task) never see each other's.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic_core import PydanticSerializationError


class TokenCounts(BaseModel):
    """The four token counts of one model call or of a sum of them, as the Messages
    API's ``usage`` reports them; one declaration for every event and view that
    carries them."""

    input_tokens: int = 0
    """Uncached input tokens."""
    output_tokens: int = 0
    cache_read_tokens: int = 0
    """Input tokens read from the prompt cache."""
    cache_write_tokens: int = 0
    """Input tokens written to the prompt cache."""


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ts: float = Field(default_factory=time.time)
    """Unix time the event was written."""
    run: str = ""
    member: str = ""
    span: str = ""
    """This event's span id (``<member>/t<turn>`` or ``<member>/t<turn>/<call id>``)."""
    parent: str = ""
    """The enclosing span id."""
    turn: int = 0
    """Turn number (0 before the first model call)."""


class MemberStart(_Event):
    type: Literal["member_start"] = "member_start"
    kind: str
    task: str
    model: str
    offline: bool = False
    config: dict[str, Any] = Field(default_factory=dict)


class MemberEnd(_Event, TokenCounts):
    type: Literal["member_end"] = "member_end"
    status: str
    """ok, failed, timed_out, crashed, cancelled or incomplete."""
    reason: str = ""
    turns: int = 0
    cost_usd: float = 0.0
    duration_s: float = 0.0
    result: dict[str, Any] | None = None
    partial_result: dict[str, Any] | None = None
    """``incomplete`` members: what the closing call submitted (not an answer)."""
    limit: str | None = None
    """Which limit ended an ``incomplete`` member (turns, tokens, deadline, no_result)."""
    offline: bool = False
    """An offline model (replay, offline policy) produced this member's outcome."""


class Messages(_Event):
    """New messages appended to the context this turn (deltas only)."""

    type: Literal["messages"] = "messages"
    messages: list[dict[str, Any]]


class ModelCall(_Event, TokenCounts):
    type: Literal["model_call"] = "model_call"
    model: str
    """The model that answered, as the response names it (``claude-sonnet-4-6-20260301``)."""
    request_model: str = ""
    """The model the request named (``claude-sonnet-4-6``); empty in older traces."""
    max_tokens: int = 0
    """The request's output token limit; 0 when not recorded."""
    stream: bool | None = None
    """Whether the answer was streamed; None when not recorded."""
    stop_reason: str | None = None
    context_tokens: int = 0
    """Tokens in the context sent (API usage when known, else the local estimate)."""
    latency_s: float = 0.0
    retries: int = 0
    offline: bool = False
    content: list[dict[str, Any]] = Field(default_factory=list)
    """The response content blocks (text, tool_use)."""
    response_id: str = ""
    """The response message's id (``msg_...``)."""
    server_address: str = ""
    """Host that answered (empty for offline models)."""
    server_port: int = 0
    closing: bool = False
    """The closing call after a limit (:mod:`subagents.loop.closing`): a model call, but not
    one of the member's ``max_turns`` turns, so views do not count it as one."""


class Prompt(_Event):
    """What the model is told besides the messages, once per member at its start: the
    system prompt and the tool definitions (the same for every call of the member)."""

    type: Literal["prompt"] = "prompt"
    system: str
    tools: list[dict[str, Any]] = Field(default_factory=list)


class ToolCall(_Event):
    type: Literal["tool_call"] = "tool_call"
    call_id: str
    tool: str
    input: dict[str, Any]


class ToolResult(_Event):
    type: Literal["tool_result"] = "tool_result"
    call_id: str
    tool: str
    is_error: bool = False
    duration_s: float = 0.0
    output: str = ""
    """The result text as the model saw it (after offloading), truncated for the trace."""
    output_chars: int = 0
    truncated: bool = False
    offloaded: str | None = None
    """Path of the offloaded full result, when it was offloaded."""


class Offload(_Event):
    type: Literal["offload"] = "offload"
    call_id: str = ""
    path: str
    """Where the full content lives (in the box and the run directory)."""
    tokens: int
    reason: Literal["large_result", "over_budget", "aged"] = "large_result"


class Clip(_Event):
    type: Literal["clip"] = "clip"
    call_ids: list[str]
    tokens_saved: int


class Compaction(_Event):
    type: Literal["compaction"] = "compaction"
    tokens_before: int
    tokens_after: int
    summary: str
    transcript_path: str
    server_side: bool = False


class Todos(_Event):
    type: Literal["todos"] = "todos"
    todos: list[dict[str, Any]]
    recited: bool = False


class MemoryWrite(_Event):
    type: Literal["memory_write"] = "memory_write"
    command: str
    path: str


class MemoryFileSave(BaseModel):
    """What a memory save did with one file of the profile."""

    model_config = ConfigDict(extra="forbid")

    path: str
    """Relative to the profile directory (``notes.md``)."""
    action: Literal["written", "merged", "deleted", "renamed", "unchanged", "conflict", "refused"]
    """written/deleted: nobody else had changed the file since the member loaded it;
    merged: others had, and both sides' changes were combined; renamed: the member's
    rename (its new name is saved as its own entry); unchanged: the profile already
    held this version; conflict: both changed the same lines (or one deleted what the
    other edited) - both kept, see ``detail``; refused: the path leads out of the
    profile."""
    detail: str = ""
    merged_with: list[str] = Field(default_factory=list)
    """Who saved this file since the member loaded it (``member (run RUN)``)."""


class MemorySave(_Event):
    """A member's memory changes applied to its profile (at the end of an attempt)."""

    type: Literal["memory_save"] = "memory_save"
    profile: str
    """The profile directory on the host."""
    key: str
    """This attempt's save key (``run/member/token``); a key already in the profile's
    ledger is not applied again."""
    files: list[MemoryFileSave] = Field(default_factory=list)
    already_saved: bool = False
    """The profile's ledger already held this key: nothing was applied twice."""
    error: str = ""
    """The save failed (e.g. the profile stayed locked); ``files`` were not saved and
    remain in the member's working copy (``members/<id>/memory/``)."""

    @property
    def conflicts(self) -> list[MemoryFileSave]:
        return [f for f in self.files if f.action == "conflict"]


class SandboxEvent(_Event):
    type: Literal["sandbox"] = "sandbox"
    action: str
    """create, exec, read_file, write_file, close, crashed, ..."""
    box: str = ""
    detail: dict[str, Any] = Field(default_factory=dict)
    duration_s: float = 0.0


class Retry(_Event):
    type: Literal["retry"] = "retry"
    what: str
    attempt: int
    reason: str
    delay_s: float = 0.0


class Resumed(_Event):
    """A member went on from its durable transcript instead of turn 0: ``turn`` is
    its last completed turn (the next model call is turn + 1)."""

    type: Literal["resumed"] = "resumed"
    pending_tools: int = 0
    """Tool calls of the last answer that had not completed: answered as interrupted."""
    restored: str = ""
    """What of the box was restored, in words (the workspace as of turn N, the page)."""


def resumed_text(ev: Resumed) -> str:
    """A resume in words, for a person."""
    text = f"resumed from turn {ev.turn}"
    if ev.restored:
        text += f": {ev.restored}"
    if ev.pending_tools:
        text += f"; {ev.pending_tools} interrupted tool call(s) answered as not run"
    return text


class RateWait(_Event):
    """A model call waited for the run's rate governor before going out (the account's
    per-minute limits, a 429/529 pause, or the adaptive limit on calls in flight)."""

    type: Literal["rate_wait"] = "rate_wait"
    waited_s: float = 0.0
    """How long the call waited; 0 on the event that says a wait has begun."""
    expected_s: float = 0.0
    """On the event that says a wait has begun: how long the governor expects it to be."""
    reason: str = ""


class PolicyDecision(_Event):
    """A tool call the member's policy decided by a rule (or a default other than
    allow): denied, asked (with who answered and how long it waited) or allowed."""

    type: Literal["policy"] = "policy"
    call_id: str
    tool: str
    input: dict[str, Any] = Field(default_factory=dict)
    action: str
    """The policy's word: allow, ask or deny."""
    rule: str = ""
    """The rule that matched; "" for the policy's default."""
    allowed: bool
    by: str = "rule"
    """rule, terminal, fleet approve, always, approve-all, timeout, no terminal, ..."""
    always: bool = False
    """The answer was "always" for this rule (the rest of the run asks no more)."""
    waited_s: float = 0.0

    def summary(self) -> str:
        """One line for a person: what the policy said and who decided."""
        rule = f"rule {self.rule!r}" if self.rule else f"default {self.action!r}"
        verdict = "allowed" if self.allowed else "refused"
        who = "" if self.by == "rule" else f" by {self.by}" + (" (always)" if self.always else "")
        waited = f" after {self.waited_s:.1f}s" if self.action == "ask" else ""
        return f"{self.tool} {verdict} ({self.action}, {rule}){who}{waited}"


class ErrorEvent(_Event):
    type: Literal["error"] = "error"
    error: str
    message: str
    model: str = ""
    """Set when a model call failed for good: the model the request named (``error`` is
    then the API's error type, ``invalid_request_error``)."""
    status: int = 0
    """The failed model call's HTTP status (0: none, or no answer came)."""
    latency_s: float = 0.0
    """How long the failed model call took, retries included."""


class ModelSwitch(_Event):
    """The member's model stayed overloaded; it goes on with its fallback from here
    (:mod:`subagents.model.fallback`)."""

    type: Literal["model_switch"] = "model_switch"
    model: str
    to: str
    reason: str = ""


class AttemptsChosen(_Event):
    """A coding member with parallel attempts: which attempt's patch became the member's
    (:mod:`coordinator.attempts`), once all of them ended."""

    type: Literal["attempts_chosen"] = "attempts_chosen"
    attempt: int | None
    """The chosen attempt; None: none could be chosen."""
    by: str
    """``only``, ``reviewer``, ``rule`` or ``none``."""
    reason: str = ""
    candidates: list[int] = Field(default_factory=list)
    """The attempts that could be chosen (ok, a patch, the test passed)."""


class Screenshot(_Event):
    type: Literal["screenshot"] = "screenshot"
    path: str
    url: str = ""


TraceEvent = Annotated[
    MemberStart
    | MemberEnd
    | Messages
    | Prompt
    | ModelCall
    | ToolCall
    | ToolResult
    | Offload
    | Clip
    | Compaction
    | Todos
    | MemoryWrite
    | MemorySave
    | SandboxEvent
    | Retry
    | Resumed
    | RateWait
    | PolicyDecision
    | ErrorEvent
    | Screenshot
    | AttemptsChosen
    | ModelSwitch,
    Field(discriminator="type"),
]
_ADAPTER: TypeAdapter[Any] = TypeAdapter(TraceEvent)
_SCOPE: ContextVar[tuple[Any, str, str, int] | None] = ContextVar("fleet_trace_scope", default=None)
"""(writer, span, parent, turn) of the innermost open scope in this task."""


class TraceWriter:
    """Appends events to one member's ``trace.jsonl``; fills run/member ids."""

    def __init__(self, path: Path, *, run: str, member: str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.run = run
        self.member = member
        self._fh = self.path.open("a", encoding="utf-8")
        self.listeners: list[Any] = []
        """Callables invoked with each event (live progress, OpenTelemetry)."""

    @contextmanager
    def scope(self, span: str, parent: str, turn: int) -> Iterator[None]:
        """Events emitted inside (in this task and tasks it starts) without span ids
        get these; the innermost scope wins."""
        token = _SCOPE.set((self, span, parent, turn))
        try:
            yield
        finally:
            _SCOPE.reset(token)

    def emit(self, event: _Event) -> None:
        if not event.run:
            event.run = self.run
        if not event.member:
            event.member = self.member
        if not event.span:
            scope = _SCOPE.get()
            if scope is not None and scope[0] is self:
                _, event.span, parent, turn = scope
                event.parent = event.parent or parent
                event.turn = event.turn or turn
            else:
                event.span = self.member
        if not event.parent and event.span == self.member:
            event.parent = self.run
        self._fh.write(_line(event) + "\n")
        self._fh.flush()
        for listener in self.listeners:
            listener(event)

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()


_SURROGATE = re.compile("[\ud800-\udfff]")


def no_lone_surrogates(text: str) -> str:
    """``text`` with each lone surrogate (which UTF-8 cannot encode) made U+FFFD; the
    model's text and tools' output pass through it before any record or request."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def _line(event: _Event) -> str:
    """The event as one JSON line. A lone surrogate - a model can write one as a
    ``\\ud800`` escape, a file's undecodable bytes become them - cannot be encoded as
    UTF-8: such an event is written with every non-ASCII character escaped instead,
    which reads back to the same text, rather than failing the member."""
    try:
        return event.model_dump_json(exclude_none=True)
    except PydanticSerializationError:
        return json.dumps(event.model_dump(mode="json", exclude_none=True), ensure_ascii=True)


def read_trace(path: Path) -> Iterator[Any]:
    """Parse a ``trace.jsonl`` back into events; a torn last line is skipped."""
    with Path(path).open(encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                yield _ADAPTER.validate_python(json.loads(line))
            except (ValueError, RecursionError):  # not an event (or nested past the stack)
                continue

"""A member turn by turn: model calls, tool calls with results, and marks.

Marks are the events that change the context or the member's fate without being a
call: offloads, clips, compactions, todo recitations, screenshots, retries, errors,
memory writes and sandbox actions. Long contents are cut to ``limit`` characters and
carry ``ref`` = ``members/<id>/trace.jsonl:<line>`` (or the offloaded file's path),
so every view can say where the full text is without copying it.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from coordinator.traceview.load import MemberTrace
from coordinator.traceview.rollup import (
    MemberRollup,
    clip_text,
    compact_json,
    rollup_member,
    split_attempts,
)
from subagents.trace import (
    Clip,
    Compaction,
    ErrorEvent,
    MemberEnd,
    MemberStart,
    MemoryFileSave,
    MemorySave,
    MemoryWrite,
    Messages,
    ModelCall,
    Offload,
    PolicyDecision,
    Prompt,
    Resumed,
    Retry,
    SandboxEvent,
    Screenshot,
    Todos,
    TokenCounts,
    ToolCall,
    ToolResult,
    resumed_text,
)


class _View(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelCallView(_View, TokenCounts):
    """One model call of a turn."""

    model: str
    start: float
    end: float
    stop_reason: str | None = None
    context_tokens: int = 0
    retries: int = 0
    text: str = ""
    """The response's text blocks, joined (cut to the limit)."""
    truncated: bool = False
    tool_uses: list[str] = Field(default_factory=list)
    ref: str = ""


class ToolView(_View):
    """A tool call and its result (when it came back)."""

    call_id: str
    tool: str
    start: float
    end: float | None = None
    input: str = ""
    """The input as compact JSON (cut to the limit)."""
    output: str = ""
    output_chars: int = 0
    """Length of the result the model saw, before cutting."""
    truncated: bool = False
    is_error: bool = False
    offloaded: str | None = None
    ref: str = ""
    """Where the full result is: the offloaded file, else the result's trace line."""
    input_ref: str = ""
    """The trace line of the call, where the full input is."""
    input_truncated: bool = False


class Mark(_View):
    """A non-call event: offload, clip, compaction, todos, screenshot, retry, error, ..."""

    kind: str
    ts: float
    text: str = ""
    path: str = ""
    """A file (offloaded result, transcript, screenshot) relative to the run directory."""
    tokens_before: int = 0
    tokens_after: int = 0
    summary: str = ""
    truncated: bool = False
    ref: str = ""


class TurnView(_View):
    """Everything that happened in one turn."""

    turn: int
    attempt: int = 1
    """Which attempt of the member (a retried member counts its turns from 1 again)."""
    start: float
    end: float
    model_calls: list[ModelCallView] = Field(default_factory=list)
    tools: list[ToolView] = Field(default_factory=list)
    marks: list[Mark] = Field(default_factory=list)
    closing: bool = False
    """The closing call after a limit, not one of the member's turns."""


class PageView(_View):
    """A page text a browser member fetched (a line of its ``pages/index.jsonl``)."""

    n: int = 0
    url: str = ""
    title: str = ""
    chars: int = 0
    ts: float = 0.0
    path: str = ""
    """The page text, relative to the run directory."""


class FileView(_View):
    """A file the member left in its directory (patch, transcript, offload, memory, ...)."""

    path: str
    """Relative to the run directory."""
    bytes: int


class MemorySaveView(_View):
    """A memory save at the end of an attempt: what it did per file, its conflicts."""

    attempt: int = 1
    ts: float
    profile: str
    files: list[MemoryFileSave] = Field(default_factory=list)
    already_saved: bool = False
    error: str = ""
    ref: str = ""


class MemberDetail(_View):
    """One member: its rollup, task, turns and final result."""

    rollup: MemberRollup
    task: str = ""
    config: dict[str, Any] = Field(default_factory=dict)
    preamble: list[Mark] = Field(default_factory=list)
    """Marks before the first model call (sandbox creation, memory loading)."""
    turns: list[TurnView] = Field(default_factory=list)
    result: dict[str, Any] | None = None
    partial: str = ""
    """Where ``result`` came from when it is not a finished answer: ``partial_result``
    (what an incomplete or timed-out member submitted in its closing call) or
    ``progress`` (what the harness recorded it did, when it submitted nothing)."""
    dir: str = ""
    """The member directory, relative to the run directory."""
    pages: list[PageView] = Field(default_factory=list)
    """Pages a browser member fetched, in fetch order."""
    memory_saves: list[MemorySaveView] = Field(default_factory=list)
    """Its memory saves (one per attempt that changed memory), in order."""
    files: list[FileView] = Field(default_factory=list)
    """Other files in the member directory (at most :data:`MAX_FILES`), pages and
    screenshots excepted (those are listed with their context)."""
    system: str = ""
    """The system prompt it was given (its first ``prompt`` event), cut to the limit."""
    tools: list[str] = Field(default_factory=list)
    """The names of the tools it was offered."""
    first: str = ""
    """Its first message (the task, its inputs, loaded memory), cut to the limit."""
    first_ref: str = ""
    """Where the first message is in full (``<dir>/trace.jsonl:<line>``)."""
    first_cut: bool = False
    """The first message was cut to the limit."""


MAX_FILES = 60
"""Files listed per member: enough for patches, transcripts and offloads, bounded so a
member that wrote thousands of offloads does not bloat the page."""


_MEMBER_SUBDIRS = ("offloads", "transcripts", "screenshots", "pages", "memory")


def member_file(prefix: str, path: str) -> str:
    """``path`` as the trace records it, made relative to the run directory.

    The harness records the path the *model* was given: the box copy
    (``/tmp/fleet/offloads/003_read.txt``) when the box took it, else the host copy.
    Both have a run-directory twin ``members/<id>/<subdir>/<name>``, which is the one
    a person (or ``fleet view``) can open; a path already relative to the member
    directory is kept as is.
    """
    if not path:
        return ""
    parts = path.replace("\\", "/").split("/")
    if not path.startswith("/"):
        return f"{prefix}/{path}"
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] in _MEMBER_SUBDIRS:
            return f"{prefix}/" + "/".join(parts[i:])
    return path


def _pages(member: MemberTrace, prefix: str) -> list[PageView]:
    try:
        lines = (member.dir / "pages" / "index.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line while the member is still writing
        if not isinstance(rec, dict) or not isinstance(rec.get("path"), str):
            continue
        out.append(PageView(
            n=int(rec.get("n") or 0), url=str(rec.get("url") or ""),
            title=str(rec.get("title") or ""), chars=int(rec.get("chars") or 0),
            ts=float(rec.get("ts") or 0.0), path=f"{prefix}/pages/{rec['path']}",
        ))  # fmt: skip
    return out


def _files(member: MemberTrace, prefix: str) -> list[FileView]:
    skip = {"pages", "screenshots"}
    found: list[FileView] = []
    try:
        paths = sorted(member.dir.rglob("*"))
    except OSError:
        return found
    for path in paths:
        rel = path.relative_to(member.dir)
        if rel.parts[0] in skip:
            continue
        try:
            if not path.is_file():
                continue
            size = path.stat().st_size
        except OSError:
            continue
        found.append(FileView(path=f"{prefix}/{rel.as_posix()}", bytes=size))
        if len(found) >= MAX_FILES:
            break
    return found


def _mark(ev: Any, ref: str, limit: int, prefix: str) -> Mark | None:
    if isinstance(ev, Offload):
        text = f"{ev.tokens} tokens ({ev.reason}) -> {ev.path}"
        return Mark(kind="offload", ts=ev.ts, text=text, path=member_file(prefix, ev.path), ref=ref)
    if isinstance(ev, Compaction):
        summary, cut = clip_text(ev.summary, limit)
        side = " (server-side)" if ev.server_side else ""
        text = f"{ev.tokens_before} -> {ev.tokens_after} tokens{side}"
        return Mark(kind="compaction", ts=ev.ts, text=text,
                    path=member_file(prefix, ev.transcript_path),
                    tokens_before=ev.tokens_before, tokens_after=ev.tokens_after,
                    summary=summary, truncated=cut, ref=ref)  # fmt: skip
    if isinstance(ev, Clip):
        text = f"{len(ev.call_ids)} old tool inputs clipped, {ev.tokens_saved} tokens saved"
        return Mark(kind="clip", ts=ev.ts, text=text, ref=ref)
    if isinstance(ev, Screenshot):
        return Mark(kind="screenshot", ts=ev.ts, text=ev.url, path=member_file(prefix, ev.path),
                    ref=ref)  # fmt: skip
    if isinstance(ev, Todos):
        done = sum(1 for t in ev.todos if t.get("status") == "completed")
        text = f"{done}/{len(ev.todos)} done" + (", recited" if ev.recited else "")
        return Mark(
            kind="todos", ts=ev.ts, text=text, summary=compact_json(ev.todos)[:limit], ref=ref
        )
    if isinstance(ev, Resumed):
        return Mark(kind="resumed", ts=ev.ts, text=resumed_text(ev)[:limit], ref=ref)
    if isinstance(ev, Retry):
        text = f"{ev.what} attempt {ev.attempt}: {ev.reason}"
        return Mark(kind="retry", ts=ev.ts, text=text, ref=ref)
    if isinstance(ev, ErrorEvent):
        return Mark(kind="error", ts=ev.ts, text=f"{ev.error}: {ev.message}"[:limit], ref=ref)
    if isinstance(ev, PolicyDecision):
        return Mark(kind="policy", ts=ev.ts, text=ev.summary()[:limit], ref=ref)
    if isinstance(ev, MemoryWrite):
        return Mark(kind="memory", ts=ev.ts, text=ev.command, path=member_file(prefix, ev.path),
                    ref=ref)  # fmt: skip
    if isinstance(ev, SandboxEvent) and ev.action in ("setup", "setup_start"):
        return Mark(kind="sandbox", ts=ev.ts, text=setup_text(ev)[:limit], ref=ref)
    if isinstance(ev, SandboxEvent):
        return Mark(kind="sandbox", ts=ev.ts, text=f"{ev.action} {ev.box}".strip(), ref=ref)
    return None


def _model_view(ev: ModelCall, ref: str, limit: int) -> ModelCallView:
    text = "\n".join(b.get("text", "") for b in ev.content if b.get("type") == "text")
    text, cut = clip_text(text, limit)
    uses = [str(b.get("name", "")) for b in ev.content if b.get("type") == "tool_use"]
    return ModelCallView(
        model=ev.model, start=ev.ts - ev.latency_s, end=ev.ts, stop_reason=ev.stop_reason,
        input_tokens=ev.input_tokens, output_tokens=ev.output_tokens,
        cache_read_tokens=ev.cache_read_tokens, cache_write_tokens=ev.cache_write_tokens,
        context_tokens=ev.context_tokens, retries=ev.retries, text=text, truncated=cut,
        tool_uses=uses, ref=ref,
    )  # fmt: skip


def member_detail(
    member: MemberTrace, *, limit: int = 2_000, rollup: MemberRollup | None = None
) -> MemberDetail:
    """Group a member's events by turn, cutting long contents to ``limit`` characters.

    ``rollup`` is the member's row from :func:`rollup_run` (which also reads the run's
    journal); without it the row is computed from the member's own files.
    """
    prefix = member.rel
    detail = MemberDetail(rollup=rollup or rollup_member(member), dir=prefix)
    outcome = member.result or {}
    if isinstance(outcome.get("result"), dict):
        detail.result = outcome["result"]
    else:
        # An unfinished member's work is still worth reading: what it submitted in its
        # closing call, else what the harness recorded of its progress.
        for key in ("partial_result", "progress"):
            if isinstance(outcome.get(key), dict) and outcome[key]:
                detail.result, detail.partial = outcome[key], key
                break
    turns: dict[tuple[int, int], TurnView] = {}
    calls: dict[str, ToolView] = {}
    cuts = set(split_attempts(member.events))
    attempt = 0
    for i, (ev, line) in enumerate(zip(member.events, member.lines, strict=True)):
        if i in cuts:
            attempt += 1
            calls = {}  # an offline model may reuse call ids in the next attempt
        ref = f"{prefix}/trace.jsonl:{line}"
        if isinstance(ev, MemberStart):
            detail.task, detail.config = ev.task, ev.config
            continue
        if isinstance(ev, MemberEnd):
            if ev.result is not None:
                detail.result, detail.partial = ev.result, ""
            continue
        if isinstance(ev, Prompt):
            if not detail.system:
                detail.system = clip_text(ev.system, limit * 4)[0]
                detail.tools = [str(t.get("name", "")) for t in ev.tools]
            continue
        if isinstance(ev, Messages):
            if not detail.first and ev.messages and ev.messages[0].get("role") == "user":
                detail.first, detail.first_cut = clip_text(_message_text(ev.messages[0]), limit * 4)
                detail.first_ref = ref
            continue  # deltas duplicate the calls and results shown below
        if isinstance(ev, MemorySave):
            detail.memory_saves.append(
                MemorySaveView(
                    attempt=max(attempt, 1), ts=ev.ts, profile=ev.profile, files=ev.files,
                    already_saved=ev.already_saved, error=ev.error, ref=ref,
                )
            )  # fmt: skip
            continue
        if ev.turn <= 0 and not isinstance(ev, ModelCall | ToolCall | ToolResult):
            mark = _mark(ev, ref, limit, prefix)
            if mark is not None:
                detail.preamble.append(mark)
            continue
        view = turns.get((attempt, ev.turn))
        if view is None:
            view = turns[(attempt, ev.turn)] = TurnView(
                turn=ev.turn, attempt=attempt, start=ev.ts, end=ev.ts
            )
        _add_to_turn(view, ev, ref, limit, calls, prefix)
    detail.turns = [turns[k] for k in sorted(turns)]
    detail.pages, detail.files = _pages(member, prefix), _files(member, prefix)
    return detail


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "\n\n".join(
        str(b.get("text", "")) for b in content or [] if isinstance(b, dict) and "text" in b
    )


def _add_to_turn(
    view: TurnView, ev: Any, ref: str, limit: int, calls: dict[str, ToolView], prefix: str
) -> None:
    if isinstance(ev, ModelCall):
        call = _model_view(ev, ref, limit)
        view.model_calls.append(call)
        view.closing = view.closing or ev.closing
        view.start = min(view.start, call.start)
    elif isinstance(ev, ToolCall):
        text, cut = clip_text(compact_json(ev.input), limit)
        tool = ToolView(
            call_id=ev.call_id, tool=ev.tool, start=ev.ts, input=text, ref=ref,
            input_ref=ref, input_truncated=cut,
        )  # fmt: skip
        calls[ev.call_id] = tool
        view.tools.append(tool)
    elif isinstance(ev, ToolResult):
        found = calls.get(ev.call_id)
        if found is None:
            found = ToolView(call_id=ev.call_id, tool=ev.tool, start=ev.ts - ev.duration_s)
            view.tools.append(found)
        tool = found
        output, cut = clip_text(ev.output, limit)
        tool.end, tool.output, tool.output_chars = ev.ts, output, ev.output_chars or len(ev.output)
        tool.is_error, tool.offloaded = ev.is_error, ev.offloaded
        tool.truncated = cut or ev.truncated
        # The full text lives in the offloaded file when there is one, else in the trace line.
        tool.ref = member_file(prefix, ev.offloaded) if ev.offloaded else ref
    else:
        mark = _mark(ev, ref, limit, prefix)
        if mark is not None:
            view.marks.append(mark)
    view.end = max(view.end, ev.ts)


def setup_text(ev: SandboxEvent) -> str:
    """A repository setup's event in words: waited for, made, reused or failed."""
    if ev.action == "setup_start":
        return "SETUP waiting on the repository's setup"
    d = ev.detail
    if not d.get("ok"):
        return f"SETUP failed after {ev.duration_s:.1f}s: {d.get('reason', '')}"
    how = "reused the prepared snapshot" if d.get("reused") else "made the prepared snapshot"
    return f"SETUP {how} {d.get('key', '')} in {ev.duration_s:.1f}s"

"""Plain-text views for the terminal: the run table, a member's turns, live event lines."""

from __future__ import annotations

import time
from typing import Any

from coordinator.report.report import memory_lines
from coordinator.traceview.detail import (
    MemberDetail,
    MemorySaveView,
    ToolView,
    TurnView,
    setup_text,
)
from coordinator.traceview.rollup import MemberRollup, RunRollup, compact_json
from subagents.trace import (
    Compaction,
    ErrorEvent,
    MemberEnd,
    MemberStart,
    MemorySave,
    Messages,
    ModelCall,
    Offload,
    PolicyDecision,
    RateWait,
    Resumed,
    SandboxEvent,
    Screenshot,
    ToolCall,
    ToolResult,
    resumed_text,
)


def human_tokens(n: float) -> str:
    if n >= 1_000_000:
        return f"{n / 1e6:.1f}M"
    if n >= 1_000:
        return f"{n / 1e3:.1f}k"
    return str(int(n))


def human_duration(s: float) -> str:
    if s >= 3600:
        return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    if s >= 60:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{s:.1f}s"


def one_line(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _full(text: str, width: int, ref: str, cut: bool = False) -> str:
    """``text`` on one line, and where the whole of it is whenever any of it is not
    shown: cut here for the terminal's width, or earlier by ``--limit`` (``cut``)."""
    shown = one_line(text, width)
    if (cut or shown.endswith("…")) and ref:
        shown += f"  [full: {ref}]"
    return shown


_COLUMNS = ("MEMBER", "KIND", "STATUS", "ATT", "WALL", "BOX", "TURNS", "IN", "CACHED", "OUT",
            "TOOLS", "ERR", "OFFL", "COMP", "COST", "REASON")  # fmt: skip


def _row(r: MemberRollup, nodes: bool, waves: bool) -> list[str]:
    cost = f"${r.cost_usd:.3f}" + ("*" if r.cost_estimated else "")
    wave = "lead" if r.kind == "lead" else str(r.wave or "-")
    return [
        r.member, *([wave] if waves else []), *([r.node or "-"] if nodes else []), r.kind, r.status, str(r.attempts),
        human_duration(r.duration_s),
        human_duration(r.box_s), str(r.turns),
        human_tokens(r.total_input), human_tokens(r.cache_read_tokens),
        human_tokens(r.output_tokens), str(r.tool_calls), str(r.errors), str(r.offloads),
        str(r.compactions), cost, one_line(r.reason, 60),
    ]  # fmt: skip


def _who(roll: RunRollup) -> str:
    """``3 members``, or ``a lead and 3 members`` for a lead run."""
    tries = sum(1 for r in roll.members if r.attempt_of is not None)
    members = sum(1 for r in roll.members if r.kind != "lead" and r.attempt_of is None)
    lead = "a lead and " if any(r.kind == "lead" for r in roll.members) else ""
    said = f"{lead}{members} member{'' if members == 1 else 's'}"
    return said + (f", {tries} parallel attempts" if tries else "")


def setup_lines(roll: RunRollup) -> list[str]:
    """One line per repository setup: its key, what came of it, for whom, its log."""
    out = []
    for su in roll.setups:
        key = su.key or "(key not recorded)"
        who = ", ".join(su.members)
        if su.status == "made":
            what = f"ran in {human_duration(su.duration_s)} (by {su.ran_by})"
        elif su.status == "reused":
            what = "reused a prepared snapshot"
        elif su.status == "failed":
            what = f"FAILED after {human_duration(su.duration_s)}: {one_line(su.reason, 200)}"
        else:
            what = "running"
        out.append(f"{key}  {what}  for {who}" + (f"  log {su.log}" if su.log else ""))
    return out


def format_run(roll: RunRollup) -> str:
    """The run table: a header line, one row per member, and a legend."""
    t = roll.totals
    statuses = ", ".join(f"{n} {s}" for s, n in sorted(roll.statuses.items()))
    total_in = (
        t.get("input_tokens", 0) + t.get("cache_read_tokens", 0) + t.get("cache_write_tokens", 0)
    )
    head = (
        f"run {roll.run}  {'finished' if roll.finished else 'RUNNING'}  "
        f"{_who(roll)} ({statuses or 'none yet'})  wall {human_duration(roll.duration_s)}  "
        f"(boxes {human_duration(t.get('box_s', 0))})  "
        f"in {human_tokens(total_in)} (cached {human_tokens(t.get('cache_read_tokens', 0))})  "
        f"out {human_tokens(t.get('output_tokens', 0))}  cost ${t.get('cost_usd', 0):.3f}"
    )
    # NODE only for a run on a cluster: where each member's last attempt ran.
    nodes = any(r.node for r in roll.members)
    # WAVE only for a lead run: which of the lead's spawn calls started each member.
    waves = any(r.wave for r in roll.members)
    columns = [_COLUMNS[0], *(["WAVE"] if waves else []), *(["NODE"] if nodes else []),
               *_COLUMNS[1:]]  # fmt: skip
    rows = [columns, *(_row(r, nodes, waves) for r in roll.members)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = [head, ""]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    if roll.setups:
        lines += ["", "repository setups (one per key; members waited on them):"]
        lines += [f"  {line}" for line in setup_lines(roll)]
    waited = [r for r in roll.members if r.rate_wait_s >= 0.1]
    if waited:
        lines += ["", "waited for the API's rate limits (429/529 pauses, per-minute limits):"]
        lines += [f"  {r.member}  {human_duration(r.rate_wait_s)}" for r in waited]
    if roll.memory:
        lines += ["", "memory conflicts (both versions kept in the file, between markers):"]
        lines += [f"  {line}" for line in memory_lines(roll.memory)]
    lines.append("")
    lines.append(
        "ATT = attempts; WALL = from the member's first box starting to its last event "
        "(box start-up, every attempt and back-off included); BOX = the box start-up it "
        "waited for (a box started while its setup ran: only the setup's tree laid in it); "
        "IN counts every input token (uncached + cache read + cache write); * = estimated cost."
        + (" NODE = the cluster node the member's last attempt ran on." if nodes else "")
        + (" WAVE = the lead's spawn call that started the member." if waves else "")
    )
    return "\n".join(lines)


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def _tool_lines(tool: ToolView, width: int) -> list[str]:
    dur = f" {tool.end - tool.start:.1f}s" if tool.end is not None else " (no result)"
    shown = _full(tool.input, width - 20, tool.input_ref, tool.input_truncated)
    lines = [f"    -> {tool.tool} {shown}{dur}"]
    if tool.end is not None:
        state = "ERROR" if tool.is_error else "ok"
        cut = tool.truncated or bool(tool.offloaded)
        lines.append(
            f"       <- {state} {tool.output_chars} chars: "
            + _full(tool.output, width - 40, tool.ref, cut)
        )
    return lines


def _turn_lines(turn: TurnView, width: int) -> list[str]:
    name = "closing call (after a limit)" if turn.closing else f"turn {turn.turn}"
    lines = [f"{name}  {_clock(turn.start)}  {human_duration(turn.end - turn.start)}"]
    for call in turn.model_calls:
        total_in = call.input_tokens + call.cache_read_tokens + call.cache_write_tokens
        lines.append(
            f"  model {call.model} {call.end - call.start:.1f}s  ctx {human_tokens(call.context_tokens)}  "
            f"in {human_tokens(total_in)} (cached {human_tokens(call.cache_read_tokens)})  "
            f"out {human_tokens(call.output_tokens)}  stop {call.stop_reason}"
        )
        if call.text:
            lines.append(f"    says: {_full(call.text, width - 10, call.ref, call.truncated)}")
    for tool in turn.tools:
        lines.extend(_tool_lines(tool, width))
    for mark in turn.marks:
        if mark.kind in ("sandbox", "todos"):
            continue
        path = f"  [{mark.path}]" if mark.path else ""
        lines.append(f"  [{mark.kind.upper()}] {one_line(mark.text, width - 30)}{path}")
        if mark.kind == "compaction" and mark.summary:
            lines.append(f"    summary: {one_line(mark.summary, width - 14)}")
    return lines


def _attempt_lines(r: MemberRollup) -> list[str]:
    """One line per attempt when the member was retried (the last one is the outcome)."""
    if r.attempts < 2:
        return []
    lines = [f"{r.attempts} attempts:"]
    for a in r.per_attempt:
        why = f": {a.reason}" if a.reason else ""
        lines.append(
            f"  attempt {a.n}  {a.status}{why}  {human_duration(a.duration_s)} "
            f"(box {human_duration(a.box_s)}), {a.turns} turns"
        )
    return [*lines, ""]


def _memory_lines(save: MemorySaveView, attempts: int) -> list[str]:
    """A memory save: where to, then one line per file (what was done, with whom)."""
    when = f" (attempt {save.attempt})" if attempts > 1 else ""
    if save.error:
        return [f"memory NOT saved to {save.profile}{when}: {save.error}"]
    again = ": already saved by this attempt, nothing applied again" if save.already_saved else ""
    lines = [f"memory saved to {save.profile}{when}{again}"]
    for f in save.files:
        with_ = f" with {', '.join(f.merged_with)}" if f.merged_with else ""
        why = f": {f.detail}" if f.detail else ""
        mark = "CONFLICT" if f.action == "conflict" else f.action
        lines.append(f"  {f.path}  {mark}{with_}{why}")
    return lines


def format_member(detail: MemberDetail, *, width: int = 160) -> str:
    """A member turn by turn, then its final result."""
    r = detail.rollup
    head = f"member {r.member} ({r.kind}, {r.model})  {r.status}"
    if r.reason:
        head += f": {r.reason}"
    lines = [
        head,
        f"task: {one_line(detail.task, width - 6)}",
        f"{r.turns} turns, {r.tool_calls} tool calls, {r.errors} errors, {r.offloads} offloads, "
        f"{r.compactions} compactions, wall {human_duration(r.duration_s)} "
        f"(box start-up {human_duration(r.box_s)}), ${r.cost_usd:.3f}",
        "",
    ]
    if r.setup_s:
        lines.insert(-1, f"waited {human_duration(r.setup_s)} on the repository's setup")
    if r.rate_wait_s:
        lines.insert(-1, f"waited {human_duration(r.rate_wait_s)} for the API's rate limits")
    lines.extend(_attempt_lines(r))
    attempt = 0
    for turn in detail.turns:
        if r.attempts > 1 and turn.attempt != attempt:
            attempt = turn.attempt
            lines.append(f"-- attempt {attempt} --")
        lines.extend(_turn_lines(turn, width))
    lines.append("")
    for save in detail.memory_saves:
        lines.extend(_memory_lines(save, r.attempts))
    if detail.memory_saves:
        lines.append("")
    if detail.result is not None:
        lines.append("result: " + compact_json(detail.result))
    else:
        lines.append("result: none")
    if detail.pages:
        lines.append(f"\npages fetched ({len(detail.pages)}):")
        for page in detail.pages:
            lines.append(
                f"  {page.n:>3}  {page.path}  {page.chars} chars  {one_line(page.url, width - 50)}"
            )
    return "\n".join(lines)


def format_event(member: str, ev: Any, width: int = 160) -> str | None:
    """One line for ``--follow``; None for events not worth a line (message deltas)."""
    if isinstance(ev, Messages):
        return None
    head = f"{_clock(ev.ts)} {member:<8} t{ev.turn:<3} "
    if isinstance(ev, MemberStart):
        body = f"START {ev.kind} {ev.model}: {one_line(ev.task, 80)}"
    elif isinstance(ev, MemberEnd):
        body = (
            f"END {ev.status} {ev.reason}".rstrip()
            + f" ({ev.turns} turns, {human_duration(ev.duration_s)})"
        )
    elif isinstance(ev, ModelCall):
        body = (
            f"model {ev.latency_s:.1f}s ctx {human_tokens(ev.context_tokens)} out {ev.output_tokens} "
            f"stop {ev.stop_reason}"
        )
    elif isinstance(ev, ToolCall):
        body = f"-> {ev.tool} {one_line(compact_json(ev.input), 80)}"
    elif isinstance(ev, ToolResult):
        state = "ERROR" if ev.is_error else "ok"
        body = (
            f"<- {ev.tool} {state} {ev.output_chars or len(ev.output)} chars {ev.duration_s:.1f}s"
        )
    elif isinstance(ev, Offload):
        body = f"OFFLOAD {ev.tokens} tokens -> {ev.path}"
    elif isinstance(ev, Compaction):
        body = f"COMPACTION {ev.tokens_before} -> {ev.tokens_after} tokens"
    elif isinstance(ev, ErrorEvent):
        body = f"ERROR {ev.error}: {ev.message}"
    elif isinstance(ev, PolicyDecision):
        body = f"POLICY {ev.summary()}"
    elif isinstance(ev, MemorySave):
        state = f"NOT saved: {ev.error}" if ev.error else f"saved {len(ev.files)} file(s)"
        conflicts = f", {len(ev.conflicts)} CONFLICT(s)" if ev.conflicts else ""
        body = f"MEMORY {state}{conflicts} -> {ev.profile}"
    elif isinstance(ev, Screenshot):
        body = f"screenshot {ev.path}"
    elif isinstance(ev, Resumed):
        body = f"RESUMED {resumed_text(ev)}"
    elif isinstance(ev, RateWait):
        body = (
            f"RATE waited {ev.waited_s:.1f}s: {ev.reason}"
            if ev.waited_s
            else f"RATE waiting ~{ev.expected_s:.0f}s: {ev.reason}"
        )
    elif isinstance(ev, SandboxEvent) and ev.action in ("setup", "setup_start"):
        body = setup_text(ev)
    elif isinstance(ev, SandboxEvent):
        body = f"box {ev.action}" + (f" {ev.duration_s:.1f}s" if ev.duration_s else "")
    else:
        body = ev.type
    return one_line(head + body, width)

"""From events to views: one rollup row per member, and a member's turn-by-turn detail.

Every number is recomputed from the trace events rather than copied from the
member's end event, so a member that crashed before writing ``member_end`` (or a
run still going) still gets honest counts; the end event only supplies what the
events cannot (status, reason, the harness's own cost figure). Token fields keep
the API's four counters apart; "in" in the views means every input token the
model read (uncached + cache read + cache write), as OpenTelemetry counts it.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from coordinator.traceview.load import MemberTrace, RunTrace
from subagents import profiles
from subagents.model_base import ModelProfile
from subagents.trace import (
    Clip,
    Compaction,
    ErrorEvent,
    MemberEnd,
    MemberStart,
    ModelCall,
    Offload,
    Retry,
    Screenshot,
    ToolCall,
    ToolResult,
)

_DEFAULT_PRICES = ModelProfile(name="default")


def _prices(model: str, offline: bool) -> ModelProfile:
    """The harness's own price table for ``model``; offline models cost nothing.

    Unknown names get the defaults here without :func:`profiles.profile_for`'s
    warning: the run already warned once when it started, the viewer need not.
    """
    if offline:
        return profiles.OFFLINE_PROFILE
    key = model.lower()
    if (
        key == "offline"
        or key.startswith(("offline:", "replay:"))
        or any(key.startswith(prefix) for prefix in profiles.KNOWN_PROFILES)
    ):
        return profiles.profile_for(model)
    return _DEFAULT_PRICES


class _View(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MemberRollup(_View):
    """One member of a run at a glance."""

    member: str
    kind: str = ""
    model: str = ""
    status: str = "running"
    """ok, failed, timed_out, crashed, cancelled, incomplete, or running (no end yet)."""
    reason: str = ""
    start: float = 0.0
    """Unix time of the member's first event."""
    end: float = 0.0
    """Unix time of its last event."""
    duration_s: float = 0.0
    turns: int = 0
    """Model calls made."""
    input_tokens: int = 0
    """Uncached input tokens."""
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    tool_calls: int = 0
    errors: int = 0
    """Tool results flagged as errors plus error events."""
    offloads: int = 0
    compactions: int = 0
    clips: int = 0
    retries: int = 0
    screenshots: int = 0
    context_peak: int = 0
    """Largest context sent to the model, in tokens."""
    cost_usd: float = 0.0
    cost_estimated: bool = False
    """True when the harness recorded no cost and it was priced from the model profile
    (Fleet's default rates for a model it does not know)."""

    @property
    def total_input(self) -> int:
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens


class RunRollup(_View):
    """A run at a glance: one row per member, plus totals."""

    run: str
    finished: bool
    start: float = 0.0
    end: float = 0.0
    duration_s: float = 0.0
    members: list[MemberRollup] = Field(default_factory=list)
    totals: dict[str, float] = Field(default_factory=dict)
    """Sums of the members' counters (tokens, tool calls, errors, cost, ...)."""
    statuses: dict[str, int] = Field(default_factory=dict)


def _estimate_cost(r: MemberRollup, offline: bool) -> float:
    p = _prices(r.model, offline)
    return (
        r.input_tokens * p.input_per_mtok
        + r.output_tokens * p.output_per_mtok
        + r.cache_read_tokens * p.cache_read_per_mtok
        + r.cache_write_tokens * p.cache_write_per_mtok
    ) / 1e6


def rollup_member(
    member: MemberTrace, *, run_finished: bool = True, journal: tuple[str, str] | None = None
) -> MemberRollup:
    """Count one member's events into a rollup row."""
    r = MemberRollup(member=member.id)
    end_event: MemberEnd | None = None
    offline = False
    for ev in member.events:
        if isinstance(ev, ModelCall):
            offline = offline or ev.offline
            r.turns += 1
            r.input_tokens += ev.input_tokens
            r.output_tokens += ev.output_tokens
            r.cache_read_tokens += ev.cache_read_tokens
            r.cache_write_tokens += ev.cache_write_tokens
            r.context_peak = max(r.context_peak, ev.context_tokens)
            r.model = r.model or ev.model
        elif isinstance(ev, ToolCall):
            r.tool_calls += 1
        elif isinstance(ev, ToolResult):
            r.errors += ev.is_error
        elif isinstance(ev, ErrorEvent):
            r.errors += 1
        elif isinstance(ev, Offload):
            r.offloads += 1
        elif isinstance(ev, Compaction):
            r.compactions += 1
        elif isinstance(ev, Clip):
            r.clips += 1
        elif isinstance(ev, Retry):
            r.retries += 1
        elif isinstance(ev, Screenshot):
            r.screenshots += 1
        elif isinstance(ev, MemberStart):
            r.kind, r.model = ev.kind, ev.model
        elif isinstance(ev, MemberEnd):
            end_event = ev
    if member.events:
        r.start = member.events[0].ts
        r.end = max(ev.ts for ev in member.events)
        r.duration_s = round(r.end - r.start, 3)
    _apply_outcome(r, end_event, member.result, run_finished, journal)
    if not r.cost_usd:
        r.cost_usd, r.cost_estimated = (
            round(_estimate_cost(r, offline), 6),
            r.turns > 0 and not offline,
        )
    return r


def _apply_outcome(
    r: MemberRollup,
    end: MemberEnd | None,
    result: dict[str, Any] | None,
    run_finished: bool,
    journal: tuple[str, str] | None,
) -> None:
    # Precedence: the member's own end event, its result file, the coordinator's
    # journal (a member whose box crashed may have no trace end at all), then a guess.
    if end is not None:
        r.status, r.reason = end.status, end.reason
        if end.duration_s:
            r.duration_s = end.duration_s
        r.cost_usd = end.cost_usd
    elif result and isinstance(result.get("status"), str):
        r.status, r.reason = result["status"], str(result.get("reason") or "")
    elif journal is not None:
        r.status, r.reason = journal
    elif run_finished:
        r.status, r.reason = "incomplete", "the trace ends without a member_end event"


_SUMMED = (
    "turns", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
    "tool_calls", "errors", "offloads", "compactions", "clips", "retries", "screenshots",
    "cost_usd",
)  # fmt: skip


def rollup_run(run: RunTrace) -> RunRollup:
    """The run at a glance, members sorted by id."""
    finished = run.finished
    outcomes = run.journal_outcomes()
    rows = [
        rollup_member(m, run_finished=finished, journal=outcomes.get(m.id)) for m in run.members
    ]
    out = RunRollup(run=run.id, finished=finished, members=rows)
    with_events = [r for r in rows if r.start]
    if with_events:
        out.start = min(r.start for r in with_events)
        out.end = max(r.end for r in with_events)
        out.duration_s = round(out.end - out.start, 3)
    out.totals = {k: sum(getattr(r, k) for r in rows) for k in _SUMMED}
    out.totals["cost_usd"] = round(out.totals["cost_usd"], 6)
    for r in rows:
        out.statuses[r.status] = out.statuses.get(r.status, 0) + 1
    return out


def clip_text(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to ``limit`` characters; the flag says whether it was cut."""
    if len(text) <= limit:
        return text, False
    return text[:limit], True


def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)

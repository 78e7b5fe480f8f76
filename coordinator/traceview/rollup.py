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
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from coordinator.job.spec import split_attempt
from coordinator.report.report import MemoryProblem, memory_problems
from coordinator.traceview.load import MemberJournal, MemberTrace, RunTrace
from subagents.model import profiles
from subagents.model.profiles import ModelProfile
from subagents.trace import (
    Clip,
    Compaction,
    ErrorEvent,
    MemberEnd,
    MemberStart,
    ModelCall,
    Offload,
    RateWait,
    Retry,
    SandboxEvent,
    Screenshot,
    TokenCounts,
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


class AttemptRollup(_View):
    """One attempt of a member (a retried member has several)."""

    n: int
    """1-based attempt number."""
    status: str = "running"
    reason: str = ""
    start: float = 0.0
    """Unix time its box began being created (or its first event)."""
    ready: float = 0.0
    """Unix time its box was up (equals ``start`` when no box creation was traced)."""
    end: float = 0.0
    """Unix time of its last event."""
    duration_s: float = 0.0
    """``end - start``: box start-up included."""
    box_s: float = 0.0
    """Seconds spent creating its box - for a box started while the member's setup ran
    (:mod:`sandbox.prepared.waiting`), laying the setup's tree in it after: the part of
    its start the member waited for."""
    setup_s: float = 0.0
    """Seconds it waited on its repository's setup (run, reused or failed)."""
    turns: int = 0
    tool_calls: int = 0
    node: str = ""
    """The cluster node it ran on ("" on one machine)."""


class MemberRollup(_View, TokenCounts):
    """One member of a run at a glance."""

    member: str
    attempt_of: str | None = None
    """A parallel attempt's row (``coder.2``): the member it is an attempt of."""
    kind: str = ""
    model: str = ""
    status: str = "running"
    """ok, failed, timed_out, crashed, cancelled, incomplete, skipped; or, with no end yet,
    queued, running, or not_started (the run ended before it started)."""
    reason: str = ""
    node: str = ""
    """The cluster node its last attempt ran on ("" on one machine)."""
    wave: int | None = None
    """A lead run: the wave (the lead's spawn call) that started it; None otherwise."""
    start: float = 0.0
    """Unix time its first box began being created (or its first event)."""
    end: float = 0.0
    """Unix time of its last event."""
    duration_s: float = 0.0
    """Wall seconds from ``start`` to ``end``: every attempt, its box start-up and the
    back-off between attempts included."""
    box_s: float = 0.0
    """Seconds spent creating boxes, all attempts."""
    setup_s: float = 0.0
    """Seconds waited on the repository's setup, all attempts."""
    attempts: int = 0
    """Attempts made (1 unless the member was retried; 0 before it started)."""
    per_attempt: list[AttemptRollup] = Field(default_factory=list)
    """Each attempt's status, reason and times, in order."""
    turns: int = 0
    """Turns made (all attempts): model calls, the closing call after a limit not
    counted, as ``max_turns`` does not count it."""
    tool_calls: int = 0
    errors: int = 0
    """Tool results flagged as errors plus error events."""
    offloads: int = 0
    compactions: int = 0
    clips: int = 0
    retries: int = 0
    rate_wait_s: float = 0.0
    """Seconds its model calls waited for the run's rate governor (limits, 429/529)."""
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


class SetupRollup(_View):
    """One repository setup of the run: the members that needed one key, and what came
    of it (made here, reused from the engine or this run, or failed)."""

    key: str = ""
    """The key's first 16 characters ("" in a trace that does not say it)."""
    status: str = "running"
    """``made`` (it ran in this run), ``reused`` (an earlier run's snapshot), ``failed``,
    or ``running`` (members still wait on it)."""
    start: float = 0.0
    """Unix time the first member began waiting on it."""
    end: float = 0.0
    """Unix time the last member's wait ended."""
    duration_s: float = 0.0
    """The setup's own time when it ran here (the member that ran it waited that long),
    else the span of the waits."""
    ran_by: str = ""
    """The member whose directory holds ``setup.log`` ("" when nothing ran here)."""
    log: str = ""
    """``setup.log``'s path relative to the run directory, when it is there."""
    members: list[str] = Field(default_factory=list)
    reason: str = ""
    """Why it failed."""


def rollup_setups(run: RunTrace) -> list[SetupRollup]:
    """The run's setups, one per key, from the members' ``setup_start`` / ``setup``
    events, in the order they began."""
    by_key: dict[str, SetupRollup] = {}
    for member in run.members:
        began: float | None = None
        for ev in member.events:
            if not isinstance(ev, SandboxEvent) or ev.action not in ("setup_start", "setup"):
                continue
            if ev.action == "setup_start":
                began = ev.ts
                continue
            d = ev.detail
            key = str(d.get("key") or "")
            s = by_key.setdefault(key, SetupRollup(key=key, start=ev.ts))
            start = began if began is not None else ev.ts - ev.duration_s
            began = None
            s.start, s.end = min(s.start, start), max(s.end, ev.ts)
            if member.id not in s.members:
                s.members.append(member.id)
            ran = bool(d.get("ran")) if not d.get("ok") else not d.get("reused")
            if not d.get("ok"):
                s.status, s.reason = "failed", s.reason or str(d.get("reason") or "")
            elif ran and s.status != "failed":
                s.status = "made"
            elif s.status == "running":
                s.status = "reused"
            if ran:
                s.ran_by, s.duration_s = member.id, round(ev.duration_s, 3)
                if (member.dir / "setup.log").is_file():
                    s.log = f"{member.rel}/setup.log"
        if began is not None:  # still waiting (a run going on, or one cut short)
            s = by_key.setdefault("", SetupRollup(start=began))
            s.start = min(s.start, began)
            if member.id not in s.members:
                s.members.append(member.id)
    out = sorted(by_key.values(), key=lambda s: s.start)
    for s in out:
        if not s.ran_by:
            s.duration_s = round(max(0.0, s.end - s.start), 3)
    return out


class RunRollup(_View):
    """A run at a glance: one row per member, plus totals."""

    run: str
    finished: bool
    start: float = 0.0
    """Unix time the run started (journal), else its first member's start."""
    end: float = 0.0
    """Unix time the run ended (journal), else its last member event."""
    duration_s: float = 0.0
    """Wall seconds of the run: its journal's start-to-end stretches (planning, members
    and synthesis), else the span of its members."""
    members: list[MemberRollup] = Field(default_factory=list)
    totals: dict[str, float] = Field(default_factory=dict)
    """Sums of the members' counters (tokens, tool calls, errors, cost, ...)."""
    statuses: dict[str, int] = Field(default_factory=dict)
    """Members by status (a lead run's lead not counted: it is no member)."""
    memory: list[MemoryProblem] = Field(default_factory=list)
    """Memory saves that left a conflict in their profile or failed (from the journal)."""
    setups: list[SetupRollup] = Field(default_factory=list)
    """The run's repository setups, one per key."""


def _estimate_cost(r: MemberRollup, offline: bool) -> float:
    p = _prices(r.model, offline)
    return (
        r.input_tokens * p.input_per_mtok
        + r.output_tokens * p.output_per_mtok
        + r.cache_read_tokens * p.cache_read_per_mtok
        + r.cache_write_tokens * p.cache_write_per_mtok
    ) / 1e6


def split_attempts(events: list[Any]) -> list[int]:
    """Where each attempt of a member begins: indexes into ``events`` (``[0]`` for one).

    The fan-out writes every attempt to the same trace: box create, ``member_start``,
    ..., ``member_end``, box close, then the next attempt's box create. A create or a
    ``member_start`` opens a new attempt once the current one has ended, or when the
    current one already had one (an attempt whose end was never written). A create that
    ``replaces`` a box which waited for the member's setup and was let go is the same
    attempt's (:mod:`sandbox.prepared.waiting`).
    """
    starts = [0] if events else []
    ended = created = begun = False
    for i, ev in enumerate(events):
        create = (
            isinstance(ev, SandboxEvent)
            and ev.action == "create"
            and not (isinstance(ev.detail, dict) and ev.detail.get("replaces"))
        )
        begin = isinstance(ev, MemberStart)
        if i and (create or begin) and (ended or (create and created) or (begin and begun)):
            starts.append(i)
            ended = created = begun = False
        ended = ended or isinstance(ev, MemberEnd)
        created, begun = created or create, begun or begin
    return starts


def _attempt(n: int, events: list[Any], journal: MemberJournal | None) -> AttemptRollup:
    """One attempt's times and counts (status filled by the caller)."""
    a = AttemptRollup(n=n, end=max(ev.ts for ev in events))
    starts = [events[0].ts]
    ready = events[0].ts
    for ev in events:
        if isinstance(ev, SandboxEvent) and ev.action == "create":
            starts.append(ev.ts - ev.duration_s)
            if not (isinstance(ev.detail, dict) and ev.detail.get("waits_for")):
                a.box_s += ev.duration_s  # else it ran during the setup, counted there
                ready = ev.ts
        elif isinstance(ev, SandboxEvent) and ev.action == "lay":
            a.box_s += ev.duration_s
            ready = ev.ts
        elif isinstance(ev, SandboxEvent) and ev.action == "setup":
            a.setup_s += ev.duration_s
        elif isinstance(ev, ModelCall):
            a.turns += not ev.closing
        elif isinstance(ev, ToolCall):
            a.tool_calls += 1
        elif isinstance(ev, MemberEnd):
            a.status, a.reason = ev.status, ev.reason
            starts.append(ev.ts - ev.duration_s)
    if journal is not None and n in journal.starts:
        starts.append(journal.starts[n])
        a.node = journal.nodes.get(n, "")
    a.start = min(starts)
    a.ready = max(ready, a.start)
    a.box_s = round(a.box_s, 3)
    a.setup_s = round(a.setup_s, 3)
    a.duration_s = round(a.end - a.start, 3)
    return a


def _attempts(member: MemberTrace, journal: MemberJournal | None) -> list[AttemptRollup]:
    cuts = split_attempts(member.events)
    bounds = zip(cuts, [*cuts[1:], len(member.events)][: len(cuts)], strict=True)
    out = [_attempt(n, member.events[i:j], journal) for n, (i, j) in enumerate(bounds, 1)]
    for a in out[:-1]:
        if a.status == "running":  # ended without a member_end, yet a later attempt came
            a.status, a.reason = (journal.retried.get(a.n) if journal else None) or (
                "incomplete",
                "a later attempt started before this one traced its end",
            )
    return out


def rollup_member(
    member: MemberTrace, *, run_finished: bool = True, journal: MemberJournal | None = None
) -> MemberRollup:
    """Count one member's events into a rollup row (``journal``: its journal records)."""
    r = MemberRollup(member=member.id)
    offline = False
    ended_cost = 0.0
    for ev in member.events:
        if isinstance(ev, ModelCall):
            offline = offline or ev.offline
            r.turns += not ev.closing  # the closing call after a limit is not a turn
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
        elif isinstance(ev, RateWait):
            r.rate_wait_s += ev.waited_s
        elif isinstance(ev, Screenshot):
            r.screenshots += 1
        elif isinstance(ev, MemberStart):
            r.kind, r.model = ev.kind, ev.model
        elif isinstance(ev, MemberEnd):
            ended_cost += ev.cost_usd
    r.per_attempt = _attempts(member, journal)
    r.attempts = len(r.per_attempt)
    if r.per_attempt:
        r.start, r.end = r.per_attempt[0].start, max(a.end for a in r.per_attempt)
        r.duration_s = round(r.end - r.start, 3)
        r.box_s = round(sum(a.box_s for a in r.per_attempt), 3)
        r.setup_s = round(sum(a.setup_s for a in r.per_attempt), 3)
    last = r.per_attempt[-1] if r.per_attempt else None
    r.node = last.node if last is not None else ""
    _apply_outcome(r, last, member.result, run_finished, journal)
    if last is not None:
        last.status, last.reason = r.status, r.reason
    r.cost_usd = round(ended_cost, 6)
    if not r.cost_usd:
        r.cost_usd, r.cost_estimated = (
            round(_estimate_cost(r, offline), 6),
            r.turns > 0 and not offline,
        )
    return r


def _apply_outcome(
    r: MemberRollup,
    last: AttemptRollup | None,
    result: dict[str, Any] | None,
    run_finished: bool,
    journal: MemberJournal | None,
) -> None:
    # Precedence: the coordinator's journal once it recorded the member's end (what
    # `fleet runs`, result.json and the report say); a member queued and not started;
    # the last attempt's own end event, the result file, the journal's last status (a
    # member whose box crashed may have no trace end at all), then a guess. An earlier
    # attempt's end never counts: that attempt was retried.
    if journal is not None and journal.settled and journal.outcome is not None:
        r.status, r.reason = journal.outcome
    elif journal is not None and journal.last == "member_queued":
        waits = "a free slot (fanout.max_parallel)"
        if journal.waiting == "budget":
            waits = "the run's budget to carry it ([budget])"
        r.status, r.reason = (
            ("not_started", "the run ended before this member started")
            if run_finished
            else ("queued", f"waiting for {waits}")
        )
    elif last is not None and last.status != "running":
        r.status, r.reason = last.status, last.reason
    elif result and isinstance(result.get("status"), str):
        r.status, r.reason = result["status"], str(result.get("reason") or "")
    elif journal is not None and journal.outcome is not None:
        r.status, r.reason = journal.outcome
    elif run_finished:
        r.status, r.reason = "incomplete", "the trace ends without a member_end event"


_SUMMED = (
    "turns", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
    "tool_calls", "errors", "offloads", "compactions", "clips", "retries", "screenshots",
    "cost_usd", "attempts", "box_s", "setup_s", "rate_wait_s",
)  # fmt: skip


def rollup_run(run: RunTrace) -> RunRollup:
    """The run at a glance, members sorted by id."""
    finished = run.finished
    journals = run.member_journals()
    rows = [
        rollup_member(m, run_finished=finished, journal=journals.get(m.id)) for m in run.members
    ]
    kinds, waves = run.planned_kinds(), run.waves()
    for r in rows:
        r.kind = r.kind or kinds.get(r.member, "")
        r.wave = waves.get(r.member)
    out = RunRollup(run=run.id, finished=finished, members=rows)
    with_events = [r for r in rows if r.start]
    if with_events:
        out.start = min(r.start for r in with_events)
        out.end = max(r.end for r in with_events)
        out.duration_s = round(out.end - out.start, 3)
    start, end, active = run.span()
    if start:
        out.start = min(start, out.start or start)
        # Still going: its wall time so far (no member may have an event yet).
        out.end = max(end, out.end, start if finished else time.time())
        out.duration_s = active if end else round(out.end - out.start, 3)
    out.totals = {k: sum(getattr(r, k) for r in rows) for k in _SUMMED}
    out.totals["cost_usd"] = round(out.totals["cost_usd"], 6)
    out.totals["box_s"] = round(out.totals["box_s"], 3)
    out.totals["setup_s"] = round(out.totals["setup_s"], 3)
    for r in rows:
        split = split_attempt(r.member)
        r.attempt_of = split[0] if split else None
    for r in rows:
        if r.kind != "lead" and r.attempt_of is None:
            # Members' statuses; a lead run's lead and a member's attempts are rows of
            # their own.
            out.statuses[r.status] = out.statuses.get(r.status, 0) + 1
    out.memory = memory_problems(run.journal)
    out.setups = rollup_setups(run)
    return out


def clip_text(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to ``limit`` characters; the flag says whether it was cut."""
    if len(text) <= limit:
        return text, False
    return text[:limit], True


def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)

"""Reading a run directory back: the job, the journal and every member's trace.

The run directory is the only interface between a run and its inspection: nothing
here talks to the coordinator in-process, so ``fleet trace`` works the same on a
finished run, a crashed one or one still being written (a torn last line is skipped
and picked up on the next read). Each event keeps its line number so a truncated
content in a view can point at the exact place of the full text.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from coordinator.job.spec import attempt_id, split_attempt
from coordinator.journal.entries import (
    AnyEntry,
    LeadSpawnEntry,
    MemberFinishedEntry,
    MemberQueuedEntry,
    MemberRetryEntry,
    MemberStartedEntry,
)
from coordinator.rundir.run_lookup import RunNotFound as RunNotFound
from coordinator.rundir.run_lookup import find_run
from coordinator.rundir.runs import Journal
from subagents.trace import TraceEvent

_ADAPTER: TypeAdapter[Any] = TypeAdapter(TraceEvent)

RUN_END_EVENTS = frozenset(
    {"run_end", "run_finished", "run_interrupted", "run_failed", "run_cancelled"}
)
"""Journal records (by their ``event``/``type``/``state`` value) that say the run is over."""
RUN_START_EVENTS = frozenset({"run_created", "run_started", "run_start"})
"""Journal records that say the run (or a resume of it) began."""
MEMBER_ENTRIES = (MemberQueuedEntry, MemberStartedEntry, MemberRetryEntry, MemberFinishedEntry)
"""The entries that move a member along (queued, started, retried, finished)."""


LEAD_DIR = "lead"
"""A lead run's lead member lives in ``<run>/lead/`` (its id is ``lead``)."""


@dataclass
class MemberTrace:
    """One member's events (in file order) and its ``result.json``; a lead run's lead
    is one too (``rel`` is ``lead``), listed first."""

    id: str
    dir: Path
    rel: str = ""
    """Its directory relative to the run directory (``members/<id>``, or ``lead``)."""
    events: list[Any] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    """1-based line number in ``trace.jsonl`` of each event (same order as ``events``)."""
    result: dict[str, Any] | None = None
    """The member's ``result.json`` (its outcome: status, reason, result, ...)."""
    offset: int = 0
    """Bytes of ``trace.jsonl`` consumed so far (for incremental reads)."""
    line_no: int = 0

    def __post_init__(self) -> None:
        self.rel = self.rel or f"members/{self.id}"

    @property
    def is_lead(self) -> bool:
        return self.rel == LEAD_DIR


@dataclass
class RunTrace:
    """A run directory as read from disk."""

    id: str
    dir: Path
    job: dict[str, Any] = field(default_factory=dict)
    journal: list[AnyEntry] = field(default_factory=list)
    members: list[MemberTrace] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        """True once the run's end is recorded (journal) or its report is written."""
        if (self.dir / "report.md").exists() or (self.dir / "report.json").exists():
            return True
        if any(rec.event in RUN_END_EVENTS for rec in self.journal):
            return True
        return self._owner_dead()

    def _owner_dead(self) -> bool:
        """The coordinator that owned the run (``live.json``) is gone without an end record."""
        live = read_json(self.dir / "live.json")
        if not live or not isinstance(live.get("pid"), int):
            return False
        try:
            os.kill(live["pid"], 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def planned_kinds(self) -> dict[str, str]:
        """Member id -> kind from the run's plan (``members.json``), for members that
        have no trace yet."""
        try:
            plan = json.loads((self.dir / "members.json").read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return {str(m.get("id")): str(m.get("kind") or "") for m in plan if isinstance(m, dict)}

    def waves(self) -> dict[str, int]:
        """A lead run: member id -> the wave it was spawned in (the journal's spawns)."""
        out: dict[str, int] = {}
        for rec in self.journal:
            if isinstance(rec, LeadSpawnEntry):
                for m in rec.members:
                    out[m.id] = rec.wave
        return out

    def question(self) -> str:
        """The job's question (``[lead]`` or ``[research]``), or ""."""
        for table in ("lead", "research"):
            value = self.job.get(table)
            if isinstance(value, dict) and isinstance(value.get("question"), str):
                return value["question"]
        return ""

    def journal_outcomes(self) -> dict[str, tuple[str, str]]:
        """Member id -> (last status, reason) as the journal records them."""
        return {
            mid: j.outcome for mid, j in self.member_journals().items() if j.outcome is not None
        }

    def member_journals(self) -> dict[str, MemberJournal]:
        """Member id -> what the journal says about it (outcome, attempt starts, retries)."""
        out: dict[str, MemberJournal] = {}
        for rec in self.journal:
            if not isinstance(rec, MEMBER_ENTRIES):
                continue
            j = out.setdefault(rec.member, MemberJournal())
            j.last = rec.event
            match rec:
                case MemberQueuedEntry():
                    j.waiting = rec.waiting or ""
                case MemberStartedEntry():
                    n = rec.attempt if rec.attempt is not None else len(j.starts) + 1
                    j.starts[n] = rec.ts
                    if rec.node:
                        j.nodes[n] = rec.node
                case MemberRetryEntry():
                    j.retried[rec.attempt] = (rec.status, rec.reason)
                case MemberFinishedEntry():
                    j.outcome = (rec.status, rec.reason)
                    if rec.attempts is not None:
                        j.attempts = rec.attempts
        return out

    def span(self) -> tuple[float, float, float]:
        """(start, end, active seconds) of the run as its journal records them.

        The start is the first ``run_created``/``run_started`` record, the end the last
        end record; active seconds add up each start-to-end stretch, so the time a run
        lay interrupted before a resume is not counted. Zeros where a bound is missing
        (an older run directory, a run still going).
        """
        start = end = active = 0.0
        open_at: float | None = None
        for rec in self.journal:
            if not rec.ts:  # a record without a time (ts 0) marks no bound
                continue
            if rec.event in RUN_START_EVENTS:
                start = start or rec.ts
                open_at = rec.ts if open_at is None else open_at
            elif rec.event in RUN_END_EVENTS and open_at is not None:
                active += rec.ts - open_at
                end, open_at = rec.ts, None
        return start, end, round(active, 3)


@dataclass
class MemberJournal:
    """One member as the coordinator's journal records it."""

    outcome: tuple[str, str] | None = None
    """(status, reason) of its last record that has a status."""
    starts: dict[int, float] = field(default_factory=dict)
    """Attempt number -> when the coordinator started it (``member_started``)."""
    nodes: dict[int, str] = field(default_factory=dict)
    """Attempt number -> the cluster node it ran on (none on one machine)."""
    retried: dict[int, tuple[str, str]] = field(default_factory=dict)
    """Attempt number -> (status, reason) of an attempt that was retried."""
    attempts: int = 0
    """Attempts made, from ``member_finished`` (0 while it runs)."""
    last: str = ""
    """Its latest record (``member_queued``, ``member_started``, ``member_retry``,
    ``member_finished``): where the coordinator has it now."""
    waiting: str = ""
    """What its latest ``member_queued`` said it waits for (``budget``; "": a slot)."""

    @property
    def settled(self) -> bool:
        """The coordinator recorded this member's end, and nothing since."""
        return self.last == "member_finished" and self.outcome is not None


def read_new_events(member: MemberTrace) -> list[Any]:
    """Append the complete lines written since the last call; return the new events."""
    path = member.dir / "trace.jsonl"
    try:
        with path.open("rb") as fh:
            fh.seek(member.offset)
            data = fh.read()
    except FileNotFoundError:
        return []
    end = data.rfind(b"\n")
    if end < 0:
        return []
    member.offset += end + 1
    new: list[Any] = []
    for raw in data[: end + 1].splitlines():
        member.line_no += 1
        if not raw.strip():
            continue
        try:
            event = _ADAPTER.validate_json(raw)
        except ValidationError:
            # An event type this viewer does not know (newer writer): keep going.
            continue
        member.events.append(event)
        member.lines.append(member.line_no)
        new.append(event)
    return new


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def read_journal(run_dir: Path) -> list[AnyEntry]:
    """The journal's entries (a torn last line is skipped; an unknown one kept as
    :class:`~coordinator.journal.entries.UnknownEntry`, whose ``event`` is still read
    for a run's start and end)."""
    return Journal(run_dir / "journal.jsonl").read()


def refresh_members(run: RunTrace) -> list[MemberTrace]:
    """Pick up members seen since the last look (directories, or journal records of
    members queued but not started yet); return the new ones."""
    known = {m.id for m in run.members}
    added = []
    members_dir = run.dir / "members"
    ids = (
        {sub.name for sub in members_dir.iterdir() if sub.is_dir()}
        if members_dir.is_dir()
        else set()
    )
    # A member's parallel attempts (coder.2 in members/coder/attempts/2), each a trace
    # of its own listed right after its member.
    ids |= {
        attempt_id(sub.parent.parent.name, int(sub.name))
        for sub in members_dir.glob("*/attempts/*")
        if sub.name.isdigit() and sub.is_dir()
    }
    ids |= {rec.member for rec in run.journal if isinstance(rec, MEMBER_ENTRIES)}
    for mid in sorted(ids - known):
        if not mid or "/" in mid or mid in (".", ".."):
            continue
        split = split_attempt(mid)
        if split is not None:
            rel = f"members/{split[0]}/attempts/{split[1]}"
            added.append(MemberTrace(id=mid, dir=run.dir / rel, rel=rel))
        else:
            added.append(MemberTrace(id=mid, dir=members_dir / mid))
    lead = run.dir / LEAD_DIR
    if not any(m.is_lead for m in run.members) and (lead / "trace.jsonl").is_file():
        added.append(MemberTrace(id="lead", dir=lead, rel=LEAD_DIR))
    run.members.extend(added)
    run.members.sort(key=lambda m: (not m.is_lead, m.id))
    return added


def load_run(name: str | Path, output_dir: str | Path | None = None) -> RunTrace:
    """Read a whole run directory (``name`` is a path, a run id or the start of one,
    looked up as every command does: :mod:`coordinator.rundir.run_lookup`)."""
    run_dir = find_run(str(name), output_dir)
    run = RunTrace(id=run_dir.resolve().name, dir=run_dir)
    run.job = read_json(run_dir / "job.json") or {}
    run.journal = read_journal(run_dir)
    refresh_members(run)
    for member in run.members:
        read_new_events(member)
        member.result = read_json(member.dir / "result.json")
    return run

"""The journal's entries: one model per kind, a discriminated union on ``event``.

Every line of ``journal.jsonl`` is one entry: ``{"ts": ..., "event": "<kind>", ...}``.
Writers build the entry's model (or name its kind and fields, through
:func:`entry`, where a lower layer only holds a ``journal(event, **fields)``
callable), so a misspelt field or a wrong type fails where it is written, not in
``fleet runs`` a week later. Readers get the models back and use attributes.

Why a discriminated union and not one loose model: each kind says exactly which
fields it carries, readers ``match`` on the class, and mypy knows that a
``MemberFinished`` has a ``status``.

Reading is lenient, writing strict. The file outlives the code that wrote it: a line
from an older or newer Fleet, or one damaged on disk, must not stop ``fleet runs``,
``fleet resume`` or ``fleet trace`` from reading the rest. So:

* a line that is not JSON (a line torn by a kill mid-write) is skipped, as ever;
* a JSON object whose ``event`` is unknown, or whose fields do not fit its kind,
  is kept as an :class:`UnknownEntry` with its raw fields and what was wrong with it:
  readers that match on kinds pass over it, and nothing of the file is lost;
* fields a kind does not know are ignored on reading (a newer writer's additions);
  on writing, :func:`entry` refuses them;
* a line without ``ts`` (no Fleet writes one; older tools and hand-made files do) is
  read with ``ts`` 0: its time is unknown, and readers of times pass over it.

The JSON on disk is what it was before these models: the same ``event`` names, the
same field names, fields a writer left out still left out (``None`` is not written).
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_serializer

from subagents.trace import MemoryFileSave


def _now() -> float:
    return round(time.time(), 3)


class Entry(BaseModel):
    """What every entry has: when it was written and its kind."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    ts: float = Field(default_factory=_now)
    """Unix time of the write (ms)."""
    event: str

    def to_json(self) -> str:
        """The entry as one line of the journal (no newline)."""
        return self.model_dump_json(exclude_none=True)


# -- the run -------------------------------------------------------------------------


class RunCreatedEntry(Entry):
    """The run directory exists (the journal's first line)."""

    event: Literal["run_created"] = "run_created"
    name: str = ""
    members: int = 0
    pid: int | None = None
    """The creating process: a run whose creator died before it started is dead."""


class RunStartedEntry(Entry):
    """A life of the run began: the first, or a resume."""

    event: Literal["run_started"] = "run_started"
    pid: int | None = None
    resume: bool = False


class RunFinishedEntry(Entry):
    """The run ended: ``succeeded`` or ``failed`` (``error``: it failed before fanning out)."""

    event: Literal["run_finished"] = "run_finished"
    status: str
    ok: int | None = None
    members: int | None = None
    error: str | None = None


class RunInterruptedEntry(Entry):
    """A life of the run was interrupted (Ctrl-C, a signal, the caller cancelled)."""

    event: Literal["run_interrupted"] = "run_interrupted"
    status: str = "interrupted"


class PlanEntry(Entry):
    """The planner split the question into sub-questions (a lead run: its plan input)."""

    event: Literal["plan"] = "plan"
    planner: str
    sub_questions: list[Any] = Field(default_factory=list)
    lead: bool | None = None


class BoxesKeptEntry(Entry):
    """Boxes left running at the run's end (``keep_boxes``), by name."""

    event: Literal["boxes_kept"] = "boxes_kept"
    boxes: list[str] = Field(default_factory=list)


class MergeEntry(Entry):
    """``[merge]`` ran: its verdict (``passed``, ``failed``, ``untested``, ``nothing``,
    ``error``), the members whose patches it applied and those that conflicted
    (``merge/merge.json`` has the rest)."""

    event: Literal["merge"] = "merge"
    verdict: str
    applied: list[str] = Field(default_factory=list)
    conflicts: list[str] = Field(default_factory=list)
    error: str | None = None


class ReapedEntry(Entry):
    """A resume removed this many boxes of the run's dead earlier life."""

    event: Literal["reaped"] = "reaped"
    boxes: int = 0


class ReportWrittenEntry(Entry):
    event: Literal["report_written"] = "report_written"
    analyst: str
    claims: int = 0


class AnalystFailedEntry(Entry):
    event: Literal["analyst_failed"] = "analyst_failed"
    reason: str = ""


# -- members -------------------------------------------------------------------------


class MemberQueuedEntry(Entry):
    event: Literal["member_queued"] = "member_queued"
    member: str
    wave: int | None = None
    """A lead run: the wave that spawned it."""
    waiting: str | None = None
    """What it waits for, when queued again after it was first queued (``budget``: the
    run's budget cannot carry it yet, :meth:`subagents.spend.budget.RunBudget.admit`)."""


class MemberStartedEntry(Entry):
    event: Literal["member_started"] = "member_started"
    member: str
    attempt: int | None = None
    node: str | None = None
    """The cluster node the attempt runs on (None on one machine)."""


class MemberRetryEntry(Entry):
    """An attempt failed in a way the retry policy retries."""

    event: Literal["member_retry"] = "member_retry"
    member: str
    attempt: int
    status: str
    reason: str = ""
    delay_s: float = 0.0


class MemberFinishedEntry(Entry):
    """The member's final outcome (``cancelled`` too: a resume runs it again)."""

    event: Literal["member_finished"] = "member_finished"
    member: str
    status: str
    reason: str = ""
    attempts: int | None = None
    turns: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None


class FailFastEntry(Entry):
    """``fail_fast``: this member's failure cancelled the rest."""

    event: Literal["fail_fast"] = "fail_fast"
    member: str
    reason: str = ""


class MemorySavedEntry(Entry):
    """An attempt's memory save (conflicts counted; each file's action)."""

    event: Literal["memory_saved"] = "memory_saved"
    member: str
    attempt: int | None = None
    profile: str
    key: str = ""
    files: list[MemoryFileSave] = Field(default_factory=list)
    conflicts: int = 0
    already_saved: bool | None = None
    error: str | None = None

    @field_serializer("files")
    def _files(self, files: list[MemoryFileSave]) -> list[dict[str, Any]]:
        return [f.model_dump(exclude_defaults=True) for f in files]  # as written before


class PolicyDecisionEntry(Entry):
    """A tool call a policy rule decided (who answered an ask, and how long it took)."""

    event: Literal["policy_decision"] = "policy_decision"
    member: str
    attempt: int | None = None
    call_id: str
    tool: str
    input: dict[str, Any] = Field(default_factory=dict)
    """The call's arguments, long strings cut (the whole call is in the member's trace)."""
    action: str
    rule: str = ""
    allowed: bool
    by: str = "rule"
    always: bool = False
    waited_s: float = 0.0


# -- asks ----------------------------------------------------------------------------


class _Ask(Entry):
    id: str
    member: str | None = None
    tool: str | None = None
    rule: str | None = None


class ApprovalRequestedEntry(_Ask):
    event: Literal["approval_requested"] = "approval_requested"
    sha256: str = ""
    """Of the argument as shown: a yes is a yes to that argument only."""


class ApprovalAnsweredEntry(_Ask):
    event: Literal["approval_answered"] = "approval_answered"
    allowed: bool
    always: bool = False
    by: str = ""
    who: str = ""
    answered_at: str = ""
    sha256: str = ""


class ApprovalAbandonedEntry(_Ask):
    event: Literal["approval_abandoned"] = "approval_abandoned"
    reason: str = ""


# -- the run's budget ----------------------------------------------------------------


class BudgetEntry(Entry):
    """The run's budget lines as a life of the run starts, and what was spent before."""

    event: Literal["budget"] = "budget"
    usd: float | None = None
    tokens: int | None = None
    soft: float | None = None
    spent_usd: float = 0.0
    spent_tokens: float = 0.0
    resume: bool = False


class BudgetSpentEntry(Entry):
    """One model call settled: what it spent and the run's total since."""

    event: Literal["budget_spent"] = "budget_spent"
    member: str
    usd: float = 0.0
    tokens: float = 0.0
    spent_usd: float = 0.0
    spent_tokens: float = 0.0


class BudgetSoftEntry(Entry):
    event: Literal["budget_soft"] = "budget_soft"
    member: str
    soft: float | None = None
    detail: str = ""


class BudgetHardEntry(Entry):
    event: Literal["budget_hard"] = "budget_hard"
    member: str
    detail: str = ""


# -- a lead run ----------------------------------------------------------------------


class SpawnedMember(BaseModel):
    """One member of a ``lead_spawn``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str
    kind: str = ""
    task: str = ""
    checks_claim: dict[str, Any] | None = None


class LeadStartedEntry(Entry):
    event: Literal["lead_started"] = "lead_started"
    model: str = ""
    resumed: bool = False


class LeadSpawnEntry(Entry):
    """The lead's spawn call: its wave, its members and the answer it was given (a
    resume answers the same call id with the same words)."""

    event: Literal["lead_spawn"] = "lead_spawn"
    call_id: str = ""
    wave: int = 0
    members: list[SpawnedMember] = Field(default_factory=list)
    answer: str = ""


class LeadRetryEntry(Entry):
    event: Literal["lead_retry"] = "lead_retry"
    attempt: int
    status: str
    reason: str = ""
    delay_s: float = 0.0


class LeadFinishedEntry(Entry):
    event: Literal["lead_finished"] = "lead_finished"
    status: str
    reason: str = ""
    turns: int = 0
    tokens: int = 0
    cancelled: list[str] = Field(default_factory=list)
    """Its members still running when it ended, cancelled."""


# -- reading -------------------------------------------------------------------------


class UnknownEntry(Entry):
    """A line that is a JSON object but no entry this Fleet knows: a kind from another
    version, or fields that do not fit the kind (a damaged file). Kept, not dropped."""

    raw: dict[str, Any] = Field(default_factory=dict)
    """The line's fields as they are."""
    problem: str = ""
    """Why it is not a known entry, in words."""

    def to_json(self) -> str:
        return json.dumps(self.raw, default=str)


JournalEntryModel = Annotated[
    RunCreatedEntry
    | RunStartedEntry
    | RunFinishedEntry
    | RunInterruptedEntry
    | PlanEntry
    | BoxesKeptEntry
    | MergeEntry
    | ReapedEntry
    | ReportWrittenEntry
    | AnalystFailedEntry
    | MemberQueuedEntry
    | MemberStartedEntry
    | MemberRetryEntry
    | MemberFinishedEntry
    | FailFastEntry
    | MemorySavedEntry
    | PolicyDecisionEntry
    | ApprovalRequestedEntry
    | ApprovalAnsweredEntry
    | ApprovalAbandonedEntry
    | BudgetEntry
    | BudgetSpentEntry
    | BudgetSoftEntry
    | BudgetHardEntry
    | LeadStartedEntry
    | LeadSpawnEntry
    | LeadRetryEntry
    | LeadFinishedEntry,
    Field(discriminator="event"),
]
"""Every kind of entry a run writes."""

AnyEntry = JournalEntryModel | UnknownEntry
"""What reading a journal gives: a known entry, or an unknown line kept as it is."""

ENTRY: TypeAdapter[JournalEntryModel] = TypeAdapter(JournalEntryModel)

KINDS: dict[str, type[Entry]] = {
    str(cls.model_fields["event"].default): cls
    for cls in Entry.__subclasses__() + _Ask.__subclasses__()
    if cls is not _Ask and cls is not UnknownEntry
}
"""Kind name -> its model."""


def entry(event: str, **fields: Any) -> JournalEntryModel:
    """The entry of kind ``event`` with ``fields``, for writers that name a kind (the
    ``journal(event, **fields)`` callables of lower layers). A kind or a field this
    module does not define is a bug in the writer: :class:`ValueError` (or pydantic's
    :class:`ValidationError`, one of them), never a line readers would drop."""
    cls = KINDS.get(event)
    if cls is None:
        raise ValueError(f"no journal entry of kind {event!r}")
    unknown = sorted(set(fields) - set(cls.model_fields))
    if unknown:
        raise ValueError(f"journal entry {event!r} has no field(s) {', '.join(unknown)}")
    return ENTRY.validate_python({"event": event, **fields})


def parse_line(line: str) -> AnyEntry | None:
    """One line of a journal as its entry; None for a line that is not a JSON object
    (blank, or torn by a kill mid-write)."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    if "ts" not in data:  # no Fleet writes one; the model would stamp it now
        data = {**data, "ts": 0.0}
    try:
        return ENTRY.validate_python(data)
    except ValidationError as exc:
        return unknown(data, exc)


def unknown(data: dict[str, Any], exc: ValidationError) -> UnknownEntry:
    """``data`` kept as an :class:`UnknownEntry`, with the first thing wrong with it."""
    # Older journals and other tools wrote the kind under ``type`` or ``state``.
    kind = next((v for k in ("event", "type", "state") if isinstance(v := data.get(k), str)), "")
    first = exc.errors()[0]
    if kind not in KINDS:
        problem = f"no entry of kind {kind!r}" if kind else "no event"
    else:
        where = ".".join(str(p) for p in first["loc"][1:])  # after the kind's tag
        problem = f"{where}: {first['msg']}" if where else first["msg"]
    ts = data.get("ts")
    return UnknownEntry(
        ts=float(ts) if isinstance(ts, int | float) and not isinstance(ts, bool) else 0.0,
        event=kind,
        raw=data,
        problem=problem,
    )


def parse(text: str) -> list[AnyEntry]:
    """A whole journal's entries, in file order (see the module docstring)."""
    return [e for line in text.splitlines() if (e := parse_line(line)) is not None]

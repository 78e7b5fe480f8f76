"""A lead's waves: its ``spawn``, ``wait`` and ``read_result`` against the run's fan-out.

:class:`Waves` is the coordinator's :class:`~subagents.rules.delegation.Delegation`. A spawn
is one wave: its members are validated as job members are (a bad one is refused with
the field and an example, like a bad job file), checked against the lead's limits,
written to ``members.json`` and the journal (``lead_spawn``: the call, the wave, the
members; then ``member_queued`` each), and queued on the run's one
:class:`~coordinator.fanout.fanout.Fanout` - so every member has its own box, deadline and
retries, the quorum and fail-fast count over all waves, and a wave starts while
stragglers of the last one still run.

Limits, each refused with an ``is_error`` reply that says what is left:

* ``max_members`` over all waves, ``max_waves`` spawn calls that started members;
* the run-wide ``token_budget``: what the lead used, what finished members used and
  what running members may still use (each reserves its ``max_tokens``, a hard limit
  of the harness) must stay within it, so the run cannot pass it.

What the lead sees of a member is its distilled result, cut to ``result_chars``
(``read_result``: four times that), and only ever inside the untrusted-data
delimiters, through :func:`~subagents.results.member_text.member_block` (normalized, every
spelling of a delimiter tag made inert), with the status line and the ids in our own
words outside them. Never a
transcript, a page or a tool output: the lead's context holds what members
concluded, not what they read.

Durability. A spawn's answer is kept in its journal entry under the lead's tool-call
id: a resumed lead that repeats the call it was killed in gets the same answer and
starts nothing twice. What the lead has already been told is read back from its saved
conversation (the ``member ID ... ended`` lines of earlier waits), so a resumed lead
hears of every member it had not heard of, once.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from pydantic import ValidationError

from subagents.kinds.results import result_json
from subagents.loop.conversation import TRANSCRIPT_BYTES
from subagents.loop.transcript import read_messages
from subagents.results.member_text import clean, member_block
from subagents.results.outcome import MemberOutcome
from subagents.rules.delegation import Reply, WaitUntil

from ..fanout.fanout import Fanout
from ..job.jobfile import describe_validation
from ..job.spec import LEAD_ID, Lead, MemberJob
from ..journal.entries import JournalEntryModel, LeadSpawnEntry, MemberQueuedEntry, SpawnedMember
from ..nodes.worker import MemberUnit
from ..report.synthesis import cap_result

REPORTED = re.compile(r"^member (\S+) \(\w+, wave \d+\) ended ", re.M)
"""The line that tells the lead of a finished member (how a resume knows it was told)."""
_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")


def tokens_of(outcome: MemberOutcome) -> int:
    """Every token a member used: input, output and cache."""
    o = outcome
    return o.input_tokens + o.output_tokens + o.cache_read_tokens + o.cache_write_tokens


@dataclass
class Spawned:
    """One member the lead started, as the journal records it."""

    job: MemberJob
    wave: int
    checks_claim: dict[str, Any] | None = None
    """For a coding member checking a claim: ``{member, claim}``."""


@dataclass
class Waves:
    """The delegation a lead's tools talk to (see the module docstring)."""

    lead: Lead
    fan: Fanout
    journal: Callable[[JournalEntryModel], Any]
    """Appends an entry to the run's journal (and tells its listeners)."""
    save_members: Callable[[list[MemberJob]], None]
    """Writes ``members.json`` (every member spawned so far)."""
    make_units: Callable[[list[MemberJob]], list[MemberUnit]]
    expect: Callable[[list[MemberUnit]], None] = lambda units: None
    """Tells the nodes more members are coming (warm pools)."""
    spawned: list[Spawned] = field(default_factory=list)
    answers: dict[str, Reply] = field(default_factory=dict)
    """Spawn answers by the lead's tool-call id."""
    outcomes: dict[str, MemberOutcome] = field(default_factory=dict)
    """Finished members (this life and earlier ones)."""
    reported: set[str] = field(default_factory=set)
    """Members whose end the lead has been told of."""
    lead_tokens: int = 0
    """Tokens the lead itself used so far."""
    stop_reason: str = ""
    """Set when no more members are taken (the lead ended, fail-fast, an interrupt)."""
    _changed: anyio.Event = field(default_factory=anyio.Event)

    def __post_init__(self) -> None:
        self.fan.on_outcome.append(self._ended)

    # -- bookkeeping --------------------------------------------------------------------

    def _ended(self, unit: MemberUnit, outcome: MemberOutcome) -> None:
        self.outcomes[unit.spec.id] = outcome
        self.wake()

    def wake(self) -> None:
        """Let a waiting ``wait`` look again."""
        self._changed.set()
        self._changed = anyio.Event()

    @property
    def waves(self) -> int:
        return max((s.wave for s in self.spawned), default=0)

    def wave_of(self, member: str) -> int:
        return next((s.wave for s in self.spawned if s.job.id == member), 0)

    def members(self) -> list[MemberJob]:
        return [s.job for s in self.spawned]

    def committed(self) -> int:
        """Tokens spent or reserved: the lead's, finished members' and running members'
        caps (a hard limit each)."""
        total = self.lead_tokens
        for s in self.spawned:
            done = self.outcomes.get(s.job.id or "")
            total += tokens_of(done) if done is not None else (s.job.limits.max_tokens or 0)
        return total

    def left(self) -> str:
        members = self.lead.max_members - len(self.spawned)
        waves = self.lead.max_waves - self.waves
        budget = max(0, self.lead.token_budget - self.committed())
        return f"Left: {members} member(s), {waves} wave(s), about {budget} tokens."

    def told(self, conversation: Path) -> None:
        """Mark the members the lead's saved conversation already heard of."""
        for msg in read_messages(conversation, TRANSCRIPT_BYTES) or []:
            for block in msg.get("content") or [] if isinstance(msg, dict) else []:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    for part in block.get("content") or []:
                        if isinstance(part, dict):
                            self.reported.update(REPORTED.findall(part.get("text", "")))

    # -- spawn --------------------------------------------------------------------------

    async def spawn(self, members: list[dict[str, Any]], *, call_id: str) -> Reply:
        if call_id and call_id in self.answers:
            return self.answers[call_id]  # a resumed lead repeating its last call
        refusal = self._refusal(len(members))
        if refusal:
            return Reply(refusal, is_error=True)
        jobs, problems = self._validate(members)
        if problems:
            return Reply(
                "Not spawned - fix these and spawn again:\n" + "\n".join(problems), is_error=True
            )
        need = sum(j.limits.max_tokens or 0 for j, _ in jobs)
        budget_left = self.lead.token_budget - self.committed()
        if need > budget_left:
            cap = self.lead.member_limits.max_tokens or 1
            return Reply(
                f"Refused by the run's token budget: about {max(0, budget_left)} of "
                f"{self.lead.token_budget} tokens are left and each member reserves up to "
                f"{cap}: room for {max(0, budget_left) // cap} more member(s). Spawn fewer, "
                "or finish with what you have.",
                is_error=True,
            )
        return self._start(jobs, call_id)

    def _refusal(self, count: int) -> str:
        if self.fan.stopper:
            return (
                f"Refused: fail_fast stopped the run when {self.fan.stopper[0]} failed; no "
                "more members are started. Finish with what you have."
            )
        if self.stop_reason or self.fan.closed:
            return f"Refused: the run takes no more members ({self.stop_reason or 'stopping'})."
        if self.waves >= self.lead.max_waves:
            return (
                f"Refused: max_waves is {self.lead.max_waves} and every wave was used; "
                "finish with what you have."
            )
        room = self.lead.max_members - len(self.spawned)
        if count > room:
            return (
                f"Refused: max_members is {self.lead.max_members} over all waves and "
                f"{len(self.spawned)} were spawned: room for {room} more member(s)."
            )
        return ""

    def _validate(
        self, members: list[dict[str, Any]]
    ) -> tuple[list[tuple[MemberJob, dict[str, Any] | None]], list[str]]:
        """Each request as a job member (validated as a job file's would be)."""
        wave = self.waves + 1
        taken = {s.job.id for s in self.spawned} | {LEAD_ID}
        jobs: list[tuple[MemberJob, dict[str, Any] | None]] = []
        problems: list[str] = []
        for i, raw in enumerate(members):
            req = dict(raw)
            checks = req.pop("checks_claim", None)
            kind = req.get("kind")
            if kind not in self.lead.kinds:
                allowed = ", ".join(self.lead.kinds)
                problems.append(f"members[{i}].kind: {kind!r} may not be spawned; use {allowed}.")
                continue
            mid = req.pop("id", None) or f"w{wave}-{i + 1}"
            if not isinstance(mid, str) or not _ID.match(mid) or mid in taken:
                problems.append(
                    f"members[{i}].id: {mid!r} is taken or not an id (lowercase letters, "
                    "digits, - or _; ids must be unique over all waves)."
                )
                continue
            taken.add(mid)
            check = req.pop("check", None)
            if check is not None:
                req |= {"test": check, "test_gate": False}
            try:
                job = MemberJob.model_validate(
                    {**req, "id": mid, "limits": self.lead.member_limits.model_dump()}
                )
            except ValidationError as exc:
                problems += describe_validation(exc, prefix=("members", i))
                continue
            jobs.append((job, checks))
        return jobs, problems

    def _start(self, jobs: list[tuple[MemberJob, dict[str, Any] | None]], call_id: str) -> Reply:
        wave = self.waves + 1
        new = [Spawned(job=j, wave=wave, checks_claim=c) for j, c in jobs]
        self.spawned += new
        self.save_members(self.members())  # before the journal: resume trusts the journal
        ids = ", ".join(f"{s.job.id} ({s.job.kind})" for s in new)
        reply = Reply(f"Wave {wave} started: {ids}. {self.left()} Use wait for their results.")
        self.answers[call_id] = reply
        self.journal(
            LeadSpawnEntry(
                call_id=call_id,
                wave=wave,
                members=[
                    SpawnedMember(
                        id=s.job.id or "",
                        kind=s.job.kind,
                        task=s.job.task,
                        checks_claim=s.checks_claim or None,
                    )
                    for s in new
                ],
                answer=reply.text,
            )
        )
        for s in new:
            self.journal(MemberQueuedEntry(member=s.job.id or "", wave=wave))
        units = self.make_units([s.job for s in new])
        self.expect(units)
        self.fan.add(units)
        return reply

    # -- wait and read_result -----------------------------------------------------------

    async def wait(self, *, until: WaitUntil, timeout_s: float) -> Reply:
        if not self.spawned:
            return Reply("No members were spawned yet: spawn a wave first.", is_error=True)
        with anyio.move_on_after(timeout_s):
            while not self._ready(until):
                await self._changed.wait()
        return Reply(self._news())

    def _ready(self, until: WaitUntil) -> bool:
        ids = [s.job.id for s in self.spawned]
        done = [m for m in ids if m in self.outcomes]
        if len(done) == len(ids):
            return True
        return until == "any" and any(m not in self.reported for m in done)

    def running(self) -> list[str]:
        return [s.job.id or "" for s in self.spawned if s.job.id not in self.outcomes]

    def _news(self) -> str:
        lines: list[str] = []
        for s in self.spawned:
            mid = s.job.id or ""
            outcome = self.outcomes.get(mid)
            if outcome is None or mid in self.reported:
                continue
            self.reported.add(mid)
            lines.append(self.header(s, outcome))
            lines.append(member_block(mid, self.distilled(outcome, self.lead.result_chars)))
        if not lines:
            lines.append("No member finished while you waited.")
        running = self.running()
        lines.append(
            f"Still running or queued: {', '.join(running)}."
            if running
            else "No member is running."
        )
        lines.append(self.left())
        return "\n".join(lines)

    @staticmethod
    def header(s: Spawned, o: MemberOutcome) -> str:
        """Our words about a finished member (outside the untrusted block); the task
        is the lead's, written after reading members' text, so it is cleaned too."""
        partial = (
            " (a limit stopped it: its partial_result below is what it had found, and what "
            "it left open is still open - ask it again or list it as open)"
            if o.status != "ok" and o.partial_result
            else ""
        )
        return (
            f"member {s.job.id} ({s.job.kind}, wave {s.wave}) ended {o.status} after "
            f"{o.turns} turns, {tokens_of(o)} tokens{partial}; its task: "
            f"{clean(s.job.task[:300])}"
        )

    @staticmethod
    def distilled(o: MemberOutcome, chars: int) -> dict[str, Any]:
        """A member's result as the lead may see it: without empty fields (and without
        a coding member's patch, which stays on disk), cut to ``chars`` of JSON; shown
        only through :func:`~subagents.results.member_text.member_block`."""
        data: dict[str, Any] = {} if o.status == "ok" else {"reason": o.reason}
        kept = o.result if o.result is not None else o.partial_result
        fields = result_json(kept)
        if fields:
            slim = {
                k: v
                for k, v in fields.items()
                if not k.startswith("patch") and v not in (None, "", [], {})
            }
            data["result" if o.result is not None else "partial_result"] = cap_result(slim, chars)
        return data

    async def read_result(self, member: str) -> Reply:
        s = next((x for x in self.spawned if x.job.id == member), None)
        if s is None:
            known = ", ".join(x.job.id or "" for x in self.spawned) or "none yet"
            return Reply(f"No member {member!r}; spawned members: {known}.", is_error=True)
        outcome = self.outcomes.get(member)
        if outcome is None:
            return Reply(f"{member} has not finished yet; wait for it first.", is_error=True)
        body = self.distilled(outcome, self.lead.result_chars * 4)
        return Reply(self.header(s, outcome) + "\n" + member_block(member, body))

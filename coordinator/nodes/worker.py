"""One member's life as the coordinator records it: attempts, retries, its result.

A member is a :class:`MemberUnit` (serializable: it is shipped to a node as is).
:func:`run_unit` runs its attempts through :class:`Nodes` - where an attempt runs:
its box, the harness and the box's release are the node side's
(:mod:`coordinator.nodes.node`), here or on a cluster node - and keeps what the coordinator
alone writes: the member's ``trace.jsonl`` (the node's events reach it as they
happen), the run's journal (``member_started`` with the node, retries,
``member_finished``) and ``result.json``, written last, so a member "has a result"
only when everything else of it is on disk. An exception, the deadline passing, the
box being killed, a node lost: each becomes that member's status with a reason,
never an exception - only cancellation propagates. How many members run, and what
their outcomes mean for the run, is :mod:`coordinator.fanout.fanout`'s business.

Deadlines. ``limits.deadline_s`` is the coordinator's *hard* wall-clock limit per
attempt. The harness gets a soft deadline 10% earlier, so a member that is merely
slow stops itself and reports what it did (its progress is kept in the outcome); the
hard limit is for members that hang (a stuck model call, a wedged box). Either way
the member's status is ``timed_out``: one event, one status.

Retries. Only failures a second attempt can fix are retried, with exponential
backoff: the box crashing (an OOM, a killed container, an engine hiccup) and the
model being overloaded - plus ``timed_out`` when the job asks. A member whose task
itself failed (an ``incomplete`` result, a bad request) is not retried: the same
inputs would fail the same way and cost the same again.

Resume. The harness keeps each member's transcript (and its box's checkpoint) after
every completed turn (:mod:`subagents.durable`), and an attempt that finds them goes
on from there. Whether a retry does is :func:`goes_on`'s (``fanout.retry.resume``):
after an overloaded model or a lost cluster node it does, after a crashed box or a
deadline it starts over (unless the job says ``always``). On a cluster the node sends
the transcript and checkpoint back after every saved turn, so they are in the run
directory here whichever node ran the attempt (:mod:`coordinator.nodes.node_durable`). A member with a final outcome has its transcript
removed, so only a member whose attempt never ended (the coordinator killed, Ctrl-C)
finds one on ``fleet resume``.

Memory. Every attempt loads the member's memory profile as it is then and merges its
own changes back at its end (:mod:`subagents.context.memory_profile`), so a retry
neither misses what the failed attempt saved nor applies it twice. Each save is
entered in the run's journal as ``memory_saved`` with its attempt, what it did per
file and its conflicts.
"""

from __future__ import annotations

import abc
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel, ConfigDict, ValidationError

from subagents.durable import forget
from subagents.results.outcome import MemberOutcome
from subagents.spec import MemberSpec
from subagents.trace import MemorySave, PolicyDecision, Retry, TraceWriter

from ..job.spec import RetryPolicy
from ..job.work import MemberWork
from ..journal.entries import (
    JournalEntryModel,
    MemberFinishedEntry,
    MemberRetryEntry,
    MemberStartedEntry,
    MemorySavedEntry,
    PolicyDecisionEntry,
)

CANCELLED = anyio.get_cancelled_exc_class


class MemberUnit(MemberWork):
    """One member's unit of work: everything a worker (here or on a node) needs - what
    the harness runs (``spec``) and, inherited, what is done before it starts (the
    member's :class:`~coordinator.job.work.MemberWork`: repo, files, setup, attempts;
    ``attempts`` are units of their own with ``attempts = 1``)."""

    run_id: str
    """The run this member belongs to (labels its box)."""
    member_dir: str
    """The member's own run subdirectory."""
    spec: MemberSpec
    """What the harness runs; its ``result_schema`` is the job's whole one, checked
    against the result after the member ends (:mod:`coordinator.nodes.node`)."""
    retry: RetryPolicy

    @property
    def deadline_s(self) -> float:
        """Hard wall-clock limit of one attempt: the deadline the job stated, which the
        member's spec holds (its harness's own limit is earlier, see above)."""
        return self.spec.stated_deadline_s or self.spec.limits.deadline_s


class Services(BaseModel):
    """What a run's nodes keep up while its members run (shipped to each node as is)."""

    model_config = ConfigDict(extra="forbid")

    max_parallel: int
    """Members at once; warm pools never hold more boxes than this."""
    warm_pool: bool = True
    """Start boxes ahead of the members that will take them."""
    corpus: bool = False
    """Run the offline research corpus as a service box on the run network."""
    members: int | None = None
    """Members the run may start in all, when more may come than the units its nodes
    are first given (a lead's later waves); None: those units. A cluster reserves
    slots for ``min(max_parallel, members)``."""


Started = Callable[[str], None]
"""Called by :meth:`Nodes.attempt` once the attempt has a place, with the node's name
("" on this host alone); the coordinator journals ``member_started`` then."""


class Nodes(abc.ABC):
    """Where members' attempts run: this host (:class:`coordinator.nodes.node.LocalNodes`) or
    a cluster's nodes (:class:`coordinator.nodes.cluster.RayNodes`).

    Error contract: :meth:`attempt` never raises for the member's own failure (a box
    crash, a lost node, a deadline: each is an outcome with a status and a reason);
    only cancellation propagates, after the attempt's box is released.
    """

    @abc.abstractmethod
    def serve(
        self, run_id: str, units: list[MemberUnit], services: Services
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """The run's node-side services (warm pools, the corpus box) while members run."""

    @abc.abstractmethod
    async def attempt(
        self, unit: MemberUnit, trace: TraceWriter, started: Started
    ) -> MemberOutcome:
        """Run one attempt of ``unit`` where it belongs; its trace events reach ``trace``
        as they happen and its files land in ``unit.member_dir``."""

    def lost_node(self, outcome: MemberOutcome) -> bool:
        """Whether ``outcome`` is its attempt's node being lost (the box went with the
        node, not for anything the member did). Default: no node is ever lost."""
        return False

    def expect(self, units: list[MemberUnit]) -> None:  # noqa: B027 - optional hook
        """More units are coming to a run already served (a lead's later wave): a node
        may start boxes for them ahead of need. Default: nothing."""

    @abc.abstractmethod
    async def remove_boxes(self, run_id: str) -> list[str]:
        """Remove the run's boxes on every node, except kept ones (returned by name)."""

    @abc.abstractmethod
    async def reap(self, run_id: str) -> int:
        """Remove a dead run's boxes on every node (before a resume); returns how many."""


@dataclass(kw_only=True)
class Recorder:
    """What the coordinator records of members: the run's journal and trace listeners."""

    listeners: list[Callable[[Any], None]] = field(default_factory=list)
    """Trace listeners (live progress); called with every trace event."""
    journal: Callable[[JournalEntryModel], Any] | None = None
    """Appends an entry to the run's journal; None: no journal (a bare worker)."""
    recorded: Callable[[str], str | None] | None = None
    """A member's (or parallel attempt's) last status in the run's journal, for what an
    earlier life of the run left; None: nothing to look up."""

    def note(self, entry: JournalEntryModel) -> None:
        if self.journal is not None:
            self.journal(entry)


def retry_class(outcome: MemberOutcome) -> str | None:
    """Which retryable failure this is (``crashed``, ``overloaded``, ``timed_out``)."""
    if outcome.status == "crashed":
        return "crashed"
    if outcome.status == "timed_out":
        return "timed_out"
    if outcome.status == "failed" and outcome.retryable:
        return "overloaded"
    return None


def goes_on(policy: RetryPolicy, why: str | None) -> bool:
    """Whether the next attempt after a failure of class ``why`` (None: an attempt that
    never ended; ``lost``: its node was lost) continues from the last completed turn
    rather than turn 0."""
    if policy.resume != "auto":
        return policy.resume == "always"
    return why in (None, "overloaded", "lost")


def backoff(policy: RetryPolicy, attempt: int) -> float:
    """Wait before attempt ``attempt + 1`` (attempt counts from 1)."""
    return min(policy.backoff_s * 2 ** (attempt - 1), policy.backoff_max_s)


def failed_outcome(
    unit: MemberUnit, status: str, reason: str, started: float, **kw: Any
) -> MemberOutcome:
    return MemberOutcome(
        member=unit.spec.id,
        kind=unit.spec.kind,
        status=status,  # type: ignore[arg-type]
        reason=reason,
        duration_s=round(time.monotonic() - started, 3),
        **kw,
    )


def job_fields(unit: MemberUnit) -> set[str]:
    """The job's own result fields of ``unit`` (its spec's ``result_schema``): the only
    fields a result may carry beside its kind's."""
    return set((unit.spec.job_schema() or {}).get("properties") or ())


def received_outcome(unit: MemberUnit, sent: Any) -> MemberOutcome:
    """An outcome a node sent for ``unit``, checked as coming from someone not trusted:
    the unit's member and kind, its result of that kind with only the job's own fields
    beside the kind's (:meth:`MemberOutcome.received`). ValueError says what is wrong."""
    try:
        outcome = MemberOutcome.received(sent, job_fields=job_fields(unit))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{where}: {first['msg']}" if where else first["msg"]) from None
    if (outcome.member, outcome.kind) != (unit.spec.id, unit.spec.kind):
        raise ValueError(
            f"it is for {outcome.kind} member {outcome.member!r}, not for "
            f"{unit.spec.kind} member {unit.spec.id!r}"
        )
    return outcome


async def run_unit(unit: MemberUnit, deps: Recorder, nodes: Nodes) -> MemberOutcome:
    """All attempts of one member, with retries and backoff; writes its result.json last."""
    mdir = anyio.Path(unit.member_dir)
    await mdir.mkdir(parents=True, exist_ok=True)
    trace = TraceWriter(Path(mdir) / "trace.jsonl", run=unit.run_id, member=unit.spec.id)
    trace.listeners.extend(deps.listeners)
    tries = _Tries()
    trace.listeners.append(lambda ev: _journal_event(deps, unit.spec.id, tries.n, ev))
    if not goes_on(unit.retry, None):
        forget(Path(mdir))
    try:
        outcome = await _attempts(unit, deps, nodes, trace, tries)
    except CANCELLED():
        deps.note(
            MemberFinishedEntry(
                member=unit.spec.id, status="cancelled", reason="cancelled", attempts=tries.n
            )
        )
        trace.close()
        raise
    forget(Path(mdir))  # a final outcome: nothing is left to go on from
    write_result(mdir, outcome)
    deps.note(finished_entry(unit.spec.id, outcome, tries.n))
    trace.close()
    return outcome


_FINISHED_FIELDS = sorted(
    (set(MemberFinishedEntry.model_fields) & set(MemberOutcome.model_fields))
    - {"member", "attempts", "ts", "event"}
)
"""What the journal's ``member_finished`` keeps of an outcome: the fields both have
(``attempts`` is a count there, the attempts' records here)."""


def finished_entry(member: str, outcome: MemberOutcome, attempts: int) -> MemberFinishedEntry:
    """The journal's record of a member's final outcome."""
    shared = {k: getattr(outcome, k) for k in _FINISHED_FIELDS}
    return MemberFinishedEntry(member=member, attempts=attempts, **shared)


@dataclass
class _Tries:
    n: int = 0
    """Attempts started so far: the one running is attempt ``n``."""


async def _attempts(
    unit: MemberUnit, deps: Recorder, nodes: Nodes, trace: TraceWriter, tries: _Tries
) -> MemberOutcome:
    """Attempts until one ends as the retry policy does not retry, or none are left."""
    while True:
        tries.n += 1
        attempt = tries.n

        def started(node: str, attempt: int = attempt) -> None:
            deps.note(MemberStartedEntry(member=unit.spec.id, attempt=attempt, node=node or None))

        outcome = await nodes.attempt(unit, trace, started)
        why = retry_class(outcome)
        if why not in unit.retry.on or attempt >= unit.retry.attempts:
            return outcome
        delay = backoff(unit.retry, attempt)
        deps.note(
            MemberRetryEntry(
                member=unit.spec.id,
                attempt=attempt,
                status=outcome.status,
                reason=outcome.reason,
                delay_s=delay,
            )
        )
        trace.emit(Retry(what="member", attempt=attempt, reason=outcome.reason, delay_s=delay))
        if not goes_on(unit.retry, "lost" if nodes.lost_node(outcome) else why):
            forget(Path(unit.member_dir))
        await anyio.sleep(delay)


def _journal_event(deps: Recorder, member: str, attempt: int, ev: object) -> None:
    """A trace event that is the run's record too: a memory save (with the attempt it
    ended), a decision a policy rule made (who answered an ask)."""
    if isinstance(ev, MemorySave):
        deps.note(memory_entry(ev, member, attempt))
    elif isinstance(ev, PolicyDecision):
        deps.note(
            PolicyDecisionEntry(
                member=member,
                attempt=attempt,
                call_id=ev.call_id,
                tool=ev.tool,
                input=short_input(ev.input),
                action=ev.action,
                rule=ev.rule,
                allowed=ev.allowed,
                by=ev.by,
                always=ev.always,
                waited_s=ev.waited_s,
            )
        )


def short_input(args: dict[str, Any], limit: int = 300) -> dict[str, Any]:
    """A call's arguments for the journal: long strings cut (a file's whole content
    is in the member's trace, not in the run's journal)."""
    return {
        k: (v[:limit] + "..." if isinstance(v, str) and len(v) > limit else v)
        for k, v in args.items()
    }


def memory_entry(ev: MemorySave, member: str, attempt: int) -> MemorySavedEntry:
    """A memory save as the journal records it (conflicts counted)."""
    return MemorySavedEntry(
        member=member,
        attempt=attempt,
        profile=ev.profile,
        key=ev.key,
        files=ev.files,
        conflicts=len(ev.conflicts),
        already_saved=ev.already_saved or None,
        error=ev.error or None,
    )


def write_result(mdir: anyio.Path | Path, outcome: MemberOutcome) -> None:
    """The member's ``result.json``, written last and synced."""
    from ..rundir.runs import _fsync_write

    _fsync_write(Path(mdir) / "result.json", outcome.model_dump_json(indent=2))

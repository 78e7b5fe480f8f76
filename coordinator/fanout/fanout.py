"""Fan-out: many members at once, each one's failure recorded, never propagated.

:func:`fan_out` hands every :class:`~coordinator.nodes.worker.MemberUnit` to the executor
(:mod:`coordinator.fanout.executor`: a task group with a queue), which runs each with
:func:`coordinator.nodes.worker.run_unit` - one member's retries and record - whose attempts
run where :class:`~coordinator.nodes.worker.Nodes` puts them (this host, or a cluster's
nodes). A member that fails, times out or crashes is an outcome like any other;
its siblings go on. Only ``fail_fast`` (at the first member that fails for good) or
the user's Ctrl-C cancel siblings; members that never got to run are ``cancelled``
with the reason. The run's verdict is the quorum: ``min_success`` members ``ok``,
counting those that ended ``ok`` in an earlier life of a resumed run. A lead's waves
are one :class:`Fanout` that takes units while it runs (:meth:`Fanout.stream`), so
all of that holds over every wave, and a member of a later wave may start while
stragglers of an earlier one still run.

:func:`to_member_spec` turns a job file's member into the harness's spec (the soft
deadline, the browser's egress allowlist and search page, the coding member's check
command, the memory directory).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
from pydantic import BaseModel

from sandbox.spec import NetworkPolicy, Runtime
from subagents.context.config import ContextConfig
from subagents.kinds import get_kind
from subagents.model import Model
from subagents.model import make_model as default_make_model
from subagents.results.outcome import MemberOutcome
from subagents.rules.policy import ToolPolicy
from subagents.spec import MemberSpec
from subagents.spend.budget import RunBudget, run_budget

from ..attempts.attempts import run_attempts
from ..job.spec import Egress, MemberJob
from ..journal.entries import FailFastEntry, MemberQueuedEntry
from ..nodes.node import Deps, LocalNodes
from ..nodes.worker import (
    MemberUnit,
    Nodes,
    Recorder,
    failed_outcome,
    finished_entry,
    run_unit,
    write_result,
)
from .executor import Executor, LocalExecutor

CANCELLED_BY_CALLER = "cancelled: the caller cancelled this member"

__all__ = ["Deps", "Fanout", "FanoutResult", "MemberUnit", "fan_out", "to_member_spec"]


def to_member_spec(
    job: MemberJob,
    *,
    model: str,
    max_tokens: int,
    egress: Egress,
    memory_root: Path,
    policy: ToolPolicy | None = None,
    runtime: Runtime = "runc",
    fallback: str | None = None,
) -> MemberSpec:
    """The harness's spec for a job member (soft deadline 10% before the hard one;
    ``policy`` is the job's, merged with the member's own; ``runtime`` the job's box
    runtime, unless the member names its own)."""
    lim = job.limits
    kind = get_kind(job.kind)
    # What the job says that a kind's settings may take, by name: each kind takes the
    # fields its own settings model declares (a coding member its check command, a
    # browser member the search page), and nothing here knows which kind wants what.
    offered = {"test": job.test, "test_gate": job.test_gate}
    if egress.search_url:
        offered["search_url"] = egress.search_url
    fields = kind.settings.model_fields
    settings: BaseModel = kind.settings(**{k: v for k, v in offered.items() if k in fields})
    network = NetworkPolicy()  # no network at all
    if kind.reads_web:
        network = NetworkPolicy(egress="allowlist", allow=tuple(egress.allow))
    memory_dir = None
    if job.memory is not None:
        memory_dir = Path(job.memory.dir or memory_root / job.memory.profile)
        memory_dir.mkdir(parents=True, exist_ok=True)
    return MemberSpec(
        id=job.id or job.kind,
        kind=job.kind,
        task=job.task,
        settings=settings,
        inputs=dict(job.inputs),
        model=model,
        fallback_model=fallback,
        limits=lim.model_copy(
            update={"deadline_s": max(lim.deadline_s * 0.9, lim.deadline_s - 60)}
        ),
        stated_deadline_s=lim.deadline_s,
        max_output_tokens=max_tokens,
        sandbox=job.sandbox.box(get_kind(job.kind).box_kind, network=network, runtime=runtime),
        memory_dir=memory_dir,
        todos=job.todos,
        context=ContextConfig.model_validate(job.context),
        tools=list(job.tools),
        mcp=list(job.mcp),
        result_schema=job.result_schema,
        policy=(policy or ToolPolicy()).merged(job.policy),
    )


@dataclass
class FanoutResult:
    """How a fan-out ended."""

    outcomes: dict[str, MemberOutcome]
    """Member id -> outcome, for every member (cancelled ones included)."""
    ok: int
    quorum_met: bool
    fail_fast_by: str | None = None
    """The member whose failure triggered fail-fast, if any."""


class Fanout:
    """One fan-out's policy - fail-fast, the quorum, every outcome recorded - over
    units given at once (:meth:`run`) or arriving while others run (:meth:`stream`,
    with :meth:`add`: a lead's waves, which join one fan-out, so the quorum, fail-fast
    and ``max_parallel`` count over all of them).

    ``nodes`` is where attempts run; None: this host, with ``deps`` (then a
    :class:`~coordinator.nodes.node.Deps`) as its node side. ``already_ok`` counts members
    that ended ``ok`` in an earlier life of the run (resume), toward the quorum.
    """

    def __init__(
        self,
        deps: Recorder,
        *,
        max_parallel: int,
        min_success: int,
        fail_fast: bool,
        executor: Executor[MemberUnit, MemberOutcome] | None = None,
        nodes: Nodes | None = None,
        already_ok: int = 0,
        make_model: Callable[..., Model] | None = None,
    ) -> None:
        if nodes is None:
            if not isinstance(deps, Deps):
                raise TypeError("fan_out without nodes runs on this host and needs a node.Deps")
            nodes = LocalNodes(deps)
        self.deps, self.nodes = deps, nodes
        self.max_parallel, self.min_success = max_parallel, min_success
        self.fail_fast, self.already_ok = fail_fast, already_ok
        self.executor = executor or LocalExecutor()
        self.make_model = make_model or default_make_model
        """The model a member's reviewer of its parallel attempts calls (its own)."""
        self.units: list[MemberUnit] = []
        """Every unit given so far, in order."""
        self.outcomes: dict[str, MemberOutcome] = {}
        self.stopper: list[str] = []
        self.on_outcome: list[Callable[[MemberUnit, MemberOutcome], None]] = []
        """Called as each member ends (a lead's ``wait`` listens here)."""
        self.closed = False
        """No more units are taken: :meth:`close` was called, fail-fast struck, or the
        fan-out ended."""
        self._cancelled: set[str] = set()
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._send, self._receive = anyio.create_memory_object_stream[MemberUnit](math.inf)

    def _on_done(self, unit: MemberUnit, result: MemberOutcome | BaseException) -> bool:
        if isinstance(result, BaseException):  # a worker broke its contract
            result = failed_outcome(
                unit, "failed", f"raised {type(result).__name__}: {result}", time.monotonic()
            )
        self.outcomes[unit.spec.id] = result
        stop = False
        asked = unit.spec.id in self._cancelled  # the caller's cancel is not a failure
        if self.fail_fast and result.status != "ok" and not asked and not self.stopper:
            self.stopper.append(unit.spec.id)
            self.closed = True
            self.deps.note(FailFastEntry(member=unit.spec.id, reason=result.reason))
            stop = True
        for listener in self.on_outcome:
            listener(unit, result)
        return stop

    async def _worker(self, unit: MemberUnit) -> MemberOutcome:
        member, started = unit.spec.id, time.monotonic()
        if member not in self._cancelled:
            with anyio.CancelScope() as self._scopes[member]:
                budget = run_budget(unit.run_id)
                ok = False
                try:
                    if budget is not None and budget.limited:
                        skipped = await self._admitted(unit, budget)
                        if skipped is not None:
                            return skipped
                    if unit.attempts > 1:
                        outcome = await run_attempts(unit, self.deps, self.nodes, self.make_model)
                    else:
                        outcome = await run_unit(unit, self.deps, self.nodes)
                    ok = outcome.status == "ok"
                    return outcome
                finally:
                    del self._scopes[member]
                    if budget is not None:
                        budget.ended(member, ok=ok)
        # Cancelled by the caller (cancel): while it ran (run_unit journalled it and
        # released its box) or before it started (the run's end journals it).
        return failed_outcome(unit, "cancelled", CANCELLED_BY_CALLER, started)

    async def _admitted(self, unit: MemberUnit, budget: RunBudget) -> MemberOutcome | None:
        """Wait until the run's budget admits the member (:meth:`RunBudget.admit`); its
        outcome when the budget cannot carry it: ``skipped``, recorded, no box started."""
        member = unit.spec.id

        def waiting() -> None:
            self.deps.note(MemberQueuedEntry(member=member, waiting="budget"))

        why = await budget.admit(
            member,
            unit.spec.kind,
            turns=unit.spec.limits.max_turns,
            share=unit.attempts,
            waiting=waiting,
        )
        if why is None:
            return None
        outcome = failed_outcome(unit, "skipped", why, time.monotonic(), limit="budget")
        mdir = anyio.Path(unit.member_dir)
        await mdir.mkdir(parents=True, exist_ok=True)
        write_result(mdir, outcome)
        self.deps.note(finished_entry(member, outcome, 0))
        return outcome

    def cancel(self, member: str) -> bool:
        """End one member ``cancelled`` - at once if it runs (its box is released), before
        it starts if it waits - while its siblings go on; a later resume runs it again.
        False when it has already ended."""
        if member in self.outcomes:
            return False
        self._cancelled.add(member)
        if member in self._scopes:
            self._scopes[member].cancel()
        return True

    async def run(self, units: list[MemberUnit]) -> FanoutResult:
        """Run every unit of a fixed list (through the executor's ``map``)."""
        self.units += units
        self.closed = True
        await self.executor.map(
            units, self._worker, max_parallel=self.max_parallel, on_done=self._on_done
        )
        return self.result()

    def add(self, units: list[MemberUnit]) -> None:
        """Queue more units on a running :meth:`stream`, in order; RuntimeError once
        it takes no more (check :attr:`closed` first)."""
        if self.closed:
            raise RuntimeError("this fan-out takes no more members")
        for unit in units:
            self.units.append(unit)
            self._send.send_nowait(unit)

    def close(self) -> None:
        """No more units: :meth:`stream` returns once the queued ones have ended."""
        self.closed = True
        self._send.close()

    async def stream(self) -> FanoutResult:
        """Run units as :meth:`add` gives them, until :meth:`close` (or fail-fast)."""
        try:
            await self.executor.stream(
                self._receive, self._worker, max_parallel=self.max_parallel, on_done=self._on_done
            )
        finally:
            self.closed = True
            self._send.close()
        return self.result()

    def result(self) -> FanoutResult:
        """Every unit's outcome so far; a unit that never ran is ``cancelled``."""
        stopper = self.stopper
        for unit in self.units:
            if unit.spec.id not in self.outcomes:
                why = f"cancelled: fail_fast after {stopper[0]} failed" if stopper else "cancelled"
                self.outcomes[unit.spec.id] = failed_outcome(
                    unit, "cancelled", why, time.monotonic()
                )
        ok = self.already_ok + sum(1 for o in self.outcomes.values() if o.status == "ok")
        return FanoutResult(
            outcomes=self.outcomes,
            ok=ok,
            quorum_met=ok >= self.min_success,
            fail_fast_by=stopper[0] if stopper else None,
        )


async def fan_out(
    units: list[MemberUnit],
    deps: Recorder,
    *,
    max_parallel: int,
    min_success: int,
    fail_fast: bool,
    executor: Executor[MemberUnit, MemberOutcome] | None = None,
    nodes: Nodes | None = None,
    already_ok: int = 0,
) -> FanoutResult:
    """Run every unit; returns all outcomes and whether the quorum was met (see
    :class:`Fanout` for ``nodes`` and ``already_ok``)."""
    fan = Fanout(
        deps,
        max_parallel=max_parallel,
        min_success=min_success,
        fail_fast=fail_fast,
        executor=executor,
        nodes=nodes,
        already_ok=already_ok,
    )
    return await fan.run(units)

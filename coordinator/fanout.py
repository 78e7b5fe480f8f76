"""Fan-out: many members at once, each one's failure recorded, never propagated.

:func:`fan_out` hands every :class:`~coordinator.worker.MemberUnit` to the executor
(:mod:`coordinator.executor`: a task group with a queue), which runs each with
:func:`coordinator.worker.run_unit` - one member's retries and record - whose attempts
run where :class:`~coordinator.worker.Nodes` puts them (this host, or a cluster's
nodes). A member that fails, times out or crashes is an outcome like any other;
its siblings go on. Only ``fail_fast`` (at the first member that fails for good) or
the user's Ctrl-C cancel siblings; members that never got to run are ``cancelled``
with the reason. The run's verdict is the quorum: ``min_success`` members ``ok``,
counting those that ended ``ok`` in an earlier life of a resumed run.

:func:`to_member_spec` turns a job file's member into the harness's spec (the soft
deadline, the browser's egress allowlist and search page, the coding member's check
command, the memory directory).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from sandbox.spec import NetworkPolicy
from subagents.browser.config import DEFAULT_SEARCH_URL, BrowserConfig
from subagents.context.config import ContextConfig
from subagents.kinds import get_kind
from subagents.kinds.coding import CodingSettings
from subagents.outcome import MemberOutcome
from subagents.policy import ToolPolicy
from subagents.spec import MemberSpec

from .executor import Executor, LocalExecutor
from .node import Deps, LocalNodes
from .spec import Egress, MemberJob
from .worker import MemberUnit, Nodes, Recorder, failed_outcome, run_unit

__all__ = ["Deps", "FanoutResult", "MemberUnit", "fan_out", "to_member_spec"]


def to_member_spec(
    job: MemberJob,
    *,
    model: str,
    max_tokens: int,
    egress: Egress,
    memory_root: Path,
    policy: ToolPolicy | None = None,
) -> MemberSpec:
    """The harness's spec for a job member (soft deadline 10% before the hard one;
    ``policy`` is the job's, merged with the member's own)."""
    lim = job.limits
    settings: BaseModel
    if job.kind == "coding":
        settings = CodingSettings(test=job.test)
    else:
        settings = BrowserConfig(search_url=egress.search_url or DEFAULT_SEARCH_URL)
    network = NetworkPolicy()  # no network at all
    if job.kind == "browser":
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
        limits=lim.model_copy(
            update={"deadline_s": max(lim.deadline_s * 0.9, lim.deadline_s - 60)}
        ),
        stated_deadline_s=lim.deadline_s,
        max_output_tokens=max_tokens,
        sandbox=job.sandbox.box(get_kind(job.kind).box_kind, network=network),
        memory_dir=memory_dir,
        todos=job.todos,
        context=ContextConfig.model_validate(job.context),
        tools=list(job.tools),
        mcp=list(job.mcp),
        result_schema=job.member_result_schema(),
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
    """Run every unit; returns all outcomes and whether the quorum was met.

    ``nodes`` is where attempts run; None: this host, with ``deps`` (then a
    :class:`~coordinator.node.Deps`) as its node side. ``already_ok`` counts members
    that ended ``ok`` in an earlier life of the run (resume), toward the quorum.
    """
    if nodes is None:
        if not isinstance(deps, Deps):
            raise TypeError("fan_out without nodes runs on this host and needs a node.Deps")
        nodes = LocalNodes(deps)
    where = nodes
    outcomes: dict[str, MemberOutcome] = {}
    stopper: list[str] = []

    def on_done(unit: MemberUnit, result: MemberOutcome | BaseException) -> bool:
        if isinstance(result, BaseException):  # a worker broke its contract
            result = failed_outcome(
                unit, "failed", f"raised {type(result).__name__}: {result}", time.monotonic()
            )
        outcomes[unit.spec.id] = result
        if fail_fast and result.status != "ok" and not stopper:
            stopper.append(unit.spec.id)
            deps.note("fail_fast", member=unit.spec.id, reason=result.reason)
            return True
        return False

    async def worker(unit: MemberUnit) -> MemberOutcome:
        return await run_unit(unit, deps, where)

    executor = executor or LocalExecutor()
    await executor.map(units, worker, max_parallel=max_parallel, on_done=on_done)
    for unit in units:
        if unit.spec.id not in outcomes:
            why = f"cancelled: fail_fast after {stopper[0]} failed" if stopper else "cancelled"
            outcomes[unit.spec.id] = failed_outcome(unit, "cancelled", why, time.monotonic())
    ok = already_ok + sum(1 for o in outcomes.values() if o.status == "ok")
    return FanoutResult(
        outcomes=outcomes,
        ok=ok,
        quorum_met=ok >= min_success,
        fail_fast_by=stopper[0] if stopper else None,
    )

"""The node side of a run: what runs next to the boxes.

A member's agent loop runs on the host that holds its box, because the box's exec
stream, CDP port and run network are reachable only from there. This module is that
side and nothing else: a node's :class:`NodeDeps` (its sandbox backend, warm pools,
model factory and harness), :func:`run_attempt` (one attempt of one member: box up,
harness, box down), and :func:`serving` (the node's share of a run's services: warm
pools and the corpus box). It writes only into the member directory it is given and
emits trace events through the :class:`~subagents.trace.TraceWriter` it is given;
the journal, retries and ``result.json`` are the coordinator's
(:mod:`coordinator.nodes.worker`).

On one machine :class:`LocalNodes` runs attempts in this process against the member's
own run directory. On a cluster (:mod:`coordinator.nodes.cluster`) the same functions run in
a node's actor, against a scratch directory whose files go back to the coordinator.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio

from sandbox.base import Sandbox, SandboxBackend
from sandbox.deferred import DeferredSandbox
from sandbox.docker import reaper
from sandbox.errors import (
    SandboxClosed,
    SandboxCrashed,
    SandboxError,
    SandboxUnavailable,
    SnapshotGone,
)
from sandbox.pool import SandboxPool
from sandbox.prepared.prepare import Prepared, Preparer, SetupFailed
from sandbox.spec import SandboxSpec
from sandbox.warm import WarmBoxes
from subagents.beside import beside
from subagents.browser.corpus import start_corpus
from subagents.durable import TRANSCRIPT
from subagents.kinds.results import result_json
from subagents.model.base import Model, ModelError
from subagents.model.fallback import FALLBACK_AFTER_S, FallbackModel
from subagents.results.outcome import MemberOutcome
from subagents.results.schema_check import problems as schema_problems
from subagents.rules.policy import Approver
from subagents.spec import MemberSpec
from subagents.spend.budget import Reserves, budgeted
from subagents.trace import ErrorEvent, MemberEnd, SandboxEvent, TraceWriter

from .prewarm import Prewarm
from .repo_copy import RepoRefused, RepoTooLarge, StagedRepo, copy_room, staged_copy
from .worker import CANCELLED, MemberUnit, Nodes, Recorder, Services, Started, failed_outcome

SETUP_LOG = "setup.log"
"""The setup's output (secrets masked), in the directory of the member that ran it."""
CLEANUP_S = 60.0
"""Longest the run's cleanup (boxes, pools, corpus, proxy) may take after an interrupt;
past it the run still ends, and ``fleet sandbox gc`` removes what is left."""


class RunMemberFn(Protocol):
    """The harness a node runs a member with. Its ``sandbox`` is a
    :class:`~sandbox.deferred.DeferredSandbox` still starting (``await
    sandbox.ready()`` for the box itself); a harness that uses it before then waits."""

    def __call__(
        self,
        spec: MemberSpec,
        *,
        sandbox: Sandbox | None,
        model: Model,
        run_dir: Path,
        trace: TraceWriter,
        approver: Approver | None = None,
    ) -> Awaitable[MemberOutcome]: ...


@dataclass(kw_only=True)
class NodeDeps:
    """What a node uses to run members; host-local, never shipped (a node builds its own)."""

    backend: SandboxBackend
    make_model: Callable[..., Model]
    """``make_model(name, kind=..., trace=...)`` (see :func:`subagents.model.make_model`)."""
    run_member: RunMemberFn | None = None
    """The harness; None means :func:`subagents.member.run_member`."""
    pools: dict[str, SandboxPool] = field(default_factory=dict)
    """Warm pools by box spec (JSON); a member whose spec has one takes a box from it."""
    demand: dict[str, int] = field(default_factory=dict)
    """Members per box spec still to take a box; a pool keeps no more idle than this."""
    approver: Approver | None = None
    """Answers members' policy asks (the run's approval queue); None: nobody to ask,
    each member's ``ask_default`` applies."""
    prewarm: Prewarm | None = None
    """Boxes started before the run existed (:mod:`coordinator.nodes.prewarm`), for its pools."""
    warm: WarmBoxes | None = None
    """Boxes the caller keeps ready across runs (:mod:`sandbox.warm`), for its pools."""
    budget: Reserves | None = None
    """What members' calls reserve from when not the run's budget in this process (a
    cluster node's relay to the coordinator's, :mod:`coordinator.nodes.node_budget`)."""
    preparers: dict[str, Preparer] = field(default_factory=dict)
    """Each run's setups on this node's engine (:mod:`sandbox.prepared.prepare`)."""

    def preparer(self, run: str) -> Preparer:
        """``run``'s setups on this node: one per key, whichever member asks first."""
        if run not in self.preparers:
            self.preparers[run] = Preparer(self.backend, run)
        return self.preparers[run]

    async def acquire(self, spec: SandboxSpec, run: str, member: str) -> tuple[Sandbox, Any]:
        """A fresh box for ``member`` (from a warm pool when there is one) and its pool."""
        key = spec.pool_key
        pool = self.pools.get(key)
        if pool is None:
            return await self.backend.create(spec, run=run, member=member), None
        box = await pool.acquire(member)
        # Stop warming boxes nobody will take: the pool refills to min_idle.
        self.demand[key] = max(0, self.demand.get(key, 0) - 1)
        pool.min_idle = min(pool.min_idle, self.demand[key])
        return box, pool

    def expect(self, specs: list[SandboxSpec]) -> None:
        """Members with these boxes are coming (a lead's later wave): the warm pool of
        each spec that has one starts boxes for them (never more than it may hold)."""
        for spec in specs:
            key = spec.pool_key
            self.demand[key] = self.demand.get(key, 0) + 1
        for key, pool in self.pools.items():
            pool.keep_idle(min(self.demand.get(key, 0), pool.max_size))


@dataclass(kw_only=True)
class Deps(NodeDeps, Recorder):
    """A run on this host alone: the node's things and the coordinator's record in one."""


async def _release(
    box: Sandbox | None, trace: TraceWriter, pool: SandboxPool | None, *, keep: bool
) -> None:
    """Remove the box whatever happened (shielded: cancellation must not leak boxes);
    a box whose spec says ``keep`` is only let go, and traced as ``keep``, not ``close``."""
    if box is None:
        return
    with anyio.CancelScope(shield=True):
        t0 = time.monotonic()
        try:
            await (pool.release(box) if pool is not None else box.close())
        except SandboxError:
            pass  # already gone (killed); gc removes any remains by label
        action = "keep" if keep and pool is None else "close"
        trace.emit(
            SandboxEvent(action=action, box=box.name, duration_s=round(time.monotonic() - t0, 3))
        )


def soft_deadline(unit: MemberUnit, started: float) -> MemberSpec:
    """The member's spec with the harness's own deadline counted from the attempt's
    start, like the hard one: box start-up and the repository copy have used part of
    ``deadline_s`` already, and a harness that started its clock only now would still
    be working when the hard limit cut it off, its partial result lost."""
    spec = unit.spec
    margin = max(unit.deadline_s - spec.limits.deadline_s, 0.0)
    left = unit.deadline_s - (time.monotonic() - started) - margin
    if left >= spec.limits.deadline_s:
        return spec
    limits = spec.limits.model_copy(update={"deadline_s": max(left, 0.1)})
    return spec.model_copy(update={"limits": limits})


async def _with_proxies(spec: MemberSpec, backend: SandboxBackend, run_id: str) -> MemberSpec:
    """The member's URL MCP servers, each with the run's egress proxy for its host alone:
    the host-side client reaches the server the way a box would, through the proxy's
    allowlist and address checks. Without a proxy here, the server does not start and
    says why."""
    if not any(s.url for s in spec.mcp):
        return spec
    servers = []
    for server in spec.mcp:
        if server.url is not None:
            try:
                proxy = await backend.egress_proxy(run_id, [server.egress_host()])
            except SandboxError:
                proxy = None
            server = server.model_copy(update={"proxy": proxy})
        servers.append(server)
    return spec.model_copy(update={"mcp": servers})


async def run_attempt(
    unit: MemberUnit,
    deps: NodeDeps,
    trace: TraceWriter,
    *,
    member_dir: Path | None = None,
    staged_repo: Path | None = None,
    on_turn_saved: Callable[[], None] | None = None,
) -> MemberOutcome:
    """One attempt: box up, harness, box down. Never raises except on cancellation.

    ``member_dir`` is where the harness writes the member's files (default: the unit's
    own run subdirectory; a cluster node passes a scratch directory). ``staged_repo``
    is the repository selection already made (a node gets it from the coordinator);
    default: selected here from ``unit.repo``. ``on_turn_saved`` is called each time
    the member's transcript and checkpoint hold a completed turn (a node sends them to
    the coordinator then).
    """
    started = time.monotonic()
    held = _Held(keep=unit.spec.sandbox.keep)
    ended_by_harness = False
    run_dir = member_dir or Path(unit.member_dir)
    try:
        with anyio.fail_after(unit.deadline_s):
            if staged_repo is None and unit.repo:
                # Host side first: a repository too large for the box fails before any box.
                room = copy_room(unit.spec.sandbox)
                repo = Path(unit.repo)
                held.staging = await anyio.to_thread.run_sync(lambda: staged_copy(repo, room=room))
                staged_repo = Path(held.staging.name)
        if unit.setup is not None:
            # The member's clock stands while its setup runs (bounded by its own
            # timeout): members that wait on one setup lose none of their time to it.
            t_setup = time.monotonic()
            unit = await _with_prepared(unit, deps, trace, staged_repo, run_dir, held)
            started += time.monotonic() - t_setup
        with anyio.fail_after(max(unit.deadline_s - (time.monotonic() - started), 0.001)):
            outcome = await _harness(
                unit, deps, trace, held, staged_repo, run_dir, on_turn_saved, started
            )
            ended_by_harness = True
    except CANCELLED():
        await _release(held.box, trace, held.pool, keep=held.keep)
        with anyio.CancelScope(shield=True):
            await _done_waiting(deps, unit, held)
        if held.staging is not None:
            held.staging.cleanup()
        raise
    except Exception as exc:
        outcome = _attempt_failed(unit, exc, started)
    await _release(held.box, trace, held.pool, keep=held.keep)
    await _done_waiting(deps, unit, held)
    if held.staging is not None:
        await anyio.to_thread.run_sync(held.staging.cleanup)
        if held.staging.not_copied:
            outcome = outcome.model_copy(update={"not_copied": held.staging.not_copied})
    return _settled(unit, trace, outcome, traced_end=ended_by_harness)


async def _with_prepared(
    unit: MemberUnit,
    deps: NodeDeps,
    trace: TraceWriter,
    repo: Path | None,
    run_dir: Path,
    held: _Held,
) -> MemberUnit:
    """The unit with its box made from the setup's snapshot: found on the engine, made
    by this run already, or made now (the others that need it wait). The setup's log
    goes to ``setup.log`` in the member's directory of whoever ran it (and of every
    member it failed), and a ``setup`` event to the member's trace.

    A member whose setup is still to run has its box started meanwhile, a box that gets
    the snapshot's tree when it is made (:mod:`sandbox.prepared.waiting`): ``held.waiting``
    (``held.box`` too, so that it is removed however the attempt ends).

    Raises:
        SetupFailed: the setup failed (now or earlier in this run).
    """
    setup = unit.setup
    assert setup is not None
    missing = [n for n in setup.secrets if n not in os.environ]
    if missing:
        raise SetupFailed(f"setup failed: secret {missing[0]} is not set where the member runs")
    secrets = {n: os.environ[n] for n in setup.secrets}
    t0 = time.monotonic()
    trace.emit(SandboxEvent(action="setup_start"))
    preparer = deps.preparer(unit.run_id)
    try:
        tree = held.tree = await preparer.waiting_dir(setup, unit.spec.sandbox, repo)
    except (SandboxError, OSError, ValueError):
        tree = None  # the setup meets whatever this was, and says so

    async def start_waiting() -> None:
        if tree is not None:
            await _start_waiting(unit, deps, trace, held, tree)

    async def prepare() -> Prepared:
        return await preparer.prepare(setup, unit.spec.sandbox, repo, secrets=secrets)

    try:
        made = await beside(prepare, start_waiting, wait_for_side=True)
    except SetupFailed as exc:
        await _write_log(run_dir, exc.log)
        trace.emit(
            SandboxEvent(
                action="setup",
                detail={
                    "ok": False,
                    "ran": not exc.again,
                    "key": exc.key[:16],
                    "reason": str(exc)[:500],
                },
                duration_s=round(time.monotonic() - t0, 3),
            )
        )
        raise
    await _write_log(run_dir, made.log)
    trace.emit(
        SandboxEvent(
            action="setup",
            box=made.ref[:19],
            detail={"ok": True, "key": made.key[:16], "reused": made.reused},
            duration_s=round(time.monotonic() - t0, 3),
        )
    )
    if held.waiting is not None and not made.tree:
        # Its tree was not kept for it (the snapshot came from elsewhere): the member
        # starts from the snapshot as a member that came later does.
        await _release(held.waiting, trace, None, keep=False)
        held.replaced = held.waiting.name
        held.box = held.waiting = None
    sandbox = unit.spec.sandbox.model_copy(update={"prepared": made.ref})
    return unit.model_copy(update={"spec": unit.spec.model_copy(update={"sandbox": sandbox})})


async def _start_waiting(
    unit: MemberUnit, deps: NodeDeps, trace: TraceWriter, held: _Held, tree: Path
) -> None:
    """The member's box, started while its setup runs; none when the backend makes no
    such box or the engine would not (the member then starts from the snapshot)."""
    t0 = time.monotonic()
    try:
        box = await deps.backend.create_waiting(
            unit.spec.sandbox, run=unit.run_id, member=unit.spec.id, tree=tree
        )
    except (SandboxError, OSError):
        return
    held.box = held.waiting = box
    trace.emit(
        SandboxEvent(
            action="create",
            box=box.name,
            detail={"waits_for": "setup"},
            duration_s=round(time.monotonic() - t0, 3),
        )
    )


async def _cached_snapshot(deps: NodeDeps, unit: MemberUnit, run_id: str) -> str | None:
    """The snapshot of ``unit``'s setup the engine already has, by its key from the
    repository as given (the attempt keys it from the copy that goes into the box;
    were the two to differ, the attempt would simply find no pool)."""
    assert unit.setup is not None
    try:
        repo = Path(unit.repo) if unit.repo else None
        return await deps.preparer(run_id).cached(unit.setup, unit.spec.sandbox, repo)
    except (SandboxError, OSError):
        return None  # the attempt meets whatever this was, and says so


async def _write_log(run_dir: Path, log: str) -> None:
    if log:
        await anyio.Path(run_dir).mkdir(parents=True, exist_ok=True)
        await anyio.Path(run_dir / SETUP_LOG).write_text(log)


@dataclass
class _Held:
    """What an attempt holds and must give back however it ends."""

    keep: bool
    """The box outlives the run (``sandbox.keep``)."""
    box: Sandbox | None = None
    pool: SandboxPool | None = None
    staging: StagedRepo | None = None
    waiting: Sandbox | None = None
    """A box started while the member's setup ran, its tree still to lay
    (:mod:`sandbox.prepared.waiting`)."""
    replaced: str = ""
    """The name of such a box that was let go (its tree was not kept for it, or did not
    lay): the box made instead says so, and is no new attempt on the trace."""
    tree: Path | None = None
    """The directory where the setup's tree is kept for such a box, until handed back
    (:meth:`sandbox.prepared.prepare.Preparer.done_waiting`)."""


async def _harness(
    unit: MemberUnit,
    deps: NodeDeps,
    trace: TraceWriter,
    held: _Held,
    staged_repo: Path | None,
    run_dir: Path,
    on_turn_saved: Callable[[], None] | None,
    started: float,
) -> MemberOutcome:
    """The member's harness to its end, its box started beside its first model call
    (:mod:`sandbox.deferred` says why)."""
    from subagents.member import run_member as default_run_member

    run_member = deps.run_member or default_run_member
    pending = DeferredSandbox(unit.spec.sandbox, unit.spec.id)
    member_ended = anyio.Event()
    spec = await _with_proxies(soft_deadline(unit, started), deps.backend, unit.run_id)
    if unit.spec.fallback_model:
        # Its own model waits less on overload: the fallback is there for that.
        first = deps.make_model(
            unit.spec.model, kind=unit.spec.kind, trace=trace, patience_s=FALLBACK_AFTER_S
        )
        fallback = deps.make_model(unit.spec.fallback_model, kind=unit.spec.kind, trace=trace)
        model: Model = FallbackModel(first, fallback, trace=trace)
    else:
        model = deps.make_model(unit.spec.model, kind=unit.spec.kind, trace=trace)
    model = budgeted(model, unit.run_id, unit.spec.id, deps.budget)
    extra = _harness_options(unit, deps, run_dir, on_turn_saved)

    async def attempt() -> MemberOutcome:
        try:
            outcome = await run_member(
                spec, sandbox=pending, model=model, run_dir=run_dir, trace=trace, **extra
            )
            switched = getattr(model, "switched", None)
            if isinstance(switched, str):  # its model stayed overloaded: it went on with another
                outcome = outcome.model_copy(update={"model_switch": switched})
            return outcome
        finally:
            member_ended.set()
            with anyio.CancelScope(shield=True):
                await model.aclose()

    async def start_box() -> None:
        await _start_box(unit, deps, trace, held, pending, member_ended, staged_repo)

    # The box's start is waited for: a box that came after its member ended is
    # removed like any other.
    return await beside(attempt, start_box, wait_for_side=True)


def _harness_options(
    unit: MemberUnit, deps: NodeDeps, run_dir: Path, on_turn_saved: Callable[[], None] | None
) -> dict[str, Any]:
    """What the harness is handed beyond the member: the approver, and a durable
    transcript."""
    # Only a harness that may ask is handed the approver (a test's own harness need
    # not take it).
    extra: dict[str, Any] = {}
    if deps.approver is not None:
        extra["approver"] = deps.approver
    # The harness keeps its transcript (subagents.durable) - not for a member with
    # explicit memory: its memory writes live in its box and are not checkpointed,
    # so going on from a later turn would lose them from the save; it starts over.
    if deps.run_member is None and unit.spec.memory_dir is None:
        extra["conversation_file"] = run_dir / TRANSCRIPT
        if on_turn_saved is not None:
            extra["on_turn_saved"] = on_turn_saved
    return extra


async def _start_box(
    unit: MemberUnit,
    deps: NodeDeps,
    trace: TraceWriter,
    held: _Held,
    pending: DeferredSandbox,
    member_ended: anyio.Event,
    staged_repo: Path | None,
) -> None:
    """The member's box, its repository and files in it, handed to ``pending``; a
    failure to start is the member's to meet at its first use of the box."""
    try:
        t0 = time.monotonic()
        box = await _laid(unit, deps, trace, held)
        if box is None:
            box, held.pool = await deps.acquire(unit.spec.sandbox, unit.run_id, unit.spec.id)
            held.box = box
            if not member_ended.is_set():  # else it was never the member's: no create
                trace.emit(
                    SandboxEvent(
                        action="create",
                        box=box.name,
                        detail={"replaces": held.replaced} if held.replaced else {},
                        duration_s=round(time.monotonic() - t0, 3),
                    )
                )
        if staged_repo is not None:
            await box.upload(staged_repo, "/workspace")
        for name, text in unit.files.items():
            await box.write_file(f"/workspace/{name}", text)
        if unit.setup is not None and unit.setup.refresh:
            res = await box.exec(unit.setup.refresh, cwd="/workspace", timeout=unit.setup.timeout_s)
            if not res.ok:
                tail = (res.stderr or res.stdout).strip()[-1000:]
                raise SandboxUnavailable(
                    f"the setup's refresh failed (exit {res.exit_code}): {tail}"
                )
    except SnapshotGone as exc:
        deps.preparer(unit.run_id).forget(exc.ref)  # the retry sets the setup up again
        pending.fail(exc)
    except (SandboxCrashed, SandboxClosed, SandboxUnavailable) as exc:
        pending.fail(exc)
    except SandboxError as exc:
        pending.fail(SandboxUnavailable(str(exc)))
    except Exception as exc:
        pending.fail(exc)
    except BaseException:
        pending.fail(SandboxUnavailable("the box's start was cancelled"))
        raise
    else:
        pending.set(box)


async def _laid(
    unit: MemberUnit, deps: NodeDeps, trace: TraceWriter, held: _Held
) -> Sandbox | None:
    """The box that waited for the member's setup, its tree laid (a ``lay`` event);
    None when there is none, or it could not take the tree (it is removed then)."""
    box, held.waiting = held.waiting, None
    ref = unit.spec.sandbox.prepared
    if box is None or ref is None:
        return None
    t0 = time.monotonic()
    try:
        await deps.backend.lay_tree(box, ref=ref)
    except SandboxError as exc:
        await _done_waiting(deps, unit, held)
        held.box, held.replaced = None, box.name  # lay_tree removed it
        trace.emit(
            SandboxEvent(action="lay", box=box.name, detail={"ok": False, "why": str(exc)[:300]})
        )
        return None
    trace.emit(SandboxEvent(action="lay", box=box.name, duration_s=round(time.monotonic() - t0, 3)))
    await _done_waiting(deps, unit, held)
    return box


async def _done_waiting(deps: NodeDeps, unit: MemberUnit, held: _Held) -> None:
    """Hand back the kept tree's directory this attempt was given, once (its box laid it,
    or never will): the last box of a key to do so removes it."""
    tree, held.tree = held.tree, None
    if tree is not None:
        await deps.preparer(unit.run_id).done_waiting(tree)


def _attempt_failed(unit: MemberUnit, exc: Exception, started: float) -> MemberOutcome:
    """The outcome of an attempt that raised instead of ending: a passed deadline, a
    repository that may not go into a box, a lost box, a model error, or a bug."""
    if isinstance(exc, TimeoutError):
        why = f"deadline of {unit.deadline_s:g}s passed"
        return failed_outcome(unit, "timed_out", why, started)
    if isinstance(exc, RepoTooLarge | RepoRefused | SetupFailed):
        return failed_outcome(unit, "failed", str(exc), started)
    if isinstance(exc, SandboxCrashed):
        why = f"sandbox crashed: {exc.reason}"
        return failed_outcome(unit, "crashed", why, started, retryable=True)
    if isinstance(exc, SandboxError):
        return failed_outcome(
            unit, "crashed", f"sandbox unavailable: {exc}", started, retryable=True
        )
    if isinstance(exc, ModelError):
        why = f"model error: {exc}"
        return failed_outcome(unit, "failed", why, started, retryable=exc.retryable)
    return failed_outcome(unit, "failed", f"raised {type(exc).__name__}: {exc}", started)


def _settled(
    unit: MemberUnit, trace: TraceWriter, outcome: MemberOutcome, *, traced_end: bool
) -> MemberOutcome:
    """The outcome after the job's own check of an ``ok`` result (``result_schema``),
    with the trace's last word: the harness's end, unless it traced none or this
    check overruled it."""
    settled_here = not traced_end
    schema = unit.spec.job_schema()
    if outcome.status == "ok" and schema:
        wrong = schema_problems(result_json(outcome.result) or {}, schema)
        if wrong:
            reason = "result does not satisfy the job's result_schema: " + "; ".join(wrong[:5])
            outcome = outcome.model_copy(update={"status": "failed", "reason": reason})
            trace.emit(ErrorEvent(error="ResultSchema", message=reason))
            settled_here = True
    if settled_here:
        # The harness did not get to trace its end (it raised, hung or never started),
        # or traced one this check overruled: the trace's last word is the outcome.
        trace.emit(
            MemberEnd(
                span=unit.spec.id,
                status=outcome.status,
                reason=outcome.reason,
                duration_s=outcome.duration_s,
            )
        )
    return outcome


async def open_pools(
    stack: contextlib.AsyncExitStack,
    deps: NodeDeps,
    units: list[MemberUnit],
    run_id: str,
    max_parallel: int,
    later: bool = False,
) -> None:
    """One warm pool per distinct box spec, sized to what the members will take. A
    member with a setup whose snapshot the engine has already gets a pool of boxes
    made from it; one whose setup has yet to run gets none (its box waits for it).
    A spec only one box is wanted of, with none made before, gets no pool either, unless
    members may come ``later`` (a lead's waves, which a pool starts boxes for)."""
    specs: dict[str, Any] = {}
    for u in units:
        spec = u.spec.sandbox
        if u.setup is not None:
            ref = await _cached_snapshot(deps, u, run_id)
            if ref is None:
                continue
            spec = spec.model_copy(update={"prepared": ref})
        key = spec.pool_key
        specs[key] = spec
        deps.demand[key] = deps.demand.get(key, 0) + u.attempts
    for key, spec in specs.items():
        if spec.keep:
            continue  # a pool's spare box would be kept too; these members get fresh boxes
        want = min(deps.demand[key], max_parallel)
        early: list[dict] = []
        if deps.prewarm is not None and deps.prewarm.run == run_id:
            early = await anyio.to_thread.run_sync(deps.prewarm.take, key)
        if want <= 1 and not early and deps.warm is None and not later:
            # One box, none made before: the member starts it beside its first model
            # call (sandbox/deferred.py). A pool would only start the same box at the
            # same moment, in the way of that call.
            continue
        pool = SandboxPool(deps.backend, spec, run=run_id, min_idle=want, max_size=max_parallel)
        deps.pools[key] = await stack.enter_async_context(pool)
        # No await before this: the pool counts them before its refill makes any box.
        _adopt(deps.backend, pool, early, spec, run_id)
        if deps.warm is not None:
            for box in deps.warm.take(key, want - len(early)):
                pool.adopt(_given(box))


def _given(box: Sandbox) -> Callable[[], Awaitable[Sandbox]]:
    """A box made ready before the run (:mod:`sandbox.warm`), as
    :meth:`SandboxPool.adopt` takes one: asked once that it still answers (one that died
    while idle is removed, and the pool makes another)."""

    async def ready() -> Sandbox:
        try:
            await box.check()
        except SandboxError:
            with anyio.CancelScope(shield=True):
                await box.close()
            raise
        return box

    return ready


def _adopt(
    backend: SandboxBackend, pool: SandboxPool, infos: list[dict], spec: SandboxSpec, run: str
) -> None:
    """Hand boxes of ``spec`` started before the run to its pool; each becomes idle once
    its agent answers (all come up together), one that does not is removed and the
    pool makes another."""
    if not infos or not backend.adopts_prestarted:
        return
    for info in infos:
        member = info["Config"]["Labels"].get("fleet.member", "pool")

        async def ready(info: dict = info, member: str = member) -> Sandbox:
            return await backend.adopt(info, spec, run=run, member=member)

        pool.adopt(ready)


@asynccontextmanager
async def serving(
    deps: NodeDeps, run_id: str, units: list[MemberUnit], services: Services
) -> AsyncIterator[None]:
    """A node's share of one run while its members run: warm pools, the corpus box.

    The pools close (their boxes removed, shielded by the pool) when the block ends;
    not under a time bound: a pool's own task group must be exited in the scope it was
    entered in. The corpus box is removed shielded and bounded by :data:`CLEANUP_S`.
    """
    box: Sandbox | None = None
    try:
        async with contextlib.AsyncExitStack() as stack:
            if deps.warm is not None:
                await stack.enter_async_context(deps.warm.in_use())
            if services.warm_pool:
                later = services.members is not None  # a lead's later waves may come
                await open_pools(stack, deps, units, run_id, services.max_parallel, later)
            if services.corpus:
                box = await start_corpus(deps.backend, run_id)
            yield
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_S):
            if box is not None:
                await box.close()


async def remove_run_boxes(backend: SandboxBackend, run_id: str) -> list[str]:
    """Remove what a run left on this node's engine, except boxes a member asked to
    keep (``sandbox.keep``, for debugging), whose names are returned: they stay with
    their network until ``fleet sandbox rm NAME`` (or ``gc`` after their TTL)."""
    try:
        kept = [b.name for b in await backend.list_boxes(run=run_id) if b.keep]
        if not kept:
            await backend.remove_run(run_id)
        return kept
    finally:
        # The run is over even when the engine is gone: gc may take what is left
        # (anything not kept), and `fleet resume` marks the run live again.
        reaper.mark_done(backend.owner(run_id))


class LocalNodes(Nodes):
    """This host is the only node: attempts run in this process, on its engine."""

    def __init__(self, deps: NodeDeps) -> None:
        self.deps = deps

    def serve(
        self, run_id: str, units: list[MemberUnit], services: Services
    ) -> contextlib.AbstractAsyncContextManager[None]:
        return serving(self.deps, run_id, units, services)

    async def attempt(
        self, unit: MemberUnit, trace: TraceWriter, started: Started
    ) -> MemberOutcome:
        started("")
        return await run_attempt(unit, self.deps, trace)

    def expect(self, units: list[MemberUnit]) -> None:
        self.deps.expect([u.spec.sandbox for u in units])

    async def remove_boxes(self, run_id: str) -> list[str]:
        return await remove_run_boxes(self.deps.backend, run_id)

    async def reap(self, run_id: str) -> int:
        return await self.deps.backend.remove_run(run_id)

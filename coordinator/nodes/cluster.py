"""Members on a Ray cluster: ``fleet run --cluster ADDRESS``.

Docker hosts join a Ray cluster and advertise capacity as the custom resource
``fleet_slots`` (``ray start --address HEAD --resources '{"fleet_slots": 16}'``); this
module is the coordinator's side of that (:class:`RayNodes`, a
:class:`~coordinator.nodes.worker.Nodes`). It is imported only when a run names a cluster,
so Fleet without ``--cluster`` never imports Ray.

Placement. For each run, the coordinator reserves ``min(max_parallel, members)``
slots (a lead's members: as many as it may spawn in all) spread over the nodes (one
slot at a time, round robin, up to each node's ``fleet_slots``) by starting one actor
per node (:class:`~coordinator.nodes.node_service.NodeService`) that holds its share of
``fleet_slots``: Ray's own accounting then keeps two runs from overfilling a node (a
node whose slots another run holds does not start the actor in time and is left out).
A member attempt takes a free slot on the live node with the most free slots and runs
as one streaming call on that node's actor, whose every message is checked on receipt
(:mod:`coordinator.nodes.stream`: one that is not the protocol's ends the attempt
``failed``, unread); the node name is journalled with ``member_started``. When a lead spawns a wave, each member's box is started ahead on a
node that keeps a warm pool for its spec (:meth:`RayNodes.expect`); the member is
placed there when that node has a free slot, and takes that box.

Failure. A node that dies or leaves the cluster mid-member surfaces as Ray's actor or
node errors; they become that member's ``crashed`` with the reason
``node NAME lost: ...`` (never a traceback), the node takes no more members, and the
coordinator's own retry policy runs the member again on another node: one the run
already uses, or, when none of those has a free slot, a Fleet node the run did not
use yet, where a new actor takes over the lost node's slots. Ray's own
retries stay off (``max_restarts=0``, ``max_task_retries=0``): a retried call pinned
to a dead node never finishes. The coordinator enforces each attempt's deadline
itself (the node's own, plus :data:`GRACE_S` for the node to release the box and
report): a frozen node takes about a minute to be declared dead.

Fencing. A node taken for lost has its actor killed at once (``ray.kill``): the
coordinator has already handed its member to another node, and an actor that was only
cut off for a while must not go on with that attempt beside its retry (two boxes
editing, asking and spending for one member). Killing it also makes its death Ray's
verdict now rather than after Ray's health checks give up, so the sweep of a node on
the same engine (:func:`sandbox.cluster.nodes.remove_dead`, run as each actor starts
and again as it closes) takes the lost node's boxes: their owner is dead.

Files. The repository selection, the memory profile and the MCP servers' ``files``
go to the node with the call (:mod:`coordinator.nodes.shipping`); trace events come back
as they happen and go through the coordinator's :class:`~subagents.trace.TraceWriter`
(the live progress table and ``fleet trace --follow`` see them as on one machine);
then the member's files, and
its memory changes, which the coordinator merges into the profile with
:func:`~subagents.context.memory_profile.save_profile` - the same three-way merge and
ledger as a member on this host - so members on different nodes sharing a profile
lose no update. The coordinator stays the single writer of ``runs/RUN/`` and of
memory profiles.

Asks. A member's tool-policy ask comes back in the same stream and goes to the run's
own approver - the approval queue ``fleet approve``, ``--approve-all`` and the run's
terminal answer - and the answer goes back with one actor call
(:mod:`coordinator.nodes.node_asks`); an ask still open when the attempt ends is closed as
abandoned, and the attempt's outcome (``crashed`` for a lost node) stands alone.

Security. Ray runs code sent by anyone who reaches its port, so run it with token
authentication (``RAY_AUTH_MODE=token``) on a private network. The API key stays in
each node's environment: nothing here puts it into a call, a runtime_env or the
object store.
"""

from __future__ import annotations

import contextlib
import secrets
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import ray
import ray.exceptions

from sandbox.cluster.nodes import (
    SLOTS,
    ClusterUnavailable,
    NodeUnreachable,
    actor_name,
    connect,
    fleet_nodes,
    node_name,
    on_each_node,
    pinned,
    remove_dead,
)
from sandbox.spec import SandboxSpec
from subagents.context.memory_profile import FileChange, load_profile, save_profile
from subagents.results.outcome import MemberOutcome
from subagents.rules.policy import Approver
from subagents.spend.budget import run_budget
from subagents.trace import ErrorEvent, MemberEnd, MemorySave, TraceWriter

from . import run_governor
from .node_asks import AskRelay
from .node_budget import BudgetRelay
from .node_check import MISSING, check_node, reap_node
from .node_durable import DurableRefused, DurableUpdate
from .node_durable import keep as keep_durable
from .node_durable import load as load_durable
from .node_service import NodeService, NodeSetup
from .repo_copy import copy_room, staged_copy
from .shipping import (
    NodeReply,
    NodeRequest,
    not_from_node,
    pack,
    pack_path,
    shipped_mcp,
    unpack,
)
from .stream import Ask, Durable, Events, Reply, StreamError, receive
from .worker import (
    CANCELLED,
    MemberUnit,
    Nodes,
    Services,
    Started,
    failed_outcome,
    job_fields,
    received_outcome,
)

GRACE_S = 10.0
"""How long past a member's deadline the coordinator waits for its node to report."""
READY_S = 60.0
"""How long a node's actor may take to start (its slots free, its process up)."""
CLOSE_S = 60.0
"""How long a node may take to remove the run's boxes at the end."""
LOST_CLOSE_S = 5.0
"""How long a node that could not start its share of the run is given to remove it."""

_Actor: Any = None  # ray.remote(NodeService), made on first use

__all__ = ["ClusterUnavailable", "RayNodes", "check_nodes"]


def check_nodes(
    address: str,
    images: list[str],
    own: dict[str, str],
    firewall: bool,
    *,
    insecure: bool = False,
) -> int:
    """Every Fleet node has the run's images - Fleet's (by name), and members' own
    (reference -> the field naming it) - and, for browser boxes, the host firewall rules;
    ClusterUnavailable naming each node that does not, and ``fleet setup``. Returns the
    ``fleet_slots`` the nodes offer. A cluster that lets in a process without its token
    is refused unless ``insecure`` (:func:`sandbox.cluster.nodes.connect`)."""
    connect(address, insecure=insecure)
    problems: list[str] = []
    lacking = False
    for name, found in on_each_node(address, check_node, images, own, firewall):
        if isinstance(found, NodeUnreachable):
            found = [
                f"did not answer ({found}); a node that just left the cluster stays listed "
                "for about a minute"
            ]
        problems += [f"node {name}: {p}" for p in found]
        lacking = lacking or any(p.endswith(MISSING) for p in found)
    if problems:
        push = (
            f"\nload Fleet's images into their engines from this host with 'fleet images "
            f"push --cluster {address}', or "
            if lacking
            else "\n"
        )
        raise ClusterUnavailable(
            "the cluster's nodes are not ready for this run:\n  "
            + "\n  ".join(problems)
            + push
            + "run 'fleet setup' (as root) on each of those Docker hosts (and load any "
            "image a member names there), then try again"
        )
    return sum(int(n["Resources"][SLOTS]) for n in fleet_nodes(address))


def allocate(capacity: list[int], want: int) -> list[int]:
    """Spread ``want`` slots over nodes of the given capacity, one at a time in turn."""
    share = [0] * len(capacity)
    while sum(share) < min(want, sum(capacity)):
        for i, cap in enumerate(capacity):
            if share[i] < cap and sum(share) < want:
                share[i] += 1
    return share


@dataclass
class _Node:
    """One node's actor for this run and its slots."""

    name: str
    info: dict[str, Any]
    actor: Any
    slots: int
    free: int
    lost: str = ""
    """Why the node is gone ("" while it serves)."""
    fenced: bool = False
    """Its actor was killed when it was lost mid-run (:meth:`RayNodes._lose`)."""
    pooled: set[str] = field(default_factory=set)
    """The box specs (as JSON) this node keeps a warm pool for."""
    ahead: dict[str, int] = field(default_factory=dict)
    """Boxes this node was asked to start ahead (:meth:`RayNodes.expect`) that no
    member took yet, by spec."""


def _lost_reason(exc: BaseException) -> str:
    """Ray's actor and node errors, in words (never a traceback)."""
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = exc.cause
        while isinstance(cause, BaseExceptionGroup) and cause.exceptions:
            cause = cause.exceptions[0]  # a task group's: the error itself, not its wrapper
        return f"it raised {type(cause).__name__}: {cause}"
    text = str(exc)
    if isinstance(exc, ray.exceptions.ActorUnavailableError):
        return "it stopped answering"
    if isinstance(exc, ray.exceptions.ActorDiedError):
        if "node" in text and "died" in text:
            return "it died or left the cluster"
        return "its actor process died"
    if isinstance(exc, ray.exceptions.NodeDiedError | ray.exceptions.LocalRayletDiedError):
        return "it died"
    if isinstance(exc, ray.exceptions.ObjectLostError):
        return "the member's results were lost with it"
    if isinstance(exc, ray.exceptions.WorkerCrashedError):
        return "its worker process crashed"
    return f"{type(exc).__name__}: {text.strip().splitlines()[0] if text.strip() else ''}"


class RayNodes(Nodes):
    """A run's members on the nodes of a Ray cluster (see the module docstring)."""

    def __init__(
        self,
        address: str,
        *,
        setup: NodeSetup | None = None,
        approver: Approver | None = None,
        insecure: bool = False,
    ) -> None:
        self.address = address
        self.insecure = insecure
        """Use the cluster even if it lets in a process without its token."""
        self.setup = setup
        """Builds each node's side on the node (default: its Docker engine)."""
        self.approver = approver
        """Answers members' policy asks (the run's approval queue, here); None: nobody
        to ask, each member's ``ask_default`` applies."""
        self.nodes: list[_Node] = []
        self._changed = anyio.Event()
        self._run_id = ""
        self._services = Services(max_parallel=1)
        self._missing = 0
        """Slots of lost nodes not yet found again on another node."""
        self._replacing = False
        self._ahead: list[Any] = []
        """Calls of :meth:`expect`, which nobody waits for; read when the run ends."""
        self.governor: Any = None
        """The run's rate governor actor (:mod:`coordinator.nodes.run_governor`)."""
        self._lost_with_node: dict[str, MemberOutcome] = {}
        """Each member's last outcome made here for its node being lost."""

    # ------------------------------------------------------------ placement

    @asynccontextmanager
    async def serve(
        self, run_id: str, units: list[MemberUnit], services: Services
    ) -> AsyncIterator[None]:
        self._run_id, self._services = run_id, services
        connect(self.address, insecure=self.insecure)
        self.governor = run_governor.start()
        infos = fleet_nodes(self.address)
        members = sum(u.attempts for u in units) if services.members is None else services.members
        share = allocate(
            [int(n["Resources"][SLOTS]) for n in infos], min(services.max_parallel, members)
        )
        for info, slots in zip(infos, share, strict=True):
            if slots:
                self.nodes.append(self._actor(info, slots))
        await self._start(units)
        try:
            yield
        finally:
            # A failed call changed nothing (its node is lost: the member that would
            # have used the box runs elsewhere); read, it is not reported as unhandled.
            for ref in self._ahead:
                with contextlib.suppress(Exception):
                    ray.get(ref, timeout=0)
            self._ahead.clear()
            with contextlib.suppress(Exception):
                ray.kill(self.governor)

    def expect(self, units: list[MemberUnit]) -> None:
        """A lead's later wave: each member's box is started ahead on a live node that
        keeps a warm pool for its spec, the one with the fewest such boxes per slot,
        and the member is later placed where its box waits (:meth:`_take`). Members
        whose spec no node pools get their box when they start, as on one machine."""
        ahead: dict[int, list[SandboxSpec]] = {}
        for unit in units:
            key = unit.spec.sandbox.pool_key
            holders = [i for i, n in enumerate(self.nodes) if not n.lost and key in n.pooled]
            if not holders:
                continue
            i = min(holders, key=lambda i: sum(self.nodes[i].ahead.values()) / self.nodes[i].slots)
            self.nodes[i].ahead[key] = self.nodes[i].ahead.get(key, 0) + 1
            ahead.setdefault(i, []).append(unit.spec.sandbox)
        for i, specs in ahead.items():
            self._ahead.append(self.nodes[i].actor.expect.remote(specs))

    def _actor(self, info: dict[str, Any], slots: int) -> _Node:
        """Start the run's actor on this node, holding ``slots`` of its ``fleet_slots``."""
        global _Actor
        _Actor = _Actor or ray.remote(NodeService)
        actor = _Actor.options(
            num_cpus=0,
            resources={SLOTS: slots},
            scheduling_strategy=pinned(info),
            max_restarts=0,
            max_task_retries=0,
            # Its name is its boxes' sign of life for any host's gc (sandbox.cluster.nodes).
            name=actor_name(self._run_id, node_name(info)),
            namespace="fleet",
        ).remote(self._run_id, node_name(info), self.setup, self.governor, remove_dead)
        return _Node(node_name(info), info, actor, slots, slots)

    async def _up(self, node: _Node, units: list[MemberUnit]) -> None:
        """The node's actor up and its services started, or the node marked lost."""
        services = self._services.model_copy(update={"max_parallel": node.slots})
        try:
            with anyio.fail_after(READY_S):
                await node.actor.ready.remote()
                await node.actor.start.remote(units, services)
        except TimeoutError:
            node.lost = f"its {node.slots} {SLOTS} did not come free within {READY_S:g}s"
            ray.kill(node.actor)
        except ray.exceptions.RayError as exc:
            node.lost = _lost_reason(exc)

    async def _start(self, units: list[MemberUnit]) -> None:
        """Each node's actor up and its services started; a node that cannot is left out.
        Each node's warm pools are sized for its share of the members."""
        owners = [i for i, n in enumerate(self.nodes) for _ in range(n.slots)]
        async with anyio.create_task_group() as tg:
            for i, node in enumerate(self.nodes):
                mine = [u for j, u in enumerate(units) if owners[j % len(owners)] == i]
                if self._services.warm_pool:
                    node.pooled = {u.spec.sandbox.pool_key for u in mine if not u.spec.sandbox.keep}
                tg.start_soon(self._up, node, mine)
        problems = [f"node {n.name}: {n.lost}" for n in self.nodes if n.lost]
        if self.nodes and all(n.lost for n in self.nodes):
            raise ClusterUnavailable(
                f"no node of the Ray cluster at {self.address} could take the run: "
                + "; ".join(problems)
            )

    async def warm(self) -> None:
        """Returns once every live node's warm pools hold their idle boxes (a benchmark
        starts its clock then, as on one machine)."""
        async with anyio.create_task_group() as tg:
            for node in self.nodes:
                if not node.lost:
                    tg.start_soon(_wait, node.actor.warm.remote())

    async def _take(self, key: str) -> _Node | None:
        """A free slot on the live node with the most free slots (None: no node left),
        on a node holding a box of spec ``key`` started ahead when there is one. Slots
        lost with a node are first sought on a node the run does not use yet."""
        while True:
            free = [n for n in self.nodes if not n.lost and n.free > 0]
            if free:
                node = max(free, key=lambda n: (n.ahead.get(key, 0) > 0, n.free / n.slots))
                node.free -= 1
                if node.ahead.get(key, 0) > 0:
                    node.ahead[key] -= 1
                return node
            if self._missing and not self._replacing:
                self._replacing = True
                try:
                    await self._replace()
                finally:
                    self._replacing = False
                    self._notify()
                continue
            if not self._replacing and all(n.lost for n in self.nodes):
                return None
            changed = self._changed
            await changed.wait()

    def _lose(self, node: _Node, reason: str) -> None:
        if not node.lost:
            node.lost = reason
            self._missing += node.slots
            # Fenced (see the module docstring): its attempt now runs elsewhere.
            node.fenced = True
            with contextlib.suppress(Exception):
                ray.kill(node.actor)
            self._notify()

    async def _replace(self) -> None:
        """Start the run's actor on a Fleet node it does not use yet, for the slots its
        lost nodes held (as many as that node has); none left: the run goes on with less."""
        used = {n.info["NodeID"] for n in self.nodes}
        try:
            infos = await anyio.to_thread.run_sync(fleet_nodes, self.address)
        except ClusterUnavailable:
            infos = []
        for info in infos:
            if info["NodeID"] in used:
                continue
            node = self._actor(info, min(int(info["Resources"][SLOTS]), self._missing))
            self.nodes.append(node)
            await self._up(node, [])
            if not node.lost:
                self._missing -= node.slots
                return
        self._missing = 0

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    # ------------------------------------------------------------ one attempt

    async def attempt(
        self, unit: MemberUnit, trace: TraceWriter, started: Started
    ) -> MemberOutcome:
        t0 = time.monotonic()
        node = await self._take(unit.spec.sandbox.pool_key)
        if node is None:
            lost = "; ".join(f"{n.name}: {n.lost}" for n in self.nodes)
            started("")
            return self._ended(unit, trace, f"no node of the cluster is left ({lost})", t0)
        started(node.name)
        try:
            return await self._run_on(node, unit, trace, t0)
        finally:
            node.free += 1
            self._notify()

    async def _run_on(
        self, node: _Node, unit: MemberUnit, trace: TraceWriter, t0: float
    ) -> MemberOutcome:
        if NodeRequest.has_files(unit):  # files to pack: off the loop
            request = await anyio.to_thread.run_sync(_request, unit)
        else:
            request = NodeRequest(unit=unit)
        budget = run_budget(unit.run_id)
        request.budget = budget is not None
        if budget is not None:
            request.closing_tokens = budget.closing_tokens
        call = node.actor.attempt.options(num_returns="streaming").remote(request)
        async with anyio.create_task_group() as tg:
            # The attempt's asks and reservations are answered in tg; whatever is still
            # open when the attempt ends (its node lost, its deadline) is closed then.
            asks = AskRelay(self.approver, _replier(node.actor), tg)
            relay: dict[str, Callable[[Any], None]] = {"ask": asks.ask, "unask": asks.unask}
            reservations = None
            if budget is not None:
                reservations = BudgetRelay(budget, unit.spec.id, _replier(node.actor), tg)
                relay |= {
                    "reserve": reservations.reserve,
                    "unreserve": reservations.unreserve,
                    "settle": reservations.settle,
                    "release": reservations.release,
                }
            try:
                outcome = await self._follow(node, unit, trace, t0, call, request, relay)
            finally:
                tg.cancel_scope.cancel()
                if reservations is not None:
                    reservations.close()
        return outcome

    async def _follow(
        self,
        node: _Node,
        unit: MemberUnit,
        trace: TraceWriter,
        t0: float,
        call: Any,
        request: NodeRequest,
        relay: dict[str, Callable[[Any], None]],
    ) -> MemberOutcome:
        """The attempt's stream to its end: each message validated
        (:mod:`coordinator.nodes.stream`), events traced, asks and reservations relayed
        (``relay``: message kind -> handler), turns kept, its reply kept. A message that
        is not one of the protocol's - or one this attempt does not take, a reservation
        in a run without a budget, an ask or an event in another member's name - ends the
        attempt ``failed``, unread."""
        reply: NodeReply | None = None
        held = _Held()
        fields = job_fields(unit)
        try:
            # A member's clock stands while its setup runs on the node (bounded by the
            # setup's own limit, and a box start for it).
            setup_s = unit.setup.timeout_s + 120 if unit.setup is not None else 0.0
            with anyio.fail_after(unit.deadline_s + GRACE_S + setup_s):
                async for ref in call:
                    msg = receive(await ref, job_fields=fields)
                    if reply is not None:
                        raise StreamError(f"a {msg.kind!r} message after its reply")
                    if isinstance(msg, Events):
                        _own_events(unit, msg)
                        for event in msg.events:
                            held.emit(trace, event)
                    elif isinstance(msg, Durable):
                        await _keep_turn(unit, trace, msg.update)
                    elif isinstance(msg, Reply):
                        reply = msg.reply
                    elif isinstance(msg, Ask) and msg.request.member != unit.spec.id:
                        # A person reads the ask as that member's, and an "always" is
                        # kept for that member: only this attempt's member may ask.
                        raise StreamError(
                            f"an 'ask' for member {msg.request.member[:64]!r}, not this "
                            f"attempt's {unit.spec.id!r}"
                        )
                    elif msg.kind in relay:
                        relay[msg.kind](msg)
                    else:
                        raise StreamError(
                            f"a {msg.kind!r} message, which this attempt does not take"
                        )
        except StreamError as exc:
            _cancel(call)
            reason = f"node {node.name} sent {exc}; the attempt is stopped"
            return self._ended(unit, trace, reason, t0, status="failed")
        except TimeoutError:
            # The node's own deadline would have ended the member GRACE_S ago: a node
            # this late is frozen or cut off, and takes no more members.
            _cancel(call)
            self._lose(node, f"it did not report within {GRACE_S:g}s of a member's deadline")
            reason = f"deadline of {unit.deadline_s:g}s passed (node {node.name} did not report)"
            return self._ended(unit, trace, reason, t0, status="timed_out")
        except CANCELLED():
            _cancel(call)
            raise
        except ray.exceptions.RayTaskError as exc:
            reason = f"node {node.name} failed the attempt: {_lost_reason(exc)}"
            return self._ended(unit, trace, reason, t0, status="failed")
        except ray.exceptions.RayError as exc:
            self._lose(node, _lost_reason(exc))
            lost = self._ended(unit, trace, f"node {node.name} lost: {node.lost}", t0)
            self._lost_with_node[unit.spec.id] = lost
            return lost
        if reply is None:
            return self._ended(unit, trace, f"node {node.name} ended without a result", t0)
        try:
            outcome = received_outcome(unit, reply.outcome)
        except ValueError as exc:  # nothing of the attempt is kept: not its files either
            reason = f"node {node.name} sent an outcome that is not one: {exc}"
            return self._ended(unit, trace, reason, t0, status="failed")
        saved = await anyio.to_thread.run_sync(_keep, unit, reply, request, held.key)
        if saved is not None:
            trace.emit(saved)
        for event in held.ends:
            trace.emit(event)
        if request.not_copied:  # left out here, where the repository was staged
            return outcome.model_copy(update={"not_copied": request.not_copied})
        return outcome

    def _ended(
        self,
        unit: MemberUnit,
        trace: TraceWriter,
        reason: str,
        t0: float,
        *,
        status: str = "crashed",
    ) -> MemberOutcome:
        """An attempt the node could not report itself: traced and returned here."""
        outcome = failed_outcome(unit, status, reason, t0, retryable=status == "crashed")
        trace.emit(ErrorEvent(error="NodeLost" if status == "crashed" else status, message=reason))
        trace.emit(
            MemberEnd(
                span=unit.spec.id,
                status=outcome.status,
                reason=reason,
                duration_s=outcome.duration_s,
            )
        )
        return outcome

    def lost_node(self, outcome: MemberOutcome) -> bool:
        return self._lost_with_node.get(outcome.member) is outcome

    # ------------------------------------------------------------ cleanup

    async def remove_boxes(self, run_id: str) -> list[str]:
        """Each live node removes the run's boxes (its own liveness marker goes) and
        those of dead actors on its engine. A node lost mid-run had its actor killed
        then: its boxes are left to such a sweep on its engine, ``fleet sandbox gc`` on
        it and their TTL. One that could not start its share is asked briefly."""
        kept: list[str] = []

        async def close(node: _Node) -> None:
            with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
                with anyio.fail_after(LOST_CLOSE_S if node.lost else CLOSE_S):
                    names = await node.actor.close.remote()
                kept.extend(names)  # removed with fleet sandbox rm on that node's host

        try:
            async with anyio.create_task_group() as tg:
                for node in self.nodes:
                    if not node.fenced:
                        tg.start_soon(close, node)
        finally:
            for node in self.nodes:
                with contextlib.suppress(Exception):
                    ray.kill(node.actor)
        return kept

    async def reap(self, run_id: str) -> int:
        """Remove a dead run's boxes on every Fleet node (before a resume)."""
        connect(self.address, insecure=self.insecure)
        done = await anyio.to_thread.run_sync(on_each_node, self.address, reap_node, run_id)
        # A node that does not answer keeps its boxes until its own gc or their TTL.
        return sum(count for _, count in done if isinstance(count, int))


async def _wait(ref: Any) -> None:
    await ref


def _replier(actor: Any) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
    """How an answer reaches the node's waiting member (a node gone: nobody waits)."""

    async def reply(ask_id: str, approval: dict[str, Any]) -> None:
        with contextlib.suppress(ray.exceptions.RayError):
            await actor.answer.remote(ask_id, approval)

    return reply


def _cancel(call: Any) -> None:
    with contextlib.suppress(Exception):
        ray.cancel(call)


def _own_events(unit: MemberUnit, msg: Events) -> None:
    """A node's events are its attempt's member's, of this run: the trace views and the
    live telemetry file an event under the member it names, so an event in another's
    name would put words in that member's record."""
    for event in msg.events:
        if event.member not in ("", unit.spec.id) or event.run not in ("", unit.run_id):
            raise StreamError(
                f"an event of member {event.member[:64]!r} of run {event.run[:64]!r}, not "
                f"this attempt's {unit.spec.id!r}"
            )


@dataclass
class _Held:
    """Node events the coordinator does not pass on as they come: the node's memory
    save (into its own copy of the profile; the real save is the coordinator's) and
    the member's end (traced after that save, as on one machine)."""

    key: str = ""
    ends: list[Any] = field(default_factory=list)

    def emit(self, trace: TraceWriter, event: Any) -> None:
        if isinstance(event, MemorySave):
            self.key = event.key
        elif isinstance(event, MemberEnd):
            self.ends.append(event)
        else:
            trace.emit(event)


def _request(unit: MemberUnit) -> NodeRequest:
    """What the node needs for one attempt: the unit, its repo selection, its memory
    and its MCP servers' files."""
    request = NodeRequest(unit=unit)
    if unit.repo:
        staged = staged_copy(Path(unit.repo), room=copy_room(unit.spec.sandbox))
        try:
            request.repo = pack(Path(staged.name))
        finally:
            staged.cleanup()
        request.not_copied = staged.not_copied
    if unit.spec.memory_dir is not None:
        with tempfile.TemporaryDirectory() as tmp:
            loaded = load_profile(Path(unit.spec.memory_dir), Path(tmp) / "memory")
            request.memory = pack(Path(tmp) / "memory", links=False)
            request.memory_seq = loaded.seq
    for name, path in shipped_mcp(unit):
        request.mcp_files[name] = pack_path(path)
    request.durable = load_durable(Path(unit.member_dir))
    return request


async def _keep_turn(unit: MemberUnit, trace: TraceWriter, sent: DurableUpdate) -> None:
    """A saved turn's transcript and checkpoint from the node, into the member's run
    directory; an update that breaks a bound is traced and left out (the member then
    resumes from its last good one, or from turn 0)."""
    try:
        await anyio.to_thread.run_sync(keep_durable, Path(unit.member_dir), sent)
    except DurableRefused as exc:
        trace.emit(ErrorEvent(error="DurableRefused", message=str(exc)))


def _keep(unit: MemberUnit, reply: NodeReply, request: NodeRequest, key: str) -> MemorySave | None:
    """The member's files into its run directory; its memory changes merged into its
    profile here, as a member on this host saves them (the returned event says how)."""
    unpack(reply.files, Path(unit.member_dir), drop=not_from_node)
    profile = unit.spec.memory_dir
    if profile is None or not reply.memory:
        return None
    key = key or f"{unit.run_id}/{unit.spec.id}/{secrets.token_hex(6)}"
    changes = [FileChange(c.path, c.base, c.ours) for c in reply.memory]
    event = MemorySave(profile=str(profile), key=key)
    try:
        event.files, event.already_saved = save_profile(
            Path(profile),
            changes,
            key=key,
            run=unit.run_id,
            member=unit.spec.id,
            loaded_seq=request.memory_seq,
        )
    except Exception as exc:  # the member's outcome stands; the save's failure is traced
        event.error = f"{exc}; {len(changes)} changed file(s) not saved"
    return event

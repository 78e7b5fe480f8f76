"""A cluster node's share of one run: the body of the node's Ray actor.

:mod:`coordinator.nodes.cluster` starts one actor of :class:`NodeService` per node per run
(``ray.remote(NodeService)``; this module does not import Ray). The actor owns the
node's side of the run - its Docker backend (boxes labelled ``fleet.node``), warm
pools, run network, egress proxy and corpus box - and runs members there: each
member's attempt is one streaming call of :meth:`NodeService.attempt`, which runs
:func:`coordinator.nodes.node.run_attempt` against a scratch directory and yields the
messages of :mod:`coordinator.nodes.stream`: the trace events as they happen, then a
:class:`~coordinator.nodes.shipping.NodeReply` with the outcome and the member's files. The coordinator writes all of it into ``runs/RUN/``;
nothing here touches the coordinator's file system. A member whose tool policy may
ask gets an approver that asks the coordinator through the same stream and waits for
:meth:`NodeService.answer` (:mod:`coordinator.nodes.node_asks`); in a run with a
``[budget]``, each model call's reservation goes the same way
(:mod:`coordinator.nodes.node_budget`).

Why the agent loop runs here and not on the coordinator: the box's exec stream, CDP
port and run network are reachable only from the host that holds it.

Cancellation: when the coordinator stops an attempt (Ctrl-C, fail-fast, its own
deadline) it cancels the call; the attempt's cancel scope is cancelled, so the box is
released (shielded) exactly as on one machine. :meth:`NodeService.close` then removes
whatever of the run is left on this node.

The model client is made here from the node's own environment (``ANTHROPIC_API_KEY``
and friends): the key never travels through Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from sandbox.host.scratch import Scratch
from sandbox.registry import get_backend
from sandbox.spec import SandboxSpec
from subagents.model import make_model
from subagents.results.outcome import MemberOutcome
from subagents.trace import TraceWriter

from .node import NodeDeps, remove_run_boxes, run_attempt, serving
from .node_asks import NodeAsks
from .node_budget import RelayBudget
from .node_durable import DurableUpdate, Mirror, is_durable, place
from .shipping import (
    COORDINATOR_FILES,
    NodeReply,
    NodeRequest,
    memory_changes,
    pack,
    snapshot,
    unpack,
)
from .stream import EVENTS_PER_MESSAGE, Durable, Events, Message, Reply
from .worker import MemberUnit, Services

NodeSetup = Callable[[str], NodeDeps]
"""Builds a node's :class:`NodeDeps` on the node, from the node's name (picklable)."""

CLOSE_WAIT_S = 30.0
"""How long closing waits for cancelled attempts to release their boxes."""


def _durable(send: Callable[[Message], None]) -> Callable[[DurableUpdate], None]:
    """Where a saved turn's update goes: into the stream, as a ``durable`` message."""
    return lambda update: send(Durable(update=update))


def docker_node(node: str) -> NodeDeps:
    """The default node side: this host's Docker engine, the real model factory."""
    return NodeDeps(backend=get_backend("docker", node=node), make_model=make_model)


def _preload(units: list[MemberUnit]) -> None:
    """Import what the run's members need (the harness; the API client if one of them
    calls a real model) while the run starts, not when its first member does: a second
    or more on a busy host. A run on offline models never imports the SDK (about 60% of
    what a node would import, for nothing)."""
    import subagents.member
    from subagents.model import ModelError, parse_model

    def real(unit: MemberUnit) -> bool:
        try:
            return parse_model(unit.spec.model).source not in ("offline", "replay")
        except ModelError:
            return False  # the member's attempt reports it

    if any(real(u) for u in units):
        import subagents.model.claude  # noqa: F401


def _quietly(sweep: Callable[[], int]) -> int:
    """A sweep's failure (the engine busy, Ray slow to answer) costs the run nothing:
    the next actor's sweep, or gc, takes what this one left."""
    try:
        return sweep()
    except Exception:
        return 0


@dataclass
class _Scratch:
    """One attempt's files on the node."""

    unit: MemberUnit
    member_dir: Path
    repo: Path | None = None
    memory_dir: Path | None = None
    before: dict[str, bytes] = field(default_factory=dict)
    """The memory directory's files as shipped (to tell what the member changed)."""

    def reply(self, outcome: MemberOutcome) -> NodeReply:
        return NodeReply(
            outcome=outcome,
            files=pack(self.member_dir, skip=COORDINATOR_FILES, skip_if=is_durable),
            memory=memory_changes(self.before, self.memory_dir) if self.memory_dir else [],
        )


class NodeService:
    """One node's share of one run; see the module docstring."""

    def __init__(
        self,
        run_id: str,
        node: str,
        setup: NodeSetup | None = None,
        governor: Any = None,
        sweep: Callable[[], int] | None = None,
    ) -> None:
        self.run_id = run_id
        self.node = node
        self._sweep = sweep
        """Removes this engine's boxes whose node's actor is dead (as the actor starts
        and as it closes)."""
        if governor is not None:
            # The run's one rate governor (a Ray actor): this node's model calls ask it.
            from .run_governor import install

            install(governor)
        self.deps = (setup or docker_node)(node)
        self._scratch = Scratch(f"fleet-node-{run_id}-")
        self.scratch = self._scratch.path
        self._stop: asyncio.Event | None = None
        self._serving: asyncio.Task[None] | None = None
        self._running: dict[asyncio.Task[None], anyio.CancelScope] = {}
        """Attempts in progress, each with the cancel scope that stops it."""
        self._asks = NodeAsks()
        self._swept: asyncio.Future[int] | None = None

    async def ready(self) -> str:
        """The node's name, once the actor is up (its slots are reserved then)."""
        return self.node

    async def start(self, units: list[MemberUnit], services: Services) -> None:
        """Open the run's warm pools and corpus box on this node; returns once they are up."""
        await anyio.to_thread.run_sync(_preload, units)
        loop = asyncio.get_running_loop()
        if self._sweep is not None:  # beside the run's start, never holding it up
            self._swept = loop.run_in_executor(None, _quietly, self._sweep)
        self._stop = asyncio.Event()
        up: asyncio.Future[None] = loop.create_future()
        stop = self._stop

        async def keep() -> None:
            try:
                async with serving(self.deps, self.run_id, units, services):
                    up.set_result(None)
                    await stop.wait()
            except BaseException as exc:
                if not up.done():
                    up.set_exception(exc)
                    return
                raise

        self._serving = loop.create_task(keep())
        await up

    async def warm(self) -> None:
        """Returns once the run's warm pools here hold their idle boxes, ready."""
        for pool in self.deps.pools.values():
            await pool.wait_idle()

    async def expect(self, specs: list[SandboxSpec]) -> None:
        """Members with these boxes are coming here (a lead's later wave): the run's warm
        pools on this node start boxes for them (:meth:`NodeDeps.expect`)."""
        self.deps.expect(specs)

    async def answer(self, ask_id: str, approval: dict[str, Any]) -> bool:
        """The coordinator's answer to a member's ask (:mod:`coordinator.nodes.node_asks`)."""
        return self._asks.answer(ask_id, approval)

    async def attempt(self, request: NodeRequest) -> AsyncIterator[dict[str, Any]]:
        """Run one attempt; yields the messages of :mod:`coordinator.nodes.stream` in
        their wire form: ``events`` while it runs - with its policy's asks, its budget's
        reservations and its saved turns among them, in order - then one ``reply``.
        Never raises for the member's own failure."""
        if request.repo is not None or request.memory is not None or request.has_payload():
            here = await anyio.to_thread.run_sync(self._prepare, request)
        else:
            here = self._prepare(request)
        unit = here.unit
        # Trace events (dumped as traced), the stream's other messages, None at the end.
        queue: asyncio.Queue[dict[str, Any] | Message | None] = asyncio.Queue()
        trace = TraceWriter(here.member_dir / "trace.jsonl", run=unit.run_id, member=unit.spec.id)
        trace.listeners.append(lambda e: queue.put_nowait(e.model_dump(exclude_none=True)))
        deps = self.deps
        if unit.spec.policy.may_ask:  # its asks go to the coordinator, through the stream
            deps = dataclasses.replace(deps, approver=self._asks.approver(queue.put_nowait))
        if request.budget:  # and its calls' reservations, to the run's one budget there
            relay = RelayBudget(queue.put_nowait, self._asks, request.closing_tokens)
            deps = dataclasses.replace(deps, budget=relay)
        scope = anyio.CancelScope()
        done: list[NodeReply] = []

        async def body() -> None:
            try:
                with scope:
                    outcome = await run_attempt(
                        unit,
                        deps,
                        trace,
                        member_dir=here.member_dir,
                        staged_repo=here.repo,
                        on_turn_saved=Mirror(here.member_dir, _durable(queue.put_nowait)),
                    )
                    done.append(await anyio.to_thread.run_sync(here.reply, outcome))
            finally:
                queue.put_nowait(None)

        task = asyncio.get_running_loop().create_task(body())
        self._running[task] = scope
        task.add_done_callback(lambda t: self._running.pop(t, None))
        try:
            while True:
                batch = [await queue.get()]
                while not queue.empty():
                    batch.append(queue.get_nowait())
                events: list[dict[str, Any]] = []
                for item in batch:
                    if isinstance(item, dict):
                        events.append(item)
                        if len(events) == EVENTS_PER_MESSAGE:
                            yield Events.batch(events)
                            events = []
                        continue
                    if events:  # in order: what the member traced before it asked
                        yield Events.batch(events)
                        events = []
                    if item is not None:
                        yield item.wire()
                if events:
                    yield Events.batch(events)
                if None in batch:
                    break
            await task
            if done:
                yield Reply(reply=done[0]).wire()
        finally:
            if not task.done():
                scope.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.shield(task)
            trace.close()

    def _prepare(self, request: NodeRequest) -> _Scratch:
        """The attempt's scratch space: member directory, repo, memory and MCP servers'
        files unpacked."""
        mid = request.unit.spec.id
        here = _Scratch(unit=request.unit, member_dir=self.scratch / "members" / mid)
        shutil.rmtree(here.member_dir, ignore_errors=True)  # an earlier attempt's went back
        here.member_dir.mkdir(parents=True)
        place(here.member_dir, request.durable)  # it goes on from its last saved turn
        if request.repo is not None:
            here.repo = self.scratch / "repos" / mid
            shutil.rmtree(here.repo, ignore_errors=True)
            unpack(request.repo, here.repo, any_links=True)
        if request.memory is not None:
            here.memory_dir = self.scratch / "memory" / mid
            shutil.rmtree(here.memory_dir, ignore_errors=True)
            unpack(request.memory, here.memory_dir)
            here.before = snapshot(here.memory_dir)
            spec = here.unit.spec.model_copy(update={"memory_dir": here.memory_dir})
            here.unit = here.unit.model_copy(update={"spec": spec})
        if request.mcp_files:
            here.unit = self._mcp_files(here.unit, request.mcp_files)
        return here

    def _mcp_files(self, unit: MemberUnit, shipped: dict[str, bytes]) -> MemberUnit:
        """The MCP servers' ``files`` unpacked here, each server pointed at its copy."""
        servers = []
        for server in unit.spec.mcp:
            data = shipped.get(server.name)
            if data is not None and server.files is not None:
                dest = self.scratch / "mcp" / unit.spec.id / server.name
                shutil.rmtree(dest, ignore_errors=True)
                unpack(data, dest, any_links=True)  # the user's files, links as they are
                copy = dest / Path(server.files).name
                server = server.model_copy(update={"files": str(copy)})
            servers.append(server)
        spec = unit.spec.model_copy(update={"mcp": servers})
        return unit.model_copy(update={"spec": spec})

    async def close(self) -> list[str]:
        """Stop the run's attempts and services here and remove its boxes on this node;
        returns the names of boxes kept for debugging."""
        for scope in list(self._running.values()):
            scope.cancel()  # a cancelled call may still be creating its box: wait for it
        if self._running:
            await asyncio.wait(list(self._running), timeout=CLOSE_WAIT_S)
        if self._stop is not None:
            self._stop.set()
        if self._serving is not None:
            with contextlib.suppress(Exception):
                await self._serving
        try:
            return await remove_run_boxes(self.deps.backend, self.run_id)
        finally:
            self._scratch.cleanup()
            if self._sweep is not None:
                # Again as the run ends: a node lost after this actor's first sweep, or
                # before Ray knew it then, left boxes whose owner is dead by now.
                await anyio.to_thread.run_sync(_quietly, self._sweep)

"""A box that is still starting: a member's first model call need not wait for it.

A member's first turn is a model call that uses nothing of its box (the task, the
brief and the tools' definitions are all host-side), and it takes as long as a box
takes to start or longer: 0.3-2 s for a box (a browser box until its CDP port
answers; many boxes at once on a small host take longer), 2-30 s for Claude's first
answer. Waiting for the box first adds the two; overlapping them hides the box. So
the node hands the member a :class:`DeferredSandbox` at once and starts the box
beside it (:func:`coordinator.nodes.node.run_attempt`): every call on it waits until the
box is ready and then goes to the box; a box that could not be made raises the
error that stopped it, on every call, as a dead box raises its crash. The harness
awaits :meth:`DeferredSandbox.ready` before a turn's tools run
(:meth:`subagents.loop.loop.AgentLoop.box_ready`), so an error of the box's start ends the
member as it did when the start came first (``crashed``, retryable), never as a
failed tool call.

The price is one model call made for a member whose box then fails to start; the
preflight (images present, engine up) makes that rare, and the box's error is what
the member ends with.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import anyio

from .base import Command, ExecResult, FileInfo, Sandbox
from .process import BoxProcess
from .spec import SandboxSpec


class DeferredSandbox(Sandbox):
    """The box of ``member`` once :meth:`set` gives it; every call waits for that."""

    def __init__(self, spec: SandboxSpec, member: str) -> None:
        self.spec = spec
        self.id = ""
        self.name = f"(box of {member}, starting)"
        self._set = anyio.Event()
        self._box: Sandbox | None = None
        self._error: BaseException | None = None

    def set(self, box: Sandbox) -> None:
        """The box is ready: calls go to it from now on."""
        self._box = box
        self.id, self.name, self.allowed_roots = box.id, box.name, box.allowed_roots
        self._set.set()

    def fail(self, error: BaseException) -> None:
        """The box will not come: every call (and :meth:`ready`) raises ``error``."""
        self._error = error
        self._set.set()

    async def ready(self) -> Sandbox:
        """The box, when it is ready; raises what stopped it otherwise."""
        if not self._set.is_set():  # set: no trip through the event loop (every call)
            await self._set.wait()
        if self._error is not None:
            raise self._error
        assert self._box is not None
        return self._box

    async def exec(
        self,
        cmd: Command,
        *,
        timeout: float | None = 60.0,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        output_limit: int | None = None,
    ) -> ExecResult:
        box = await self.ready()
        return await box.exec(
            cmd, timeout=timeout, cwd=cwd, env=env, stdin=stdin, output_limit=output_limit
        )

    async def start_process(self, command: str, *, cwd: str | None = None) -> BoxProcess:
        return await (await self.ready()).start_process(command, cwd=cwd)

    async def read_file(self, path: str, *, limit: int = 64 * 1024 * 1024) -> bytes:
        return await (await self.ready()).read_file(path, limit=limit)

    async def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        await (await self.ready()).write_file(path, data, mode=mode)

    async def list_dir(self, path: str) -> list[FileInfo]:
        return await (await self.ready()).list_dir(path)

    async def upload(self, local: Path, remote: str) -> None:
        await (await self.ready()).upload(local, remote)

    async def download(self, remote: str, local: Path) -> None:
        await (await self.ready()).download(remote, local)

    async def cdp_endpoint(self) -> str:
        return await (await self.ready()).cdp_endpoint()

    async def check(self) -> None:
        await (await self.ready()).check()

    def untouched_workspace(self) -> bool:
        return self._box is not None and self._box.untouched_workspace()

    def watch_workspace(self) -> None:
        if self._box is not None:
            self._box.watch_workspace()

    def settled_print(self) -> str | None:
        return None if self._box is None else self._box.settled_print()

    async def close(self) -> None:
        """Nothing to close: whoever started the box removes it (it may still be
        starting when the member ends)."""

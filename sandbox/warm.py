"""Boxes kept ready across runs, for a program that runs many jobs.

A run's own warm pool (:mod:`sandbox.pool`) starts its boxes when the run begins, so
every run's first members wait for boxes made at that moment: about 0.3 s for one
coding box and 2-3 s for sixteen on a 2-core engine (container create and start cost
the engine, ``runc`` and the kernel about 0.2 s of CPU a box, the box's agent another
0.06 s; ``bench/fanout.py``). A program that runs job after job (an evaluation loop, a
service answering requests) can pay that between its runs instead:

    async with fleet.WarmBoxes(count=16) as warm:
        for job in jobs:
            await fleet.run_async(job, warm=warm)

This is how hosted sandboxes (E2B, Modal, Daytona) keep start-up off the request
path: a pool owned by the caller, refilled in the background. The rules:

- **Never a used box.** A box leaves the pool once, to one run's warm pool, which
  destroys it when its member is done (:class:`~sandbox.pool.SandboxPool`); nothing
  returns here. A box is fresh from its image when a member gets it.
- **Owned, bounded, found.** The caller opens and closes it (``async with``); at most
  ``count`` idle boxes (1-64) exist at once, of one box spec. Its boxes carry a run id
  of their own (``warm-<hex>``) marked live with this process's id, so ``fleet sandbox
  gc`` leaves them alone while the process lives and removes them once it is gone
  (SIGKILL included); closing removes every idle box.
- **Never stale.** A box idle for a quarter of its TTL (15 minutes by default) is
  replaced, so no box handed out is near the age at which ``gc`` takes even a live
  run's boxes; a box that died while idle is dropped, not handed out.
- **One event loop.** A box's agent connection belongs to the loop that opened the
  pool; a run in another loop (``fleet.run`` makes its own) takes nothing from it.
- **Only what a member would get anyway.** The pool's box spec is the members' box
  spec (default: a coding member's defaults); a run takes boxes only for members whose
  spec is the same, so a warm box differs from the one the run would make in nothing
  but its start time. Boxes that need a run of their own (a network, an egress proxy,
  a browser's start-up) or are kept for debugging are refused at construction.
- **Refilled between runs.** Boxes are made again once no run that took from the pool
  is in progress: making them beside a run's members would take the CPU they run on.
  A program whose runs overlap without a pause gets cold boxes for the runs the pool
  could not serve, as it would without one.

Not done: ``fleet run`` (one job a process) has no use for it; its first wave starts
while the job is read (:mod:`coordinator.nodes.prewarm`). Members on a Ray cluster's
nodes take boxes on those nodes' engines, not from here.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import TaskGroup

from .base import Sandbox, SandboxBackend
from .docker import reaper
from .errors import SandboxClosed, SandboxError, SandboxSpecError
from .spec import SandboxSpec

MAX_COUNT = 64
"""More idle boxes than this is a daemon's job, not a program's."""


class WarmBoxes:
    """Use as ``async with WarmBoxes(count=16) as warm`` around the runs that take from it."""

    def __init__(
        self,
        count: int = 8,
        *,
        sandbox: SandboxSpec | Mapping[str, Any] | None = None,
        backend: SandboxBackend | None = None,
    ) -> None:
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
            raise SandboxSpecError(
                f"WarmBoxes count={count!r} is invalid; give a whole number of boxes from 1 "
                f"to {MAX_COUNT}, e.g. count=16"
            )
        spec = sandbox if isinstance(sandbox, SandboxSpec) else SandboxSpec(**(sandbox or {}))
        if spec.kind != "coding" or spec.network.egress != "none" or spec.keep:
            raise SandboxSpecError(
                "WarmBoxes keeps coding boxes without a network that are not kept: "
                f"kind={spec.kind!r}, egress={spec.network.egress!r}, keep={spec.keep} cannot "
                "be warmed (a browser or networked box needs its run's network and proxy)"
            )
        self.count = count
        self.spec = spec
        self.key = spec.pool_key
        self.max_age_s = spec.ttl_s / 4
        """Idle longer than this and a box is replaced."""
        self.run = f"warm-{secrets.token_hex(4)}"
        """The run id on every box made here (its own, so gc knows whose they are)."""
        self._backend = backend
        self._idle: list[tuple[float, Sandbox]] = []
        """(made at, box), oldest first."""
        self._making = 0
        self._using = 0
        """Runs in progress that took from the pool (:meth:`in_use`): no refill meanwhile."""
        self._seq = 0
        self._changed = anyio.Event()
        self._tg: TaskGroup | None = None
        self._loop: object | None = None
        self._closed = False
        self.made = 0
        """Boxes made so far (refills and replacements)."""
        self.taken = 0
        """Boxes handed to runs so far."""
        self.last_error: SandboxError | None = None
        """Why the last box could not be made (the pool retries after a pause)."""

    # -- the caller's side ------------------------------------------------------------
    async def __aenter__(self) -> WarmBoxes:
        if self._backend is None:
            from .docker.backend import DockerBackend

            self._backend = DockerBackend()
        self._loop = _current_loop()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._refill_loop)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        await self._close()
        return None

    async def _close(self) -> None:
        """Stop refilling and remove every idle box (boxes runs took are theirs); only
        as the ``async with`` block ends, in the task that entered it (its task group's)."""
        if self._closed:
            return
        self._closed = True
        tg, self._tg = self._tg, None
        if tg is not None:
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)
        idle, self._idle = self._idle, []
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as closing:
                for _, box in idle:
                    closing.start_soon(_close, box)
            if self._backend is not None:
                reaper.mark_done(self._backend.owner(self.run))

    @property
    def idle(self) -> int:
        """Boxes ready to be taken now."""
        return len(self._idle)

    async def wait_ready(self, timeout_s: float = 60.0) -> int:
        """Wait until ``count`` boxes are idle (or ``timeout_s`` passed); how many are."""
        with anyio.move_on_after(timeout_s):
            while len(self._idle) < self.count and not self._closed:
                await self._changed.wait()
        return len(self._idle)

    # -- a run's side -----------------------------------------------------------------
    @asynccontextmanager
    async def in_use(self) -> AsyncIterator[None]:
        """Around a run that takes from the pool: boxes are made again only once no such
        run is in progress. Making a box costs the engine, ``runc`` and the kernel about
        0.2 s of CPU; refilled while its members ran, sixteen boxes took 3 CPU-seconds
        from them on two cores (the run was no faster than with no pool at all)."""
        self._using += 1
        try:
            yield
        finally:
            self._using -= 1
            self._notify()

    def take(self, key: str, n: int) -> list[Sandbox]:
        """Up to ``n`` idle boxes of box spec ``key`` for a run's warm pool, each handed
        out once and never returned; none when the key differs, the pool is closed or
        the caller runs in another event loop. The pool refills once the run, taking
        inside :meth:`in_use`, is over."""
        if n <= 0 or key != self.key or self._closed or _current_loop() is not self._loop:
            return []
        now = time.monotonic()
        out: list[Sandbox] = []
        keep: list[tuple[float, Sandbox]] = []
        for made, box in self._idle:
            if len(out) < n and now - made < self.max_age_s and box.looks_alive():
                out.append(box)
            else:
                keep.append((made, box))
        self._idle = keep
        self.taken += len(out)
        self._notify()
        return out

    # -- the refill -------------------------------------------------------------------
    async def _refill_loop(self) -> None:
        assert self._tg is not None
        tg = self._tg
        while True:
            await self._drop_stale()
            missing = 0 if self._using else self.count - len(self._idle) - self._making
            for _ in range(max(0, missing)):
                self._making += 1
                tg.start_soon(self._make_one)
            with anyio.move_on_after(max(1.0, self.max_age_s / 8)):
                await self._changed.wait()

    async def _make_one(self) -> None:
        assert self._backend is not None
        self._seq += 1
        try:
            box = await self._backend.create(self.spec, run=self.run, member=f"warm-{self._seq}")
        except SandboxError as exc:
            self.last_error = exc
            try:
                await anyio.sleep(2.0)  # an engine that refuses now is asked again, not hammered
            finally:
                self._making -= 1
                self._notify()
            return
        except BaseException:
            self._making -= 1
            raise
        self._making -= 1
        if self._closed:
            with anyio.CancelScope(shield=True):
                await _close(box)
            return
        self.made += 1
        self._idle.append((time.monotonic(), box))
        self._notify()

    async def _drop_stale(self) -> None:
        """Remove idle boxes past their age or no longer alive (the refill replaces them)."""
        now = time.monotonic()
        stale = [(m, b) for m, b in self._idle if now - m >= self.max_age_s or not b.looks_alive()]
        if not stale:
            return
        self._idle = [entry for entry in self._idle if entry not in stale]
        for _, box in stale:
            await _close(box)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()


async def _close(box: Sandbox) -> None:
    try:
        await box.close()
    except (SandboxError, SandboxClosed, OSError):
        pass  # gone already, or gc takes it once this process is not live


def _current_loop() -> object | None:
    try:
        import asyncio

        return asyncio.get_running_loop()
    except RuntimeError:
        return None


__all__ = ["MAX_COUNT", "WarmBoxes"]

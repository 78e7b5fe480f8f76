"""A warm pool: pre-started boxes of one spec, handed out in a few milliseconds.

Creating a box costs a few hundred milliseconds (more for a browser box, which waits
for Chromium); a pool pays that ahead of time in a background task group. Rules:

- a box goes to exactly one member and is destroyed when released, never returned
  to the pool: nothing one member left behind (files, processes, browser state) can
  reach another;
- at most ``max_size`` boxes exist at once (idle plus handed out); the pool refills
  to ``min_idle`` idle boxes in the background whenever one is taken;
- ``acquire`` on an empty pool takes a box already on its way to the pool (a refill
  or an adopted box being readied) when one is not yet promised to an earlier
  caller, else creates a box directly (or waits for room when ``max_size`` is
  reached), so the pool only ever makes things faster: a box started ahead for a
  member (:meth:`keep_idle`) is the box it gets, not a spare beside the one it makes.

Boxes are labelled ``fleet.member=pool`` at creation (labels are immutable); the
member that acquires a box is recorded on the :class:`Sandbox` object (``member``).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from types import TracebackType

import anyio
from anyio.abc import TaskGroup

from .base import Sandbox, SandboxBackend
from .errors import SandboxClosed, SandboxError, SandboxSpecError, SnapshotGone
from .spec import SandboxSpec


class SandboxPool:
    """Use as ``async with SandboxPool(backend, spec, run=..., min_idle=2, max_size=8) as pool``."""

    def __init__(
        self,
        backend: SandboxBackend,
        spec: SandboxSpec,
        *,
        run: str,
        min_idle: int = 1,
        max_size: int = 8,
    ) -> None:
        if min_idle < 0 or max_size < 1 or min_idle > max_size:
            raise SandboxSpecError(
                f"pool sizes min_idle={min_idle}, max_size={max_size} are invalid; need "
                f"0 <= min_idle <= max_size and max_size >= 1, e.g. min_idle=2, max_size=8"
            )
        self.backend, self.spec, self.run = backend, spec, run
        self.min_idle, self.max_size = min_idle, max_size
        self._idle: list[Sandbox] = []
        self._live = 0  # idle + leased + being created
        self._coming = 0  # refills and adopted boxes on their way to idle
        self._promised = 0  # acquirers waiting for one of those
        self._changed = anyio.Event()
        self._seq = itertools.count(1)
        self._tg: TaskGroup | None = None
        self._closed = False
        self.last_error: BaseException | None = None
        self._gone = False  # the spec's snapshot image is gone: no more refills

    async def __aenter__(self) -> SandboxPool:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._refill_loop)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        self._closed = True
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        try:
            await self._tg.__aexit__(et, e, tb)
        finally:
            # Shielded: Ctrl-C while leaving must not leak the idle boxes.
            with anyio.CancelScope(shield=True):
                idle, self._idle = self._idle, []
                for box in idle:
                    await box.close()
        return None

    @property
    def idle(self) -> int:
        return len(self._idle)

    def keep_idle(self, count: int) -> None:
        """Keep ``count`` boxes idle from now on (at most ``max_size``): more boxes are
        started in the background when that is more than now."""
        self.min_idle = max(0, min(count, self.max_size))
        self._notify()

    async def wait_idle(self, count: int | None = None) -> None:
        """Wait until ``count`` (default ``min_idle``) boxes are idle."""
        want = self.min_idle if count is None else count
        while len(self._idle) < want:
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def _refill_loop(self) -> None:
        while True:
            while not self._gone and len(self._idle) < self.min_idle and self._live < self.max_size:
                self._live += 1
                self._coming += 1
                try:
                    box = await self.backend.create(
                        self.spec, run=self.run, member=f"pool-{next(self._seq)}"
                    )
                except BaseException as e:
                    self._coming -= 1
                    self._live -= 1
                    if not isinstance(e, SandboxError):
                        raise  # the pool is closing
                    self.last_error = e
                    if isinstance(e, SnapshotGone):
                        # The image this pool's boxes start from is gone for good: no
                        # box of this spec will start again, so the pool makes no more
                        # (an acquirer meets the error and its member's retry sets the
                        # setup up again, under another spec).
                        self._gone = True
                    # Wake waiters: with room freed, acquire creates a box itself (and
                    # reports the engine's error) instead of waiting for this loop.
                    self._notify()
                    await anyio.sleep(1.0)  # engine trouble: do not spin
                    continue
                self._coming -= 1
                self._idle.append(box)
                self._notify()
            await self._changed.wait()

    def adopt(self, ready: Callable[[], Awaitable[Sandbox]]) -> None:
        """Take a box started before the pool (a run's first wave, started while the
        run was being read): ``ready()`` makes it usable (its agent up). It counts
        against ``max_size`` at once, so a member waits for it rather than making
        another, and is idle once ready; if it fails, the pool makes one instead."""
        if self._closed or self._tg is None:
            raise SandboxClosed("the sandbox pool is closed")
        self._live += 1
        self._coming += 1

        async def take() -> None:
            try:
                box = await ready()
            except SandboxError as e:
                self._live -= 1
                self.last_error = e
            else:
                self._idle.append(box)
            finally:
                self._coming -= 1
            self._notify()

        self._tg.start_soon(take)

    async def acquire(self, member: str) -> Sandbox:
        """A box for ``member`` alone: an idle one if any, else a new one."""
        while True:
            if self._closed:
                raise SandboxClosed("the sandbox pool is closed")
            while self._idle:
                box = self._idle.pop(0)
                self._notify()
                if not box.looks_alive():
                    await box.close()  # died while idle: drop it, refill makes another
                    self._live -= 1
                    continue
                box.member = member  # type: ignore[attr-defined]
                return box
            if self._coming > self._promised:
                # A box is on its way and no earlier caller waits for it: take that one.
                self._promised += 1
                try:
                    await self._changed.wait()
                finally:
                    self._promised -= 1
                continue
            if self._live < self.max_size:
                self._live += 1
                try:
                    box = await self.backend.create(self.spec, run=self.run, member=member)
                except BaseException:
                    self._live -= 1
                    raise
                return box
            await self._changed.wait()

    async def release(self, box: Sandbox) -> None:
        """Destroy a box handed out by this pool (never reused) and make room."""
        with anyio.CancelScope(shield=True):
            try:
                await box.close()
            finally:
                self._live -= 1
                self._notify()

    @asynccontextmanager
    async def box(self, member: str) -> AsyncIterator[Sandbox]:
        """``async with pool.box("m1") as box``: acquire, then release even on Ctrl-C."""
        sandbox = await self.acquire(member)
        try:
            yield sandbox
        finally:
            await self.release(sandbox)

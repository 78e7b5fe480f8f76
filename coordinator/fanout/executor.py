"""The fan-out executor seam: when member units run.

A unit of work is serializable data in, serializable data out (a member's spec in,
its outcome out); the executor only decides *when* each unit runs: one anyio task
group on the coordinator with a capacity limiter as the queue. *Where* each attempt
of a member runs - its box and agent loop on this host, or on a cluster node - is
:class:`coordinator.nodes.worker.Nodes`'s business, so the same executor serves both. The
fan-out policy (quorum, fail-fast) lives in :mod:`coordinator.fanout.fanout`, one member's
retries and record in :mod:`coordinator.nodes.worker`, and both only talk to these seams.

Units may also arrive while others run (:meth:`Executor.stream`: a lead's waves
join a fan-out already under way); :meth:`Executor.map` is the fixed list, as a
stream that ends at once.

Contract for ``worker``: it records its own failures in the outcome it returns and
raises only on cancellation. The executor still guards against a worker that
breaks that promise: the exception is handed to ``on_done`` instead of tearing the
task group (and so every sibling) down.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import anyio
import anyio.lowlevel

U = TypeVar("U")
R = TypeVar("R")

Worker = Callable[[U], Awaitable[R]]
OnDone = Callable[[U, "R | BaseException"], bool]
"""Called as each unit ends; returning True cancels every unit not yet done."""


class Executor(abc.ABC, Generic[U, R]):
    """Runs units with bounded parallelism and reports each as it ends."""

    @abc.abstractmethod
    async def map(
        self,
        units: Sequence[U],
        worker: Worker[U, R],
        *,
        max_parallel: int,
        on_done: Callable[[U, R | BaseException], bool],
    ) -> None:
        """Run ``worker(unit)`` for every unit, at most ``max_parallel`` at once, in order
        of ``units`` (the rest wait in a queue). Returns when all ended or were cancelled
        (by ``on_done`` returning True, or by cancellation of the caller)."""

    async def stream(
        self,
        units: AsyncIterable[U],
        worker: Worker[U, R],
        *,
        max_parallel: int,
        on_done: Callable[[U, R | BaseException], bool],
    ) -> None:
        """As :meth:`map`, for units that arrive while others run, queued in arrival
        order; returns when ``units`` is exhausted and every unit ended (or all were
        cancelled). An executor that only runs fixed lists keeps this default, which
        says so instead of running a lead's waves badly."""
        raise NotImplementedError(
            f"{type(self).__name__} runs fixed lists of units only (map), not a stream"
        )


async def _each(units: Sequence[U]) -> AsyncIterator[U]:
    for unit in units:
        yield unit


class LocalExecutor(Executor[U, R]):
    """Units as tasks in one anyio task group on this host."""

    async def map(
        self,
        units: Sequence[U],
        worker: Worker[U, R],
        *,
        max_parallel: int,
        on_done: Callable[[U, R | BaseException], bool],
    ) -> None:
        await self.stream(_each(units), worker, max_parallel=max_parallel, on_done=on_done)

    async def stream(
        self,
        units: AsyncIterable[U],
        worker: Worker[U, R],
        *,
        max_parallel: int,
        on_done: Callable[[U, R | BaseException], bool],
    ) -> None:
        limiter = anyio.CapacityLimiter(max_parallel)

        async with anyio.create_task_group() as tg:

            async def one(unit: U) -> None:
                async with limiter:
                    try:
                        result: R | BaseException = await worker(unit)
                    except anyio.get_cancelled_exc_class():
                        raise
                    except Exception as exc:
                        result = exc
                if on_done(unit, result):
                    tg.cancel_scope.cancel()

            async for unit in units:
                tg.start_soon(one, unit)
                # Yield once so tasks queue on the limiter in the order given
                # (the queue is FIFO; without this, start order is unspecified).
                await anyio.lowlevel.checkpoint()

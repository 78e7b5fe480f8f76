"""The executor seam on its own: queue order, the concurrency bound, stop, and a
worker that breaks its no-raise promise without taking its siblings down."""

from __future__ import annotations

import anyio

from coordinator.fanout.executor import LocalExecutor


def test_local_executor_bounds_parallelism_and_keeps_queue_order():
    started: list[int] = []
    running = peak = 0

    async def worker(n: int) -> int:
        nonlocal running, peak
        started.append(n)
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.05)
        running -= 1
        if n == 3:
            raise ValueError("broken worker")
        return n * 10

    done: dict[int, object] = {}

    def on_done(unit: int, result: object) -> bool:
        done[unit] = result
        return False

    anyio.run(lambda: LocalExecutor().map(list(range(7)), worker, max_parallel=3, on_done=on_done))
    assert started == list(range(7)) and peak == 3
    assert {k: v for k, v in done.items() if k != 3} == {n: n * 10 for n in range(7) if n != 3}
    assert isinstance(done[3], ValueError)


def test_on_done_returning_true_cancels_the_rest():
    finished: list[int] = []

    async def worker(n: int) -> int:
        await anyio.sleep(0.01 if n == 0 else 10)
        finished.append(n)
        return n

    async def go() -> None:
        with anyio.fail_after(5):
            await LocalExecutor().map(
                [0, 1, 2, 3], worker, max_parallel=2, on_done=lambda unit, result: True
            )

    anyio.run(go)
    assert finished == [0]

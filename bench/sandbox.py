"""Sandbox benchmarks on the real engine: cold starts, pool acquire, exec round trips.

Run: ``.venv/bin/python bench/sandbox.py [--rounds N]``. Prints median and p95 per
measurement and the fast-path/docker-exec ratio. Every box it makes belongs to one
run (``bench-<hex>``) that is removed at the end, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable

# Run as a script, this file's folder comes first on sys.path and its name would
# shadow the ``sandbox`` package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import anyio  # noqa: E402

from sandbox.docker import DockerBackend  # noqa: E402
from sandbox.pool import SandboxPool  # noqa: E402
from sandbox.spec import SandboxSpec  # noqa: E402


def stats(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered), p95


def show(name: str, samples: list[float], target_ms: float | None = None) -> float:
    med, p95 = stats(samples)
    goal = f"   target <= {target_ms:g} ms" if target_ms else ""
    print(
        f"{name:<40} median {med * 1000:8.1f} ms   p95 {p95 * 1000:8.1f} ms   n={len(samples)}{goal}"
    )
    return med


async def timed(fn: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await fn()
    return time.perf_counter() - start


async def bench_cold(backend: DockerBackend, run: str, rounds: int) -> None:
    samples = []
    for i in range(rounds):
        start = time.perf_counter()
        box = await backend.create(SandboxSpec(), run=run, member=f"cold-{i}")
        await box.exec(["true"])
        samples.append(time.perf_counter() - start)
        await box.close()
    show("coding cold start to first exec", samples, 400)


async def bench_browser(backend: DockerBackend, run: str, rounds: int) -> None:
    spec = SandboxSpec(kind="browser")
    warm = await backend.create(spec, run=run, member="browser-warmup")  # network + proxy
    await warm.close()
    samples = []
    for i in range(rounds):
        start = time.perf_counter()
        box = await backend.create(spec, run=run, member=f"browser-{i}")
        await box.cdp_endpoint()
        samples.append(time.perf_counter() - start)
        await box.close()
    show("browser cold start to CDP ready", samples, 2000)


async def bench_pool(backend: DockerBackend, run: str, rounds: int) -> None:
    samples = []
    async with SandboxPool(backend, SandboxSpec(), run=run, min_idle=2, max_size=4) as pool:
        for i in range(rounds):
            await pool.wait_idle()
            start = time.perf_counter()
            box = await pool.acquire(f"pooled-{i}")
            samples.append(time.perf_counter() - start)
            await pool.release(box)
    show("pool acquire (idle box ready)", samples, 10)


async def bench_exec(backend: DockerBackend, run: str, rounds: int) -> None:
    box = await backend.create(SandboxSpec(), run=run, member="exec")
    try:
        fast = [await timed(lambda: box.exec(["true"])) for _ in range(rounds * 20)]
        container = backend.client.containers.get(box.id)
        plain = [
            await timed(lambda: anyio.to_thread.run_sync(container.exec_run, ["true"]))
            for _ in range(rounds * 3)
        ]
    finally:
        await box.close()
    f = show("exec round trip, agent fast path", fast, 10)
    p = show("exec round trip, docker exec", plain)
    print(f"{'  ratio docker exec / fast path':<40} {p / f:8.1f}x")


async def bench_concurrent(backend: DockerBackend, run: str, rounds: int, n: int = 16) -> None:
    samples = []
    for r in range(rounds):
        boxes: list = []

        async def one(i: int, r: int = r, boxes: list = boxes) -> None:
            box = await backend.create(SandboxSpec(), run=run, member=f"c{r}-{i}")
            await box.exec(["true"])
            boxes.append(box)

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
        samples.append(time.perf_counter() - start)
        async with anyio.create_task_group() as tg:
            for box in boxes:
                tg.start_soon(box.close)
    show(f"{n} concurrent creates (all exec-ready)", samples, 4000)


async def main(rounds: int) -> None:
    backend = DockerBackend()
    run = f"bench-{uuid.uuid4().hex[:8]}"
    try:
        await bench_exec(backend, run, rounds)
        await bench_cold(backend, run, rounds)
        await bench_pool(backend, run, rounds)
        await bench_browser(backend, run, max(3, rounds // 2))
        await bench_concurrent(backend, run, max(2, rounds // 4))
    finally:
        with anyio.CancelScope(shield=True):
            await backend.remove_run(run)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="samples per measurement")
    anyio.run(main, parser.parse_args().rounds)

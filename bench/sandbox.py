"""Sandbox benchmarks on the real engine: cold starts, pool acquire, exec round trips.

Run: ``.venv/bin/python bench/sandbox.py [--rounds N]``. Prints median and p95 per
measurement and the fast-path/docker-exec ratio. ``--locks`` measures only the host's
CPU per ``exec`` with the agent stream's locks as Fleet makes them and as anyio's
default makes them. Every box it makes belongs to one
run (``bench-<hex>``) that is removed at the end, Ctrl-C included.

``--runtime gvisor`` runs the same measurements with boxes under gVisor;
``--runtime both`` measures what a runtime changes, runc and gVisor in alternating
blocks (``--blocks``), and prints the medians side by side: coding cold start, exec round trip, browser
cold start, a coding turn's box work (a Python process, a file read and a write, a
grep) and a whole offline coding member (``examples/code.toml``: box, repository copy,
turns, the test; the offline model costs next to nothing).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path and its name would
# shadow the ``sandbox`` package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import anyio  # noqa: E402

from sandbox.docker.backend import DockerBackend  # noqa: E402
from sandbox.pool import SandboxPool  # noqa: E402
from sandbox.spec import NetworkPolicy, Runtime, SandboxSpec  # noqa: E402

RUNTIME: Runtime = "runc"
"""The boxes' runtime for the measurements (``--runtime``)."""
EXAMPLES = Path(_HERE).parent / "examples"


def coding() -> SandboxSpec:
    return SandboxSpec(runtime=RUNTIME)


def browser() -> SandboxSpec:
    return SandboxSpec(kind="browser", runtime=RUNTIME, network=NetworkPolicy(egress="allowlist"))


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


async def bench_cold(backend: DockerBackend, run: str, rounds: int) -> float:
    samples = []
    for i in range(rounds):
        start = time.perf_counter()
        box = await backend.create(coding(), run=run, member=f"cold-{i}")
        await box.exec(["true"])
        samples.append(time.perf_counter() - start)
        await box.close()
    return show("coding cold start to first exec", samples, 400)


async def bench_browser(backend: DockerBackend, run: str, rounds: int) -> float:
    spec = browser()
    warm = await backend.create(spec, run=run, member="browser-warmup")  # network + proxy
    await warm.close()
    samples = []
    for i in range(rounds):
        start = time.perf_counter()
        box = await backend.create(spec, run=run, member=f"browser-{i}")
        await box.cdp_endpoint()
        samples.append(time.perf_counter() - start)
        await box.close()
    return show("browser cold start to CDP ready", samples, 2000)


async def bench_pool(backend: DockerBackend, run: str, rounds: int) -> None:
    samples = []
    async with SandboxPool(backend, coding(), run=run, min_idle=2, max_size=4) as pool:
        for i in range(rounds):
            await pool.wait_idle()
            start = time.perf_counter()
            box = await pool.acquire(f"pooled-{i}")
            samples.append(time.perf_counter() - start)
            await pool.release(box)
    show("pool acquire (idle box ready)", samples, 10)


async def bench_exec(backend: DockerBackend, run: str, rounds: int) -> float:
    box = await backend.create(coding(), run=run, member="exec")
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
    return f


async def bench_exec_locks(backend: DockerBackend, run: str, rounds: int) -> None:
    """The host's CPU per ``exec`` on one box with the agent stream's locks as Fleet makes
    them (``fast_acquire``: a free lock is taken without a trip through the event loop)
    and as anyio makes them by default (a yield on every acquire), swapped on the same
    stream round by round, 150 execs a round."""
    box = await backend.create(coding(), run=run, member="locks")
    cpu: dict[str, list[float]] = {"yielding locks": [], "fast locks (Fleet's)": []}
    try:
        agent = box.transport.agent
        assert agent is not None, "the box has no agent stream"
        for _ in range(30):
            await box.exec(["true"])
        for _ in range(rounds):
            for way in cpu:
                fast = way != "yielding locks"
                agent._read_lock = anyio.Lock(fast_acquire=fast)
                agent._send_lock = anyio.Lock(fast_acquire=fast)
                started = time.process_time()
                for _ in range(150):
                    await box.exec(["true"])
                cpu[way].append((time.process_time() - started) / 150 * 1000)
    finally:
        await box.close()
    for way, values in cpu.items():
        print(f"{'exec CPU, ' + way:<40} {statistics.median(values):8.3f} ms (median of rounds)")
    ratios = [f / y for y, f in zip(*cpu.values(), strict=True)]
    print(f"{'  fast / yielding, median of pairs':<40} {statistics.median(ratios):8.3f}x")


TURN_SCRIPT = "import json, pathlib; print(len(json.dumps(sorted(pathlib.Path('.').iterdir()))))"


async def bench_turn(backend: DockerBackend, run: str, rounds: int) -> float:
    """A coding turn's box work, as a member's tools do it: a Python process (the
    project's test, say), a file read, a file written, a search."""
    box = await backend.create(coding(), run=run, member="turn")
    try:
        for i in range(20):
            await box.write_file(f"mod{i}.py", f"def f{i}():\n    return {i}\n" * 20)

        async def turn() -> None:
            await box.exec(["python3", "-c", TURN_SCRIPT])
            await box.read_file("mod3.py")
            await box.write_file("notes.txt", "a turn's note\n" * 100)
            await box.exec(["grep", "-rn", "return 7", "."])

        samples = [await timed(turn) for _ in range(rounds * 2)]
    finally:
        await box.close()
    return show("coding turn's box work (4 tool calls)", samples)


def bench_member(rounds: int, *, warm: bool = True) -> float:
    """``examples/code.toml`` end to end, offline, each in a fresh output directory."""
    import coordinator as fleet

    text = (EXAMPLES / "code.toml").read_text()
    text = text.replace('repo = "sample-repo"', f'repo = "{EXAMPLES / "sample-repo"}"')
    text += f'\n[sandbox]\nruntime = "{RUNTIME}"\n'
    samples = []
    for _ in range(rounds + warm):  # a first one warms the process up, uncounted
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            result = fleet.run(fleet.load(text), output_dir=out)
            samples.append(time.perf_counter() - start)
            if result.exit_code != 0:
                raise SystemExit(f"the coding member did not succeed: {result.status}")
    return show("offline coding member, end to end", samples[warm:])


async def bench_concurrent(backend: DockerBackend, run: str, rounds: int, n: int = 16) -> None:
    samples = []
    for r in range(rounds):
        boxes: list = []

        async def one(i: int, r: int = r, boxes: list = boxes) -> None:
            box = await backend.create(coding(), run=run, member=f"c{r}-{i}")
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


async def _alone(bench: Callable[[DockerBackend, str, int], Awaitable[None]], rounds: int) -> None:
    backend = DockerBackend()
    run = f"bench-{uuid.uuid4().hex[:8]}"
    try:
        await bench(backend, run, rounds)
    finally:
        with anyio.CancelScope(shield=True):
            await backend.remove_run(run)


async def runtime_figures(rounds: int) -> dict[str, float]:
    """The medians a runtime changes, for ``--runtime both``."""
    backend = DockerBackend()
    run = f"bench-{uuid.uuid4().hex[:8]}"
    try:
        return {
            "coding cold start to first exec": await bench_cold(backend, run, rounds),
            "exec round trip, agent fast path": await bench_exec(backend, run, rounds),
            "browser cold start to CDP ready": await bench_browser(
                backend, run, max(3, rounds // 2)
            ),
            "coding turn's box work (4 tool calls)": await bench_turn(backend, run, rounds),
        }
    finally:
        with anyio.CancelScope(shield=True):
            await backend.remove_run(run)


def compare(blocks: int) -> None:
    """runc and gVisor in alternating blocks (a busy machine's load drifts: neither
    runtime gets the quiet part); each figure is the median of its blocks' medians."""
    global RUNTIME
    medians: dict[str, dict[str, list[float]]] = {"runc": {}, "gvisor": {}}
    for block in range(blocks):
        for runtime in ("runc", "gvisor"):
            RUNTIME = runtime
            print(f"-- {runtime}, block {block + 1} of {blocks}")
            figures = anyio.run(runtime_figures, 2)
            figures["offline coding member, end to end"] = bench_member(1, warm=block == 0)
            for name, value in figures.items():
                medians[runtime].setdefault(name, []).append(value)
    print(f"\n{'median of block medians':<40} {'runc':>10} {'gVisor':>10} {'gVisor/runc':>12}")
    for name, values in medians["runc"].items():
        runc, gv = statistics.median(values), statistics.median(medians["gvisor"][name])
        print(f"{name:<40} {runc * 1000:8.1f}ms {gv * 1000:8.1f}ms {gv / runc:11.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="samples per measurement")
    parser.add_argument(
        "--runtime",
        choices=["runc", "gvisor", "both"],
        default="runc",
        help="the boxes' runtime; 'both': runc and gVisor side by side (needs "
        "'fleet setup --gvisor')",
    )
    parser.add_argument(
        "--blocks", type=int, default=5, help="alternating blocks per runtime ('both')"
    )
    parser.add_argument(
        "--locks", action="store_true", help="only: exec CPU with fast and yielding locks"
    )
    args = parser.parse_args()
    if args.locks:
        anyio.run(_alone, bench_exec_locks, args.rounds)
    elif args.runtime == "both":
        compare(args.blocks)
    else:
        RUNTIME = args.runtime
        anyio.run(main, args.rounds)

"""Fan-out wall time against member count, and against running the members one by one.

Each member is a real coding member: its own Docker box, the real harness loop, the
real ``anthropic`` client against the fake Messages API on 127.0.0.1 answering every
call after 500 ms. A member takes 5 turns with one box exec each (``shell``), then a
6th turn submits its result. Runs use a job's default ``max_parallel`` (4: what a user
gets without setting it; ``--max-parallel 0`` runs all N at once); the sequential
figure runs the same N members with ``max_parallel = 1``.

Usage: ``.venv/bin/python bench/fanout.py [--counts 1,4,8,16] [--repeat 2] [--sequential 4]
[--max-parallel N]``. Prints the median wall time per count, its ratio to 1 member, and
the sequential time for comparison. The "warm pool" column is the default setting
(``fanout.warm_pool = true``). Target on this 2-core machine, all at once: 8 members
<= 1.3x of 1 member.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

# The script's own directory holds bench/sandbox.py, which would shadow the sandbox
# package: put the tests directory (for the shared fake-API policy) in its place.
sys.path[0] = str(Path(__file__).resolve().parent.parent / "tests")

from fleet_policies import coding_policy  # noqa: E402

from coordinator.fanout import Deps, MemberUnit, fan_out  # noqa: E402
from coordinator.node import open_pools  # noqa: E402
from coordinator.spec import FanoutPolicy, RetryPolicy  # noqa: E402
from sandbox.docker import DockerBackend, new_run_id  # noqa: E402
from sandbox.image_build import ensure_images  # noqa: E402
from subagents.fake_api import FakeMessagesAPI  # noqa: E402
from subagents.model.factory import make_model  # noqa: E402
from subagents.spec import Limits, MemberSpec  # noqa: E402

LATENCY_S = 0.5
TURNS = 5


def units(n: int, run: str, root: Path) -> list[MemberUnit]:
    return [
        MemberUnit(
            run_id=run,
            member_dir=str(root / f"m{i}"),
            spec=MemberSpec(
                id=f"m{i}",
                kind="coding",
                task=f"Bench task {i}.",
                model="claude-sonnet-5",
                limits=Limits(max_turns=20),
            ),
            retry=RetryPolicy(attempts=1),
            deadline_s=300,
        )
        for i in range(n)
    ]


async def one_run(n: int, parallel: int, backend: DockerBackend, warm: bool) -> tuple[float, int]:
    """Wall time of one fan-out of ``n`` members. ``warm``: the run's warm pool is filled
    before the clock starts, as it is while a real run plans and starts its services."""
    run = new_run_id()
    with tempfile.TemporaryDirectory() as tmp:
        deps = Deps(backend=backend, make_model=lambda name, **kw: make_model(name, **kw))
        todo = units(n, run, Path(tmp))
        try:
            async with contextlib.AsyncExitStack() as stack:
                if warm:
                    await open_pools(stack, deps, todo, run, parallel)
                    for pool in deps.pools.values():
                        await pool.wait_idle()
                t0 = time.perf_counter()
                res = await fan_out(
                    todo, deps, max_parallel=parallel, min_success=n, fail_fast=False
                )
                wall = time.perf_counter() - t0
        finally:
            await backend.remove_run(run)
        return wall, res.ok


def measure(n: int, parallel: int, backend: DockerBackend, warm: bool, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        wall, ok = anyio.run(one_run, n, parallel, backend, warm)
        assert ok == n, f"only {ok} of {n} members ended ok"
        times.append(wall)
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", default="1,4,8,16")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--sequential", default="4", help="counts also run one at a time")
    default = FanoutPolicy().max_parallel
    ap.add_argument(
        "--max-parallel",
        type=int,
        default=default,
        help=f"members at once (default {default}, a job's default; 0 = all of them)",
    )
    args = ap.parse_args()
    load = os.getloadavg()[0]  # the machine is shared: say how busy it was
    counts = [int(c) for c in args.counts.split(",")]
    seq_counts = [int(c) for c in args.sequential.split(",") if c]
    images = ensure_images(None)
    backend = DockerBackend(images=images)
    with FakeMessagesAPI(coding_policy(turns=TURNS, latency_s=LATENCY_S)) as api:
        os.environ["ANTHROPIC_API_KEY"] = "bench-key"
        os.environ["ANTHROPIC_BASE_URL"] = api.url
        anyio.run(one_run, 1, 1, backend, False)  # warm-up: page cache, image layers
        at_once = {n: args.max_parallel or n for n in counts}
        cold = {n: measure(n, at_once[n], backend, False, args.repeat) for n in counts}
        warm = {n: measure(n, at_once[n], backend, True, args.repeat) for n in counts}
        seq = {n: measure(n, 1, backend, False, 1)[0] for n in seq_counts}
    limit = f"max_parallel {args.max_parallel}" if args.max_parallel else "all at once"
    print(
        f"fan-out: {TURNS} exec turns + 1 submit turn per member, model latency "
        f"{LATENCY_S * 1000:.0f} ms, {limit}, {args.repeat} runs per count; seconds "
        f"(median/max); load average {load:.1f} at the start"
    )
    c1, w1 = statistics.median(cold[counts[0]]), statistics.median(warm[counts[0]])
    print(
        f"{'members':>7} {'cold':>12} {'x of 1':>7} {'warm pool':>12} {'x of 1':>7} "
        f"{'one by one':>11} {'speed-up':>9}"
    )
    for n in counts:
        cm, wm = statistics.median(cold[n]), statistics.median(warm[n])
        one_by_one = seq.get(n, c1 * n)
        tag = "" if n in seq else "*"
        print(
            f"{n:>7} {cm:>6.2f}/{max(cold[n]):<5.2f} {cm / c1:>7.2f} {wm:>6.2f}/{max(warm[n]):<5.2f}"
            f" {wm / w1:>7.2f} {one_by_one:>10.2f}{tag:1} {one_by_one / cm:>8.1f}x"
        )
    print("* estimated as N x the cold 1-member time; the others were measured with max_parallel=1")


if __name__ == "__main__":
    main()

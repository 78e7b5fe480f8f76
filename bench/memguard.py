"""What a gVisor browser box's memory guard costs: commands with it against without.

Run: ``.venv/bin/python bench/memguard.py [--rounds N] [--blocks B]`` (after ``fleet
setup --gvisor``). Two gVisor browser boxes with Chromium up, one with the guard
(:mod:`sandbox.inbox.memguard`, as Fleet makes them) and one without (the guard's
variable left out of its environment, as before the guard); in alternating blocks
each runs a CPU-bound command (a Python loop of 12M additions: the guard reads the
Sentry's memory count every 10 ms while it runs) and an empty ``exec(["true"])``.
Prints the median of the block medians per box and their ratio, and the host memory
limit of a default browser box under each runtime (the guard's room). Every box it
makes belongs to one run (``bench-<hex>``), removed at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from typing import Any

# Run as a script, this file's folder comes first on sys.path and its name would
# shadow the ``sandbox`` package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import anyio  # noqa: E402

from sandbox.docker import gvisor  # noqa: E402
from sandbox.docker.backend import DockerBackend  # noqa: E402
from sandbox.spec import NetworkPolicy, SandboxSpec  # noqa: E402

CPU_LOOP = "n = 0\nfor i in range(12_000_000): n += i\nprint(n)"


def browser(runtime: str = "gvisor") -> SandboxSpec:
    return SandboxSpec(kind="browser", runtime=runtime, network=NetworkPolicy(egress="allowlist"))  # type: ignore[arg-type]


async def timed(box: Any, cmd: Any) -> float:
    start = time.perf_counter()
    res = await box.exec(cmd, timeout=120)
    assert res.ok, res
    return (time.perf_counter() - start) * 1000


async def main(rounds: int, blocks: int) -> None:
    import docker

    from sandbox.docker.reaper import mark_done, mark_live

    client = docker.from_env()
    if gvisor.missing_runtimes(client.info()):
        sys.exit("gVisor is not registered: run 'fleet setup --gvisor' first")
    backend = DockerBackend(client)
    run = f"bench-{uuid.uuid4().hex[:8]}"
    mark_live(run)
    real_env = gvisor.box_env
    try:
        guarded = await backend.create(browser(), run=run, member="guard")
        gvisor.box_env = lambda spec: {  # type: ignore[assignment]
            k: v for k, v in real_env(spec).items() if k != gvisor.MEMORY_GUARD_ENV
        }
        try:
            bare = await backend.create(browser(), run=run, member="bare")
        finally:
            gvisor.box_env = real_env  # type: ignore[assignment]
        boxes = {"guard": guarded, "bare": bare}
        medians: dict[tuple[str, str], list[float]] = {}
        for box in boxes.values():
            await box.exec(["true"])  # the agent (and the guard's thread) started
        for _ in range(blocks):
            for name, box in boxes.items():
                for what, cmd in (("cpu", ["python3", "-c", CPU_LOOP]), ("true", ["true"])):
                    samples = [await timed(box, cmd) for _ in range(rounds)]
                    medians.setdefault((name, what), []).append(statistics.median(samples))
        for what, label in (("cpu", "CPU-bound command"), ("true", "exec(['true'])")):
            g = statistics.median(medians[("guard", what)])
            b = statistics.median(medians[("bare", what)])
            print(f"{label:<28} with guard {g:8.1f} ms   without {b:8.1f} ms   ratio {g / b:.2f}x")
        for runtime in ("runc", "gvisor"):
            limit = gvisor.host_memory(browser(runtime)) / 2**20
            print(f"host memory limit of a default browser box, {runtime}: {limit:.0f} MiB")
    finally:
        await backend.remove_run(run)
        mark_done(run)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="samples per block")
    parser.add_argument("--blocks", type=int, default=3, help="alternating blocks")
    args = parser.parse_args()
    anyio.run(main, args.rounds, args.blocks)

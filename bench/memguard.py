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

``--headroom N`` measures instead how close the guard lets a fork bomb of allocators
come to the box's host limit: one guarded box as ``tests/test_sandbox_memory_hog.py``
makes it (512 MiB, two 64 MiB disks), N runs of that test's fork bomb, and for each
the host cgroup's peak (sampled every 2 ms from ``memory.usage_in_bytes`` or
``memory.current``: root, a host cgroup of the box's own), the room left under the
limit, and whether the box lived. A box the host ends is made again.
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


def _backend() -> tuple[DockerBackend, str]:
    """A backend on this machine's engine (gVisor registered) and the bench's run,
    marked live (``mark_done`` it at the end)."""
    import docker

    from sandbox.docker.reaper import mark_live

    client = docker.from_env()
    if gvisor.missing_runtimes(client.info()):
        sys.exit("gVisor is not registered: run 'fleet setup --gvisor' first")
    run = f"bench-{uuid.uuid4().hex[:8]}"
    mark_live(run)
    return DockerBackend(client), run


async def main(rounds: int, blocks: int) -> None:
    from sandbox.docker.reaper import mark_done

    backend, run = _backend()
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


def _fork_bomb() -> str:
    """The memory tests' fork bomb of allocators (each process allocates 256 MiB)."""
    sys.path.insert(0, os.path.join(os.path.dirname(_HERE), "tests"))
    from test_sandbox_memory_hog import FORK_BOMB

    return str(FORK_BOMB)


def _cgroup_files(container: str) -> tuple[str, int]:
    """The box's host memory cgroup: its usage file, and its limit in bytes."""
    import glob

    for usage, limit in (
        ("memory.usage_in_bytes", "memory.limit_in_bytes"),  # cgroup v1
        ("memory.current", "memory.max"),  # v2
    ):
        for pattern in (
            f"/sys/fs/cgroup/memory/**/*{container}*",
            f"/sys/fs/cgroup/**/*{container}*",
        ):
            for d in glob.glob(pattern, recursive=True):
                if os.path.exists(os.path.join(d, usage)):
                    with open(os.path.join(d, limit)) as f:
                        return os.path.join(d, usage), int(f.read())
    sys.exit(f"no memory cgroup found for box {container[:12]} (run as root on the host)")


async def headroom(runs: int) -> None:
    import threading

    from sandbox.docker.reaper import mark_done
    from sandbox.errors import SandboxError

    backend, run = _backend()
    bomb = _fork_bomb()
    spec = SandboxSpec(
        kind="browser",
        runtime="gvisor",
        memory="512m",
        tmpfs_size="64m",
        workspace_size="64m",
        network=NetworkPolicy(egress="allowlist"),
    )
    rooms: list[float] = []
    box: Any = None
    try:
        for i in range(runs):
            if box is None or not box.looks_alive():
                box = await backend.create(spec, run=run, member=f"hog-{i}")
                await box.exec(["true"])
            usage_file, limit = _cgroup_files(box.id)
            peak = [0]
            stop = threading.Event()

            def sample(
                usage_file: str = usage_file, peak: list[int] = peak, stop: Any = stop
            ) -> None:
                while not stop.is_set():
                    try:
                        peak[0] = max(peak[0], int(open(usage_file).read()))
                    except (OSError, ValueError):
                        return  # the cgroup is gone with its box
                    time.sleep(0.002)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            try:
                res = await box.exec(["python3", "-c", bomb], timeout=60)
                await box.check()
                lived, how = True, f"exit {res.exit_code}, oom_killed {res.oom_killed}"
            except SandboxError as exc:
                lived, how = False, f"box ended: {exc}"[:120]
            stop.set()
            sampler.join()
            room = (limit - peak[0]) / 2**20
            rooms.append(room)
            print(
                f"run {i + 1}: peak {peak[0] / 2**20:.0f} MiB of {limit / 2**20:.0f} MiB, "
                f"room left {room:.0f} MiB, box {'lived' if lived else 'ENDED'} ({how})",
                flush=True,
            )
            if not lived:
                box = None
        print(
            f"room left under the host limit: median {statistics.median(rooms):.0f} MiB, "
            f"least {min(rooms):.0f} MiB over {len(rooms)} runs"
        )
    finally:
        await backend.remove_run(run)
        mark_done(run)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="samples per block")
    parser.add_argument("--blocks", type=int, default=3, help="alternating blocks")
    parser.add_argument(
        "--headroom", type=int, metavar="N", help="N fork bombs: how close each came (see above)"
    )
    args = parser.parse_args()
    if args.headroom:
        anyio.run(headroom, args.headroom)
    else:
        anyio.run(main, args.rounds, args.blocks)

"""Members on a Ray cluster against members on this host, in one run of the script.

16 coding members (the real harness and ``anthropic`` client against the fake Messages
API on 127.0.0.1 answering every call after 500 ms; 5 turns of one ``shell`` exec each,
then a submit) run with ``max_parallel = 16``: on this host (``LocalNodes``), and on a
Ray cluster of two simulated nodes with 8 ``fleet_slots`` each (``RayNodes``; head +
2 nodes of ``ray.cluster_utils.Cluster`` on this machine, sharing its Docker engine,
token authentication on). The two alternate, ``--repeat`` times each, so load on the
shared machine falls on both alike. As in ``bench/fanout.py``, the clock starts once
the run's warm pools are full (on a cluster: the node actors up and their pools
full), as they are while a real run plans; the node actors' start-up is reported on
its own.

Figures: wall time of the fan-out, cluster against local (target <= 1.15x); Ray's
dispatch overhead per member - from the coordinator's ``member_started`` to the
member's first model request (the first ``model_call`` event less its latency),
cluster median minus local median (target <= 100 ms); the coordinator's RSS after
the local runs and after the cluster runs, and the Ray processes' RSS.

With ``--own-engines`` each node runs its boxes on a Docker engine of its own (a
second ``dockerd`` per node on this machine, ``tests/node_engine.py``, the coding
image copied in before the clock), as on a cluster of real hosts: the local runs keep
the machine's engine. ``--nodes`` sets how many nodes; each offers
``ceil(members / nodes)`` ``fleet_slots``, so both sides run every member at once.

Usage: ``.venv/bin/python bench/cluster.py [--members 16] [--nodes 2] [--own-engines]
[--repeat 2]``
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
from typing import Any

import anyio

# The script's own directory holds bench/sandbox.py, which would shadow the sandbox
# package: put the tests directory (for the fake-API policy and the cluster helper) there.
sys.path[0] = str(Path(__file__).resolve().parent.parent / "tests")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from fleet_policies import coding_policy  # noqa: E402
from node_engine import node_engine  # noqa: E402
from ray_support import environment, ray_cluster  # noqa: E402

from coordinator.fanout.fanout import Deps, MemberUnit, fan_out  # noqa: E402
from coordinator.job.spec import RetryPolicy  # noqa: E402
from coordinator.journal.entries import MemberStartedEntry  # noqa: E402
from coordinator.nodes.cluster import RayNodes  # noqa: E402
from coordinator.nodes.node import open_pools  # noqa: E402
from coordinator.nodes.worker import Recorder, Services  # noqa: E402
from sandbox.docker.backend import DockerBackend, new_run_id  # noqa: E402
from sandbox.images.build import ensure_images  # noqa: E402
from subagents.fake_api import FakeMessagesAPI  # noqa: E402
from subagents.model.factory import make_model  # noqa: E402
from subagents.spec import Limits, MemberSpec  # noqa: E402
from subagents.trace import ModelCall  # noqa: E402

LATENCY_S = 0.5
TURNS = 5


def units(n: int, run: str, root: Path) -> list[MemberUnit]:
    """``n`` coding members as the fan-out benchmark's jobs make them."""
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
                stated_deadline_s=300,
            ),
            retry=RetryPolicy(attempts=1),
        )
        for i in range(n)
    ]


class Dispatch:
    """Per member: the coordinator's ``member_started`` and its first model request."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.first_call: dict[str, float] = {}

    def journal(self, entry: Any) -> None:
        if isinstance(entry, MemberStartedEntry):
            self.started.setdefault(entry.member, time.time())

    def listen(self, event: Any) -> None:
        if isinstance(event, ModelCall) and event.member not in self.first_call:
            self.first_call[event.member] = event.ts - event.latency_s

    def delays(self) -> list[float]:
        return [self.first_call[m] - t for m, t in self.started.items() if m in self.first_call]


async def local_run(n: int, backend: DockerBackend) -> tuple[float, Dispatch, int]:
    run = new_run_id()
    seen = Dispatch()
    with tempfile.TemporaryDirectory() as tmp:
        todo = units(n, run, Path(tmp))
        deps = Deps(
            backend=backend,
            make_model=make_model,
            journal=seen.journal,
            listeners=[seen.listen],
        )
        try:
            async with contextlib.AsyncExitStack() as stack:
                await open_pools(stack, deps, todo, run, n)
                for pool in deps.pools.values():
                    await pool.wait_idle()
                t0 = time.perf_counter()
                res = await fan_out(todo, deps, max_parallel=n, min_success=n, fail_fast=False)
                wall = time.perf_counter() - t0
        finally:
            await backend.remove_run(run)
    return wall, seen, res.ok


async def cluster_run(
    n: int, address: str, backend: DockerBackend
) -> tuple[float, float, Dispatch, int]:
    run = new_run_id()
    seen = Dispatch()
    with tempfile.TemporaryDirectory() as tmp:
        todo = units(n, run, Path(tmp))
        nodes = RayNodes(address)
        record = Recorder(journal=seen.journal, listeners=[seen.listen])
        try:
            t_up = time.perf_counter()
            async with nodes.serve(run, todo, Services(max_parallel=n, warm_pool=True)):
                await nodes.warm()
                up = time.perf_counter() - t_up
                t0 = time.perf_counter()
                res = await fan_out(
                    todo, record, nodes=nodes, max_parallel=n, min_success=n, fail_fast=False
                )
                wall = time.perf_counter() - t0
        finally:
            await nodes.remove_boxes(run)
    return wall, up, seen, res.ok


def rss_mib(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def descendants_rss_mib(leave_out: frozenset[int] | set[int] = frozenset()) -> float:
    """RSS of every process this one started (the Ray cluster's), in MiB; not those in
    ``leave_out`` (the nodes' Docker engines) or theirs."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo, total = list(children.get(os.getpid(), [])), 0.0
    while todo:
        pid = todo.pop()
        if pid in leave_out:
            continue
        with contextlib.suppress(OSError):
            total += rss_mib(pid)
        todo += children.get(pid, [])
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--members", type=int, default=16)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--own-engines", action="store_true", help="a Docker engine per node")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    n = args.members
    slots = -(-n // args.nodes)
    images = ensure_images(None)
    backend = DockerBackend(images=images)
    local: list[tuple[float, Dispatch]] = []
    own: set[int] = set()
    remote: list[tuple[float, float, Dispatch]] = []
    with FakeMessagesAPI(coding_policy(turns=TURNS, latency_s=LATENCY_S)) as api:
        # The nodes' model clients read their own environment: set before they start.
        os.environ["ANTHROPIC_API_KEY"] = "bench-key"
        os.environ["ANTHROPIC_BASE_URL"] = api.url
        anyio.run(local_run, 1, backend)  # warm-up: page cache, image layers
        rss_local = 0.0
        with contextlib.ExitStack() as engines, ray_cluster(nodes=0) as cluster:
            engines.enter_context(environment(cluster.env))  # this process is its client
            t_engines = time.perf_counter()
            started = []
            for i in range(args.nodes):
                env: dict[str, str] = {}
                if args.own_engines:
                    engine = engines.enter_context(node_engine([images["coding"]]))
                    env = engine.node_env(i)
                    own.add(engine.pid)
                    started.append(engine)
                cluster.add_node(slots=slots, env=env)
            for engine in started:  # the node joined while its engine's image was copied
                engine.loaded()
            t_engines = time.perf_counter() - t_engines
            anyio.run(cluster_run, 1, cluster.address, backend)  # warm-up: node workers
            for _ in range(args.repeat):
                wall, seen, ok = anyio.run(local_run, n, backend)
                assert ok == n, f"only {ok} of {n} members ended ok on this host"
                local.append((wall, seen))
                rss_local = max(rss_local, rss_mib())
                wall, up, seen, ok = anyio.run(cluster_run, n, cluster.address, backend)
                assert ok == n, f"only {ok} of {n} members ended ok on the cluster"
                remote.append((wall, up, seen))
            rss_cluster, rss_ray = rss_mib(), descendants_rss_mib(own)
    lw = statistics.median(w for w, _ in local)
    cw = statistics.median(w for w, _, _ in remote)
    ld = statistics.median(d for _, s in local for d in s.delays())
    cd = statistics.median(d for _, _, s in remote for d in s.delays())
    print(
        f"{n} coding members, {TURNS} exec turns + 1 submit each, model latency "
        f"{LATENCY_S * 1000:.0f} ms, max_parallel {n}; cluster: {args.nodes} nodes x {slots} "
        f"fleet_slots on this machine"
        + (" each on its own Docker engine" if args.own_engines else ", sharing its engine")
        + f"; {args.repeat} runs each, alternating"
    )
    print(f"nodes up (and their engines, with the coding image): {t_engines:.1f} s")
    print(
        f"wall, this host:     median {lw:.2f} s  (runs: {', '.join(f'{w:.2f}' for w, _ in local)})"
    )
    print(
        f"wall, on the cluster: median {cw:.2f} s  (runs: "
        f"{', '.join(f'{w:.2f}' for w, _, _ in remote)})  = {cw / lw:.2f}x of this host"
    )
    print(
        f"start to first model request, median: this host {ld * 1000:.0f} ms, cluster "
        f"{cd * 1000:.0f} ms: Ray dispatch overhead {(cd - ld) * 1000:.0f} ms per member"
    )
    print(
        f"node actors up and pools full before the clock: "
        f"{', '.join(f'{u:.2f}' for _, u, _ in remote)} s"
    )
    print(
        f"coordinator RSS: {rss_local:.0f} MiB after the local runs, {rss_cluster:.0f} MiB "
        f"after the cluster runs (Ray imported and connected); the Ray cluster's own "
        f"processes (head + {args.nodes} nodes + workers): {rss_ray:.0f} MiB"
    )


if __name__ == "__main__":
    main()

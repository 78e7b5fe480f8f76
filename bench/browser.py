"""Browser member benchmarks on the real engine with real Chromium and the corpus.

Run: ``.venv/bin/python bench/browser.py [--rounds N]``. Measures

* member start: browser box create (until CDP answers) + Playwright ``connect_over_cdp``,
  and the CPU the box spent until then (its cgroup's counter: Chromium's start);
* snapshot latency of the ``snapshot`` tool on a large corpus page (library/stdtypes.html,
  about 700 KB of HTML): repeated on the loaded page, the first one after each load
  (Chromium builds the page's accessibility tree then), and with names from the
  in-page script only (the snapshot before they came from the accessibility tree);
* resident memory per browser box after it loaded that page (``docker stats``: usage
  minus page cache);
* wall time of 4 offline research members in parallel (each its own box) against one,
  split into box start (create until CDP answers) and the member's run.

``--image REF`` runs the browser boxes from another ``fleet-browser`` image (one built
from an older tree, to compare).

Every box belongs to one run (``bench-<hex>``), removed at the end, Ctrl-C included.
All traffic stays on that run's network (the corpus box) and 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import anyio  # noqa: E402

import subagents.tools.browser_session as browser_session  # noqa: E402
from sandbox.docker.backend import DockerBackend  # noqa: E402
from sandbox.spec import NetworkPolicy, SandboxSpec  # noqa: E402
from subagents.browser.config import BrowserConfig  # noqa: E402
from subagents.browser.corpus import CORPUS_ALLOW, start_corpus  # noqa: E402
from subagents.member import run_member  # noqa: E402
from subagents.model.factory import make_model  # noqa: E402
from subagents.spec import MemberSpec  # noqa: E402
from subagents.tools.base import ToolContext  # noqa: E402
from subagents.tools.browser import Snapshot, close_session, session  # noqa: E402
from subagents.tools.browser_session import BrowserSession  # noqa: E402
from subagents.trace import TraceWriter  # noqa: E402

LARGE_PAGE = "http://corpus:8080/library/stdtypes.html"
TASK = "How does asyncio shield protect a task from cancellation?"
SPEC = SandboxSpec(kind="browser", network=NetworkPolicy(egress="allowlist", allow=(CORPUS_ALLOW,)))


def stats(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered), p95


def show(name: str, samples: list[float]) -> None:
    med, p95 = stats(samples)
    print(f"{name:<46} median {med * 1000:8.1f} ms   p95 {p95 * 1000:8.1f} ms   n={len(samples)}")


async def member_start(backend: DockerBackend, run: str, rounds: int) -> None:
    samples, cpu = [], []
    for i in range(rounds):
        t0 = time.perf_counter()
        box = await backend.create(SPEC, run=run, member=f"start{i}")
        s = await BrowserSession.open(box, BrowserConfig())
        samples.append(time.perf_counter() - t0)
        cpu.append(box_cpu(backend, box.id))
        await s.close()
        await box.close()
    show("browser member start (box + CDP connect)", samples)
    show("browser box CPU until connected (Chromium start)", cpu)


@contextlib.contextmanager
def without_ax_tree() -> Iterator[None]:
    """The snapshot as it was before the accessibility-tree pass (script names only)."""
    real = browser_session.ax_nodes

    async def none(_cdp: object, count: int) -> list[None]:
        return [None] * count

    browser_session.ax_nodes = none  # type: ignore[assignment]
    try:
        yield
    finally:
        browser_session.ax_nodes = real


def box_cpu(backend: DockerBackend, box_id: str) -> float:
    """CPU seconds a box has used since it started (its cgroup's counter)."""
    # one_shot: read the counters now instead of waiting a second for a second sample.
    stats = backend.client.api.stats(box_id, stream=False, one_shot=True)
    return stats["cpu_stats"]["cpu_usage"]["total_usage"] / 1e9


def box_memory(backend: DockerBackend, box_id: str) -> float:
    """Resident MiB of a box: cgroup usage minus page cache (what docker stats shows)."""
    stats = backend.client.api.stats(box_id, stream=False)
    mem = stats["memory_stats"]
    inner = mem.get("stats", {})
    cache = inner.get("total_inactive_file", inner.get("inactive_file", inner.get("cache", 0)))
    return (mem["usage"] - cache) / 2**20


async def snapshot_latency(backend: DockerBackend, run: str, rounds: int, tmp: Path) -> None:
    box = await backend.create(SPEC, run=run, member="snap")
    ctx = ToolContext(
        sandbox=box,
        run_dir=tmp,
        trace=TraceWriter(tmp / "t.jsonl", run=run, member="snap"),
        member="snap",
    )
    try:
        s = await session(ctx, BrowserConfig())
        await s.run("open", lambda p: p.goto(LARGE_PAGE, wait_until="load"), navigation=True)
        tool = Snapshot(BrowserConfig())
        samples, plain, first, size = [], [], [], 0
        for _ in range(rounds):
            t0 = time.perf_counter()
            size = len(await tool.run(tool.Input(), ctx))
            samples.append(time.perf_counter() - t0)
            with without_ax_tree():
                t0 = time.perf_counter()
                await tool.run(tool.Input(), ctx)
                plain.append(time.perf_counter() - t0)
        show(f"snapshot of stdtypes.html ({size} chars out)", samples)
        show("  same, names from the in-page script only", plain)
        for i in range(max(3, rounds // 2)):
            url = f"{LARGE_PAGE}?load={i}"
            await s.run("open", lambda p, u=url: p.goto(u, wait_until="load"), navigation=True)
            t0 = time.perf_counter()
            await tool.run(tool.Input(), ctx)
            first.append(time.perf_counter() - t0)
        show("  first snapshot after each load (AX tree built)", first)
    finally:
        await close_session(ctx)
        await box.close()


async def memory_after_snapshots(
    backend: DockerBackend, run: str, tmp: Path, *, ax_tree: bool
) -> None:
    """Resident memory of a fresh box after loading the large page and 3 snapshots."""
    name = "mem-ax" if ax_tree else "mem-plain"
    box = await backend.create(SPEC, run=run, member=name)
    ctx = ToolContext(
        sandbox=box,
        run_dir=tmp / name,
        trace=TraceWriter(tmp / name / "t.jsonl", run=run, member=name),
        member=name,
    )
    try:
        s = await session(ctx, BrowserConfig())
        await s.run("open", lambda p: p.goto(LARGE_PAGE, wait_until="load"), navigation=True)
        tool = Snapshot(BrowserConfig())
        with contextlib.nullcontext() if ax_tree else without_ax_tree():
            for _ in range(3):
                await tool.run(tool.Input(), ctx)
        await anyio.sleep(1)
        mib = await anyio.to_thread.run_sync(box_memory, backend, box.id)
        how = "accessibility tree" if ax_tree else "script names only"
        print(f"{'resident memory of a browser box, ' + how:<46} {mib:8.1f} MiB")
    finally:
        await close_session(ctx)
        await box.close()


async def one_member(
    backend: DockerBackend, run: str, name: str, tmp: Path, phases: dict[str, list[float]]
) -> float:
    t0 = time.perf_counter()
    box = await backend.create(SPEC, run=run, member=name)
    t1 = time.perf_counter()
    try:
        run_dir = tmp / name
        trace = TraceWriter(run_dir / "trace.jsonl", run=run, member=name)
        spec = MemberSpec(id=name, kind="browser", task=TASK)
        out = await run_member(
            spec,
            sandbox=box,
            model=make_model("offline", kind="browser"),
            run_dir=run_dir,
            trace=trace,
        )
        trace.close()
        t2 = time.perf_counter()
        if out.status != "ok":
            raise RuntimeError(f"{name} ended {out.status}: {out.reason}")
        cpu = await anyio.to_thread.run_sync(box_cpu, backend, box.id)
    finally:
        t3 = time.perf_counter()
        await box.close()
    phases["box start"].append(t1 - t0)
    phases["member run"].append(t2 - t1)
    phases["box removal"].append(time.perf_counter() - t3)
    phases["box CPU"].append(cpu)
    return time.perf_counter() - t0


async def parallel_ratio(backend: DockerBackend, run: str, tmp: Path, n: int = 4) -> None:
    solo: dict[str, list[float]] = {
        "box start": [],
        "member run": [],
        "box removal": [],
        "box CPU": [],
    }
    par: dict[str, list[float]] = {k: [] for k in solo}
    t0 = time.perf_counter()
    await one_member(backend, run, "solo", tmp, solo)
    single = time.perf_counter() - t0
    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one_member, backend, run, f"par{i}", tmp, par)
    wall = time.perf_counter() - t0
    print(
        f"{n} research members in parallel vs 1: {wall:.2f} s vs {single:.2f} s "
        f"(ratio {wall / single:.2f}; sequential would be about {n:.0f}.00)"
    )
    for phase in solo:
        each = ", ".join(f"{x:.2f}" for x in sorted(par[phase]))
        print(f"  {phase:<12} solo {solo[phase][0]:.2f} s; in parallel {each} s")
    cores = os.cpu_count() or 1
    floor = sum(par["box CPU"]) / cores
    print(
        f"  CPU floor: {n} boxes used {sum(par['box CPU']):.2f} CPU-s (Chromium start included); "
        f"on {cores} cores that alone is {floor:.2f} s, ratio >= {floor / single:.2f} "
        "before any host-side work"
    )


async def main(rounds: int) -> None:
    backend = DockerBackend()
    run = f"bench-{uuid.uuid4().hex[:10]}"
    try:
        corpus = await start_corpus(backend, run)
        with tempfile.TemporaryDirectory() as tmp:
            await member_start(backend, run, rounds)
            await snapshot_latency(backend, run, rounds * 2, Path(tmp))
            for ax_tree in (False, True):
                await memory_after_snapshots(backend, run, Path(tmp), ax_tree=ax_tree)
            await parallel_ratio(backend, run, Path(tmp))
        await corpus.close()
    finally:
        with anyio.CancelScope(shield=True):
            await backend.remove_run(run)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--image", help="a fleet-browser image to run instead of the current one")
    args = parser.parse_args()
    if args.image:
        SPEC = SPEC.model_copy(update={"image": args.image})
    anyio.run(main, args.rounds)

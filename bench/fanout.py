"""Fan-out wall time with the default job settings: N explicit coding members against 1.

Each member is a real coding member: its own Docker box, the real harness loop, the
real ``anthropic`` client against the fake Messages API (in another process, on
127.0.0.1) answering every call after 500 ms. A member takes 5 turns with one box
exec each (``shell``), then a 6th turn submits its result: about 3.0 s of model
latency. A run is what ``fleet run JOB`` does, through the Python API
(:func:`coordinator.api.run_async`): the preflight (models, images, the engine's
host), the run directory, warm boxes, the fan-out and the cleanup, with the job's
defaults (Fleet chooses ``max_parallel``; warm pool on). Only the analyst step is off
(``synthesis.enabled = false``): the figure is the fan-out's.

Rounds interleave the counts (1, 8, 16, 1, 8, 16, ...) so that the shared machine's
drifting speed hits every count alike; each round's ratio to its own 1-member run is
taken, and the medians are printed.

``--cli`` times the real ``fleet run JOB --plain`` process instead, start-up included:
what a user waits for, and where the first wave's boxes start while Fleet loads
(:mod:`coordinator.nodes.prewarm`).

Beside the wall times (API call only): the coordinator process's CPU per run and the
CPU its boxes burned (each box's cgroup, read as it is removed) - the work a run
puts on the machine, which other people's load on a shared machine changes far less
than it changes wall times.

``--timeline`` adds, for the last run of each count, when each member's phases ended,
counted from the start of the call (median and latest over its members, from their
traces): the first model answer, the box ready, the first tool result, the last model
answer, the member's end and its box removed - where a wider fan-out's extra time goes.

``--warm`` runs every round in one event loop around a :class:`fleet.WarmBoxes` of as
many boxes as the largest count (boxes kept ready across runs, ``sandbox/warm.py``);
each run starts once the pool is full again, and that wait is printed, not timed.

Usage: ``.venv/bin/python bench/fanout.py [--counts 1,8,16] [--rounds 3] [--max-parallel N] [--cli | --warm] [--timeline]``
Targets on this 2-core machine, with the defaults: 8 members <= 1.10x of 1, 16 <= 1.25x.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

# The script's own directory holds bench/sandbox.py, which would shadow the sandbox
# package: put the tests directory (for the shared fake-API policy) in its place.
ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT / "tests")
sys.path.insert(1, str(ROOT))

LATENCY_S = 0.5
TURNS = 5


def serve() -> None:
    """The fake Messages API with the coding policy, until stdin closes."""
    from fleet_policies import coding_policy

    from subagents.fake_api import FakeMessagesAPI

    api = FakeMessagesAPI(coding_policy(turns=TURNS, latency_s=LATENCY_S)).start()
    api.record = lambda entry: None  # type: ignore[method-assign]  # keep no bodies
    print(api.url, flush=True)
    sys.stdin.read()
    api.stop()


def job(n: int, max_parallel: int | None) -> dict[str, Any]:
    fanout: dict[str, Any] = {"min_success": n}
    if max_parallel is not None:
        fanout["max_parallel"] = max_parallel
    return {
        "name": f"fanout-{n}",
        "model": {"name": "claude-sonnet-5"},
        "members": [
            {"id": f"m{i}", "kind": "coding", "task": f"Bench task {i}."} for i in range(n)
        ],
        "fanout": fanout,
        "synthesis": {"enabled": False},
    }


BOX_CPU: list[float] = []
"""CPU seconds of each box, read from its cgroup just before it is removed."""


def count_box_cpu() -> None:
    """Record each box's CPU (cgroup v1 ``cpuacct``) as the backend removes it: what
    the members' commands and Fleet's in-box programs cost, which the load average of
    a shared machine does not change much."""
    from sandbox.docker.backend import DockerBackend

    remove = DockerBackend.remove_container

    def used(ident: str) -> None:
        usage = Path(f"/sys/fs/cgroup/cpuacct/docker/{ident}/cpuacct.usage")
        try:
            BOX_CPU.append(int(usage.read_text()) / 1e9)
        except (OSError, ValueError):
            pass  # another cgroup layout: no figure

    async def counted(self: DockerBackend, ident: str) -> None:
        used(ident)  # a small file of the kernel's: no need for a thread
        await remove(self, ident)

    DockerBackend.remove_container = counted  # type: ignore[method-assign]


PHASES = (
    ("first answer", "model_call", "first"),
    ("box ready", "create", "first"),
    ("first tool result", "tool_result", "first"),
    ("last answer", "model_call", "last"),
    ("member end", "member_end", "last"),
    ("box removed", "close", "last"),
)
"""A member's phases: (column, trace event type or sandbox action, which of them)."""


def timeline(run: Path, started: float) -> dict[str, list[float]]:
    """Each phase's end per member of ``run``, in seconds from ``started`` (epoch)."""
    from subagents.trace import read_trace

    out: dict[str, list[float]] = {name: [] for name, _, _ in PHASES}
    for member in sorted((run / "members").iterdir()):
        events = list(read_trace(member / "trace.jsonl"))
        for name, what, which in PHASES:
            times = [
                e.ts - started
                for e in events
                if e.type == what or (e.type == "sandbox" and getattr(e, "action", "") == what)
            ]
            if times:
                out[name].append(times[0] if which == "first" else times[-1])
    return out


def print_timelines(lines: dict[int, tuple[dict[str, list[float]], float]]) -> None:
    print("\nWhen each phase ended (s from the call's start; median / latest member), last run:\n")
    names = [name for name, _, _ in PHASES]
    print("| members | " + " | ".join(names) + " | wall |")
    print("|---:|" + "---:|" * (len(names) + 1))
    for n, (phases, wall) in lines.items():
        cells = [
            f"{statistics.median(v):.2f} / {max(v):.2f}" if v else "-"
            for v in (phases[name] for name in names)
        ]
        print(f"| {n} | " + " | ".join(cells) + f" | {wall:.2f} |")


async def one_run(n: int, max_parallel: int | None, out: Path, warm: Any = None) -> float:
    from coordinator.api import run_async

    started = time.perf_counter()
    summary = await run_async(job(n, max_parallel), output_dir=out, warm=warm)
    wall = time.perf_counter() - started
    ok = sum(1 for o in summary.outcomes.values() if o.status == "ok")
    assert ok == n, f"only {ok} of {n} members ended ok: {summary.outcomes}"
    return wall


def one_cli_run(n: int, max_parallel: int | None, out: Path) -> float:
    """``fleet run JOB --plain`` as a user types it: the whole process, start-up included."""
    from coordinator.job.jobfile import render_toml

    path = out / f"fanout-{n}.toml"
    path.write_text(render_toml({**job(n, max_parallel), "output_dir": str(out)}))
    # This checkout's Fleet, as the `fleet` script starts it (the script itself would
    # run whichever checkout the virtualenv has installed).
    fleet = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from coordinator.cli import main; sys.exit(main())"
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", fleet, "run", str(path), "--plain"], capture_output=True, text=True
    )
    wall = time.perf_counter() - started
    assert proc.returncode == 0 and f"{n} of {n} members ok" in proc.stderr, proc.stderr[-2000:]
    return wall


async def warm_rounds(
    counts: list[int],
    args: argparse.Namespace,
    out: Path,
    walls: dict[int, list[float]],
    cpu: dict[int, list[tuple[float, float]]],
    refills: list[float],
) -> None:
    """The rounds in one event loop around one :class:`sandbox.warm.WarmBoxes`; each run
    starts once the pool is full again (that wait is reported, not timed)."""
    from sandbox.warm import WarmBoxes

    async with WarmBoxes(count=max(counts)) as warm:

        async def timed(n: int) -> float:
            waited = time.perf_counter()
            await warm.wait_ready()
            refills.append(time.perf_counter() - waited)
            BOX_CPU.clear()
            before = time.process_time()
            wall = await one_run(n, args.max_parallel, out, warm)
            cpu[n].append((time.process_time() - before, sum(BOX_CPU)))
            return wall

        await timed(1)  # warm-up: caches, image layers
        refills.clear()
        for _ in range(args.rounds):
            for n in counts:
                walls[n].append(await timed(n))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", default="1,8,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-parallel", type=int, default=None, help="default: Fleet's choice")
    ap.add_argument(
        "--cli",
        action="store_true",
        help="time the real `fleet run JOB` process (start-up included) instead of the API call",
    )
    ap.add_argument(
        "--warm",
        action="store_true",
        help="run every round in one event loop with boxes kept ready across runs "
        "(fleet.WarmBoxes, as many as the largest count); each run starts once they are",
    )
    ap.add_argument(
        "--timeline",
        action="store_true",
        help="print when each member's phases ended in the last run of each count",
    )
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve()
        return
    counts = [int(c) for c in args.counts.split(",")]
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    walls: dict[int, list[float]] = {n: [] for n in counts}
    refills: list[float] = []
    cpu: dict[int, list[tuple[float, float]]] = {n: [] for n in counts}
    lines: dict[int, tuple[dict[str, list[float]], float]] = {}
    if not args.cli:
        count_box_cpu()
    try:
        assert server.stdout is not None
        os.environ["ANTHROPIC_BASE_URL"] = server.stdout.readline().strip()
        os.environ["ANTHROPIC_API_KEY"] = "bench-key"
        with tempfile.TemporaryDirectory() as tmp:

            def timed(n: int) -> float:
                if args.cli:
                    return one_cli_run(n, args.max_parallel, Path(tmp))
                BOX_CPU.clear()
                before, started = time.process_time(), time.time()
                wall = anyio.run(one_run, n, args.max_parallel, Path(tmp))
                cpu[n].append((time.process_time() - before, sum(BOX_CPU)))
                if args.timeline:
                    (run,) = [
                        p for p in Path(tmp).glob(f"fanout-{n}-*") if p.stat().st_mtime >= started
                    ]
                    lines[n] = (timeline(run, started), wall)
                    shutil.rmtree(run)
                return wall

            if args.warm:
                anyio.run(warm_rounds, counts, args, Path(tmp), walls, cpu, refills)
            else:
                timed(1)  # warm-up: caches, image layers
                for _ in range(args.rounds):
                    for n in counts:
                        walls[n].append(timed(n))
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(timeout=10)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    setting = "the default" if args.max_parallel is None else str(args.max_parallel)
    how = "the `fleet run` process" if args.cli else "the API call"
    if args.warm:
        how += f", boxes kept ready across runs ({max(counts)})"
    print(
        f"fan-out ({how}), max_parallel {setting}: {TURNS} exec turns + 1 submit turn per member, "
        f"model latency {LATENCY_S * 1000:.0f} ms, {args.rounds} interleaved rounds; "
        f"load average after: {load}\n"
    )
    if refills:
        print(
            f"waited for the pool to refill before a run (outside the timed call): median "
            f"{statistics.median(refills):.2f} s, max {max(refills):.2f} s\n"
        )
    print(
        "| members | wall, median (s) | min | max | x of 1, median of rounds "
        "| coordinator CPU (s) | boxes' CPU (s) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    base = walls[counts[0]]
    for n in counts:
        ratios = [w / b for w, b in zip(walls[n], base, strict=True)]
        used = cpu[n] or [(math.nan, math.nan)]
        print(
            f"| {n} | {statistics.median(walls[n]):.2f} | {min(walls[n]):.2f} | "
            f"{max(walls[n]):.2f} | {statistics.median(ratios):.2f}x | "
            f"{statistics.median(c for c, _ in used):.2f} | "
            f"{statistics.median(b for _, b in used):.2f} |"
        )
    if lines:
        print_timelines(lines)


if __name__ == "__main__":
    main()

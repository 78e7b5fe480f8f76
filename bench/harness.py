"""Harness benchmark through the real client: CPU per turn, CPU before the first turn,
tokens sent, prompt-cache reads.

    .venv/bin/python bench/harness.py [--repeats N] [--parts cpu,tokens]

A member runs as it does in a run: its own :class:`~subagents.model.claude.AnthropicModel`
(the official ``anthropic`` client, streaming), :func:`~subagents.member.run_member` with
the real loop and context manager, its trace and offloads written to disk, default
job settings (``claude-sonnet-5``: a 1M window, so the 150,000-token working-set
budget). The model is the fake Messages API running in *another process* (this
script with ``--serve``), so what it costs is not counted; it answers from a plan
named in the task, computes usage from what it received, and simulates the prompt
cache (:class:`subagents.fake_api.PromptCache`). The tools run in-process; the CPU
they use is measured and subtracted. What is left is the coordinator's CPU for the
member: the loop, the context mechanisms, the trace and the client.

Part ``cpu`` - CPU per turn for members of 10, 100 and 200 turns (mostly 300-token
results, a 3,000-token one every 10th turn): the whole member's CPU (model client
made, every turn, the end) divided by its turns, median of ``--repeats`` members;
and the CPU before the first turn (model client made, member set up, first request
built), for the first member in the process and for later ones.

Part ``tokens`` - total input tokens (uncached + cache read + cache write, summary
calls included, as the fake API counts them), the peak context of one call, and
the share of input read from the prompt cache, for 60 results of 15,000 tokens
(just under the offload line), 60 of 25,000 (over it) and the 200-turn member.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from context import METER  # registers the in-process "bench" kind

from subagents.context.budget import working_set_budget
from subagents.context.compaction import SUMMARY_SYSTEM
from subagents.context.config import ContextConfig
from subagents.member import run_member
from subagents.model.base import ModelRequest, ModelResponse
from subagents.model.factory import make_model
from subagents.results.outcome import MemberOutcome
from subagents.spec import Limits, MemberSpec
from subagents.trace import Compaction, ModelCall, Offload, TraceWriter, read_trace

MODEL = "claude-sonnet-5"
PLAN = re.compile(r"PLAN\[(\w+):(\d+):(\d+):(\w+)\]")
"""``PLAN[kind:turns:size:nonce]`` in a member's task: what the fake model asks for."""


# -- the fake model, in its own process ------------------------------------------------
def serve() -> None:
    """Serve the plan policy on 127.0.0.1 until stdin closes; print the URL first."""
    from subagents.fake_api import text, tool_use

    steps: dict[str, int] = {}
    lock = threading.Lock()

    def policy(body: dict[str, Any]) -> Any:
        if SUMMARY_SYSTEM in system_text(body):
            return text("## Session intent\nbench\n## Next steps\ngo on")
        found = PLAN.search(json.dumps(body["messages"][0]))
        assert found is not None, "no PLAN[...] in the task"
        kind, turns, size = found.group(1), int(found.group(2)), int(found.group(3))
        with lock:
            step = steps.get(found.group(0), 0)
            steps[found.group(0)] = step + 1
        if step >= turns - 1:
            return tool_use("submit_result", {"summary": "done"})
        if kind == "cpu":
            size = 3_000 if step % 10 == 9 else 300
        return tool_use("produce", {"tokens": size, "tag": f"turn {step}"})

    serve_policy(policy)


def system_text(body: dict[str, Any]) -> str:
    """A request's system prompt as one string."""
    system = body.get("system") or ""
    return system if isinstance(system, str) else "".join(b.get("text", "") for b in system)


def serve_policy(policy: Any) -> None:
    """Serve ``policy`` on 127.0.0.1 until stdin closes, recording no bodies; print the
    URL first (the parent reads it: :func:`fake_server`)."""
    from subagents.fake_api import FakeMessagesAPI

    api = FakeMessagesAPI(policy).start()
    api.record = lambda entry: None  # type: ignore[method-assign]  # keep no bodies
    print(api.url, flush=True)
    sys.stdin.read()
    api.stop()


@contextmanager
def fake_server(script: str) -> Iterator[None]:
    """``script --serve`` in another process (its CPU is not this one's), with the
    ``anthropic`` client of this process pointed at it."""
    server = subprocess.Popen(
        [sys.executable, script, "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        os.environ["ANTHROPIC_BASE_URL"] = server.stdout.readline().strip()
        os.environ["ANTHROPIC_API_KEY"] = "bench-key"
        yield
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(timeout=10)


# -- one member ---------------------------------------------------------------------
@dataclass
class Run:
    outcome: MemberOutcome
    cpu_s: float
    """Coordinator CPU of the whole member, tools excluded."""
    setup_cpu_s: float
    """CPU from the start until the first request is handed to the client."""
    peak: int
    offloads: int
    compactions: int


_NONCE = iter(range(1, 1_000_000))


async def run_one(kind: str, turns: int, size: int = 0) -> Run:
    task = f"Run the benchmark plan. PLAN[{kind}:{turns}:{size}:n{next(_NONCE)}]"
    spec = MemberSpec(
        id="bench",
        kind="bench",
        task=task,
        model=MODEL,
        limits=Limits(max_turns=turns + 5, deadline_s=3_600),
        context=ContextConfig(),
    )
    first: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        trace = TraceWriter(Path(tmp) / "trace.jsonl", run="bench", member="bench")
        METER.outside = 0.0
        start = time.process_time()
        model = make_model(spec.model, kind=spec.kind, trace=trace)
        complete = model.complete

        async def timed(request: ModelRequest) -> ModelResponse:
            if not first:
                first.append(time.process_time())
            return await complete(request)

        model.complete = timed  # type: ignore[method-assign]
        try:
            outcome = await run_member(
                spec, sandbox=None, model=model, run_dir=Path(tmp), trace=trace
            )
        finally:
            await model.aclose()
        cpu = time.process_time() - start - METER.outside
        trace.close()
        events = list(read_trace(Path(tmp) / "trace.jsonl"))
    assert outcome.status == "ok", outcome.reason
    calls = [e for e in events if isinstance(e, ModelCall)]
    return Run(
        outcome=outcome,
        cpu_s=cpu,
        setup_cpu_s=first[0] - start,
        peak=max(c.context_tokens for c in calls),
        offloads=sum(1 for e in events if isinstance(e, Offload)),
        compactions=sum(1 for e in events if isinstance(e, Compaction)),
    )


def member(kind: str, turns: int, size: int = 0) -> Run:
    return anyio.run(run_one, kind, turns, size)


# -- the parts ----------------------------------------------------------------------
def part_cpu(repeats: int) -> list[str]:
    first = member("cpu", 10)  # the first member in this process: one-time set-up
    later: list[float] = []
    rows = [
        "| turns | CPU per turn, median (ms) | min | max | CPU before the first turn, median (ms) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for turns in (10, 100, 200):
        runs = [member("cpu", turns) for _ in range(repeats)]
        per_turn = [r.cpu_s / r.outcome.turns * 1_000 for r in runs]
        setup = [r.setup_cpu_s * 1_000 for r in runs]
        later += setup
        rows.append(
            f"| {turns} | {statistics.median(per_turn):.2f} | {min(per_turn):.2f} | "
            f"{max(per_turn):.2f} | {statistics.median(setup):.1f} |"
        )
    rows.append("")
    rows.append(
        f"CPU before the first turn: first member in the process {first.setup_cpu_s * 1e3:.1f} ms "
        f"(its whole 10 turns: {first.cpu_s * 1e3:.1f} ms), later members median "
        f"{statistics.median(later):.1f} ms"
    )
    return rows


def part_tokens() -> list[str]:
    budget = working_set_budget(ContextConfig(), 1_000_000)
    rows = [
        "| member | turns | total input tokens | peak context | budget | cache read share "
        "| offloads | compactions |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    cases = [
        ("60 results of 15,000 tokens", "size", 61, 15_000),
        ("60 results of 25,000 tokens", "size", 61, 25_000),
        ("200 turns, 300-token results", "cpu", 200, 0),
    ]
    for name, kind, turns, size in cases:
        run = member(kind, turns, size)
        o = run.outcome
        total = o.input_tokens + o.cache_read_tokens + o.cache_write_tokens
        rows.append(
            f"| {name} | {o.turns} | {total:,} | {run.peak:,} | {budget:,} | "
            f"{o.cache_read_tokens / total:.0%} | {run.offloads} | {run.compactions} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="members per turn count (cpu)")
    parser.add_argument("--parts", default="cpu,tokens", help="cpu, tokens or both")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    with fake_server(__file__):
        parts = args.parts.split(",")
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
        if "cpu" in parts:
            print("Coordinator CPU per member turn (real anthropic client; tool CPU excluded)\n")
            print("\n".join(part_cpu(args.repeats)))
        if "tokens" in parts:
            print("\nTokens sent (as the fake API counts them) and prompt-cache reads\n")
            print("\n".join(part_tokens()))


if __name__ == "__main__":
    main()

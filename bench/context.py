"""Context mechanisms in-process: what they do to the window, with and without them.

    .venv/bin/python bench/context.py [--repeats N]

Everything runs in-process through the real :class:`subagents.loop.loop.AgentLoop` and
the real :class:`subagents.context.ContextManager` (trace written to disk, offloads
written to the run directory). The model is a scripted in-process
:class:`ScriptedModel` (no HTTP) and the tools are in-process too, so the CPU they
use is measured separately and subtracted: what is left is the loop and the context
mechanisms, without the model client (``bench/harness.py`` measures the whole
harness through the real ``anthropic`` client).

Part 1 - loop CPU per turn at 10, 100 and 200 turns, no client.
Part 2 - peak context and total input tokens, mechanisms off and on, for scripted
tool-call tasks with large outputs (target: the peak never above the working-set
budget with the mechanisms on).
Part 3 - cost of one ``observe_usage`` (the per-turn token accounting) as the
conversation grows: it must stay flat, not grow with the run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import anyio
from anthropic.types import Message
from pydantic import BaseModel, ConfigDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from subagents.context import ContextConfig, ContextManager
from subagents.context.budget import working_set_budget
from subagents.context.compaction import SUMMARY_SYSTEM
from subagents.context.tokens import estimate_message, estimate_text
from subagents.kinds import Kind, register_kind
from subagents.loop.loop import AgentLoop
from subagents.model.base import ModelProfile, ModelRequest, ModelResponse
from subagents.results.result import estimate_tokens
from subagents.spec import Limits, MemberSpec
from subagents.tools.base import Tool, ToolContext, ToolOutput
from subagents.trace import TraceWriter

LINE = "0123456789 abcdefghij klmnopqrst uvwxyz ABCDEFGHIJ KLMNOPQRST UVWXYZ 0123456789\n"
"""80 characters = 20 tokens by the local estimate."""


class Meter:
    """CPU seconds spent in the model and the tools (to subtract from the total)."""

    def __init__(self) -> None:
        self.outside = 0.0

    def __enter__(self) -> Meter:
        self._t = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.outside += time.process_time() - self._t


METER = Meter()


class ProduceInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tokens: int
    tag: str = ""


class Produce(Tool):
    """Returns ``tokens`` tokens of text (a log, a page, a listing)."""

    name: ClassVar[str] = "produce"
    description: ClassVar[str] = "Produce output of a given size."
    Input: ClassVar[type[BaseModel]] = ProduceInput

    async def run(self, args: ProduceInput, ctx: ToolContext) -> ToolOutput:
        with METER:
            body = LINE * max(1, args.tokens // 20)
            return ToolOutput(text=f"{args.tag}\n{body}")


class WriteInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    content: str


class BenchWrite(Tool):
    name: ClassVar[str] = "write_file"
    description: ClassVar[str] = "Write a file."
    Input: ClassVar[type[BaseModel]] = WriteInput

    async def run(self, args: WriteInput, ctx: ToolContext) -> ToolOutput:
        with METER:
            return ToolOutput(text=f"wrote {args.path}", files_written=[args.path])


class BenchResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    summary: str


register_kind(
    Kind(
        name="bench",
        system_prompt="You are a benchmark agent. " + "Follow the plan. " * 50,
        tools=lambda settings: [Produce(), BenchWrite()],
        result_model=BenchResult,
    )
)


@dataclass
class ScriptedModel:
    """Answers from a plan of tool calls, in-process; counts tokens like an API would."""

    offline = False

    plan: list[list[tuple[str, dict[str, Any]]]]
    window: int
    profile: ModelProfile = field(init=False)
    step: int = 0
    calls: int = 0
    summary_calls: int = 0
    input_tokens: list[int] = field(default_factory=list)
    summary_input: int = 0

    def __post_init__(self) -> None:
        self.profile = ModelProfile(name="bench-model", context_window=self.window)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        with METER:
            tokens = estimate_text(str(request.system)) + sum(
                estimate_message(m) for m in request.messages
            )
            tokens += sum(estimate_text(str(t)) for t in request.tools)
            if request.system == SUMMARY_SYSTEM:
                self.summary_calls += 1
                self.summary_input += tokens
                content = [
                    {"type": "text", "text": "## Session intent\nbench\n## Next steps\ngo on"}
                ]
            else:
                self.calls += 1
                self.input_tokens.append(tokens)
                content = self._next()
            return ModelResponse(message=_message(content, tokens))

    def _next(self) -> list[dict[str, Any]]:
        if self.step >= len(self.plan):
            return [_use(f"s{self.step}", "submit_result", {"summary": "done"})]
        calls = self.plan[self.step]
        self.step += 1
        return [_use(f"c{self.step}_{i}", name, args) for i, (name, args) in enumerate(calls)]

    async def count_tokens(self, request: ModelRequest) -> int | None:
        return None

    async def aclose(self) -> None:
        return None


def _use(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{call_id}", "name": name, "input": args}


def _message(content: list[dict[str, Any]], input_tokens: int) -> Message:
    return Message.model_validate(
        {
            "id": "msg_bench",
            "type": "message",
            "role": "assistant",
            "model": "bench-model",
            "content": content,
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 20},
        }
    )


class NullContext:
    """The mechanisms off: everything passes through untouched."""

    def __init__(self) -> None:
        self.summary_usage: list[Any] = []

    def tools(self) -> list[Tool]:
        return []

    async def start(self) -> str:
        return ""

    async def prepare(self, messages: list[dict], **kw: Any) -> list[dict]:
        return messages

    def observe_usage(self, usage: Any, sent_messages: list[dict]) -> None:
        pass

    def estimate(self, messages: list[dict], system: Any, tools: list[dict]) -> int:
        return estimate_tokens(json.dumps([system, tools, messages], default=str))

    def context_management(self) -> None:
        return None

    def todo_items(self) -> list[dict[str, Any]]:
        return []

    async def admit_tool_result(self, call_id: str, tool: str, text: str) -> tuple[str, None]:
        return text, None

    def note_files_written(self, paths: list[str]) -> None:
        pass

    async def finish(self) -> None:
        pass


@dataclass
class RunStats:
    turns: int
    harness_cpu_s: float
    model: ScriptedModel
    manager: ContextManager | None


async def run_plan(
    plan: list[list[tuple[str, dict[str, Any]]]],
    *,
    window: int,
    on: bool,
    config: ContextConfig | None = None,
) -> RunStats:
    model = ScriptedModel(plan, window)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        spec = MemberSpec(
            id="bench",
            kind="bench",
            task="Run the benchmark plan to the end.",
            limits=Limits(max_turns=len(plan) + 5, deadline_s=3_600),
            context=config or ContextConfig(),
        )
        trace = TraceWriter(run_dir / "trace.jsonl", run="bench", member="bench")
        manager: ContextManager | None = None
        context: Any = NullContext()
        if on:
            manager = ContextManager(
                spec.context,
                profile=model.profile,
                model=model,
                sandbox=None,
                run_dir=run_dir,
                trace=trace,
                task=spec.task,
                memory_dir=None,
                todos_enabled=True,
            )
            context = manager
        from subagents.kinds import get_kind

        loop = AgentLoop(
            spec,
            get_kind("bench"),
            model=model,
            sandbox=None,
            run_dir=run_dir,
            trace=trace,
            context=context,
        )
        METER.outside = 0.0
        start = time.process_time()
        outcome = await loop.run()
        total = time.process_time() - start
        trace.close()
    assert outcome.status == "ok", outcome.reason
    return RunStats(outcome.turns, total - METER.outside, model, manager)


def cpu_plan(turns: int) -> list[list[tuple[str, dict[str, Any]]]]:
    """A coding-like mix: mostly 300-token outputs, a 3,000-token one every 10th turn."""
    plan = []
    for i in range(turns - 1):
        size = 3_000 if i % 10 == 9 else 300
        plan.append([("produce", {"tokens": size, "tag": f"turn {i}"})])
    return plan


def part1(repeats: int) -> list[str]:
    rows = [
        "| turns | harness CPU per turn, median of runs (ms) | min (ms) | max (ms) |",
        "|---:|---:|---:|---:|",
    ]
    for turns in (10, 100, 200):
        per_turn = []
        for _ in range(repeats):
            stats = anyio.run(partial(run_plan, cpu_plan(turns), window=200_000, on=True))
            per_turn.append(stats.harness_cpu_s / stats.turns * 1_000)
        rows.append(
            f"| {turns} | {statistics.median(per_turn):.2f} | {min(per_turn):.2f} | "
            f"{max(per_turn):.2f} |"
        )
    return rows


def large_outputs_plan() -> list[list[tuple[str, dict[str, Any]]]]:
    """200 tool calls; sizes cycle 2k, 6k, 30k, 800, 12k tokens (every 5th over 20k)."""
    sizes = [2_000, 6_000, 30_000, 800, 12_000]
    return [[("produce", {"tokens": sizes[i % 5], "tag": f"call {i}"})] for i in range(200)]


def under_threshold_plan() -> list[list[tuple[str, dict[str, Any]]]]:
    """60 results of 15,000 tokens: each just under the 20,000-token offload threshold."""
    return [[("produce", {"tokens": 15_000, "tag": f"page {i}"})] for i in range(60)]


def writes_plan() -> list[list[tuple[str, dict[str, Any]]]]:
    """100 writes of ~2,500-token files, each followed by a 1,000-token check."""
    plan = []
    for i in range(100):
        plan.append([("write_file", {"path": f"/workspace/m{i}.py", "content": LINE * 125})])
        plan.append([("produce", {"tokens": 1_000, "tag": f"check {i}"})])
    return plan


def small_results_plan() -> list[list[tuple[str, dict[str, Any]]]]:
    """200 results of 900 tokens: too small to offload one by one, so compaction acts."""
    return [[("produce", {"tokens": 900, "tag": f"step {i}"})] for i in range(200)]


def part2() -> list[str]:
    rows = [
        "| task | window | budget | mechanisms | peak context | total input | offloads | clips "
        "| compactions | peak <= budget | harness CPU/turn |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    cases = [
        ("200 calls, large outputs", large_outputs_plan, 200_000),
        ("60 x 15,000-token results", under_threshold_plan, 1_000_000),
        ("100 writes + 100 checks", writes_plan, 200_000),
        ("200 calls, 900-token results", small_results_plan, 200_000),
    ]
    for name, make, window in cases:
        budget = working_set_budget(ContextConfig(), window)
        for on in (False, True):
            stats = anyio.run(partial(run_plan, make(), window=window, on=on))
            m = stats.model
            peak = max(m.input_tokens)
            total = sum(m.input_tokens) + m.summary_input
            counts = _counts(stats.manager)
            ok = "yes" if peak <= budget else "no"
            if peak > window:
                ok += " (over the window)"
            rows.append(
                f"| {name} | {window:,} | {budget:,} | {'on' if on else 'off'} | {peak:,} | "
                f"{total:,} | {counts[0]} | {counts[1]} | {counts[2]} | {ok} | "
                f"{stats.harness_cpu_s / stats.turns * 1_000:.2f} ms |"
            )
    return rows


def _counts(manager: ContextManager | None) -> tuple[int, int, int]:
    if manager is None:
        return (0, 0, 0)
    return (manager.offloads, manager.clips, manager.compactions)


def part3(points: tuple[int, ...] = (10, 100, 200, 1_000)) -> list[str]:
    """Median wall time of ``observe_usage`` over the 10 turns before each point."""
    with tempfile.TemporaryDirectory() as tmp:
        manager = ContextManager(
            ContextConfig(),
            profile=ModelProfile(name="bench", context_window=1_000_000),
            model=ScriptedModel([], window=1_000_000),
            sandbox=None,
            run_dir=Path(tmp),
            trace=TraceWriter(Path(tmp) / "trace.jsonl", run="bench", member="m"),
            task="t",
            memory_dir=None,
            todos_enabled=False,
        )
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": [{"type": "text", "text": "t"}]}
        ]
        times: list[float] = []
        for turn in range(1, max(points) + 1):
            messages.append({"role": "assistant", "content": [_use(f"c{turn}", "shell", {})]})
            result = {"type": "tool_result", "tool_use_id": f"c{turn}", "content": "x" * 400}
            messages.append({"role": "user", "content": [result]})
            manager.estimate(messages, "s", [])
            started = time.perf_counter()
            manager.observe_usage({"input_tokens": 1_000}, messages, "s", [])
            times.append(time.perf_counter() - started)
    rows = ["| turns | messages | observe_usage, median (us) |", "|---:|---:|---:|"]
    for n in points:
        median = statistics.median(times[n - 10 : n]) * 1e6
        rows.append(f"| {n} | {2 * n + 1} | {median:.1f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per turn count (part 1)")
    args = parser.parse_args()
    print(
        "Loop CPU per turn without a model client (model and tool CPU excluded; mechanisms on, 200k window)\n"
    )
    print("\n".join(part1(args.repeats)))
    print("\nContext size, mechanisms off vs on (tokens by the local estimate)\n")
    print("\n".join(part2()))
    print("\nToken accounting per turn (observe_usage) as the conversation grows\n")
    print("\n".join(part3()))


if __name__ == "__main__":
    main()

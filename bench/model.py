"""Model seam costs: request building (cache breakpoints) per turn, and a full
streamed call through the real ``anthropic`` client against the fake server.

Run: ``.venv/bin/python bench/model.py``. Prints medians and p95s; no network
beyond 127.0.0.1.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio

# The script's own directory holds bench/sandbox.py, which would shadow the sandbox package.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from subagents.fake_api import FakeMessagesAPI, text, tool_use  # noqa: E402
from subagents.model.base import ModelRequest  # noqa: E402
from subagents.model.claude import AnthropicModel, build_params  # noqa: E402

TOOLS = [
    {"name": f"tool{i}", "description": "x" * 200, "input_schema": {"type": "object"}}
    for i in range(12)
]


def conversation(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "task " * 200}]
    for t in range(turns):
        call = {"type": "tool_use", "id": f"t{t}", "name": "tool1", "input": {"q": "x" * 100}}
        messages.append({"role": "assistant", "content": [call]})
        result = {"type": "tool_result", "tool_use_id": f"t{t}", "content": "r" * 2000}
        messages.append({"role": "user", "content": [result]})
    return messages


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def bench_build() -> None:
    print("build_params (cache breakpoints), microseconds per call")
    print(f"{'turns':>6} {'median':>8} {'p95':>8}")
    for turns in (10, 100, 200):
        request = ModelRequest(system="sys " * 500, tools=TOOLS, messages=conversation(turns))
        samples = []
        for _ in range(300):
            started = time.perf_counter()
            build_params(request, "claude-sonnet-5")
            samples.append((time.perf_counter() - started) * 1e6)
        print(f"{turns:>6} {statistics.median(samples):>8.1f} {pct(samples, 0.95):>8.1f}")


async def bench_call() -> None:
    calls = 60
    script = [
        tool_use("tool1", {"q": "y" * 300}) if i % 2 else text("ok " * 50) for i in range(calls)
    ]
    request = ModelRequest(system="sys", tools=TOOLS, messages=conversation(20))
    with FakeMessagesAPI(script) as api:
        async with AnthropicModel("claude-sonnet-5", api_key="b", base_url=api.url) as model:
            samples = []
            for _ in range(calls):
                started = time.perf_counter()
                await model.complete(request)
                samples.append((time.perf_counter() - started) * 1e3)
    samples = samples[5:]  # connection warm-up
    print("\nAnthropicModel.complete via the fake server (streamed, 20-turn context), ms")
    print(f"median {statistics.median(samples):.2f}  p95 {pct(samples, 0.95):.2f}")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    bench_build()
    anyio.run(bench_call)

"""Token accounting stays incremental: a turn's cost does not grow with the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from subagents.context import ContextConfig
from subagents.context.manager import ContextManager
from subagents.context.tokens import TokenCounter, estimate_message
from subagents.model.base import ModelProfile
from subagents.trace import TraceWriter

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def exchange(n: int, size: int = 400) -> list[dict[str, Any]]:
    call = {"type": "tool_use", "id": f"c{n}", "name": "shell", "input": {"command": "ls"}}
    result = {"type": "tool_result", "tool_use_id": f"c{n}", "content": f"out{n} " * size}
    return [
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [result]},
    ]


class Counting(TokenCounter):
    """Counts the per-message estimates the counter has to look at."""

    def __init__(self) -> None:
        super().__init__()
        self.looked_at = 0

    def message(self, message: dict[str, Any]) -> int:
        self.looked_at += 1
        return super().message(message)


async def test_observe_usage_looks_only_at_messages_added_since_the_last_turn(
    tmp_path: Path,
) -> None:
    manager = ContextManager(
        ContextConfig(),
        profile=ModelProfile(name="m", context_window=1_000_000),
        model=None,  # type: ignore[arg-type]  # no compaction in this test
        sandbox=None,
        run_dir=tmp_path,
        trace=TraceWriter(tmp_path / "trace.jsonl", run="r", member="m1"),
        task="t",
        memory_dir=None,
        todos_enabled=False,
    )
    counter = manager.counter = Counting()
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "t"}]}]
    looked: list[int] = []
    for turn in range(1, 201):
        sent = await manager.prepare(messages, turn=turn, system="s", tools=[])
        before = counter.looked_at
        manager.observe_usage({"input_tokens": 10 * len(sent)}, sent)
        looked.append(counter.looked_at - before)
        messages += exchange(turn, size=5)
    # Each turn adds two messages; the 200th turn must not walk the 400 before it.
    assert max(looked[10:]) <= 4, looked[-5:]


def test_running_total_follows_in_place_rewrites_and_replacements() -> None:
    counter = TokenCounter()
    messages = [m for n in range(50) for m in exchange(n)]
    assert counter.messages_total(messages) == sum(estimate_message(m) for m in messages)
    messages += exchange(50)
    assert counter.messages_total(messages) == sum(estimate_message(m) for m in messages)
    # An offload rewrites an old result in place and says so.
    messages[5]["content"][0]["content"] = "offloaded: see /offloads/c2.txt"
    counter.forget(messages[5])
    assert counter.messages_total(messages) == sum(estimate_message(m) for m in messages)
    # A block appended in place to the last message (todo recitation) is seen.
    messages[-1]["content"].append({"type": "text", "text": "todo " * 300})
    assert counter.messages_total(messages) == sum(estimate_message(m) for m in messages)
    # Compaction replaces the whole list.
    messages[:] = exchange(99, size=10)
    counter.reset()
    assert counter.messages_total(messages) == sum(estimate_message(m) for m in messages)
    # Another, shorter list (a different conversation) is never served the old total.
    other = exchange(7, size=3)
    assert counter.messages_total(other) == sum(estimate_message(m) for m in other)

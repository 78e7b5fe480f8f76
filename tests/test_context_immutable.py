"""The context mechanisms never change a message in place: they replace it.

The model adapter serializes each message once and reuses the bytes while the
message object is the same (subagents/model/wire.py); a message edited in place
would be sent as it was before the edit. These tests keep every message object the
conversation ever held, with a deep copy of it, and check after each mechanism
acted that no object differs from its copy - while the conversation itself did
change.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from context_fakes import context_manager

from subagents.context import ContextConfig
from subagents.context.todos import TodoItem

pytestmark = pytest.mark.anyio
TASK = "Keep the context small."


def _exchange(i: int, tool: str, result: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    call = f"call_{i}"
    return [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": call, "name": tool, "input": args}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": call,
                    "content": [{"type": "text", "text": result}],
                }
            ],
        },
    ]


class Witness:
    """Every message object seen, each with a deep copy taken when first seen."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}

    def look(self, messages: list[dict[str, Any]]) -> None:
        for m in messages:
            self.seen.setdefault(id(m), (m, copy.deepcopy(m)))

    def changed_in_place(self) -> list[dict[str, Any]]:
        return [m for m, snapshot in self.seen.values() if m != snapshot]


async def test_offload_clip_recitation_and_retiring_replace_messages(tmp_path: Path) -> None:
    config = ContextConfig(budget_tokens=30_000, keep_recent_results=2, keep_recent_writes=1)
    manager = context_manager(tmp_path, config, todos=True, task=TASK)
    assert manager.todos is not None
    witness = Witness()
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": TASK}]}]
    for turn in range(1, 13):
        manager.todos.replace([TodoItem(content=f"step {turn}", status="in_progress")])
        if turn % 2:
            args = {"path": f"/workspace/m{turn}.py", "content": "x = 1\n" * 1_500}
            messages += _exchange(turn, "write_file", "wrote it", args)
        else:
            messages += _exchange(turn, "shell", f"output {turn}\n" + "o" * 20_000, {})
        witness.look(messages)
        await manager.prepare(messages, turn=turn, system="sys", tools=[])
        witness.look(messages)
    assert manager.offloads and manager.clips  # the mechanisms did act...
    assert sum("Current todo list" in str(m) for m in messages) >= 1
    assert witness.changed_in_place() == []  # ...and never on a message in place

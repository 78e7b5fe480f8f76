"""Aging: results the model has moved past shrink, in batches (subagents/context/aging.py).

A member's turns are played against the real ContextManager (results admitted as
the loop admits them, prepare before every call) and the tokens each call would
send are summed by the manager's own estimate.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from context_fakes import MemoryBox, context_manager

from subagents.context import ContextManager
from subagents.context.offload import OFFLOAD_MARK
from subagents.trace import read_trace

pytestmark = pytest.mark.anyio
TASK = "Read the sixty pages and report."
NEEDLE = "the release key is 7731"
LINE = "0123456789 abcdefghij klmnopqrst uvwxyz ABCDEFGHIJ KLMNOPQRST UVWXYZ 0123456789\n"


def manager_for(tmp_path: Path) -> ContextManager:
    # A 1M window: the 150,000-token budget binds.
    manager: ContextManager = context_manager(tmp_path, window=1_000_000, task=TASK)
    return manager


class Session:
    """Turns of one member: admit each result, prepare, count what would be sent."""

    def __init__(self, manager: ContextManager) -> None:
        self.manager = manager
        self.messages: list[dict[str, Any]] = [
            {"role": "user", "content": [{"type": "text", "text": TASK}]}
        ]
        self.sent: list[int] = []
        self.rewrites = 0
        """Calls before which an old message was replaced (an aging batch)."""

    async def turn(self, n: int, result: str) -> None:
        before = list(self.messages)
        await self.manager.prepare(self.messages, turn=n, system="sys", tools=[])
        if any(a is not b for a, b in zip(before, self.messages, strict=False)):
            self.rewrites += 1
        self.sent.append(self.manager.estimate(self.messages, "sys", []))
        call = f"call_{n}"
        text, _ = await self.manager.admit_tool_result(call, "fetch", result)
        use = {"type": "tool_use", "id": call, "name": "fetch", "input": {"page": n}}
        self.messages.append({"role": "assistant", "content": [use]})
        content = [{"type": "text", "text": text}]
        result_block = {"type": "tool_result", "tool_use_id": call, "content": content}
        self.messages.append({"role": "user", "content": [result_block]})

    def results(self) -> list[str]:
        out = []
        for m in self.messages[2::2]:
            content = m["content"][0]["content"]
            out.append(content if isinstance(content, str) else content[0]["text"])
        return out


def page(n: int, tokens: int) -> str:
    return f"page {n}\n" + LINE * (tokens // 20)


async def test_sixty_results_under_the_offload_line_send_a_fraction(tmp_path: Path) -> None:
    manager = manager_for(tmp_path)
    session = Session(manager)
    for n in range(1, 61):
        await session.turn(n, page(n, 15_000))
        assert all(not r.startswith(OFFLOAD_MARK) for r in session.results()[-3:])
    await session.turn(61, "done")
    # Before aging the same member sent 6.0M tokens, peaking at 135k (the trigger).
    assert sum(session.sent) <= 3_600_000
    assert max(session.sent) <= manager.budget
    # In batches: at most every other call rewrites history, the rest are appends.
    assert 10 <= session.rewrites <= 30
    assert manager.aged >= 50 and manager.compactions == 0


async def test_old_pointers_lose_their_preview_and_keep_their_path(tmp_path: Path) -> None:
    manager = manager_for(tmp_path)
    session = Session(manager)
    for n in range(1, 61):
        await session.turn(n, page(n, 25_000))  # over the line: a pointer on arrival
    await session.turn(61, "done")
    assert sum(session.sent) <= 450_000  # 608k with every pointer keeping its preview
    results = session.results()
    assert all(r.startswith(OFFLOAD_MARK) and "Full content: " in r for r in results[:-1])
    assert all("First 10 lines:" in r for r in results[-4:-1])  # the newest keep it
    assert sum("First 10 lines:" in r for r in results) <= 12
    path = re.search(r"Full content: (\S+)", results[0])
    assert path is not None and path.group(1).endswith("call_1.txt")


async def test_a_small_context_keeps_what_the_model_read(tmp_path: Path) -> None:
    manager = manager_for(tmp_path)
    session = Session(manager)
    for n in range(1, 16):
        await session.turn(n, page(n, 2_000))  # 30,000 tokens: under 30% of the budget
    assert not any(r.startswith(OFFLOAD_MARK) for r in session.results())
    assert manager.aged == 0


async def test_an_aged_fact_is_recovered_after_compaction(tmp_path: Path) -> None:
    manager = manager_for(tmp_path)
    box = manager.sandbox
    assert isinstance(box, MemoryBox)
    session = Session(manager)
    await session.turn(1, f"config dump: {NEEDLE}\n" + page(1, 15_000))
    for n in range(2, 8):
        await session.turn(n, page(n, 15_000))
    first = session.results()[0]
    assert first.startswith(OFFLOAD_MARK) and NEEDLE not in first  # aged...
    path = re.search(r"Full content: (\S+)", first)
    assert path is not None and NEEDLE in box.files[path.group(1)].decode()  # ...not lost
    await manager.compact(session.messages, turn=8, system="sys", tools=[])
    manager.trace.close()
    (event,) = [e for e in read_trace(manager.trace.path) if e.type == "compaction"]
    transcript = box.files[event.transcript_path].decode()
    # The transcript names the file; grep there, then in the file, finds the fact.
    assert path.group(1) in json.dumps(transcript) and NEEDLE not in transcript
    aged = [e for e in read_trace(manager.trace.path) if e.type == "offload"]
    assert aged and all(e.reason == "aged" for e in aged)

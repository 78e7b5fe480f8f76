"""Compaction and todo recitation on message lists (box: in-memory fake).

The end-to-end version, a scripted 60-step task through the real loop, the real
``anthropic`` client, the fake Messages API and a real Docker box, is in
tests/test_context_loop.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from context_fakes import MemoryBox, SummaryModel
from test_context_offload import TASK, exchange

from subagents.context import ContextConfig, ContextManager
from subagents.context.compaction import DEFAULT_PROMPT, unmatched_tool_calls
from subagents.context.todos import TodoItem
from subagents.trace import TraceWriter, read_trace

pytestmark = pytest.mark.anyio
NEEDLE = "the staging database port is 48213"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def manager_for(
    tmp_path: Path, config: ContextConfig, model: SummaryModel, *, todos: bool = True
) -> tuple[ContextManager, MemoryBox, TraceWriter]:
    box = MemoryBox()
    trace = TraceWriter(tmp_path / "trace.jsonl", run="r", member="m")
    manager = ContextManager(
        config,
        profile=model.profile,
        model=model,
        sandbox=box,
        run_dir=tmp_path / "member",
        trace=trace,
        task=TASK,
        memory_dir=None,
        todos_enabled=todos,
    )
    return manager, box, trace


def long_session(steps: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": TASK}]}]
    for i in range(1, steps + 1):
        result = f"step {i} output " + ("." * 500)
        if i == 5:
            result = f"config dump: {NEEDLE}. " + result
        messages += exchange(i, "shell", result, {"command": f"echo step {i}"})
    return messages


async def test_compaction_keeps_task_verbatim_saves_transcript_and_todos(tmp_path: Path) -> None:
    model = SummaryModel()
    config = ContextConfig(budget_tokens=10_000)
    manager, box, trace = manager_for(tmp_path, config, model)
    manager.todos.replace([TodoItem(content="port the parser", status="in_progress")])
    manager.note_files_written(["/workspace/a.py", "/workspace/big.py", "/workspace/gone.py"])
    box.files["/workspace/a.py"] = b"print('a')\n"
    box.files["/workspace/big.py"] = b"x = 1\n" * 5_000  # ~7,500 tokens: path only
    messages = long_session(60)
    await manager.prepare(messages, turn=61, system="sys", tools=[])

    assert len(messages) == 1 and messages[0]["role"] == "user"
    texts = [b["text"] for b in messages[0]["content"]]
    assert texts[0] == TASK  # the goal, verbatim, first
    summary = next(t for t in texts if "<compaction_summary" in t)
    (event,) = [e for e in read_trace(trace.path) if e.type == "compaction"]
    assert event.transcript_path in summary and model.summary in summary
    assert event.tokens_before > manager.limits.trigger > event.tokens_after
    assert any("[~] port the parser" in t for t in texts)
    assert any(t.startswith('<file path="/workspace/a.py"') and "print('a')" in t for t in texts)
    assert any("/workspace/big.py" in t and "tokens" in t and "x = 1" not in t for t in texts)
    assert not any("gone.py" in t for t in texts)
    assert unmatched_tool_calls(messages) == []

    # The needle was summarized away but is in the transcript, in the box and on the host.
    transcript = box.files[event.transcript_path].decode()
    assert NEEDLE not in json.dumps(messages)
    hits = [line for line in transcript.splitlines() if "48213" in line]
    assert len(hits) == 1 and NEEDLE in json.loads(hits[0])["content"][0]["content"][0]["text"]
    host = tmp_path / "member" / "transcripts" / Path(event.transcript_path).name
    assert host.read_text() == transcript
    assert len(transcript.splitlines()) == 121  # task + 60 exchanges, one message per line

    # The summarizer read the session as text, with our structured prompt.
    (request,) = model.requests
    assert "step 5" in request.messages[0]["content"][0]["text"]
    assert request.messages[0]["content"][1]["text"] == DEFAULT_PROMPT
    assert not request.tools


async def test_custom_instructions_replace_our_prompt(tmp_path: Path) -> None:
    model = SummaryModel()
    config = ContextConfig(budget_tokens=10_000, compaction_instructions="Only list open bugs.")
    manager, _, _ = manager_for(tmp_path, config, model)
    await manager.prepare(long_session(60), turn=61, system="", tools=[])
    assert model.requests[0].messages[0]["content"][1]["text"] == "Only list open bugs."


async def test_a_failed_summary_call_falls_back_and_the_run_goes_on(tmp_path: Path) -> None:
    model = SummaryModel(fail=True)
    manager, _, trace = manager_for(tmp_path, ContextConfig(budget_tokens=10_000), model)
    messages = long_session(60)
    await manager.prepare(messages, turn=61, system="", tools=[])
    (event,) = [e for e in read_trace(trace.path) if e.type == "compaction"]
    assert "produced mechanically" in event.summary and "echo step 60" in event.summary
    assert messages[0]["content"][0]["text"] == TASK


async def test_todos_are_recited_when_changed_and_every_few_turns(tmp_path: Path) -> None:
    manager, _, trace = manager_for(tmp_path, ContextConfig(recite_every=3), SummaryModel())
    (tool,) = manager.tools()
    assert tool.name == "write_todos"
    messages = long_session(2)
    await manager.prepare(messages, turn=1, system="", tools=[])  # empty list: nothing
    assert messages[-1]["content"][-1]["type"] == "tool_result"

    items = [TodoItem(content="read code", status="completed"), TodoItem(content="fix bug")]
    await tool.run(tool.Input(todos=items), None)  # type: ignore[arg-type]
    recited_at = []
    for turn in range(2, 10):
        messages += exchange(100 + turn, "shell", "ok")
        await manager.prepare(messages, turn=turn, system="", tools=[])
        last = messages[-1]["content"][-1]
        if last["type"] == "text":
            assert "<todo_list done=1 total=2>" in last["text"] and "[ ] fix bug" in last["text"]
            recited_at.append(turn)
    assert recited_at == [2, 5, 8]
    events = [e for e in read_trace(trace.path) if e.type == "todos"]
    assert [e.recited for e in events] == [False, True, True, True]


async def test_write_todos_refuses_two_items_in_progress(tmp_path: Path) -> None:
    from subagents.tools.base import ToolError

    manager, _, _ = manager_for(tmp_path, ContextConfig(), SummaryModel())
    (tool,) = manager.tools()
    both = [
        TodoItem(content="a", status="in_progress"),
        TodoItem(content="b", status="in_progress"),
    ]
    with pytest.raises(ToolError, match="at most one in_progress"):
        await tool.run(tool.Input(todos=both), None)  # type: ignore[arg-type]
    assert manager.todos.items == []


async def test_superseded_recitations_shrink_under_budget_pressure(tmp_path: Path) -> None:
    from subagents.context.todos import SUPERSEDED

    config = ContextConfig(budget_tokens=20_000, recite_every=1)
    manager, _, _ = manager_for(tmp_path, config, SummaryModel())
    manager.todos.replace([TodoItem(content="step " + "x" * 300)])
    messages = long_session(1)
    for turn in range(1, 6):
        messages += exchange(200 + turn, "shell", "ok")
        await manager.prepare(messages, turn=turn, system="", tools=[])
    recited = [b["text"] for m in messages for b in m["content"] if b.get("type") == "text"][1:]
    assert len(recited) == 5 and SUPERSEDED not in recited
    messages += exchange(300, "shell", "y" * 70_000)  # push past clip_at (17,000 tokens)
    await manager.prepare(messages, turn=6, system="", tools=[])
    recited = [b["text"] for m in messages for b in m["content"] if b.get("type") == "text"][1:]
    # The latest recitation at clip time (turn 5) and this turn's stay whole.
    assert recited[:4] == [SUPERSEDED] * 4
    assert "<todo_list" in recited[4] and "<todo_list" in recited[5]


async def test_summary_call_is_traced_and_counted(tmp_path: Path) -> None:
    model = SummaryModel()
    manager, _, trace = manager_for(tmp_path, ContextConfig(budget_tokens=10_000), model)
    await manager.prepare(long_session(60), turn=61, system="", tools=[])
    trace.close()
    (call,) = [e for e in read_trace(trace.path) if e.type == "model_call"]
    assert call.span == "m/t61/compaction" and call.input_tokens == 10 and call.output_tokens == 5
    assert len(manager.summary_usage) == 1


async def test_replay_of_a_trace_gives_the_recorded_summary_back(tmp_path: Path) -> None:
    from subagents.model.offline import ReplayModel

    manager, _, trace = manager_for(
        tmp_path / "a", ContextConfig(budget_tokens=10_000), SummaryModel()
    )
    await manager.prepare(long_session(60), turn=61, system="", tools=[])
    trace.close()
    (recorded,) = [e.summary for e in read_trace(trace.path) if e.type == "compaction"]
    replay = ReplayModel(trace.path)
    again, _, trace2 = manager_for(tmp_path / "b", ContextConfig(budget_tokens=10_000), replay)
    await again.prepare(long_session(60), turn=61, system="", tools=[])
    trace2.close()
    (replayed,) = [e.summary for e in read_trace(trace2.path) if e.type == "compaction"]
    assert replayed == recorded and "Session intent" in recorded


async def test_an_oversized_task_does_not_make_every_turn_compact(tmp_path: Path) -> None:
    model = SummaryModel()
    manager, _, _ = manager_for(tmp_path, ContextConfig(budget_tokens=10_000), model)
    manager.task = "T" * 40_000  # 10,000 tokens: over the 9,000-token trigger on its own
    messages = long_session(60)
    for turn in range(61, 66):
        messages += exchange(turn, "shell", "ok")
        await manager.prepare(messages, turn=turn, system="", tools=[])
    assert len(model.requests) == 1
    messages += exchange(99, "shell", "z" * 4_000 * 4)  # grown by more than 10% of the budget
    await manager.prepare(messages, turn=67, system="", tools=[])
    assert len(model.requests) == 2


async def test_server_side_compaction_is_passed_through_and_traced(tmp_path: Path) -> None:
    config = ContextConfig(
        budget_tokens=10_000, server_side="compact", compaction_instructions="Keep bugs."
    )
    model = SummaryModel()
    manager, _, trace = manager_for(tmp_path, config, model)
    assert manager.context_management() == {
        "edits": [
            {
                "type": "compact_20260112",
                "trigger": {"type": "input_tokens", "value": 9_000},
                "instructions": "Keep bugs.",
            }
        ]
    }
    messages = long_session(60)
    messages[-2]["content"].insert(0, {"type": "compaction", "content": "server summary"})
    await manager.prepare(messages, turn=61, system="", tools=[])
    await manager.prepare(messages, turn=61, system="", tools=[])
    assert model.requests == [] and len(messages) == 121  # no local compaction
    (event,) = [e for e in read_trace(trace.path) if e.type == "compaction"]
    assert event.server_side and event.summary == "server summary"
    clear = ContextConfig(server_side="clear_tool_uses")
    edits = manager_for(tmp_path / "b", clear, model)[0].context_management()
    assert edits is not None and edits["edits"][0]["type"] == "clear_tool_uses_20250919"
    assert edits["edits"][0]["keep"] == {"type": "tool_uses", "value": 3}

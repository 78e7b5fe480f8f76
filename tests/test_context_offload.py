"""Budget, token accounting, offload and clip on message lists (box: in-memory fake).

The box side of offloading is proven again against the real Docker sandbox in
tests/test_context_box.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from context_fakes import MemoryBox, RefusingModel, SummaryModel

from subagents.context import ContextConfig, ContextManager
from subagents.context.budget import Budget, working_set_budget
from subagents.context.compaction import unmatched_tool_calls
from subagents.context.tokens import TokenCounter, estimate_message
from subagents.tools.base import ToolContext, ToolError
from subagents.trace import TraceWriter, read_trace

pytestmark = pytest.mark.anyio

TASK = "Refactor the parser. Constraint: keep the public API unchanged."


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def make_manager(
    tmp_path: Path,
    config: ContextConfig | None = None,
    *,
    model: Any = None,
    window: int = 200_000,
    box_tools: bool = True,
) -> tuple[ContextManager, MemoryBox, TraceWriter]:
    box = MemoryBox()
    trace = TraceWriter(tmp_path / "trace.jsonl", run="r", member="m")
    manager = ContextManager(
        config or ContextConfig(),
        profile=(model or SummaryModel(window=window)).profile,
        model=model or SummaryModel(window=window),
        sandbox=box,
        run_dir=tmp_path / "member",
        trace=trace,
        task=TASK,
        memory_dir=None,
        todos_enabled=False,
        box_tools=box_tools,
    )
    return manager, box, trace


def exchange(i: int, tool: str, result: str, args: dict | None = None) -> list[dict[str, Any]]:
    """One assistant tool_use and its user tool_result."""
    call = f"call_{i}"
    return [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": call, "name": tool, "input": args or {}}],
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


def events(trace: TraceWriter, kind: str) -> list[Any]:
    trace.close()
    return [e for e in read_trace(trace.path) if e.type == kind]


def test_budget_is_the_smaller_of_85_percent_and_150k() -> None:
    config = ContextConfig()
    assert working_set_budget(config, 200_000) == 150_000
    assert working_set_budget(config, 1_000_000) == 150_000
    assert working_set_budget(config, 100_000) == 85_000
    assert working_set_budget(ContextConfig(budget_tokens=40_000), 200_000) == 40_000
    limits = Budget.from_config(ContextConfig(compact_fraction=0.5), 200_000)
    assert limits.trigger == 75_000
    assert limits.clip_at == 75_000  # clipping never acts later than compaction


def test_token_counter_anchors_on_api_usage_and_adds_new_content() -> None:
    counter = TokenCounter()
    messages = [{"role": "user", "content": [{"type": "text", "text": "x" * 4_000}]}]
    local = counter.count(messages, "", [])
    assert local == estimate_message(messages[0])
    counter.observe({"input_tokens": 1_500}, messages, "", [])
    assert counter.count(messages, "", []) == 1_500
    messages += exchange(1, "shell", "y" * 400)
    added = estimate_message(messages[1]) + estimate_message(messages[2])
    assert counter.count(messages, "", []) == 1_500 + added
    # A rewritten prefix drops the anchor; the full estimate is scaled by the last ratio.
    counter.forget(messages[0])
    assert counter.count(messages, "", []) == int((local + added) * counter.ratio)
    assert counter.ratio == pytest.approx(1_500 / local)


async def test_result_at_threshold_is_kept_and_one_token_over_is_offloaded(tmp_path: Path) -> None:
    manager, box, trace = make_manager(tmp_path)
    at_limit = "a" * (20_000 * 4)
    text, path = await manager.admit_tool_result("c1", "shell", at_limit)
    assert (text, path) == (at_limit, None)

    lines = [f"line {n}: " + "z" * 60 for n in range(1, 1_400)]
    over = "\n".join(lines)
    assert len(over) > 80_000
    text, path = await manager.admit_tool_result("c2", "shell", over)
    assert path is not None and path.startswith("/tmp/fleet/offloads/")
    assert path in text and f"{len(over):,} chars" in text and "~" in text
    preview = text.split("First 10 lines:\n", 1)[1].splitlines()
    assert preview == lines[:10]
    assert len(text) < 2_000
    # Read-back: the box copy and the run-directory copy are the full result.
    assert (await box.read_file(path)).decode() == over
    host = tmp_path / "member" / "offloads" / Path(path).name
    assert host.read_text() == over
    (offload,) = events(trace, "offload")
    assert offload.path == path and offload.reason == "large_result" and offload.tokens > 20_000


async def test_offload_without_a_box_says_the_content_cannot_be_read_back(tmp_path: Path) -> None:
    manager, box, _ = make_manager(tmp_path)
    box.crashed = True
    text, path = await manager.admit_tool_result("c1", "shell", "q" * 100_000)
    assert path is not None and path.startswith(str(tmp_path))
    assert "cannot read it back" in text
    assert Path(path).read_text() == "q" * 100_000  # noqa: ASYNC240


async def test_a_member_without_file_tools_reads_back_only_its_own_saved_files(
    tmp_path: Path,
) -> None:
    manager, box, _ = make_manager(tmp_path, box_tools=False)
    (tool,) = manager.tools()
    assert tool.name == "read_saved"
    lines = [f"line {n}: " + ("needle" if n % 100 == 0 else "z" * 60) for n in range(1, 1_400)]
    text, path = await manager.admit_tool_result("c1", "navigate", "\n".join(lines))
    assert path == "offloads/0001-navigate-c1.txt" and "read_saved" in text
    assert "read_file" not in text and not box.files  # no box copy it could not read
    ctx = ToolContext(sandbox=box, run_dir=tmp_path / "member", trace=None, member="m")  # type: ignore[arg-type]
    page = await tool.run(tool.Input(path=path, offset=100, limit=2), ctx)
    assert page.splitlines()[1:] == ["   100\tline 100: needle", "   101\tline 101: " + "z" * 60]
    found = await tool.run(tool.Input(path=path, pattern="NEEDLE", limit=3), ctx)
    assert "13 line(s) containing 'NEEDLE'" in found and len(found.splitlines()) == 4
    (tmp_path / "member" / "result.json").write_text("{}")
    (tmp_path / "secret").write_text("no")
    for other in ("result.json", "offloads/../result.json", "../secret", "/etc/passwd", "pages/x"):
        with pytest.raises(ToolError, match=r"offloads/0001-navigate-c1\.txt"):
            await tool.run(tool.Input(path=other), ctx)


async def test_over_budget_offload_comes_before_compaction(tmp_path: Path) -> None:
    # Aging off (age_fraction=1): the over-budget path on its own, as when a turn
    # brings more than aging frees (tests/test_context_aging.py covers aging).
    config = ContextConfig(budget_tokens=40_000, keep_recent_results=3, age_fraction=1.0)
    manager, box, trace = make_manager(tmp_path, config, model=RefusingModel())
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": TASK}]}]
    for i in range(10):
        messages += exchange(i, "shell", f"result {i}\n" + "r" * 16_000)  # ~4,000 tokens each
    before = manager.estimate(messages, "sys", [])
    assert before > manager.limits.trigger
    sent = await manager.prepare(messages, turn=11, system="sys", tools=[])
    assert sent is messages
    after = manager.estimate(messages, "sys", [])
    assert after <= manager.limits.offload_to
    offloads = events(trace, "offload")
    assert offloads and all(e.reason == "over_budget" for e in offloads)
    assert not [e for e in read_trace(trace.path) if e.type == "compaction"]
    # Oldest first; the three most recent results stay inline, untouched.
    assert [e.call_id for e in offloads] == [f"call_{i}" for i in range(len(offloads))]
    recent = [m["content"][0]["content"][0]["text"] for m in messages[-5::2]]
    assert all(t.startswith("result ") for t in recent)
    first = messages[2]["content"][0]["content"]
    assert first.startswith("[tool result offloaded") and offloads[0].path in first
    assert (await box.read_file(offloads[0].path)).decode().startswith("result 0\n")
    assert messages[0]["content"][0]["text"] == TASK
    assert unmatched_tool_calls(messages) == []


async def test_compaction_follows_when_offloading_cannot_make_room(tmp_path: Path) -> None:
    config = ContextConfig(budget_tokens=8_000)
    model = SummaryModel()
    manager, _, trace = make_manager(tmp_path, config, model=model)
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": TASK}]}]
    messages += exchange(0, "shell", "big\n" + "b" * 12_000)  # offloadable
    for i in range(1, 60):
        messages += exchange(i, "shell", f"small result {i} " + "s" * 600)  # too small to offload
    await manager.prepare(messages, turn=61, system="", tools=[])
    trace.close()
    kinds = [e.type for e in read_trace(trace.path) if e.type in ("offload", "compaction")]
    assert kinds == ["offload", "compaction"]
    assert len(messages) == 1 and messages[0]["content"][0]["text"] == TASK
    assert len(model.requests) == 1


async def test_clip_replaces_old_successful_write_inputs_with_pointers(tmp_path: Path) -> None:
    config = ContextConfig(budget_tokens=20_000, keep_recent_writes=2)
    manager, _, trace = make_manager(tmp_path, config, model=RefusingModel())
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": TASK}]}]
    for i in range(5):
        args = {"path": f"/workspace/m{i}.py", "content": f"# module {i}\n" + "x = 1\n" * 2_500}
        messages += exchange(i, "write_file", f"wrote /workspace/m{i}.py", args)
    messages[4]["content"][0]["is_error"] = True  # call_1 failed: its content is not on disk
    assert manager.estimate(messages, "", []) > manager.limits.clip_at
    await manager.prepare(messages, turn=6, system="", tools=[])
    inputs = [m["content"][0]["input"] for m in messages[1::2]]
    assert (
        inputs[0]["content"].startswith("[clipped:") and "/workspace/m0.py" in inputs[0]["content"]
    )
    assert inputs[0]["path"] == "/workspace/m0.py"
    assert inputs[1]["content"].startswith("# module 1")  # failed write kept
    assert inputs[2]["content"].startswith("[clipped:")
    assert inputs[3]["content"].startswith("# module 3")  # the two most recent kept
    assert inputs[4]["content"].startswith("# module 4")
    (clip,) = events(trace, "clip")
    assert clip.call_ids == ["call_0", "call_2"] and clip.tokens_saved > 7_000
    assert unmatched_tool_calls(messages) == []
    assert manager.estimate(messages, "", []) <= manager.limits.clip_at


async def test_small_context_is_left_alone(tmp_path: Path) -> None:
    manager, _, trace = make_manager(tmp_path, model=RefusingModel())
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": TASK}]}]
    messages += exchange(0, "shell", "ok")
    snapshot = repr(messages)
    await manager.prepare(messages, turn=2, system="", tools=[])
    assert repr(messages) == snapshot
    trace.close()
    assert list(read_trace(trace.path)) == []

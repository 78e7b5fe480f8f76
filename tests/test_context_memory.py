"""Explicit per-member memory: cap and wrapper, the memory tool, saving back to the host.

Saving after a member FAILS is proven through the real loop in tests/test_context_loop.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from context_fakes import MemoryBox, SummaryModel

from subagents.context import ContextConfig, ContextManager
from subagents.context.memory import WRAPPER_NOTE, cap_text
from subagents.context.memory_tool import MemoryInput
from subagents.tools.base import ToolError
from subagents.trace import TraceWriter, read_trace

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def manager_with_memory(
    tmp_path: Path, memory_dir: Path | None
) -> tuple[ContextManager, MemoryBox, TraceWriter]:
    box = MemoryBox()
    trace = TraceWriter(tmp_path / "trace.jsonl", run="r", member="m")
    model = SummaryModel()
    manager = ContextManager(
        ContextConfig(),
        profile=model.profile,
        model=model,
        sandbox=box,
        run_dir=tmp_path / "member",
        trace=trace,
        task="t",
        memory_dir=memory_dir,
        todos_enabled=False,
    )
    return manager, box, trace


def test_cap_keeps_200_lines_and_25_kb_with_a_note() -> None:
    lines = [f"fact {n:03d} " + "m" * 120 for n in range(201)]  # 201 lines, ~26 KB
    text = "\n".join(lines)
    assert len(lines) == 201 and len(text.encode()) > 26_000
    kept, note = cap_text(text, 200, 25_600)
    assert len(kept.encode()) <= 25_600
    assert kept.splitlines() == lines[: len(kept.splitlines())]
    assert len(kept.splitlines()) < 200  # the byte cap bit first here
    assert "memory cut at 200 lines / 25,600 bytes" in note and "201 lines" in note
    short = "\n".join(f"l{n}" for n in range(201))
    kept, note = cap_text(short, 200, 25_600)
    assert kept.splitlines() == [f"l{n}" for n in range(200)] and "not shown" in note
    assert cap_text("small\nmemory", 200, 25_600) == ("small\nmemory", "")


async def test_memory_is_loaded_capped_wrapped_and_mirrored_into_the_box(tmp_path: Path) -> None:
    memory = tmp_path / "memory"
    memory.mkdir()
    (memory / "MEMORY.md").write_text("\n".join(f"line {n} " + "k" * 130 for n in range(201)))
    (memory / "extra.md").write_text("later file\n")
    manager, box, _ = manager_with_memory(tmp_path, memory)
    text = await manager.start()
    assert text.startswith('<memory trust="reference" may_be_stale="true">')
    assert (
        WRAPPER_NOTE in text and "may be stale" in text and "ranks below the system prompt" in text
    )
    assert "=== /memories/MEMORY.md ===\nline 0 " in text
    assert "[memory cut at 200 lines / 25,600 bytes" in text and text.endswith("</memory>")
    assert "later file" not in text  # past the cap
    assert len(text.encode()) < 25_600 + 1_000
    assert box.files["/tmp/fleet/memory/extra.md"] == b"later file\n"
    assert [t.name for t in manager.tools()] == ["memory"]


async def test_no_memory_dir_means_no_memory_and_no_tool(tmp_path: Path) -> None:
    manager, _, _ = manager_with_memory(tmp_path, None)
    assert await manager.start() == ""
    assert manager.tools() == []
    await manager.finish()


async def test_memory_tool_commands_edit_the_copy_and_save_back_on_finish(tmp_path: Path) -> None:
    memory = tmp_path / "memory"
    memory.mkdir()
    (memory / "old.md").write_text("obsolete\n")
    manager, box, trace = manager_with_memory(tmp_path, memory)
    await manager.start()
    (tool,) = manager.tools()

    async def call(**kw: object) -> str:
        return await tool.run(MemoryInput(**kw), None)  # type: ignore[arg-type]

    await call(command="create", path="/memories/notes.md", file_text="a\nb\n")
    await call(command="str_replace", path="notes.md", old_str="b", new_str="B")
    await call(command="insert", path="/memories/notes.md", insert_line=1, insert_text="between")
    assert (
        await call(command="view", path="/memories/notes.md")
        == "     1\ta\n     2\tbetween\n     3\tB"
    )
    assert await call(command="view", path="/memories/notes.md", view_range=[2, -1]) == (
        "     2\tbetween\n     3\tB"
    )
    await call(command="rename", old_path="/memories/notes.md", new_path="/memories/n/facts.md")
    await call(command="delete", path="/memories/old.md")
    listing = await call(command="view", path="/memories")
    assert "/memories/n/facts.md" in listing and "old.md" not in listing
    assert box.files["/tmp/fleet/memory/n/facts.md"] == b"a\nbetween\nB\n"
    assert "/tmp/fleet/memory/old.md" not in box.files
    # Nothing reaches the host directory until the member ends.
    assert (memory / "old.md").exists() and not (memory / "n").exists()
    await manager.finish()
    assert (memory / "n" / "facts.md").read_text() == "a\nbetween\nB\n"
    assert not (memory / "old.md").exists() and not (memory / "notes.md").exists()
    trace.close()
    writes = [(e.command, e.path) for e in read_trace(trace.path) if e.type == "memory_write"]
    assert ("create", "/memories/notes.md") in writes and ("delete", "/memories/old.md") in writes


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"command": "view", "path": "/memories/../../etc/passwd"}, "leaves the memory directory"),
        ({"command": "create", "path": "../escape.md", "file_text": "x"}, "leaves the memory"),
        ({"command": "create", "path": "/etc/cron.d/x", "file_text": "x"}, "outside the memory"),
        ({"command": "rename", "old_path": "a.md", "new_path": "/memories/../../b"}, "leaves"),
        ({"command": "view", "path": "/memories/link/secret"}, "does not exist"),
        (
            {"command": "str_replace", "path": "a.md", "old_str": "zzz", "new_str": "y"},
            "does not occur",
        ),
        (
            {"command": "str_replace", "path": "a.md", "old_str": "a", "new_str": "y"},
            "occurs 2 times",
        ),
        (
            {"command": "insert", "path": "a.md", "insert_line": 9, "insert_text": "y"},
            "between 0 and 1",
        ),
        ({"command": "create", "path": "b.md"}, "needs 'file_text'"),
        ({"command": "delete", "path": "/memories"}, "refusing to delete the whole"),
        ({"command": "view", "path": "missing.md"}, "does not exist"),
    ],
)
async def test_memory_tool_refuses_escapes_and_says_what_was_wrong(
    tmp_path: Path, kw: dict, message: str
) -> None:
    memory = tmp_path / "memory"
    memory.mkdir()
    (memory / "a.md").write_text("a a\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    (memory / "link").symlink_to(outside)
    manager, _, _ = manager_with_memory(tmp_path, memory)
    assert "secret" not in await manager.start()  # symlinks are not followed
    (tool,) = manager.tools()
    with pytest.raises(ToolError, match=message):
        await tool.run(MemoryInput(**kw), None)  # type: ignore[arg-type]
    await manager.finish()
    assert sorted(p.name for p in memory.iterdir() if p.name != ".fleet") == ["a.md", "link"]
    assert (outside / "secret").read_text() == "s"


async def test_a_symlink_planted_in_the_working_copy_cannot_lead_out(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    manager, _, _ = manager_with_memory(tmp_path, tmp_path / "memory")
    await manager.start()
    assert manager.memory is not None
    (manager.memory.root / "link").symlink_to(outside)  # e.g. made by some other process
    (tool,) = manager.tools()
    for kw in (
        {"command": "view", "path": "/memories/link/secret"},
        {"command": "create", "path": "/memories/link/new", "file_text": "x"},
    ):
        with pytest.raises(ToolError, match="leaves the memory directory"):
            await tool.run(MemoryInput(**kw), None)  # type: ignore[arg-type]
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]

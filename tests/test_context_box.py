"""The context mechanisms against a real Docker box: what the agent can read back.

Offloaded results and compaction transcripts must be readable and greppable *inside
the member's box* with ordinary tools, and the memory copy must be there too.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from context_fakes import SummaryModel
from test_context_compaction import NEEDLE, long_session

from sandbox.docker.backend import DockerBackend, DockerSandbox
from sandbox.spec import SandboxSpec
from subagents.context import ContextConfig, ContextManager
from subagents.context.memory_tool import MemoryInput
from subagents.trace import TraceWriter, read_trace

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def box(docker_client, images, run_id: str) -> AsyncIterator[DockerSandbox]:
    backend = DockerBackend(docker_client, images=images)
    sandbox = await backend.create(SandboxSpec(), run=run_id, member="ctx")
    async with sandbox:
        yield sandbox


def manager_in(
    box: DockerSandbox, tmp_path: Path, config: ContextConfig, memory_dir: Path | None = None
) -> tuple[ContextManager, TraceWriter]:
    trace = TraceWriter(tmp_path / "trace.jsonl", run="r", member="m")
    model = SummaryModel()
    return (
        ContextManager(
            config,
            profile=model.profile,
            model=model,
            sandbox=box,
            run_dir=tmp_path / "member",
            trace=trace,
            task="Migrate the service.",
            memory_dir=memory_dir,
            todos_enabled=True,
        ),
        trace,
    )


async def test_offload_threshold_preview_and_read_back_in_the_box(
    box: DockerSandbox, tmp_path: Path
) -> None:
    manager, trace = manager_in(box, tmp_path, ContextConfig())
    rows = [f"row {n:05d} value={n * 7}" for n in range(1, 6_000)]
    full = "\n".join(rows)
    just_under = full[: 20_000 * 4]  # exactly 20,000 tokens by the local estimate
    text, path = await manager.admit_tool_result("call_a", "shell", just_under)
    assert path is None and text == just_under
    just_over = full[: 20_000 * 4 + 1]
    text, path = await manager.admit_tool_result("call_b", "shell", just_over)
    assert path is not None and path.startswith("/tmp/fleet/offloads/")
    assert text.splitlines()[-10:] == rows[:10]
    assert f"{len(just_over):,} chars" in text and len(text) < 1_500
    # The agent reads it back in pieces and greps it with ordinary tools in its box.
    assert (await box.read_file(path)).decode() == just_over
    sed = await box.exec(["sed", "-n", "2000,2002p", path])
    assert sed.stdout.splitlines() == rows[1999:2002]
    grep = await box.exec(["rg", "--line-number", "value=21000$", path])
    assert grep.stdout.strip() == f"3000:{rows[2999]}"
    trace.close()
    (event,) = [e for e in read_trace(trace.path) if e.type == "offload"]
    assert event.path == path and event.call_id == "call_b"


async def test_compaction_transcript_is_greppable_in_the_box(
    box: DockerSandbox, tmp_path: Path
) -> None:
    await box.write_file("/workspace/app.py", "PORT = 8080\n")
    manager, trace = manager_in(box, tmp_path, ContextConfig(budget_tokens=10_000))
    manager.note_files_written(["/workspace/app.py"])
    messages = long_session(60)
    await manager.prepare(messages, turn=61, system="", tools=[])
    trace.close()
    (event,) = [e for e in read_trace(trace.path) if e.type == "compaction"]
    assert event.transcript_path.startswith("/tmp/fleet/transcripts/")
    assert NEEDLE not in json.dumps(messages)
    grep = await box.exec(["rg", "--count", "48213", event.transcript_path])
    assert grep.stdout.strip() == "1"
    texts = [b["text"] for b in messages[0]["content"]]
    assert texts[0] == "Migrate the service."
    assert any("PORT = 8080" in t for t in texts)  # recently modified file re-read from the box


async def test_memory_copy_is_in_the_box_and_tool_edits_reach_it(
    box: DockerSandbox, tmp_path: Path
) -> None:
    memory = tmp_path / "memory"
    memory.mkdir()
    (memory / "MEMORY.md").write_text("The API lives at /v2.\n")
    manager, _ = manager_in(box, tmp_path, ContextConfig(), memory_dir=memory)
    assert "The API lives at /v2." in await manager.start()
    cat = await box.exec(["cat", "/tmp/fleet/memory/MEMORY.md"])
    assert cat.stdout == "The API lives at /v2.\n"
    tool = next(t for t in manager.tools() if t.name == "memory")
    await tool.run(MemoryInput(command="create", path="/memories/new.md", file_text="x\n"), None)  # type: ignore[arg-type]
    await tool.run(MemoryInput(command="delete", path="/memories/MEMORY.md"), None)  # type: ignore[arg-type]
    ls = await box.exec(["ls", "/tmp/fleet/memory"])
    assert ls.stdout.split() == ["new.md"]
    await manager.finish()
    assert sorted(p.name for p in memory.iterdir() if p.name != ".fleet") == ["new.md"]

"""A coding member's checkpoint costs one box call a turn when its workspace did not change.

Real coding box, the real in-box git program, the real checkpoint store: a turn that
leaves ``/workspace`` as the newest checkpoint has it writes no file on the host and
reads nothing back, and a resume drops the checkpoints of turns that will run again
(so an unchanged turn never stands on a stale one).
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox.docker.backend import DockerBackend, DockerSandbox
from sandbox.spec import SandboxSpec
from subagents.durable import Checkpoints
from subagents.kinds import coding
from subagents.tools.base import ToolContext
from subagents.trace import TraceWriter

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Counted:
    """The box, with its calls counted by name; ``prints=False`` hides the stamps print
    its commands report, so that the checkpoint's own calls are what is tested."""

    def __init__(self, box: DockerSandbox, *, prints: bool = False) -> None:
        self.box = box
        self.calls: list[str] = []
        self.prints = prints

    def settled_print(self) -> str | None:
        return self.box.settled_print() if self.prints else None

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.box, name)
        if name in ("exec", "read_file", "write_file"):

            async def counted(*args: Any, **kwargs: Any) -> Any:
                self.calls.append(name)
                return await value(*args, **kwargs)

            return counted
        return value


@pytest.fixture
async def box(images: dict[str, str], run_id: str) -> AsyncIterator[DockerSandbox]:
    made = await DockerBackend().create(SandboxSpec(kind="coding"), run=run_id, member="ckpt")
    try:
        yield made
    finally:
        await made.close()


def _store(tmp_path: Path, box: Any) -> tuple[Checkpoints, ToolContext]:
    trace = TraceWriter(tmp_path / "trace.jsonl", run="r", member="m")
    ctx = ToolContext(sandbox=box, run_dir=tmp_path, trace=trace, member="m")
    kind = coding.CODING
    store = Checkpoints(tmp_path, ctx, trace, save=kind.checkpoint, restore=kind.restore)
    return store, ctx


def _kept(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.glob("checkpoint-*"))


async def _turn(store: Checkpoints, turn: int, tools: list[str], tmp_path: Path) -> list[str]:
    """The checkpoint of a turn that ran ``tools``; the checkpoints kept after it."""
    await store.after_tools(turn, tools)
    store.committed(turn)
    return _kept(tmp_path)


async def test_an_unchanged_turn_writes_no_checkpoint_and_reads_nothing_back(
    box: DockerSandbox, tmp_path: Path
) -> None:
    await box.write_file("/workspace/a.txt", "one\n")
    written = time.monotonic()
    counted = Counted(box)
    store, ctx = _store(tmp_path, counted)
    # Once the workspace's times have settled, a turn that changed nothing is answered
    # from its stamps alone: with the baseline's objects out of the way, a collection
    # could not even run (it would be checkpoint-1.over).
    await anyio.sleep(max(0.0, written + 2.2 - time.monotonic()))
    await coding.snapshot_workspace(ctx)
    objects = ctx.state["baseline"]["objects"]
    await box.exec(["mv", objects, f"{objects}.away"])
    await store.after_tools(1, ["shell"])
    store.committed(1)
    assert _kept(tmp_path) == []  # the baseline is turn 1's state: nothing to keep
    # So is the final patch: empty, and no collection ran for it either.
    done = await coding.collect_patch({"summary": "nothing to change"}, ctx)
    assert done["patch"] == "" and done["files_changed"] == [], done
    assert "collection_error" not in done and (tmp_path / "patch.diff").read_bytes() == b""
    await box.exec(["mv", f"{objects}.away", objects])

    # Same size, modification time set back: the change time still gives it away.
    edit = "touch -r a.txt t && echo two > a.txt && touch -r t a.txt && rm t"
    await box.exec(["sh", "-c", edit], cwd="/workspace")
    await store.after_tools(2, ["shell"])
    store.committed(2)
    assert _kept(tmp_path) == ["checkpoint-2.bin"]
    assert b"+two" in (tmp_path / "checkpoint-2.bin").read_bytes()

    outputs = ["sh", "-c", "ls -d /tmp/fleet-out-* | wc -l"]  # the snapshot's stays
    before = (await box.exec(outputs)).stdout
    counted.calls.clear()
    await store.after_tools(3, ["shell"])  # nothing changed (times not settled yet)
    store.committed(3)
    assert _kept(tmp_path) == ["checkpoint-2.bin"]
    assert counted.calls == ["exec"], counted.calls  # the diff alone: no read, no clean-up
    assert (await box.exec(outputs)).stdout == before, "the in-box program left its output"

    await box.write_file("/workspace/a.txt", "one\n")  # back to the baseline: a change too
    await store.after_tools(4, ["shell"])
    store.committed(4)
    assert _kept(tmp_path) == ["checkpoint-4.bin"]
    assert (tmp_path / "checkpoint-4.bin").read_bytes() == b""

    await box.write_file("/workspace/b.txt", "new\n")  # the final patch sees a change
    done = await coding.collect_patch({"summary": "added b.txt"}, ctx)
    assert done["files_changed"] == ["b.txt"] and "+new" in done["patch"], done


async def test_a_resume_drops_checkpoints_of_turns_that_run_again(
    box: DockerSandbox, tmp_path: Path
) -> None:
    await box.write_file("/workspace/a.txt", "one\n")
    store, ctx = _store(tmp_path, box)
    await coding.snapshot_workspace(ctx)
    await box.write_file("/workspace/a.txt", "two\n")
    await store.after_tools(3, ["shell"])
    store.committed(3)
    # What a killed process leaves: turn 4's checkpoint, written before its results
    # joined the transcript, of a workspace turn 4 changed.
    (tmp_path / "checkpoint-4.bin").write_bytes(b"stale: turn 4 of the killed process")

    await box.write_file("/workspace/a.txt", "one\n")  # as a fresh box has it
    restored = await store.restore(3)  # the transcript ends at turn 3
    assert restored and "restored" in restored
    assert await box.read_file("/workspace/a.txt") == b"two\n"
    assert _kept(tmp_path) == ["checkpoint-3.bin"]
    await store.after_tools(4, ["shell"])  # turn 4 again, changing nothing this time
    store.committed(4)
    assert _kept(tmp_path) == ["checkpoint-3.bin"]  # turn 4's state is turn 3's


async def test_a_turn_whose_commands_changed_nothing_makes_no_call_at_all(
    box: DockerSandbox, tmp_path: Path
) -> None:
    await box.write_file("/workspace/a.txt", "one\n")
    written = time.monotonic()
    counted = Counted(box, prints=True)
    store, ctx = _store(tmp_path, counted)
    await anyio.sleep(max(0.0, written + 2.2 - time.monotonic()))
    await coding.snapshot_workspace(ctx)
    await counted.exec(["ls", "-la"], cwd="/workspace")  # the turn's command
    counted.calls.clear()
    await store.after_tools(1, ["shell"])
    store.committed(1)
    # The command's reply carried the workspace's stamps print, the baseline's.
    assert counted.calls == [], counted.calls
    assert _kept(tmp_path) == []

    # A file written after the turn's command (an edit tool of the same turn): the
    # command's print no longer stands, and the checkpoint collects.
    await counted.exec(["ls"], cwd="/workspace")
    await box.write_file("/workspace/b.txt", "new\n")
    assert box.settled_print() is None
    assert await _turn(store, 2, ["shell", "write_file"], tmp_path) == ["checkpoint-2.bin"]
    assert b"+new" in (tmp_path / "checkpoint-2.bin").read_bytes()

    # A command that ran beside another gives no print: here the other one writes
    # after the short one's print was taken (both settled writes, so only the overlap
    # can refuse it).
    await anyio.sleep(2.2)
    await counted.exec(["ls"], cwd="/workspace")  # settled: the print of checkpoint 2
    assert await _turn(store, 3, ["shell"], tmp_path) == ["checkpoint-2.bin"]
    slow = "echo x > c.txt; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo y >> c.txt"
    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(counted.exec, ["sh", "-c", slow], cwd="/workspace"))
        await anyio.sleep(2.4)
        await counted.exec(["touch", "/tmp/go"])  # its print would miss the last write
    assert box.settled_print() is None
    assert await _turn(store, 4, ["shell", "shell"], tmp_path) == ["checkpoint-4.bin"]
    assert b"+y" in (tmp_path / "checkpoint-4.bin").read_bytes()

    # A long-lived process of the member's writes through no operation the host sees:
    # no print holds from its start on.
    await anyio.sleep(2.2)
    await counted.exec(["ls"], cwd="/workspace")
    assert box.settled_print() is not None
    process = await box.start_process("cat")
    try:
        assert box.settled_print() is None
        await counted.exec(["ls"], cwd="/workspace")
        assert box.settled_print() is None
    finally:
        await process.close()


def test_a_print_from_the_box_is_taken_only_as_64_hex_digits() -> None:
    from sandbox.watch import WorkspaceWatch

    for forged in ("same", "A" * 64, "0" * 63, "0" * 65, 7, None, ["0" * 64]):
        watch = WorkspaceWatch()
        with watch.command() as report:
            report(forged)
        assert watch.settled is None, forged
    watch = WorkspaceWatch()
    with watch.command() as report:
        report("0" * 64)
    assert watch.settled == "0" * 64

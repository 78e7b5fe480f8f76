"""A coding box whose workspace is known to be empty takes its baseline without a box
call, and everything computed against it is what a real snapshot gives.

Real coding boxes and the real in-box git program: the constant baseline is the commit
a snapshot of an empty workspace makes; a patch, a checkpoint and a restore against it
are byte for byte those against a snapshot; a box that anything ran in, was written
into, or is another image's, is snapshotted as before; and the in-box collection builds
that baseline from nothing in the box.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox.docker.backend import DockerBackend, DockerSandbox
from sandbox.spec import SandboxSpec
from subagents.durable import Checkpoints
from subagents.kinds import coding, workspace_git
from subagents.tools.base import ToolContext
from subagents.trace import TraceWriter

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

# Everything a patch may hold: text, an executable, a binary file, symlinks (one out of
# the workspace), a nested directory, a .gitignore of the member's, a cache Fleet leaves
# out, a name that is not UTF-8.
EDITS = (
    "mkdir -p src/deep && printf 'print(1)\\n' > src/deep/a.py && "
    "printf '#!/bin/sh\\necho hi\\n' > run.sh && chmod +x run.sh && "
    'python3 -c \'open("blob.bin", "wb").write(bytes(range(256)) * 3)\' && '
    "ln -s src/deep/a.py link && ln -s /etc/passwd out && "
    "printf 'build/\\n' > .gitignore && mkdir -p build __pycache__ && "
    "echo out > build/x && echo c > __pycache__/m.pyc && echo odd > $'caf\\xe9.txt'"
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def boxes(images: dict[str, str], run_id: str) -> AsyncIterator[list[DockerSandbox]]:
    backend = DockerBackend()
    made: list[DockerSandbox] = []
    try:
        for name in ("fresh", "snapshotted"):
            made.append(await backend.create(SandboxSpec(kind="coding"), run=run_id, member=name))
        yield made
    finally:
        for box in made:
            await box.close()


class Counted:
    """The box, its calls recorded."""

    def __init__(self, box: DockerSandbox) -> None:
        self.box = box
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.box, name)
        if name in ("exec", "read_file", "write_file", "upload", "start_process"):

            async def counted(*args: Any, **kwargs: Any) -> Any:
                self.calls.append(name)
                return await value(*args, **kwargs)

            return counted
        return value


def _ctx(tmp_path: Path, box: Any, name: str) -> tuple[Checkpoints, ToolContext]:
    where = tmp_path / name
    where.mkdir()
    trace = TraceWriter(where / "trace.jsonl", run="r", member=name)
    ctx = ToolContext(sandbox=box, run_dir=where, trace=trace, member=name)
    kind = coding.CODING
    return Checkpoints(where, ctx, trace, save=kind.checkpoint, restore=kind.restore), ctx


async def test_the_constant_baseline_is_what_a_snapshot_of_an_empty_workspace_makes(
    boxes: list[DockerSandbox],
) -> None:
    data, _ = await coding._in_box_git(boxes[1], "snapshot", [], {})
    assert data["ok"] and data["files"] == 0, data
    assert data["commit"] == workspace_git.empty_baseline()[0]
    assert data["stamps_print"] == coding.EMPTY_PRINT


async def test_patches_checkpoints_and_restores_match_a_real_snapshot(
    boxes: list[DockerSandbox], tmp_path: Path
) -> None:
    fresh, other = boxes
    counted = Counted(fresh)
    store, ctx = _ctx(tmp_path, counted, "fresh")
    await coding.snapshot_workspace(ctx)
    assert counted.calls == []  # no box call for the baseline
    assert ctx.state["baseline"]["objects"] == workspace_git.NO_SNAPSHOT
    await store.after_tools(1, ["shell"])  # nothing changed: the baseline is turn 1's state
    store.committed(1)
    # one call, answered from the workspace's print (the constant one): "same"
    assert counted.calls == ["exec"] and not list((tmp_path / "fresh").glob("checkpoint-*"))

    await other.exec(["true"])  # ran a command: its workspace is looked at
    assert not other.untouched_workspace()
    real_store, real = _ctx(tmp_path, other, "snapshotted")
    await coding.snapshot_workspace(real)
    assert real.state["baseline"]["objects"] != workspace_git.NO_SNAPSHOT

    for box in (fresh, other):
        done = await box.exec(["bash", "-c", EDITS], cwd="/workspace")
        assert done.ok, done.stderr
    await anyio.sleep(2.2)  # settled times: both checkpoints read the same stamps
    for s in (store, real_store):
        await s.after_tools(2, ["shell"])
        s.committed(2)
    ours = (tmp_path / "fresh" / "checkpoint-2.bin").read_bytes()
    theirs = (tmp_path / "snapshotted" / "checkpoint-2.bin").read_bytes()
    assert ours == theirs and b"src/deep/a.py" in ours and b"GIT binary patch" in ours
    # Fleet's excludes hold; a .gitignore the member wrote hides nothing of its own
    assert b"__pycache__" not in ours and b"build/x" in ours
    assert b"+/etc/passwd" in ours and b"root:" not in ours  # a link out is a link, not its file

    a = await coding.collect_patch({"summary": "s"}, ctx)
    b = await coding.collect_patch({"summary": "s"}, real)
    assert "collection_error" not in a, a
    assert (a["patch"], sorted(a["files_changed"])) == (b["patch"], sorted(b["files_changed"]))
    assert "caf\\xe9.txt" in a["files_changed"] and "link" in a["files_changed"]

    # A resumed member's fresh box: the checkpoint applies onto the constant baseline.
    backend = DockerBackend()
    again = await backend.create(SandboxSpec(kind="coding"), run=fresh.run, member="again")
    try:
        store3, ctx3 = _ctx(tmp_path, again, "again")
        (tmp_path / "again" / "checkpoint-2.bin").write_bytes(ours)
        await coding.snapshot_workspace(ctx3)
        assert ctx3.state["baseline"]["objects"] == workspace_git.NO_SNAPSHOT
        assert "restored" in str(await store3.restore(2))
        c = await coding.collect_patch({"summary": "s"}, ctx3)
        assert c["patch"] == a["patch"]
    finally:
        await again.close()


async def test_a_box_written_into_or_of_another_image_is_snapshotted(
    images: dict[str, str], run_id: str, tmp_path: Path
) -> None:
    backend = DockerBackend()
    named = SandboxSpec(
        kind="coding", image=images["coding"]
    )  # a user's image, as far as Fleet knows
    for spec, touch in (
        (SandboxSpec(kind="coding"), "write_file"),
        (SandboxSpec(kind="coding"), "upload"),
        (SandboxSpec(kind="coding"), "start_process"),
        (named, None),
    ):
        box = await backend.create(spec, run=run_id, member="w")
        try:
            assert box.untouched_workspace() == (touch is not None)
            if touch == "write_file":
                await box.write_file("/workspace/a.txt", "from the host\n")
            elif touch == "upload":
                (tmp_path / "repo").mkdir(exist_ok=True)
                (tmp_path / "repo" / "a.txt").write_text("from the host\n")
                await box.upload(tmp_path / "repo", "/workspace")
            elif touch == "start_process":
                proc = await box.start_process("echo x > /workspace/a.txt; sleep 30")
                await anyio.sleep(0.5)
                await proc.close()
            assert not box.untouched_workspace()
            _, ctx = _ctx(tmp_path, box, f"w-{touch}")
            await coding.snapshot_workspace(ctx)
            assert ctx.state["baseline"]["objects"] != workspace_git.NO_SNAPSHOT
            if touch is not None:  # what the host put there is the baseline, not a change
                done = await coding.collect_patch({"summary": "s"}, ctx)
                assert done["files_changed"] == [] and done["patch"] == "", done
        finally:
            await box.close()


async def test_the_collection_builds_the_empty_baseline_from_nothing_in_the_box(
    boxes: list[DockerSandbox], tmp_path: Path
) -> None:
    fresh = boxes[0]
    _, ctx = _ctx(tmp_path, fresh, "fresh")
    await coding.snapshot_workspace(ctx)
    # The member plants what a snapshot would have left, with other content: the
    # collection reads none of it (there is no path for it to read).
    plant = (
        "mkdir -p /tmp/fleet-baseline-x/objects/76 && echo junk > "
        "/tmp/fleet-baseline-x/objects/76/417ebc3c9f953ec4b5a3a726c34fcdb34ec3f3 && "
        "echo hello > /workspace/new.txt"
    )
    assert (await fresh.exec(["bash", "-c", plant])).ok
    done = await coding.collect_patch({"summary": "s"}, ctx)
    assert done["files_changed"] == ["new.txt"] and "+hello" in done["patch"], done

    # Only the empty baseline can be taken by no snapshot.
    ctx.state["baseline"] = {**ctx.state["baseline"], "commit": "0" * 40}
    bad = await coding.collect_patch({"summary": "s"}, ctx)
    assert "not '0000" in bad["collection_error"], bad


def test_the_box_agnostic_constants_agree() -> None:
    commit, objects = workspace_git.empty_baseline()
    assert set(objects) == {commit, "4b825dc642cb6eb9a060e54bf8d69288fbee4904"}
    assert coding.EMPTY_PRINT == hashlib.sha256(b"").hexdigest()

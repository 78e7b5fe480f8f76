"""A coding member's checkpoint: its workspace as a binary diff against the baseline.

After each turn that ran a tool which may write (anything but the read-only tools in
``READ_ONLY``), the box's ``/workspace`` is diffed against the baseline snapshot the
patch is computed against (:mod:`subagents.kinds.coding`), with the same rules: bytes
as they are, binary files as git binary patches, ``.gitignore``'d files and the
excluded ones (``.git/``, caches) left out. The diff is read back bounded
(:data:`~subagents.durable.CHECKPOINT_BYTES`) and kept on the host by
:mod:`subagents.durable`; a resumed member's fresh box, whose baseline is the same
repository, gets it back with ``git apply`` inside the box - the host only carries
the bytes, it never reads a path out of them. What a diff cannot hold is not put
back: ignored files (build output), empty directories, commits made in the
repository's own ``.git``.
"""

from __future__ import annotations

from sandbox.errors import OutputLimitExceeded, SandboxClosed, SandboxUnavailable

from ..durable import CHECKPOINT_BYTES, CheckpointTooLarge, CheckpointUnavailable
from ..tools.base import ToolContext
from .coding import _GIT, WORKSPACE

READ_ONLY = frozenset(
    {"read_file", "glob", "grep", "write_todos", "read_saved", "tool_search", "submit_result"}
)
"""Tools that cannot change ``/workspace``: a turn of only these needs no checkpoint."""
_DIFF = "/tmp/fleet-checkpoint.diff"
_RESTORE = "/tmp/fleet-restore.diff"


async def checkpoint_workspace(ctx: ToolContext, tools: list[str]) -> bytes | None:
    """The workspace's diff against the baseline, when this turn's tools may have written."""
    box = ctx.sandbox
    if box is None or READ_ONLY.issuperset(tools):
        return None
    if not ctx.state.get("baseline"):
        raise CheckpointUnavailable("no baseline snapshot of /workspace")
    diff = f"{_GIT} diff --cached --no-renames --binary --no-color --no-ext-diff --no-textconv"
    try:
        res = await box.exec(["bash", "-c", f"{_GIT} add -A && {diff} > {_DIFF}"], timeout=300)
        if not res.ok:
            raise CheckpointUnavailable(f"git diff failed: {(res.stderr or res.stdout)[-300:]}")
        return await box.read_file(_DIFF, limit=CHECKPOINT_BYTES)
    except OutputLimitExceeded as exc:
        raise CheckpointTooLarge(exc.size or CHECKPOINT_BYTES + 1) from exc
    except (SandboxUnavailable, SandboxClosed) as exc:
        # A box dying under the turn's last tool: its next call says how (a crash), as
        # it did before checkpoints; this turn only cannot be resumed from.
        raise CheckpointUnavailable(f"the box did not answer: {exc}") from exc


async def restore_workspace(ctx: ToolContext, data: bytes) -> str:
    """Apply a checkpoint to the fresh box's baseline; raises when it does not apply."""
    box = ctx.sandbox
    if box is None or not ctx.state.get("baseline"):
        raise RuntimeError("no baseline snapshot of /workspace to restore onto")
    if not data:
        return "workspace unchanged from its baseline"
    await box.write_file(_RESTORE, data)
    script = f"cd {WORKSPACE} && {_GIT} apply --binary --whitespace=nowarn {_RESTORE}"
    res = await box.exec(["bash", "-c", script], timeout=300)
    if not res.ok:
        raise RuntimeError(f"git apply refused it: {(res.stderr or res.stdout)[-300:]}")
    return f"workspace restored ({len(data)}-byte diff against its baseline)"

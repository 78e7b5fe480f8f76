"""A coding member's checkpoint: its workspace as a binary diff against the baseline.

After each turn that ran a tool which may write (anything but the read-only tools in
``READ_ONLY``), the box's ``/workspace`` is diffed against the baseline snapshot by
the same hardened in-box program that collects the final patch
(:mod:`subagents.kinds.workspace_git`, through the ``collect`` the coding kind hands
in): bytes as they are, binary files as git binary patches, files the baseline's
ignore rules left out and the excluded ones (``.git/``, caches) left out, no setting
or attribute of the member's obeyed. A turn whose commands reported
the workspace's stamps print (:mod:`sandbox.watch`) equal to the newest checkpoint's
is that checkpoint's state: no call at all. The diff is read back bounded
(:data:`~subagents.durable.CHECKPOINT_BYTES`) and kept on the host by
:mod:`subagents.durable`; a resumed member's fresh box, whose baseline is the same
repository, gets it back with ``git apply`` inside the box - the host only carries
the bytes, it never reads a path out of them. What a diff cannot hold is not put
back: ignored files (build output), empty directories, commits made in the
repository's own ``.git``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

from sandbox.errors import OutputLimitExceeded, SandboxClosed, SandboxUnavailable

from ..durable import CHECKPOINT_BYTES, CheckpointTooLarge, CheckpointUnavailable
from ..tools.base import ToolContext
from .workspace_git import GIT, GIT_CONFIG, RAW_ATTRIBUTES, WORKSPACE

Collect = Callable[
    [ToolContext, dict[str, str | None] | None], Awaitable[tuple[dict[str, Any], str]]
]
"""Runs the in-box ``collect`` against the kept baseline: its result and output dir;
given the last checkpoint (its patch's ``sha256``, the box's ``stamps_print`` then),
``{"same": True}`` when the workspace is as it was."""

READ_ONLY = frozenset(
    {"read_file", "glob", "grep", "write_todos", "read_saved", "tool_search", "submit_result"}
)
"""Tools that cannot change ``/workspace``: a turn of only these needs no checkpoint."""
_LAST = "last_checkpoint"
"""ctx.state key: the newest checkpoint kept on the host - the SHA-256 of its patch and
the box's stamps print of the workspace then, if settled - (absent: none kept, or the
last turn's could not be)."""
_EMPTY = hashlib.sha256(b"").hexdigest()
_RESTORE = "/tmp/fleet-restore.diff"
_APPLY_GIT = "/tmp/fleet-restore.git"


def from_baseline(ctx: ToolContext, stamps_print: str) -> None:
    """The baseline snapshot is the member's first state: a workspace still as it was
    (same stamps print) is its empty patch, which no checkpoint needs to hold (a resume
    with no checkpoint starts from the baseline)."""
    ctx.state[_LAST] = {"sha256": _EMPTY, "stamps_print": stamps_print}


def baseline_state(ctx: ToolContext) -> dict[str, str | None] | None:
    """The newest checkpoint when it is the empty patch (the workspace as its baseline)."""
    last = ctx.state.get(_LAST)
    return last if last is not None and last.get("sha256") == _EMPTY else None


async def checkpoint_workspace(
    ctx: ToolContext, tools: list[str], collect: Collect
) -> bytes | None:
    """The workspace's diff against the baseline, when this turn's tools may have written."""
    box = ctx.sandbox
    if box is None or READ_ONLY.issuperset(tools):
        return None
    if not ctx.state.get("baseline"):
        raise CheckpointUnavailable("no baseline snapshot of /workspace")
    last = ctx.state.get(_LAST)
    if (
        last is not None
        and last.get("stamps_print")
        and box.settled_print() == last["stamps_print"]
    ):
        return None  # the turn's commands reported the workspace as the last checkpoint has it
    last = ctx.state.pop(_LAST, None)  # put back only once this turn's is kept
    try:
        # No checkpoint kept yet: nothing can be "same", but the box's stamps print is
        # taken, so that the next turn may be answered from it.
        found, out = await collect(ctx, last or {"sha256": "-", "stamps_print": None})
        if found.get("same") and last is not None:
            ctx.state[_LAST] = {**last, "stamps_print": found.get("stamps_print")}
            return None  # the last checkpoint is this turn's state too
        try:
            if not found.get("ok"):
                error = str(found.get("error"))[-300:]
                raise CheckpointUnavailable(f"the diff failed: {error}")
            data = await box.read_file(f"{out}/patch.diff", limit=CHECKPOINT_BYTES)
        finally:  # one such directory a turn would fill the box's /tmp
            await box.exec(["rm", "-rf", out], timeout=60)
    except OutputLimitExceeded as exc:
        raise CheckpointTooLarge(exc.size or CHECKPOINT_BYTES + 1) from exc
    except (SandboxUnavailable, SandboxClosed) as exc:
        # A box dying under the turn's last tool: its next call says how (a crash), as
        # it did before checkpoints; this turn only cannot be resumed from.
        raise CheckpointUnavailable(f"the box did not answer: {exc}") from exc
    ctx.state[_LAST] = {
        "sha256": hashlib.sha256(data).hexdigest(),
        "stamps_print": found.get("stamps_print"),
    }
    return data


async def restore_workspace(ctx: ToolContext, data: bytes) -> str:
    """Apply a checkpoint to the fresh box's baseline; raises when it does not apply."""
    box = ctx.sandbox
    if box is None or not ctx.state.get("baseline"):
        raise RuntimeError("no baseline snapshot of /workspace to restore onto")
    if not data:
        return "workspace unchanged from its baseline"
    await box.write_file(_RESTORE, data)
    # git of Fleet's own settings only: an empty git directory made here, no system,
    # global or repository config, attributes that name no filter or driver - the
    # workspace's .git and .gitattributes (the repository's, untrusted) are not obeyed.
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/nonexistent",
        "GIT_DIR": _APPLY_GIT,
        "GIT_WORK_TREE": WORKSPACE.decode(),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_CONFIG_COUNT": str(len(GIT_CONFIG)),
    }
    for i, (key, value) in enumerate(GIT_CONFIG.items()):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    script = (
        f"rm -rf {_APPLY_GIT} && {GIT} init -q --template= {_APPLY_GIT} && "
        f"mkdir -p {_APPLY_GIT}/info && "
        f"printf '%s' {_shell_quote(RAW_ATTRIBUTES)} > {_APPLY_GIT}/info/attributes && "
        f"cd {WORKSPACE.decode()} && {GIT} apply --binary --whitespace=nowarn {_RESTORE}"
    )
    res = await box.exec(["bash", "-c", script], timeout=300, env=env, cwd="/")
    if not res.ok:
        raise RuntimeError(f"git apply refused it: {(res.stderr or res.stdout)[-300:]}")
    ctx.state[_LAST] = {"sha256": hashlib.sha256(data).hexdigest(), "stamps_print": None}
    return f"workspace restored ({len(data)}-byte diff against its baseline)"


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"

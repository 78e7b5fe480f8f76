"""A member durable turn by turn: its transcript and its box's checkpoint, on the host.

A member whose process died (the coordinator SIGKILLed, Ctrl-C, the model's retries
exhausted) goes on from its last completed turn instead of turn 0. Two things make
that turn whole again:

* the conversation - :class:`~subagents.loop.conversation.Conversation` with ``save_to``,
  the mechanism the lead already continues from: written after every message, so it
  always ends at a message boundary (:mod:`subagents.loop.transcript`; fsynced before each
  model call, and before an older checkpoint is removed). Its size is the member's
  context budget (the context mechanisms shrink it in place), not its history.
* the box's state, which the kind saves (:attr:`Kind.checkpoint`) after every turn
  whose tools may have changed it and puts back (:attr:`Kind.restore`) into the new
  box: for a coding member the binary diff of ``/workspace`` against its baseline,
  for a browser member the URL of its open page. A checkpoint is host-side bytes the
  kind alone reads back, into the box; the host never opens a path it names.

Order makes the two agree. A turn's checkpoint is written (``checkpoint-<turn>.bin``,
atomically) *before* the turn's tool results join the transcript, and the previous
checkpoint is removed only *after* they did. So whatever instant the process dies,
the newest checkpoint no later than the transcript's last completed turn is the box
as of that turn: tool calls whose results are in the transcript are never run again
(their results are read from it), and calls of the last answer that had not all
answered run again on a box put back to before them.

A turn that leaves the box as the newest checkpoint has it writes none (the kind's
checkpoint answers None): the newest checkpoint no later than the turn is that turn's
state too, so a turn that changed nothing costs no write on the host.

Bounds. A checkpoint over ``CHECKPOINT_BYTES`` is not kept: the turn is marked
``checkpoint-<turn>.over`` instead (so is a turn whose state could not be read:
``CheckpointUnavailable``), and a member whose last completed turn stands on
such a mark starts over from turn 0 (its box could not be put back). A checkpoint is
read back only up to that bound. A restore that fails (the patch does not apply to
the baseline: the repository changed between the attempts) also means turn 0.
"""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

from .context.memory_profile import _fsync_replace
from .tools.base import ToolContext
from .trace import ErrorEvent, TraceWriter

TRANSCRIPT = "conversation.json"
"""The member's saved conversation, in its run directory (as the lead's)."""
CHECKPOINT_BYTES = 64 * 1024 * 1024
"""Largest checkpoint kept (and read back); past it the member cannot resume."""
_CHECKPOINT = re.compile(r"checkpoint-(\d{1,7})\.(bin|over)")


class CheckpointUnavailable(Exception):
    """The box's state could not be saved after a turn; raised by a kind's checkpoint.
    The turn is marked: a resume from it starts over."""


class CheckpointTooLarge(CheckpointUnavailable):
    """The box's state is over ``CHECKPOINT_BYTES``."""

    def __init__(self, size: int) -> None:
        super().__init__(f"{size} bytes, over the {CHECKPOINT_BYTES}-byte checkpoint limit")
        self.size = size


Checkpoint = Callable[[ToolContext, list[str]], Awaitable[bytes | None]]
"""The box's state after a turn that ran these tools, or None: nothing to keep (the
tools could not change it, or the newest checkpoint kept is that state already).
Raises CheckpointUnavailable."""
Restore = Callable[[ToolContext, bytes], Awaitable[str]]
"""Put a checkpoint back into a fresh box; returns what was restored, in words."""


def forget(member_dir: Path) -> None:
    """Remove the member's transcript and checkpoints: its next attempt starts fresh."""
    for entry in _entries(member_dir):
        entry.unlink(missing_ok=True)
    (member_dir / TRANSCRIPT).unlink(missing_ok=True)


def _entries(member_dir: Path) -> list[Path]:
    try:
        names = os.listdir(member_dir)
    except OSError:
        return []
    return [member_dir / n for n in names if _CHECKPOINT.fullmatch(n)]


def _turn_of(path: Path) -> int:
    match = _CHECKPOINT.fullmatch(path.name)
    assert match is not None
    return int(match.group(1))


class Checkpoints:
    """The member's checkpoints in its run directory (see the module docstring)."""

    def __init__(
        self,
        run_dir: Path,
        ctx: ToolContext,
        trace: TraceWriter,
        *,
        save: Checkpoint | None,
        restore: Restore | None,
        on_saved: Callable[[], None] | None = None,
    ) -> None:
        self.dir, self.ctx, self.trace = Path(run_dir), ctx, trace
        self._save, self._restore = save, restore
        self.on_saved = on_saved
        """Called once a turn is saved whole (a cluster node sends the files on)."""

    async def after_tools(self, turn: int, tools: list[str]) -> None:
        """Keep the box's state after ``turn``'s tools (before their results are saved)."""
        if self._save is None:
            return
        try:
            data = await self._save(self.ctx, tools)
        except CheckpointUnavailable as exc:
            self.trace.emit(ErrorEvent(error=type(exc).__name__, message=str(exc)))
            _fsync_replace(self.dir / f"checkpoint-{turn}.over", str(exc).encode())
            return
        if data is not None:
            _fsync_replace(self.dir / f"checkpoint-{turn}.bin", data)

    def committed(self, turn: int, durable: Callable[[], None] | None = None) -> None:
        """``turn``'s results are in the transcript: older checkpoints are not needed.
        ``durable`` (the transcript's fsync) runs before the first is removed: a
        transcript whose tail a power loss took must still find its checkpoint."""
        kept = self._newest(turn)
        older = [
            entry
            for entry in _entries(self.dir)
            if kept is not None and _turn_of(entry) < _turn_of(kept)
        ]
        if older and durable is not None:
            durable()
        for entry in older:
            entry.unlink(missing_ok=True)
        if self.on_saved is not None:
            self.on_saved()

    async def restore(self, turn: int) -> str | None:
        """Put the box back as it was after ``turn``; what was restored in words ("":
        nothing to restore), or None when it cannot be (the member starts over)."""
        for later in _entries(self.dir):
            # Kept for a turn that runs again now: it must not stand for that turn's
            # state, which the new run's checkpoint may leave unwritten (unchanged).
            if _turn_of(later) > turn:
                later.unlink(missing_ok=True)
        entry = self._newest(turn)
        if entry is None:
            return ""
        if entry.suffix == ".over" or self._restore is None:
            self._refuse(f"the box's state after turn {_turn_of(entry)} was not kept")
            return None
        try:
            with entry.open("rb") as fh:
                data = fh.read(CHECKPOINT_BYTES + 1)
            if len(data) > CHECKPOINT_BYTES:
                raise CheckpointTooLarge(len(data))
            return await self._restore(self.ctx, data)
        except Exception as exc:
            self._refuse(f"the checkpoint of turn {_turn_of(entry)} could not be restored: {exc}")
            return None

    def _refuse(self, why: str) -> None:
        self.trace.emit(ErrorEvent(error="ResumeRefused", message=f"{why}; starting over"))

    def _newest(self, turn: int) -> Path | None:
        at_most = [e for e in _entries(self.dir) if _turn_of(e) <= turn]
        return max(at_most, key=_turn_of, default=None)

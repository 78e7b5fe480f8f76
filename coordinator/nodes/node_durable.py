"""A cluster member's transcript and box checkpoint, kept on the coordinator turn by turn.

On one machine a member's durable files (:mod:`subagents.durable`: ``conversation.json``
and ``checkpoint-<turn>.bin``) are written into its run directory, where ``fleet
resume`` finds them. On a cluster the harness writes them into the node's scratch
directory, which goes with the node's actor - and a real cluster shares no disk
between the coordinator and its nodes. So they travel through the attempt's stream,
like the member's trace events:

* on the node, :class:`Mirror` is called by the harness each time a turn is saved
  (its tool results in the transcript, older checkpoints removed). It reads the
  durable files synchronously, in the harness's own event loop, so what it reads is
  one consistent instant of them, and sends a :class:`DurableUpdate` (a ``durable``
  message of the stream, :mod:`coordinator.nodes.stream`): the
  names the member has now and the bytes of those changed since the last update (a
  checkpoint is sent once, the transcript each turn - its size is the member's
  context, not its history);
* on the coordinator, :func:`keep` validates the update and applies it to the
  member's run directory: new checkpoints first, then the transcript, then the
  entries the node no longer has removed - the order the harness itself keeps, so a
  coordinator killed half-way still holds a transcript whose checkpoint is there;
* the next attempt of the member, on any node, gets them back with its request
  (:func:`load` here, :func:`place` there) and goes on from its last completed turn.

Trust. The node is less trusted than the coordinator: an update may name only the
durable files (``conversation.json``, ``checkpoint-<turn>.bin|.over``) - never a
path, so nothing is written outside the member's directory - and each is bounded
(the transcript by ``TRANSCRIPT_BYTES``, a checkpoint by ``CHECKPOINT_BYTES``, a
mark by ``MARK_BYTES``, an update by ``MAX_NAMES`` names). The coordinator carries
the bytes and never interprets them: the next node's harness reads them with the
bounds and checks it uses on one machine. Files are written without following a link
at the target or its temporary name, and read back without following one.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from subagents.durable import CHECKPOINT_BYTES, TRANSCRIPT
from subagents.loop.conversation import TRANSCRIPT_BYTES

MARK_BYTES = 64 * 1024
"""Largest ``checkpoint-<turn>.over`` mark (it holds why the turn's state was not kept)."""
MAX_NAMES = 8
"""Most durable files one member has at once (a transcript and two checkpoints, in
practice): an update naming more is refused."""
_NAME = re.compile(r"conversation\.json|checkpoint-\d{1,7}\.(bin|over)")


class DurableRefused(Exception):
    """A durable update from a node that breaks a bound; nothing of it was applied."""


class DurableUpdate(BaseModel):
    """The member's durable files after a saved turn (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    names: list[str] = Field(max_length=MAX_NAMES)
    """Every durable file the member has now; the coordinator removes the others."""
    files: dict[str, bytes] = Field(default_factory=dict)
    """The bytes of those that changed since the last update."""


def is_durable(name: str) -> bool:
    """Whether ``name`` (a file name, no directory) is one of a member's durable files."""
    return _NAME.fullmatch(name) is not None


def _limit(name: str) -> int:
    if name == TRANSCRIPT:
        return TRANSCRIPT_BYTES
    return MARK_BYTES if name.endswith(".over") else CHECKPOINT_BYTES


def _names(member_dir: Path) -> list[str]:
    try:
        return sorted(n for n in os.listdir(member_dir) if is_durable(n))
    except OSError:
        return []


def _read(path: Path, limit: int) -> bytes | None:
    """The file's bytes, or None when it is not a regular file or is over ``limit``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        data = fh.read(limit + 1)
    return None if len(data) > limit else data


def _write(path: Path, data: bytes) -> None:
    """Atomically, following no link at ``path`` or at its temporary name."""
    tmp = path.with_name(f".{path.name}.node-tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class Mirror:
    """The node side: called after each saved turn, sends what changed (module docstring)."""

    def __init__(self, member_dir: Path, send: Callable[[DurableUpdate], None]) -> None:
        self.dir = member_dir
        self.send = send
        self._sent: dict[str, tuple[int, int, int]] = {}
        """Each file as last sent: (inode, size, mtime_ns)."""

    def __call__(self) -> None:
        now: dict[str, tuple[int, int, int]] = {}
        files: dict[str, bytes] = {}
        for name in _names(self.dir):
            path = self.dir / name
            try:
                st = path.stat(follow_symlinks=False)
            except OSError:
                continue
            seen = (st.st_ino, st.st_size, st.st_mtime_ns)
            if self._sent.get(name) != seen:
                data = _read(path, _limit(name))
                if data is None:  # too large to resume from: the coordinator drops its copy
                    continue
                files[name] = data
            now[name] = seen
        if files or now.keys() != self._sent.keys():
            self._sent = now
            self.send(DurableUpdate(names=sorted(now), files=files))


def keep(member_dir: Path, sent: Any) -> None:
    """Apply a node's update to the member's run directory; :class:`DurableRefused`
    (nothing applied) when it breaks a bound."""
    try:
        update = sent if isinstance(sent, DurableUpdate) else DurableUpdate.model_validate(sent)
    except ValidationError as exc:
        raise DurableRefused(f"not a durable update: {exc.errors()[0]['msg']}") from None
    for name in update.names:
        if not is_durable(name):
            raise DurableRefused(f"{name[:80]!r} is not a durable file's name")
    for name, data in update.files.items():
        if name not in update.names:
            raise DurableRefused(f"{name[:80]!r} is sent but not named")
        if len(data) > _limit(name):
            raise DurableRefused(f"{name} is {len(data)} bytes, over {_limit(name)}")
    member_dir.mkdir(parents=True, exist_ok=True)
    # The harness's own order (subagents.durable): a turn's checkpoint before the
    # transcript that needs it, older ones removed only after.
    for name in sorted(update.files, key=lambda n: n == TRANSCRIPT):
        _write(member_dir / name, update.files[name])
    for name in _names(member_dir):
        if name not in update.names:
            (member_dir / name).unlink(missing_ok=True)


def load(member_dir: Path) -> dict[str, bytes]:
    """The member's durable files in its run directory, for its next attempt's node
    (a file over its bound, or not a regular file, is left out)."""
    out: dict[str, bytes] = {}
    for name in _names(member_dir):
        data = _read(member_dir / name, _limit(name))
        if data is not None:
            out[name] = data
    return out


def place(member_dir: Path, files: dict[str, bytes]) -> None:
    """The durable files from the coordinator into the attempt's scratch directory."""
    for name, data in files.items():
        if is_durable(name):
            _write(member_dir / name, data)

"""The ``memory`` tool: the one way a member views and edits its memory.

Every command works on the member's working copy (:class:`~.memory.MemoryStore`, on the
host) in a worker thread, and reports the changes to repeat in the box's mirror and to
trace as ``memory_write`` - also when the command fails halfway. Paths are checked by
the store: nothing outside the memory directory, nothing through a symlink, nothing in
the profile's bookkeeping. What the tool changes is what the store merges into the
profile when the member ends.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Literal

import anyio
from pydantic import BaseModel, ConfigDict

from ..tools.base import Tool, ToolContext, ToolError, ToolOutput
from .memory import MEMORY_PREFIX, Change, MemoryStore


class MemoryInput(BaseModel):
    """One memory command; which fields it needs depends on ``command``."""

    model_config = ConfigDict(extra="forbid")

    command: Literal["view", "create", "str_replace", "insert", "delete", "rename"]
    """view (a file with line numbers, or a directory), create (or overwrite), str_replace
    (one exact occurrence), insert (after a line; 0 = at the top), delete, rename."""
    path: str | None = None
    """File or directory under /memories (all commands but rename)."""
    view_range: list[int] | None = None
    """view: [first, last] line numbers, 1-based, last -1 for the end."""
    file_text: str | None = None
    """create: the whole content of the file."""
    old_str: str | None = None
    """str_replace: the exact text to replace; must occur exactly once."""
    new_str: str | None = None
    """str_replace: the replacement text."""
    insert_line: int | None = None
    """insert: the new text goes after this line (0 = before the first)."""
    insert_text: str | None = None
    """insert: the text to insert."""
    old_path: str | None = None
    """rename: the current path."""
    new_path: str | None = None
    """rename: the new path (must not exist)."""


def _need(value: object, field: str, command: str) -> None:
    if value is None:
        raise ToolError(f"the {command} command needs {field!r}")


class MemoryTool(Tool):
    """The ``memory`` tool: view and edit this member's memory directory.

    Commands run in a worker thread (they touch host files) and report the changes
    to repeat in the box, which is then done on the event loop.
    """

    name = "memory"
    description = (
        "Your persistent memory: a directory of text files at /memories that outlives this "
        "run. Commands: view {path, view_range?}, create {path, file_text}, str_replace "
        "{path, old_str, new_str}, insert {path, insert_line, insert_text}, delete {path}, "
        "rename {old_path, new_path}. Keep it short and factual: it is loaded at the start "
        "of later runs (only the first lines), so put the most useful facts first."
    )
    Input = MemoryInput

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    async def run(self, args: MemoryInput, ctx: ToolContext) -> ToolOutput | str:
        changes: list[Change] = []
        handler = getattr(self, f"_{args.command}")
        try:
            text = await anyio.to_thread.run_sync(handler, args, changes)
        finally:
            await self.store.apply(changes)
        return text

    def _view(self, args: MemoryInput, changes: list[Change]) -> str:
        full = self.store.resolve(args.path or MEMORY_PREFIX)
        if full.is_dir():
            entries = sorted(p for p in full.rglob("*") if p.is_file())
            lines = [f"{p.stat().st_size:>8}  {MEMORY_PREFIX}/{self.store.rel(p)}" for p in entries]
            return "\n".join(lines) or f"{args.path or MEMORY_PREFIX}: empty directory"
        if not full.is_file():
            raise ToolError(f"{args.path} does not exist; view {MEMORY_PREFIX} to list files")
        lines = full.read_text(encoding="utf-8", errors="replace").splitlines()
        first, last = 1, len(lines)
        if args.view_range:
            if len(args.view_range) != 2 or args.view_range[0] < 1:
                raise ToolError("view_range is [first, last], 1-based; last may be -1")
            first = args.view_range[0]
            last = len(lines) if args.view_range[1] == -1 else min(args.view_range[1], len(lines))
        return "\n".join(f"{n:6}\t{lines[n - 1]}" for n in range(first, last + 1))

    def _create(self, args: MemoryInput, changes: list[Change]) -> str:
        _need(args.file_text, "file_text", "create")
        full = self.store.resolve(args.path)
        if full.is_dir():
            raise ToolError(f"{args.path} is a directory; give a file path")
        full.parent.mkdir(parents=True, exist_ok=True)
        return self._write("create", full, args.file_text or "", changes)

    def _str_replace(self, args: MemoryInput, changes: list[Change]) -> str:
        _need(args.old_str, "old_str", "str_replace")
        full, text = self._existing(args.path)
        count = text.count(args.old_str or "")
        if count != 1:
            what = "does not occur" if count == 0 else f"occurs {count} times"
            raise ToolError(f"old_str {what} in {args.path}; it must occur exactly once")
        new = text.replace(args.old_str or "", args.new_str or "", 1)
        return self._write("str_replace", full, new, changes)

    def _insert(self, args: MemoryInput, changes: list[Change]) -> str:
        _need(args.insert_line, "insert_line", "insert")
        _need(args.insert_text, "insert_text", "insert")
        full, text = self._existing(args.path)
        lines = text.splitlines()
        at = args.insert_line or 0
        if not 0 <= at <= len(lines):
            raise ToolError(f"insert_line must be between 0 and {len(lines)} for {args.path}")
        lines[at:at] = (args.insert_text or "").splitlines()
        return self._write("insert", full, "\n".join(lines) + "\n", changes)

    def _delete(self, args: MemoryInput, changes: list[Change]) -> str:
        full = self.store.resolve(args.path)
        if full == self.store.root.resolve():
            raise ToolError("refusing to delete the whole memory directory; delete its files")
        if not full.exists():
            raise ToolError(f"{args.path} does not exist")
        if full.is_dir():
            for p in full.rglob("*"):
                if p.is_file():
                    self.store.origins.pop(self.store.record(p), None)
            shutil.rmtree(full)
        else:
            self.store.origins.pop(self.store.rel(full), None)
            full.unlink()
        changes.append(("delete", self.store.record(full), None))
        return f"deleted {MEMORY_PREFIX}/{self.store.rel(full)}"

    def _rename(self, args: MemoryInput, changes: list[Change]) -> str:
        _need(args.old_path, "old_path", "rename")
        _need(args.new_path, "new_path", "rename")
        src = self.store.resolve(args.old_path)
        dst = self.store.resolve(args.new_path)
        if not src.is_file():
            raise ToolError(f"{args.old_path} is not an existing file")
        if dst.exists():
            raise ToolError(f"{args.new_path} already exists; delete it first or pick another")
        dst.parent.mkdir(parents=True, exist_ok=True)
        src.rename(dst)
        self.store.moved(self.store.rel(src), self.store.rel(dst))
        changes.append(("rename", self.store.record(src), None))
        changes.append(("rename", self.store.record(dst), dst.read_bytes()))
        return f"renamed {args.old_path} to {MEMORY_PREFIX}/{self.store.rel(dst)}"

    def _existing(self, path: str | None) -> tuple[Path, str]:
        full = self.store.resolve(path)
        if not full.is_file():
            raise ToolError(f"{path} is not an existing file; create it first")
        return full, full.read_text(encoding="utf-8")

    def _write(self, command: str, full: Path, text: str, changes: list[Change]) -> str:
        data = text.encode("utf-8")
        limit = self.store.config.memory_file_max_bytes
        if len(data) > limit:
            raise ToolError(f"a memory file may hold at most {limit:,} bytes; keep memory short")
        full.write_bytes(data)
        changes.append((command, self.store.record(full), data))
        return f"{command}: {MEMORY_PREFIX}/{self.store.rel(full)} saved"

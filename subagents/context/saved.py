"""``read_saved``: how a member without file tools reads back what its context saved.

Offloaded tool results and compaction transcripts are files; a pointer to one is only
useful if the member can open it. A coding member has ``read_file`` and ``grep`` in
its box. A browser member has only browser tools, so it gets this one: it reads the
run-directory copy (``offloads/NAME`` or ``transcripts/NAME`` of this member) and
nothing else - not the box, not a sibling's files, not the host - by line range or by
the lines that contain a text. Its answer is kept under the offload threshold, so
reading a saved file back never offloads it again.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import ClassVar

import anyio
from pydantic import BaseModel, ConfigDict, Field

from ..tools.base import Tool, ToolContext, ToolError
from .offload import READ_SAVED

SAVED_DIRS = ("offloads", "transcripts")
LINE_CHARS = 2_000


class ReadSavedInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(
        min_length=1,
        max_length=300,
        description="The saved file as its pointer names it, e.g. offloads/0001-search-t1.txt.",
    )
    offset: int = Field(default=1, ge=1, description="First line to show, from 1.")
    limit: int = Field(default=200, ge=1, le=2_000, description="Lines to show at most.")
    pattern: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Show only the lines containing this text (case-insensitive), numbered.",
    )


class ReadSaved(Tool):
    name: ClassVar[str] = READ_SAVED
    description: ClassVar[str] = (
        "Read back a tool result or transcript that was saved outside your context "
        "(the path its pointer names): lines offset..offset+limit, or only the lines "
        "containing pattern."
    )
    Input: ClassVar[type[BaseModel]] = ReadSavedInput

    def __init__(self, run_dir: Path, *, max_chars: int) -> None:
        self.run_dir = Path(run_dir)
        self.max_chars = max_chars

    def resolve(self, path: str) -> Path:
        """The member's own saved file that ``path`` names; ToolError for anything else."""
        parts = PurePosixPath(path).parts
        sub, name = (parts[-2], parts[-1]) if len(parts) >= 2 else ("", "")
        folder = self.run_dir / sub
        target = folder / name
        if (
            sub in SAVED_DIRS
            and not name.startswith(".")
            and target.is_file()
            and not target.is_symlink()
            and target.resolve().parent == folder.resolve()
        ):
            return target
        saved = sorted(
            f"{d}/{f.name}"
            for d in SAVED_DIRS
            if (self.run_dir / d).is_dir()
            for f in (self.run_dir / d).iterdir()
            if f.is_file()
        )
        listing = ", ".join(saved[-20:]) or "none yet"
        raise ToolError(f"no saved file {path!r}; the files saved for you: {listing}")

    async def run(self, args: ReadSavedInput, ctx: ToolContext) -> str:
        target = self.resolve(args.path)
        text = await anyio.to_thread.run_sync(
            lambda: target.read_text(encoding="utf-8", errors="replace")
        )
        lines = text.splitlines()
        rel = f"{target.parent.name}/{target.name}"
        numbered = list(enumerate(lines, 1))[args.offset - 1 :]
        if args.pattern is not None:
            needle = args.pattern.lower()
            numbered = [(n, line) for n, line in numbered if needle in line.lower()]
            what = f"{len(numbered)} line(s) containing {args.pattern!r}"
        else:
            what = f"lines {args.offset}-{min(args.offset + args.limit - 1, len(lines))}"
        shown = numbered[: args.limit]
        out = [f"{rel} ({len(lines):,} lines): {what}"]
        used = len(out[0])
        for n, line in shown:
            if len(line) > LINE_CHARS:
                line = line[:LINE_CHARS] + f"... [{len(line):,} chars in this line]"
            entry = f"{n:>6}\t{line}"
            if used + len(entry) > self.max_chars:
                out.append(f"[... cut at {self.max_chars:,} characters: ask for fewer lines]")
                break
            out.append(entry)
            used += len(entry) + 1
        if not shown:
            out.append("(nothing there)" if args.pattern is None else "(no line matches)")
        return "\n".join(out)

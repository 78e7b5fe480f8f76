"""Coding tools, confined to the member's box: shell, read, write, edit, glob, grep.

None of these tools but ``shell`` runs a file the member can write: ``glob`` runs an
isolated interpreter (``python3 -I -S``) from ``/``, ``grep`` runs ripgrep, which reads
ignore files but runs nothing from them, and the file tools are the box agent's own
operations. So a deny rule on ``shell`` keeps the model's code from running through
them; it does not stop the job's own check command, which runs the code it tests.

Every tool talks only to ``ctx.sandbox``; paths are resolved by the box's own rules
(relative to ``/workspace``, refused outside its allowed roots), so a tool can never
touch the host. Errors the model can fix raise :class:`ToolError` with what to do
next - in particular ``edit_file`` refuses a missing or ambiguous match and says how
many places matched, because a guessed edit is worse than none.

Output sizes: results are not cut to a few kilobytes here. A result too large for
the context is offloaded whole by the context manager (path + preview, readable back
with ``read_file``), which loses nothing; only pathological output is capped (head and
tail kept, middle marked) so one runaway command cannot fill the host's memory.
"""

from __future__ import annotations

import base64
import json
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from sandbox.base import Sandbox

from .base import Tool, ToolContext, ToolError, ToolOutput
from .names import parse, show
from .registry import render_exec

STREAM_CHARS = 200_000
"""Per-stream characters of a command's output passed on (head and tail kept)."""
READ_LIMIT_BYTES = 16 * 1024 * 1024
LINE_CHARS = 2_000
"""A longer line is cut in read_file output (minified files, data dumps)."""

# Runs inside the box (python3 is in the coding image): glob with ``**`` support,
# files only, newest first - the files an agent just touched are usually the ones
# it wants. Run as ``python3 -I -S`` from ``/``: with a plain ``python3 -c`` in
# /workspace, a glob.py or json.py the member wrote there would be imported instead
# of the standard module, and a .pth file would run - the member's code run by a tool
# of Fleet's, even under a deny rule on shell.
_GLOB_PY = r"""
import glob, json, os, sys
root, pattern, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
hits = [p for p in glob.glob(os.path.join(root, pattern), recursive=True) if os.path.isfile(p)]
hits.sort(key=lambda p: -os.path.getmtime(p))
print(json.dumps({"total": len(hits), "paths": hits[:limit]}))
"""


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _box(ctx: ToolContext) -> Sandbox:
    if ctx.sandbox is None:
        raise ToolError("this member has no sandbox; coding tools need one")
    return ctx.sandbox


def _path(box: Sandbox, given: str) -> str:
    """The box path the model means by ``given`` (shown names parsed back to bytes)."""
    return box.resolve(parse(given))


def _cap(text: str, limit: int = STREAM_CHARS) -> tuple[str, bool]:
    if len(text) <= limit:
        return text, False
    half = limit // 2
    dropped = len(text) - 2 * half
    return f"{text[:half]}\n[... {dropped} characters omitted ...]\n{text[-half:]}", True


class ShellInput(_In):
    command: str = Field(min_length=1)
    """Shell command (bash -c) run in the box, in /workspace unless cwd says otherwise."""
    timeout_s: float = Field(default=60.0, gt=0, le=1800)
    """Seconds before the command's whole process group is killed (partial output kept)."""
    cwd: str | None = None
    """Working directory (default /workspace)."""


class Shell(Tool):
    name: ClassVar[str] = "shell"
    description: ClassVar[str] = (
        "Run a shell command in your sandbox (Linux, no network unless granted). "
        "Returns exit code, stdout and stderr. Use for builds, tests, git, installs. "
        "Processes it leaves running (background jobs, daemons) end with it: start a "
        "server and what uses it in the same command."
    )
    Input: ClassVar[type[BaseModel]] = ShellInput

    async def run(self, args: ShellInput, ctx: ToolContext) -> ToolOutput:
        box = _box(ctx)
        cwd = _path(box, args.cwd) if args.cwd else None
        res = await box.exec(args.command, timeout=args.timeout_s, cwd=cwd)
        out, cut1 = _cap(res.stdout)
        err, cut2 = _cap(res.stderr)
        text = render_exec(out, err, res.exit_code, res.timed_out, args.timeout_s)
        # A failing command is information, not a tool error: the model asked for it.
        return ToolOutput(text=text, truncated=res.truncated or cut1 or cut2)


class ReadFileInput(_In):
    path: str
    """File to read (absolute, or relative to /workspace)."""
    offset: int = Field(default=1, ge=1)
    """First line to show (1-based)."""
    limit: int = Field(default=2_000, ge=1, le=20_000)
    """How many lines to show at most."""


class ReadFile(Tool):
    name: ClassVar[str] = "read_file"
    description: ClassVar[str] = (
        "Read a text file with numbered lines. Use offset/limit to page through big files."
    )
    Input: ClassVar[type[BaseModel]] = ReadFileInput

    async def run(self, args: ReadFileInput, ctx: ToolContext) -> ToolOutput:
        box = _box(ctx)
        path = _path(box, args.path)
        data = await _read(box, path, args.path)
        if b"\0" in data[:8192]:
            raise ToolError(
                f"{show(path)} is a binary file ({len(data)} bytes); inspect it with shell"
            )
        lines = data.decode("utf-8", errors="replace").splitlines()
        total = len(lines)
        if total == 0:
            return ToolOutput(text=f"{show(path)} is empty (0 lines)")
        if args.offset > total:
            raise ToolError(f"offset {args.offset} is past the end of {show(path)} ({total} lines)")
        end = min(total, args.offset + args.limit - 1)
        body = "\n".join(f"{n:>6}\t{_cut_line(lines[n - 1])}" for n in range(args.offset, end + 1))
        note = f"{show(path)}: lines {args.offset}-{end} of {total}"
        if end < total:
            note += f"; call read_file with offset={end + 1} for more"
        return ToolOutput(text=f"{body}\n({note})")


def _cut_line(line: str) -> str:
    if len(line) <= LINE_CHARS:
        return line
    return line[:LINE_CHARS] + f" [... line cut, {len(line)} characters]"


async def _read(box: Sandbox, path: str, given: str) -> bytes:
    try:
        return await box.read_file(path, limit=READ_LIMIT_BYTES)
    except FileNotFoundError:
        raise ToolError(f"no such file: {given} ({show(path)}); use glob to find it") from None
    except IsADirectoryError:
        raise ToolError(f"{show(path)} is a directory; use glob or shell 'ls' to list it") from None


class WriteFileInput(_In):
    path: str
    """File to create or replace (parents are created)."""
    content: str
    """The whole new content of the file."""


class WriteFile(Tool):
    name: ClassVar[str] = "write_file"
    description: ClassVar[str] = (
        "Create or overwrite a file with the given content. For small changes to an "
        "existing file prefer edit_file."
    )
    Input: ClassVar[type[BaseModel]] = WriteFileInput

    async def run(self, args: WriteFileInput, ctx: ToolContext) -> ToolOutput:
        box = _box(ctx)
        path = _path(box, args.path)
        await box.write_file(path, args.content)
        n = args.content.count("\n") + (0 if args.content.endswith("\n") or not args.content else 1)
        size = len(args.content.encode())
        text = f"wrote {show(path)} ({size} bytes, {n} lines)"
        return ToolOutput(text=text, files_written=[path])


class EditFileInput(_In):
    path: str
    """File to edit."""
    old_string: str = Field(min_length=1)
    """Exact text to replace, whitespace included; must match exactly once."""
    new_string: str
    """Replacement text."""
    replace_all: bool = False
    """Replace every match instead of requiring exactly one."""


class EditFile(Tool):
    name: ClassVar[str] = "edit_file"
    description: ClassVar[str] = (
        "Replace an exact piece of text in a file. old_string must match exactly once "
        "(include surrounding lines to make it unique) unless replace_all is true."
    )
    Input: ClassVar[type[BaseModel]] = EditFileInput

    async def run(self, args: EditFileInput, ctx: ToolContext) -> ToolOutput:
        box = _box(ctx)
        path = _path(box, args.path)
        text = (await _read(box, path, args.path)).decode("utf-8", errors="surrogateescape")
        if args.old_string == args.new_string:
            raise ToolError("old_string and new_string are identical; nothing would change")
        count = text.count(args.old_string)
        if count == 0:
            raise ToolError(
                f"old_string not found in {show(path)} (0 matches). Read the file again and copy "
                "the exact text, including indentation and line breaks."
            )
        if count > 1 and not args.replace_all:
            raise ToolError(
                f"old_string is not unique in {show(path)}: it matches {count} places. Include "
                "more surrounding lines to pick one, or set replace_all=true to change all."
            )
        start_line = text[: text.index(args.old_string)].count("\n") + 1
        new_text = text.replace(args.old_string, args.new_string)
        await box.write_file(path, new_text.encode("utf-8", errors="surrogateescape"))
        lines = new_text.splitlines()
        shown = range(
            max(1, start_line - 2),
            min(len(lines), start_line + args.new_string.count("\n") + 2) + 1,
        )
        snippet = "\n".join(f"{n:>6}\t{_cut_line(lines[n - 1])}" for n in shown)
        what = f"{count} places" if count > 1 else f"line {start_line}"
        text = f"edited {show(path)} ({what}); now:\n{snippet}"
        return ToolOutput(text=text, files_written=[path])


class GlobInput(_In):
    pattern: str = Field(min_length=1)
    """Glob pattern, ``**`` for any depth (e.g. ``**/*.py``)."""
    path: str = "/workspace"
    """Directory to search from."""
    limit: int = Field(default=200, ge=1, le=5_000)
    """Most paths returned (newest first)."""


class Glob(Tool):
    name: ClassVar[str] = "glob"
    description: ClassVar[str] = "Find files by name pattern (e.g. '**/*.py'), newest first."
    Input: ClassVar[type[BaseModel]] = GlobInput

    async def run(self, args: GlobInput, ctx: ToolContext) -> ToolOutput:
        box = _box(ctx)
        root = _path(box, args.path)
        res = await box.exec(
            ["python3", "-I", "-S", "-c", _GLOB_PY, root, args.pattern, str(args.limit)],
            timeout=60,
            cwd="/",
        )
        if not res.ok:
            raise ToolError(f"glob failed: {res.stderr.strip()[-500:] or res.stdout[-500:]}")
        found: dict[str, Any] = json.loads(res.stdout)
        if not found["paths"]:
            return ToolOutput(text=f"no files match {args.pattern!r} under {show(root)}")
        more = found["total"] - len(found["paths"])
        tail = f"\n({more} more not shown; narrow the pattern)" if more > 0 else ""
        return ToolOutput(text="\n".join(show(p) for p in found["paths"]) + tail)


class GrepInput(_In):
    pattern: str = Field(min_length=1)
    """Regular expression (ripgrep syntax)."""
    path: str = "/workspace"
    """File or directory to search."""
    glob: str | None = None
    """Only files whose name matches this glob (e.g. ``*.py``)."""
    ignore_case: bool = False
    context: int = Field(default=0, ge=0, le=20)
    """Lines of context around each match."""
    max_count: int = Field(default=100, ge=1, le=10_000)
    """Most matching lines per file."""


class Grep(Tool):
    name: ClassVar[str] = "grep"
    description: ClassVar[str] = (
        "Search file contents with a regular expression (ripgrep); prints path:line:text."
    )
    Input: ClassVar[type[BaseModel]] = GrepInput

    async def run(self, args: GrepInput, ctx: ToolContext) -> ToolOutput:
        box = _box(ctx)
        root = _path(box, args.path)
        # JSON, because it carries a path or line that is not UTF-8 as bytes.
        argv = ["rg", "--json", "--max-count", str(args.max_count)]
        if args.ignore_case:
            argv.append("--ignore-case")
        if args.context:
            argv += ["--context", str(args.context)]
        if args.glob:
            argv += ["--glob", args.glob]
        argv += ["--regexp", args.pattern, "--", root]
        res = await box.exec(argv, timeout=60)
        if res.exit_code == 1 and not res.stderr.strip():
            return ToolOutput(text=f"no matches for {args.pattern!r} under {show(root)}")
        if res.exit_code not in (0, 1) or res.timed_out:
            raise ToolError(f"grep failed (exit {res.exit_code}): {res.stderr.strip()[-500:]}")
        out, cut = _cap("\n".join(_grep_lines(res.stdout, separate=args.context > 0)))
        return ToolOutput(text=out, truncated=res.truncated or cut)


def _rg_data(value: dict[str, str]) -> str:
    """A path or line of ripgrep's JSON: text, or bytes (surrogate-escaped)."""
    if "text" in value:
        return value["text"]
    return base64.b64decode(value["bytes"]).decode("utf-8", "surrogateescape")


def _grep_lines(stdout: str, *, separate: bool) -> list[str]:
    """ripgrep's JSON as ``path:line:text`` (context lines ``path-line-text``, ``--``
    between groups); a line cut by the output cap is skipped."""
    lines: list[str] = []
    last: tuple[str, int] | None = None
    for raw in stdout.splitlines():
        try:
            msg = json.loads(raw)
        except ValueError:
            continue
        if msg.get("type") not in ("match", "context"):
            continue
        data = msg["data"]
        path, number = show(_rg_data(data["path"])), data["line_number"]
        if separate and last is not None and last != (path, number - 1):
            lines.append("--")
        sep = ":" if msg["type"] == "match" else "-"
        lines.append(f"{path}{sep}{number}{sep}{_rg_data(data['lines']).rstrip(chr(10))}")
        last = (path, number)
    return lines


def coding_tools() -> list[Tool]:
    """The coding member's tools, in the order the model sees them."""
    return [Shell(), ReadFile(), WriteFile(), EditFile(), Glob(), Grep()]

"""Offloading: large tool results leave the window and become a pointer + preview.

A result over ``offload_result_tokens`` is written to a file in the box (so the
agent can read it in pieces or grep it with its own tools) and in the run
directory (so a person can inspect it), and the model sees only its path, size
and first lines. When the whole context passes the compaction trigger, older
results beyond the most recent few are offloaded the same way, oldest first,
before anything is summarized: a pointer loses nothing (the content is one read
away), a summary does.

Every pointer names the tool that reads the file back, which depends on the
member's kind. A kind with its own file tools (coding: ``read_file``, ``grep``) reads
the box copy under ``box_dir`` (``/tmp/fleet`` by default, outside ``/workspace``, so
a coding member's patch and file listings never include it). A kind without them
(browser) gets ``read_saved`` (:mod:`subagents.context.saved`), which reads the
run-directory copy and nothing else - so no box copy is written for it. If the box
cannot take the file (it crashed, or there is none), the pointer names the
run-directory copy and says the agent cannot read it back, and the context is still
relieved: the window matters more than the read-back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from sandbox.base import Sandbox
from sandbox.errors import SandboxError

from .config import ContextConfig
from .tokens import estimate_text

OFFLOAD_MARK = "[tool result offloaded"
"""Start of every pointer text. Which results are pointers is known by their call id
(:attr:`Offloader.briefs`), never by this text: a page may begin with it too."""
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_name(text: str, limit: int = 60) -> str:
    """A file-name-safe form of a tool name or call id."""
    return _UNSAFE.sub("_", text)[:limit] or "x"


READ_SAVED = "read_saved"
"""The tool a member without file tools reads its saved files back with."""


@dataclass
class Saved:
    """Where one artifact was written, and how its member reads it back."""

    host: Path
    """The run-directory copy."""
    box: str | None
    """The box copy, or None when the box could not take it (or was not given it)."""
    box_tools: bool = True
    """The member reads box files with its own tools; False: with ``read_saved``."""

    @property
    def for_model(self) -> str:
        """The path the member is told (and its trace records)."""
        if not self.box_tools:
            return f"{self.host.parent.name}/{self.host.name}"
        return self.box if self.box is not None else str(self.host)

    @property
    def how_to_read(self) -> str:
        """One sentence naming the member's own tools for it; empty when it cannot."""
        if not self.box_tools:
            return (
                f"Read it in pieces ({READ_SAVED} with its path, offset and limit) or "
                f"search it ({READ_SAVED} with pattern) as needed."
            )
        if self.box is not None:
            return "Read it in pieces (read_file with offset/limit) or search it (grep) as needed."
        return ""


async def save_artifact(
    sandbox: Sandbox | None,
    run_dir: Path,
    box_dir: str,
    sub: str,
    name: str,
    data: str,
    *,
    box_tools: bool = True,
) -> Saved:
    """Write ``data`` to ``run_dir/sub/name`` and, for a member that reads it with its
    own file tools, to ``box_dir/sub/name`` in the box."""
    host = run_dir / sub / name
    await anyio.to_thread.run_sync(_write_host, host, data)
    box_path: str | None = None
    if sandbox is not None and box_tools:
        target = f"{box_dir.rstrip('/')}/{sub}/{name}"
        try:
            await sandbox.write_file(target, data.encode("utf-8"))
            box_path = target
        except (SandboxError, OSError):
            box_path = None
    return Saved(host=host, box=box_path, box_tools=box_tools)


def _write_host(path: Path, data: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data, encoding="utf-8")


def pointer_text(
    saved: Saved, text: str, tokens: int, config: ContextConfig, *, preview_lines: int | None = None
) -> str:
    """What the model sees instead of an offloaded result (``preview_lines``: default
    the config's; 0 for a result the model has already read whole)."""
    lines = text.splitlines()
    preview = []
    count = config.preview_lines if preview_lines is None else preview_lines
    for line in lines[:count]:
        if len(line) > config.preview_line_chars:
            line = line[: config.preview_line_chars] + f"... [{len(line):,} chars in this line]"
        preview.append(line)
    if saved.how_to_read:
        how = f"Full content: {saved.for_model}\n{saved.how_to_read}"
    else:
        how = (
            f"Full content was saved outside your sandbox ({saved.host}); you cannot read "
            "it back, so re-run the tool with a narrower query if you need more of it."
        )
    head = f"{OFFLOAD_MARK}: {len(text):,} chars, ~{tokens:,} tokens, {len(lines):,} lines]\n{how}"
    if not preview:
        return head
    return f"{head}\nFirst {len(preview)} lines:\n" + "\n".join(preview)


def brief_pointer(saved: Saved, text: str, tokens: int) -> str:
    """The short pointer of a result the model has read or moved past: its size and
    path only. How to read it back is said by every new pointer and the tool list, so
    it is not repeated in each old one, which every later turn re-sends."""
    head = f"{OFFLOAD_MARK}: ~{tokens:,} tokens, {len(text.splitlines()):,} lines]"
    if saved.how_to_read:
        return f"{head}\nFull content: {saved.for_model}"
    return f"{head}\nSaved outside your sandbox; you cannot read it back."


class Offloader:
    """Saves results to the box and the run directory and builds their pointers."""

    def __init__(
        self,
        config: ContextConfig,
        sandbox: Sandbox | None,
        run_dir: Path,
        *,
        box_tools: bool = True,
    ) -> None:
        self.config = config
        self.sandbox = sandbox
        self.run_dir = run_dir
        self.box_tools = box_tools
        """The member reads box files with its own tools (else with ``read_saved``)."""
        self.briefs: dict[str, str] = {}
        """call id -> short pointer (:func:`brief_pointer`) of every result offloaded:
        which results are pointers, and what an old pointer shrinks to."""
        self._seq = 0

    def too_large(self, text: str) -> bool:
        return estimate_text(text) > self.config.offload_result_tokens

    async def offload(
        self, call_id: str, tool: str, text: str, *, preview: bool = True
    ) -> tuple[str, Saved, int]:
        """Save ``text``; returns (pointer text, where it was saved, its tokens). Without
        ``preview`` (a result the model has read whole) the pointer is the brief one."""
        self._seq += 1
        name = f"{self._seq:04d}-{safe_name(tool, 40)}-{safe_name(call_id)}.txt"
        saved = await self.save("offloads", name, text)
        tokens = estimate_text(text)
        brief = brief_pointer(saved, text, tokens)
        self.briefs[call_id] = brief
        pointer = pointer_text(saved, text, tokens, self.config) if preview else brief
        return pointer, saved, tokens

    async def save(self, sub: str, name: str, data: str) -> Saved:
        """Save one artifact where this member can read it back."""
        return await save_artifact(
            self.sandbox,
            self.run_dir,
            self.config.box_dir,
            sub,
            name,
            data,
            box_tools=self.box_tools,
        )


def result_text(block: dict[str, Any]) -> str | None:
    """The text of a tool_result block, or None if it holds more than text."""
    content = block.get("content", "")
    if isinstance(content, str):
        return content
    parts = []
    for item in content:
        if item.get("type") != "text":
            return None
        parts.append(item.get("text", ""))
    return "\n".join(parts)


def old_results(messages: list[dict[str, Any]], keep_recent: int) -> list[tuple[int, dict]]:
    """(message index, tool_result block) of every result but the ``keep_recent`` newest."""
    found: list[tuple[int, dict]] = []
    for i, message in enumerate(messages):
        if message.get("role") != "user" or not isinstance(message.get("content"), list):
            continue
        for block in message["content"]:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                found.append((i, block))
    return found[: max(0, len(found) - keep_recent)]


def tool_names(messages: list[dict[str, Any]]) -> dict[str, str]:
    """tool_use id -> tool name, over the whole context."""
    names: dict[str, str] = {}
    for message in messages:
        if message.get("role") != "assistant" or not isinstance(message.get("content"), list):
            continue
        for block in message["content"]:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                names[block.get("id", "")] = block.get("name", "")
    return names

"""Clipping: old write/edit inputs whose content is on disk become pointers.

A ``write_file`` call carries the whole file in its input, and that input stays in
the context long after the file exists on disk, where the agent can read its
current (and more accurate) content at any time. Past ``clip_fraction`` of the
budget, such inputs older than the most recent few are rewritten (the message is
replaced by a copy, never changed in place): every long string argument but the
path becomes a one-line pointer to the file. Only
calls that succeeded are clipped (a failed write's content is not on disk), and
the tool_use block itself, its id and its name stay, so tool_use/tool_result
pairing is untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..model.wire import replace_block
from .config import ContextConfig
from .tokens import estimate_text

CLIP_MARK = "[clipped:"
_PATH_KEYS = ("path", "file_path", "filename", "file")


@dataclass
class ClipReport:
    """What one clipping pass did."""

    call_ids: list[str] = field(default_factory=list)
    tokens_saved: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)
    """Messages replaced by rewritten copies (their cached sizes must be forgotten)."""


def _failed_calls(messages: list[dict[str, Any]]) -> set[str]:
    failed: set[str] = set()
    for message in messages:
        if message.get("role") != "user" or not isinstance(message.get("content"), list):
            continue
        for block in message["content"]:
            if (
                isinstance(block, dict)
                and block.get("type") == "tool_result"
                and block.get("is_error")
            ):
                failed.add(block.get("tool_use_id", ""))
    return failed


def _path_of(args: dict[str, Any]) -> str:
    for key in _PATH_KEYS:
        value = args.get(key)
        if isinstance(value, str):
            return value
    return "the file it wrote"


def _clip_input(args: dict[str, Any], min_chars: int) -> tuple[dict[str, Any], int]:
    """A copy of ``args`` with long content strings replaced; returns (copy, tokens saved)."""
    path = _path_of(args)
    clipped: dict[str, Any] = {}
    saved = 0
    for key, value in args.items():
        if key not in _PATH_KEYS and isinstance(value, str) and len(value) > min_chars:
            pointer = f"{CLIP_MARK} {len(value):,} chars, now on disk in {path}; read the file]"
            saved += estimate_text(value) - estimate_text(pointer)
            clipped[key] = pointer
        else:
            clipped[key] = value
    return clipped, saved


def clip_old_writes(messages: list[dict[str, Any]], config: ContextConfig) -> ClipReport:
    """Rewrite old, successful write/edit inputs to pointers, in place."""
    report = ClipReport()
    tools = set(config.clip_tools)
    uses: list[tuple[int, dict[str, Any]]] = []
    for index, message in enumerate(messages):
        if message.get("role") != "assistant" or not isinstance(message.get("content"), list):
            continue
        for block in message["content"]:
            if (
                isinstance(block, dict)
                and block.get("type") == "tool_use"
                and block.get("name") in tools
            ):
                uses.append((index, block))
    candidates = uses[: max(0, len(uses) - config.keep_recent_writes)]
    if not candidates:
        return report
    failed = _failed_calls(messages)
    for index, block in candidates:
        args = block.get("input")
        if not isinstance(args, dict) or block.get("id") in failed:
            continue
        new_args, saved = _clip_input(args, config.clip_min_chars)
        if saved <= 0:
            continue
        report.messages.append(messages[index])
        replace_block(messages, index, block, {**block, "input": new_args})
        report.call_ids.append(block.get("id", ""))
        report.tokens_saved += saved
    return report

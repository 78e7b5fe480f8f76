"""A durable conversation's file: one JSON document, appended to in place.

The file is ``{"messages":[`` on its first line, one message per line (every one
after the first opened by a comma), and ``]}`` on the last: a JSON document any
reader takes whole (:func:`read_messages`, the lead's ``told``, a person with ``jq``).
A turn's messages are added where the closing line was - written over it, the
closing line written again after them, fsynced - so a save costs the new messages'
bytes, not the whole conversation's: the file is rewritten whole (a temporary file,
fsynced, renamed over it) only when what it holds is not the start of the
conversation any more (the context compacted or offloaded an older message - it
replaces a message rather than changing it, the contract of
:mod:`subagents.model.wire`, so "the same" is "the same objects").

Crash safety, as the whole-file rewrite had it: whatever instant the process dies,
the file reads back as a whole conversation ending at a message boundary. A write cut
short can leave only the last line torn (no closing line, or half a message): the
file is then no JSON document, and :func:`read_messages` takes its lines one by one,
up to the last whole message. The next save after a restore rewrites the file whole,
so a torn tail is never appended to.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .model.wire import encode_json

_HEAD = b'{"messages":[\n'
_TAIL = b"]}\n"


def _encode(message: Any) -> bytes:
    try:
        return encode_json(message)
    except UnicodeEncodeError:  # a lone surrogate from the model: kept as an escape
        return json.dumps(message, separators=(",", ":")).encode("ascii")


class _Kept:
    """One message as the file holds it: the objects it was encoded from, and its line."""

    __slots__ = ("blocks", "content", "line", "message")

    def __init__(self, message: Any, line: bytes) -> None:
        self.message, self.line = message, line
        self.content = message.get("content") if isinstance(message, dict) else None
        self.blocks = len(self.content) if isinstance(self.content, list) else -1

    def same(self, message: Any) -> bool:
        content = message.get("content") if isinstance(message, dict) else None
        return (
            message is self.message
            and content is self.content
            and (len(content) if isinstance(content, list) else -1) == self.blocks
        )


class TranscriptFile:
    """The messages of one conversation on disk (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._kept: list[_Kept] = []
        """What the file holds, in order (empty: nothing known, the next save rewrites)."""
        self._end = 0
        """Where the closing line starts."""

    def save(self, messages: list[Any]) -> None:
        """Make the file hold ``messages``: appended when it holds their start."""
        kept = self._kept
        n = len(kept)
        if n and n <= len(messages) and all(map(_Kept.same, kept, messages)):
            if n < len(messages):
                self._append(messages[n:])
            return
        self._rewrite(messages)

    def forget(self) -> None:
        """The file was removed or replaced by someone else: the next save rewrites it."""
        self._kept, self._end = [], 0

    def _append(self, messages: list[Any]) -> None:
        new = [_Kept(m, _encode(m)) for m in messages]
        body = b"".join(b"," + k.line + b"\n" for k in new)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_NOFOLLOW)
        except OSError:  # gone (a forgotten transcript): start it again
            self._rewrite([k.message for k in self._kept] + messages)
            return
        try:
            os.pwrite(fd, body + _TAIL, self._end)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._kept += new
        self._end += len(body)

    def _rewrite(self, messages: list[Any]) -> None:
        known = {id(k.message): k for k in self._kept}
        kept = []
        for m in messages:
            hit = known.get(id(m))
            kept.append(hit if hit is not None and hit.same(m) else _Kept(m, _encode(m)))
        lines = [k.line + b"\n" for k in kept]
        body = _HEAD + b",".join(lines)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as fh:
            fh.write(body + _TAIL)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        self._kept, self._end = kept, len(body)


def read_messages(path: Path, limit: int) -> list[Any] | None:
    """The messages a transcript file holds, up to its last whole one; None when it
    is missing, over ``limit`` bytes, or not a transcript at all."""
    if not path.is_file():
        return None
    try:
        with path.open("rb") as fh:
            raw = fh.read(limit + 1)
    except OSError:
        return None
    if len(raw) > limit:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return _whole_lines(raw)
    messages = data.get("messages") if isinstance(data, dict) else None
    return messages if isinstance(messages, list) else None


def _whole_lines(raw: bytes) -> list[Any] | None:
    """A file whose last write was cut short: its whole message lines, in order."""
    lines = raw.split(b"\n")
    if not lines or lines[0] + b"\n" != _HEAD:
        return None
    messages = []
    for i, line in enumerate(lines[1:]):
        if i and not line.startswith(b","):
            break  # the closing line, or a torn one
        try:
            messages.append(json.loads(line[1:] if i else line))
        except (ValueError, RecursionError):
            break
    return messages

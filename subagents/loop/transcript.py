"""A durable conversation's file: one JSON document, appended to in place.

The file is ``{"messages":[`` on its first line, one message per line (every one
after the first opened by a comma), and ``]}`` on the last: a JSON document any
reader takes whole (:func:`read_messages`, the lead's ``told``, a person with ``jq``).
A turn's messages are added where the closing line was - written over it, the
closing line written again after them - so a save costs the new messages' bytes, not
the whole conversation's: the file is rewritten whole (a temporary file, fsynced,
renamed over it) only when what it holds is not the start of the conversation any more
(the context compacted or offloaded an older message - it replaces a message rather
than changing it, the contract of :mod:`subagents.model.wire`, so "the same" is "the
same objects").

Crash safety, as the whole-file rewrite had it: whatever instant the process dies,
the file reads back as a whole conversation ending at a message boundary. A write cut
short can leave only the last line torn (no closing line, or half a message): the
file is then no JSON document, and :func:`read_messages` takes its lines one by one,
up to the last whole message. The next save after a restore rewrites the file whole,
so a torn tail is never appended to.

Durability: a group commit. An append is written (``pwrite``) at once but fsynced
only by :meth:`TranscriptFile.sync`, which the conversation calls before each model
call (so a turn's answer and its tool results share one fsync: it was one an
append, two a turn, about 0.15 ms of CPU each - ``bench/README.md``), before a
checkpoint the new messages supersede is removed (:mod:`subagents.durable`) and when
the member ends (before the journal records it). What each failure keeps:

- the coordinator killed (SIGKILL, a crash of Python, Ctrl-C): everything appended -
  a written page lives in the kernel's page cache, which outlives the process;
- the machine losing power or its kernel crashing: everything up to the last sync;
  the messages of the turn under way (the model's answer and the tool results that
  followed it) may be lost, and the member goes on from the turn before, which is
  where it would have been had the power gone a moment earlier. Whatever is lost
  is lost from the end: the file still reads back whole up to a message boundary.
"""

from __future__ import annotations

import json
import operator
import os
from pathlib import Path
from typing import Any

from ..model.wire import encode_json

_HEAD = b'{"messages":[\n'
_TAIL = b"]}\n"


def _encode(message: Any) -> bytes:
    try:
        return encode_json(message)
    except UnicodeEncodeError:  # a lone surrogate from the model: kept as an escape
        return json.dumps(message, separators=(",", ":")).encode("ascii")


_content = operator.itemgetter("content")


class _Shape:
    """Messages as the file holds them: the objects they were encoded from (held, so
    that no id is reused while it is compared), their contents' lengths, their lines.
    Compared with ``map`` and list equality: a save looks at every message it holds,
    and that look must cost next to nothing for a conversation of hundreds."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.contents: list[Any] = []
        self.ids: list[int] = []
        self.content_ids: list[int] = []
        self.lengths: list[int] = []
        self.lines: list[bytes] = []

    def add(self, messages: list[Any], lines: list[bytes]) -> None:
        """Hold these too; raises KeyError or TypeError for a message of no content."""
        contents = list(map(_content, messages))
        lengths = list(map(len, contents))
        self.messages += messages
        self.contents += contents
        self.ids += map(id, messages)
        self.content_ids += map(id, contents)
        self.lengths += lengths
        self.lines += lines

    def start_of(self, messages: list[Any]) -> bool:
        """Whether ``messages`` begin with what is held, the same objects unchanged."""
        n = len(self.ids)
        if n > len(messages):
            return False
        head = messages[:n]
        if list(map(id, head)) != self.ids:
            return False
        try:
            contents = list(map(_content, head))
            return list(map(id, contents)) == self.content_ids and (
                list(map(len, contents)) == self.lengths
            )
        except (KeyError, TypeError):
            return False

    def lines_of(self, messages: list[Any]) -> list[bytes | None]:
        """The held line of each message that is held unchanged, else None."""
        where = {id(m): i for i, m in enumerate(self.messages)}
        found: list[bytes | None] = []
        for m in messages:
            i = where.get(id(m))
            content = m.get("content") if isinstance(m, dict) else None
            if i is not None and content is self.contents[i] and len(content) == self.lengths[i]:
                found.append(self.lines[i])
            else:
                found.append(None)
        return found


class TranscriptFile:
    """The messages of one conversation on disk (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._held = _Shape()
        """What the file holds, in order (empty: nothing known, the next save rewrites)."""
        self._end = 0
        """Where the closing line starts."""
        self._unsynced = False
        """Appends were written since the last fsync."""

    def save(self, messages: list[Any]) -> None:
        """Make the file hold ``messages``: appended when it holds their start."""
        held = self._held
        if held.ids and held.start_of(messages):
            if len(held.ids) < len(messages):
                self._append(messages[len(held.ids) :])
            return
        self._rewrite(messages)

    def _append(self, messages: list[Any]) -> None:
        lines = [_encode(m) for m in messages]
        body = b"".join(b"," + line + b"\n" for line in lines)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_NOFOLLOW)
        except OSError:  # gone (a forgotten transcript): start it again
            self._rewrite(self._held.messages + messages)
            return
        try:
            os.pwrite(fd, body + _TAIL, self._end)
        finally:
            os.close(fd)
        self._unsynced = True
        self._held.add(messages, lines)
        self._end += len(body)

    def sync(self) -> None:
        """Make what was appended since the last sync durable (fsync; a no-op when
        nothing was). A file that is gone (forgotten) has nothing to keep."""
        if not self._unsynced:
            return
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_NOFOLLOW)
        except OSError:
            self._unsynced = False
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._unsynced = False

    def _rewrite(self, messages: list[Any]) -> None:
        held = self._held.lines_of(messages)
        lines = [line or _encode(m) for line, m in zip(held, messages, strict=True)]
        body = _HEAD + b",".join(line + b"\n" for line in lines)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as fh:
            fh.write(body + _TAIL)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        self._unsynced = False
        self._held, self._end = _Shape(), len(body)
        try:
            self._held.add(messages, lines)
        except (KeyError, TypeError):  # not a message the loop writes: rewrite next time
            self._held = _Shape()


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

"""Request bodies as bytes, each message serialized once per member.

The official client prepares every request by walking and copying the whole body
(so that a retry can send it again) and then JSON-encodes it: at 200 turns that was
most of the coordinator's CPU per turn, spent on history that had not changed since
the previous turn. :class:`BodyEncoder` builds the JSON text of a Messages API
request itself, from fragments cached per message, and the adapter hands the client
those bytes (``content=``), which it sends as they are: only what is new in a turn
(the latest messages, the blocks that carry cache breakpoints) is encoded again.

The contract that makes the cache safe: **a message handed to the model is never
changed in place.** Whoever changes one (an offload, a clip, a todo recitation
retired) replaces it in the conversation with a new dict, and a block with a new
block (:func:`replace_block`). A cached fragment is used only while the message
object and its content list are the same objects as when it was encoded and the
list has as many blocks (and, outside the unchanged run of messages at the start of
the conversation, the same block objects), so appending a block or replacing the
content list is seen; assigning a key inside a block in place would not be, and is
what the contract rules out.
"""

from __future__ import annotations

import json
import operator
from typing import Any

from pydantic import BaseModel

from .base import ModelRequest

MAX_BREAKPOINTS = 4
_EPHEMERAL = {"type": "ephemeral"}


def _plain(value: Any) -> Any:
    """What a pydantic model in a message (a dumped response block) is sent as."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


_ENCODE = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=_plain
).encode


def encode_json(value: Any) -> bytes:
    """Compact JSON, as the client itself encodes a body."""
    return _ENCODE(value).encode()


class BodyEncoder:
    """JSON bytes of request parameters; message and list-item fragments are cached."""

    def __init__(self) -> None:
        self._items: dict[int, _Entry] = {}
        """id(item) -> its entry, for the items of the last request."""
        self._last: list[_Entry] = []
        """The entries of the last request's messages, in order."""
        self._shape: list[tuple[int, int, int]] = []
        """Their objects' ids, their contents' ids and lengths (the entries hold the
        objects, so no id is reused while it is compared)."""

    def encode(self, params: dict[str, Any]) -> bytes:
        """The request body for ``params`` (``messages``, ``tools`` and ``system`` lists
        are encoded item by item, other fields as they are)."""
        used: dict[int, _Entry] = {}
        parts = [b"{"]
        for key, value in params.items():
            parts += (encode_json(key), b":")
            if key in ("messages", "tools", "system") and isinstance(value, list):
                if key == "messages":
                    entries = self._messages(value, used)
                else:
                    entries = [self._entry(v, used) for v in value]
                parts += (b"[", b",".join([e[3] for e in entries]), b"]")
            else:
                parts.append(encode_json(value))
            parts.append(b",")
        parts[-1] = b"}"
        # Only the items of this request stay: a compacted-away message is let go.
        self._items = used
        return b"".join(parts)

    def _messages(self, messages: list[Any], used: dict[int, _Entry]) -> list[_Entry]:
        """Entries of the messages: the run of messages unchanged since the last request
        (same objects, same content lists of the same length) is taken as it was,
        without looking inside; the rest item by item."""
        now = _shape(messages)
        same = _common_start(self._shape, now)
        entries = self._last[:same]
        for entry in entries:
            used[id(entry[0])] = entry
        entries += [self._entry(m, used) for m in messages[same:]]
        self._last, self._shape = entries, now
        return entries

    def _entry(self, item: Any, used: dict[int, _Entry]) -> _Entry:
        content = item.get("content") if isinstance(item, dict) else None
        blocks = tuple(content) if isinstance(content, list) else ()
        hit = self._items.get(id(item))
        if (
            hit is not None
            and hit[0] is item
            and hit[1] is content
            and len(hit[2]) == len(blocks)
            and all(map(operator.is_, hit[2], blocks))
        ):
            used[id(item)] = hit
            return hit
        entry = (item, content, blocks, encode_json(item))
        used[id(item)] = entry
        return entry


_Entry = tuple[Any, Any, tuple[Any, ...], bytes]
"""(item, its content, its content's blocks, its JSON)."""
_content = operator.methodcaller("get", "content")


def _shape(messages: list[Any]) -> list[tuple[int, int, int]]:
    """Each message's id, its content's id and its content's length (0: not a list),
    made with ``map`` alone: a request compares hundreds of them."""
    contents = list(map(_content, messages))
    lengths = [len(c) if type(c) is list else 0 for c in contents]
    return list(zip(map(id, messages), map(id, contents), lengths, strict=True))


def _common_start(a: list[Any], b: list[Any]) -> int:
    """How many leading items ``a`` and ``b`` share: list comparisons (in C) halving
    the run, not one Python step an item."""
    low, high = 0, min(len(a), len(b))
    if a[:high] == b[:high]:
        return high
    while low < high:  # the shared run is at least low items, at most high
        mid = (low + high + 1) // 2
        if a[low:mid] == b[low:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def build_params(
    request: ModelRequest,
    model: str,
    *,
    cache: bool = True,
    unchanged: int | None = None,
    marks: MarkCounter | None = None,
) -> dict[str, Any]:
    """Messages API parameters for ``request``, with cache breakpoints when ``cache``;
    ``unchanged``: how many leading messages are the previous request's (see
    :func:`place_breakpoints`); ``marks``: the caller's count of the messages' own
    ``cache_control`` marks, kept across its requests."""
    params: dict[str, Any] = {
        "model": model,
        "max_tokens": request.max_tokens,
        "messages": list(request.messages),
    }
    if isinstance(request.system, str):
        system = [{"type": "text", "text": request.system}] if request.system else []
    else:
        system = list(request.system)
    if system:
        params["system"] = system
    if request.tools:
        params["tools"] = list(request.tools)
    if request.temperature is not None:
        params["temperature"] = request.temperature
    if request.tool_choice is not None:
        params["tool_choice"] = request.tool_choice
    if request.context_management is not None:
        params["context_management"] = request.context_management
    if cache:
        in_messages = None
        if marks is not None:
            in_messages = marks.count(params["messages"], unchanged or 0)
        place_breakpoints(params, unchanged=unchanged, in_messages=in_messages)
    return params


class MarkCounter:
    """The ``cache_control`` marks already in a conversation's messages, each message's
    counted once: a request's first ``unchanged`` messages are the previous request's
    own objects (a message is replaced, never changed: see :func:`replace_block`), so
    their count stands, and only the new ones are read. Counting every block of the
    history again was a pass over the whole conversation per request (0.1-0.3 ms at
    100-200 turns)."""

    def __init__(self) -> None:
        self._totals: list[int] = []
        """``_totals[i]``: the marks in the messages up to and including ``i``."""

    def count(self, messages: list[Any], unchanged: int) -> int:
        totals = self._totals
        del totals[max(0, unchanged) :]
        running = totals[-1] if totals else 0
        for message in messages[len(totals) :]:
            running += _marks(message.get("content") if isinstance(message, dict) else None)
            totals.append(running)
        return running


def place_breakpoints(
    params: dict[str, Any], *, unchanged: int | None = None, in_messages: int | None = None
) -> int:
    """Add ``cache_control`` (copying touched blocks); returns the total breakpoints.

    ``unchanged`` (the first ``unchanged`` messages are those of the previous request,
    the one after them was rewritten: an offload or aging batch) adds a breakpoint at
    the end of the unchanged run, so the history before the rewrite is still read
    from the cache: without it the cache looks back only 20 blocks from each
    breakpoint and would write the whole history again.
    """
    used = _marks(params.get("tools")) + _marks(params.get("system"))
    if in_messages is None:
        in_messages = sum(_marks(m.get("content")) for m in params["messages"])
    used += in_messages
    messages = params["messages"]
    slots: dict[str, tuple[list[Any], int]] = {}
    points = [("latest", len(messages) - 1), ("previous", len(messages) - 3)]
    if unchanged is not None and 0 < unchanged < len(messages) - 3:
        points.append(("rewritten", unchanged - 1))
    for name, index in points:
        if index >= 0:
            messages[index] = _with_list_content(messages[index])
            if messages[index]["content"]:
                slots[name] = (messages[index]["content"], len(messages[index]["content"]) - 1)
    for key in ("tools", "system"):
        if params.get(key):
            slots[key] = (params[key], len(params[key]) - 1)
    # When fewer than four slots are free, the latest turn matters most, then the
    # system prompt (whose prefix covers the tools), then the history before a
    # rewrite, then the safety net.
    for name in ("latest", "system", "rewritten", "previous", "tools"):
        if name not in slots or used >= MAX_BREAKPOINTS:
            continue
        container, index = slots[name]
        block = container[index]
        if block.get("cache_control") or block.get("type") in ("thinking", "redacted_thinking"):
            continue
        if block.get("type") == "text" and not block.get("text"):
            continue
        container[index] = {**block, "cache_control": dict(_EPHEMERAL)}
        used += 1
    return used


def _with_list_content(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, str):
        blocks = [{"type": "text", "text": content}] if content else []
        return {**message, "content": blocks}
    return {**message, "content": list(content or [])}


def _marks(blocks: Any) -> int:
    """Blocks of a list that carry ``cache_control`` (0 for a string or nothing)."""
    if not isinstance(blocks, list):
        return 0
    return sum(1 for b in blocks if isinstance(b, dict) and b.get("cache_control"))


def replace_block(
    messages: list[dict[str, Any]], index: int, old: dict[str, Any], new: dict[str, Any]
) -> dict[str, Any]:
    """Put ``new`` where ``old`` is in ``messages[index]``, as a new message (the old
    one is left as it was); returns the new message."""
    message = messages[index]
    content = [new if block is old else block for block in message["content"]]
    messages[index] = {**message, "content": content}
    return messages[index]


class StreamedMessage:
    """A streamed answer's raw events (dicts, as the client decoded them from the
    stream) gathered into the message's dict, as the SDK's own stream helper does:
    text, thinking and citations appended, a tool's input JSON parsed when its block
    ends, ``message_delta`` fields set and its cumulative usage taken over. Only the
    finished message is validated (once), rather than every event being built into a
    typed object on the way."""

    def __init__(self) -> None:
        self.message: dict[str, Any] | None = None
        self._json: dict[int, list[str]] = {}
        """Index -> the input JSON pieces of a tool_use block still streaming."""
        self._pieces: dict[tuple[int, str], list[str]] = {}
        """(index, field) -> the text or thinking pieces of a block still streaming,
        joined once when it ends: adding each delta to the string so far copied the
        whole text again per delta (a 30,000-token thinking block: gigabytes)."""
        self.saw_delta = False
        """Content arrived (from here on, a repeated call would be billed twice)."""

    def add(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            self.message = {**event["message"], "content": []}
            return
        message = self.message
        if message is None:
            raise RuntimeError(f"unexpected event order: {kind} before message_start")
        if kind == "content_block_start":
            message["content"].append(dict(event["content_block"]))
        elif kind == "content_block_delta":
            self.saw_delta = True
            self._delta(message["content"][event["index"]], event["index"], event["delta"])
        elif kind == "content_block_stop":
            self._join(message["content"][event["index"]], event["index"])
            pieces = self._json.pop(event["index"], None)
            if pieces:
                message["content"][event["index"]]["input"] = _tool_input("".join(pieces))
        elif kind == "message_delta":
            delta = event.get("delta") or {}
            for key in ("stop_reason", "stop_sequence", "stop_details"):
                message[key] = delta.get(key)
            if delta.get("container") is not None:
                message["container"] = delta["container"]
            # Usage on message_delta is cumulative: it overwrites; absent fields keep
            # the message_start value.
            usage = event.get("usage") or {}
            message["usage"] = {
                **(message.get("usage") or {}),
                **{k: v for k, v in usage.items() if v is not None},
            }

    def _delta(self, block: dict[str, Any], index: int, delta: dict[str, Any]) -> None:
        kind = delta.get("type")
        if kind == "text_delta" and block.get("type") == "text":
            self._piece(block, index, "text").append(delta["text"])
        elif kind == "input_json_delta" and "input" in block:
            self._json.setdefault(index, []).append(delta.get("partial_json", ""))
        elif kind == "citations_delta" and block.get("type") == "text":
            block["citations"] = [*(block.get("citations") or []), delta["citation"]]
        elif kind == "thinking_delta" and block.get("type") == "thinking":
            self._piece(block, index, "thinking").append(delta["thinking"])
        elif kind == "signature_delta" and block.get("type") == "thinking":
            block["signature"] = delta["signature"]

    def _piece(self, block: dict[str, Any], index: int, field: str) -> list[str]:
        pieces = self._pieces.get((index, field))
        if pieces is None:
            pieces = self._pieces[(index, field)] = [block.get(field) or ""]
        return pieces

    def _join(self, block: dict[str, Any], index: int) -> None:
        for field in ("text", "thinking"):
            pieces = self._pieces.pop((index, field), None)
            if pieces is not None:
                block[field] = "".join(pieces)

    def final(self) -> dict[str, Any]:
        """The whole message; raises if the stream ended before it began. A block whose
        stream never ended holds what arrived of it."""
        if self.message is None:
            raise RuntimeError("the stream ended without a message_start event")
        for index, _ in list(self._pieces):
            self._join(self.message["content"][index], index)
        return self.message


def _tool_input(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(
            f"Unable to parse tool parameter JSON from model: {exc}. JSON: {text[:2_000]}"
        ) from None

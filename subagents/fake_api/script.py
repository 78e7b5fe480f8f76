"""Scripting the fake server: what it answers, in order or by policy.

A script is a list of items consumed one per ``POST /v1/messages``, or a policy
callable ``(request_json) -> item`` asked for every request. An item is a
:class:`Reply` (built with :func:`text`, :func:`tool_use`, :func:`reply`), a
:class:`Fault` (:func:`rate_limited`, :func:`overloaded`, :func:`server_error`,
:func:`overloaded_mid_stream`, :func:`fault`), or a plain message dict with a
``content`` list. Faults are items too, so "429 then success" is simply
``[rate_limited(), text("ok")]`` - the SDK's retry consumes the next item.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict


class Reply(BaseModel):
    """One successful model answer."""

    model_config = ConfigDict(extra="forbid")

    content: list[dict[str, Any]]
    """Content blocks (``text``, ``tool_use``); tool_use ids may be left empty."""
    stop_reason: str | None = None
    """Defaults to ``tool_use`` when a tool_use block is present, else ``end_turn``."""
    latency_s: float = 0.0
    """Seconds the server waits before answering."""
    usage: dict[str, int] | None = None
    """Overrides the computed usage fields (e.g. ``{"output_tokens": 5}``)."""

    def final_stop_reason(self) -> str:
        if self.stop_reason:
            return self.stop_reason
        has_tool = any(b.get("type") == "tool_use" for b in self.content)
        return "tool_use" if has_tool else "end_turn"


class Fault(BaseModel):
    """An error answer: an HTTP error status, or an SSE error event mid-stream."""

    model_config = ConfigDict(extra="forbid")

    status: int
    """HTTP status (429, 500, 529, ...); for a mid-stream fault, what a non-streaming
    request gets instead."""
    error_type: str
    """The API's ``error.type`` (``rate_limit_error``, ``overloaded_error``, ...)."""
    message: str
    retry_after: float | None = None
    """Seconds sent as ``retry-after`` (and ``retry-after-ms``), when set."""
    mid_stream: bool = False
    """Streaming requests get HTTP 200, ``message_start``, then an ``error`` event."""
    latency_s: float = 0.0


ScriptItem = Reply | Fault | dict[str, Any]
Policy = Callable[[dict[str, Any]], ScriptItem]


def text(value: str, *, stop_reason: str | None = None, latency_s: float = 0.0) -> Reply:
    """A reply holding one text block."""
    return Reply(
        content=[{"type": "text", "text": value}], stop_reason=stop_reason, latency_s=latency_s
    )


def tool_use(
    name: str, input: dict[str, Any] | None = None, *, id: str = "", latency_s: float = 0.0
) -> Reply:
    """A reply holding one tool_use block (the server fills an empty ``id``)."""
    block = {"type": "tool_use", "id": id, "name": name, "input": input or {}}
    return Reply(content=[block], latency_s=latency_s)


def reply(*parts: Reply | dict[str, Any], stop_reason: str | None = None) -> Reply:
    """Merge parts into one reply: ``reply(text("Two lookups"), tool_use(..), tool_use(..))``."""
    content: list[dict[str, Any]] = []
    latency = 0.0
    for part in parts:
        if isinstance(part, Reply):
            content.extend(part.content)
            latency = max(latency, part.latency_s)
        else:
            content.append(part)
    return Reply(content=content, stop_reason=stop_reason, latency_s=latency)


def fault(
    status: int,
    error_type: str,
    message: str,
    *,
    retry_after: float | None = None,
    mid_stream: bool = False,
) -> Fault:
    """Any error answer, shaped like the API's ``{"type": "error", "error": {...}}``."""
    return Fault(
        status=status,
        error_type=error_type,
        message=message,
        retry_after=retry_after,
        mid_stream=mid_stream,
    )


def rate_limited(retry_after: float = 0.05) -> Fault:
    """HTTP 429 ``rate_limit_error`` with a ``retry-after`` header (seconds)."""
    return fault(
        429,
        "rate_limit_error",
        "Number of requests exceeded your rate limit.",
        retry_after=retry_after,
    )


def overloaded() -> Fault:
    """HTTP 529 ``overloaded_error``."""
    return fault(529, "overloaded_error", "Overloaded")


def server_error() -> Fault:
    """HTTP 500 ``api_error``."""
    return fault(500, "api_error", "Internal server error")


def overloaded_mid_stream() -> Fault:
    """HTTP 200, ``message_start``, then an ``overloaded_error`` event before any delta.

    The SDK does not retry this one; a harness must.
    """
    return fault(529, "overloaded_error", "Overloaded", mid_stream=True)


class ScriptExhausted(Exception):
    """More requests arrived than the script holds."""


class Script:
    """Thread-safe source of answers: a list consumed in order, or a policy."""

    def __init__(self, items: Iterable[ScriptItem] | Policy) -> None:
        self._lock = threading.Lock()
        self._policy: Policy | None = items if callable(items) else None
        self._items: list[ScriptItem] = [] if callable(items) else list(items)
        self.served = 0
        """How many answers were handed out."""

    @property
    def remaining(self) -> int:
        """Unconsumed list items (0 for a policy)."""
        with self._lock:
            return len(self._items)

    def extend(self, items: Iterable[ScriptItem]) -> None:
        """Append items to a list script (e.g. between phases of a test)."""
        with self._lock:
            self._items.extend(items)

    def next(self, request: dict[str, Any]) -> Reply | Fault:
        """The answer to ``request``; raises :class:`ScriptExhausted` when none is left."""
        if self._policy is not None:
            item = self._policy(request)
        else:
            with self._lock:
                if not self._items:
                    raise ScriptExhausted(
                        f"fake API script exhausted: {self.served} responses were scripted "
                        f"and request {self.served + 1} arrived"
                    )
                item = self._items.pop(0)
        with self._lock:
            self.served += 1
        return as_item(item)


def as_item(item: ScriptItem) -> Reply | Fault:
    """Normalize a plain message dict into a :class:`Reply`."""
    if isinstance(item, Reply | Fault):
        return item
    if isinstance(item, dict) and isinstance(item.get("content"), list):
        return Reply(
            content=item["content"],
            stop_reason=item.get("stop_reason"),
            usage=item.get("usage"),
        )
    raise TypeError(f"a script item must be a Reply, Fault or message dict, got {item!r}")

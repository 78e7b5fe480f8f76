"""SSE encoding: a final message as the event sequence the real API streams.

``message_start`` (empty content, input usage), then per block
``content_block_start`` / ``content_block_delta``... / ``content_block_stop``
(text as ``text_delta`` chunks; tool_use input as ``input_json_delta`` chunks of
its JSON, starting with an empty ``partial_json`` as the API does), a ``ping``,
``message_delta`` (stop_reason and cumulative usage) and ``message_stop``. A
mid-stream fault is ``message_start`` followed by an ``error`` event.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

CHUNK_CHARS = 24
"""Characters per delta: small enough that every test exercises reassembly."""


def encode(event: str, data: dict[str, Any]) -> bytes:
    """One SSE frame."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _chunks(text: str) -> Iterator[str]:
    for i in range(0, len(text), CHUNK_CHARS):
        yield text[i : i + CHUNK_CHARS]


def _start_of(message: dict[str, Any]) -> dict[str, Any]:
    usage = dict(message["usage"], output_tokens=1)
    return dict(message, content=[], stop_reason=None, stop_sequence=None, usage=usage)


def _block_events(index: int, block: dict[str, Any]) -> Iterator[bytes]:
    kind = block.get("type")
    if kind == "text":
        yield encode(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "text", "text": ""},
            },
        )
        for piece in _chunks(block["text"]):
            delta = {"type": "text_delta", "text": piece}
            yield encode(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
    elif kind == "tool_use":
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        yield encode(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": start},
        )
        pieces = ["", *_chunks(json.dumps(block.get("input") or {}))]
        for piece in pieces:
            delta = {"type": "input_json_delta", "partial_json": piece}
            yield encode(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
    else:
        # Other block kinds (thinking, server tool results) arrive whole in the start event.
        yield encode(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": block},
        )
    yield encode("content_block_stop", {"type": "content_block_stop", "index": index})


def stream_message(message: dict[str, Any]) -> Iterator[bytes]:
    """The full event sequence for a finished message."""
    yield encode("message_start", {"type": "message_start", "message": _start_of(message)})
    yield encode("ping", {"type": "ping"})
    for index, block in enumerate(message["content"]):
        yield from _block_events(index, block)
    yield encode(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": message["usage"],
        },
    )
    yield encode("message_stop", {"type": "message_stop"})


def stream_fault(message: dict[str, Any], error: dict[str, Any]) -> Iterator[bytes]:
    """``message_start`` then an ``error`` event, before any content delta."""
    yield encode("message_start", {"type": "message_start", "message": _start_of(message)})
    yield encode("error", {"type": "error", "error": error})

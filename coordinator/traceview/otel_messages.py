"""Messages API content in the OpenTelemetry GenAI message schemas, for span attributes.

The GenAI conventions give ``gen_ai.input.messages``, ``gen_ai.output.messages``,
``gen_ai.system_instructions`` and ``gen_ai.tool.definitions`` JSON schemas: a
message is ``{role, parts}``; a part is typed - ``text`` (``content``),
``tool_call`` (``id``, ``name``, ``arguments``), ``tool_call_response`` (``id``,
``response``), ``reasoning`` (``content``); an output message also has a
``finish_reason`` (``stop``, ``length``, ``content_filter``, ``tool_call``,
``error``, or the provider's own word when none fits). Anthropic's content blocks
map one to one. A user message's ``tool_result`` blocks become a ``tool`` message
(the schema's place for tool responses) and its text a ``user`` message, in their
order; a block with no counterpart keeps its type as a generic part.

The Python SDK's span attributes cannot hold nested values, so each attribute is a
JSON string, which the conventions allow. :func:`fit` keeps it under the size cap
collectors accept *as valid JSON*: long strings are shortened first, then messages
dropped from the middle - the first (the task) and the latest stay, as they say
what was asked and what the model answered to (the conventions let
instrumentations truncate) - never a cut in the middle of the JSON text.
"""

from __future__ import annotations

import json
from typing import Any

_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_call",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}


def finish_reason(stop_reason: str | None) -> str:
    """The conventions' finish reason for an Anthropic ``stop_reason``."""
    if not stop_reason:
        return "stop"
    return _FINISH.get(stop_reason, stop_reason)


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [b.get("text", "") if b.get("type") == "text" else f"[{b.get('type')}]"
                 for b in content if isinstance(b, dict)]  # fmt: skip
        return "\n".join(texts)
    return "" if content is None else str(content)


def parts(content: Any) -> list[dict[str, Any]]:
    """One message's content (a string or Anthropic blocks) as typed parts."""
    if isinstance(content, str):
        return [{"type": "text", "content": content}] if content else []
    out: list[dict[str, Any]] = []
    for block in content or []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            out.append({"type": "text", "content": block.get("text", "")})
        elif kind == "tool_use":
            out.append({"type": "tool_call", "id": block.get("id"), "name": block.get("name", ""),
                        "arguments": block.get("input")})  # fmt: skip
        elif kind == "tool_result":
            out.append({"type": "tool_call_response", "id": block.get("tool_use_id"),
                        "response": _result_text(block.get("content"))})  # fmt: skip
        elif kind == "thinking":
            out.append({"type": "reasoning", "content": block.get("thinking", "")})
        else:
            out.append({"type": str(kind or "unknown")})
    return out


def input_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A conversation (Messages API ``messages``) as the schema's input messages."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role", "user")
        group: list[dict[str, Any]] = []
        for part in parts(message.get("content")):
            to = "tool" if part["type"] == "tool_call_response" else role
            if not group or group[-1]["role"] != to:
                group.append({"role": to, "parts": []})
            group[-1]["parts"].append(part)
        out += group
    return out


def output_messages(content: list[dict[str, Any]], stop_reason: str | None) -> list[dict[str, Any]]:
    """One response (its content blocks) as the schema's single output message."""
    return [{"role": "assistant", "parts": parts(content),
             "finish_reason": finish_reason(stop_reason)}]  # fmt: skip


def system_instructions(system: str) -> list[dict[str, Any]]:
    return [{"type": "text", "content": system}] if system else []


def tool_definitions(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool definitions as the schema has them: ``function`` tools with their
    ``parameters``; a server tool (it carries its own ``type``) by type and name."""
    out = []
    for tool in tools:
        if "input_schema" in tool:
            out.append({"type": "function", "name": tool.get("name", ""),
                        "description": tool.get("description", ""),
                        "parameters": tool["input_schema"]})  # fmt: skip
        else:
            out.append({"type": str(tool.get("type", "function")), "name": tool.get("name", "")})
    return out


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _shorten(value: Any, cap: int) -> Any:
    if isinstance(value, str) and len(value) > cap:
        return f"{value[:cap]}... [{len(value) - cap} more characters]"
    if isinstance(value, list):
        return [_shorten(v, cap) for v in value]
    if isinstance(value, dict):
        return {k: _shorten(v, cap) for k, v in value.items()}
    return value


def fit(value: Any, limit: int) -> str:
    """``value`` as JSON of at most ``limit`` characters, still valid JSON: strings
    shortened, then (a list) items dropped from the middle, the first and the last
    kept longest; empty JSON if nothing fits."""
    text = _dumps(value)
    for cap in (2_000, 300, 40):
        if len(text) <= limit:
            return text
        short = _shorten(value, cap)
        while isinstance(short, list) and len(short) > 2 and len(_dumps(short)) > limit:
            del short[len(short) // 2]
        if isinstance(short, list) and len(short) == 2 and len(_dumps(short)) > limit:
            short = short[:1]  # the first (the task) says what the rest was about
        text = _dumps(short)
    if len(text) <= limit:
        return text
    return "[]" if isinstance(value, list) else "{}"

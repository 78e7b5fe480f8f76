"""Request validation: reject what the real Messages API rejects, with its wording.

Only the rules a harness can break by accident are checked (roles, tool_use /
tool_result pairing, empty content, required fields, cache breakpoint count,
tool names); each failure is one ``invalid_request_error`` message naming the
offending path, as the real API does (``messages.2.content.0: ...``).

Consecutive messages of one role are not an error: the real API combines them into
one turn, so the fake does too (:func:`merge_turns`) and checks tool_use /
tool_result pairing on the combined turns - a ``tool_result`` message followed by a
separate user text message is one user turn, as the model sees it. Paths in pairing
errors count combined turns; every other path counts the messages as sent.
"""

from __future__ import annotations

import re
from typing import Any

MAX_CACHE_BREAKPOINTS = 4
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")


class InvalidRequest(Exception):
    """The request breaks an API rule; the message is what the API would say."""


def validate_messages_request(
    body: dict[str, Any], *, count_tokens: bool = False
) -> list[dict[str, Any]]:
    """Raise :class:`InvalidRequest` for a malformed ``/v1/messages`` body.

    Returns the conversation as the model sees it: consecutive same-role messages
    combined into one turn.
    """
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise InvalidRequest("model: Field required")
    if not count_tokens:
        max_tokens = body.get("max_tokens")
        if max_tokens is None:
            raise InvalidRequest("max_tokens: Field required")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise InvalidRequest("max_tokens: Input should be a positive integer")
    messages = body.get("messages")
    if messages is None:
        raise InvalidRequest("messages: Field required")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages: at least one message is required")
    _check_system(body.get("system"))
    names = _check_tools(body.get("tools"))
    _check_tool_choice(body.get("tool_choice"), names)
    _check_roles(messages)
    for i, message in enumerate(messages):
        _check_content(i, message, last=i == len(messages) - 1)
    turns = merge_turns(messages)
    _check_tool_pairing(turns)
    _check_breakpoints(body)
    return turns


def merge_turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive messages of one role as one message whose content is all their blocks."""
    turns: list[dict[str, Any]] = []
    for message in messages:
        if turns and turns[-1]["role"] == message["role"]:
            content = _as_blocks(turns[-1]["content"]) + _as_blocks(message["content"])
            turns[-1] = {"role": message["role"], "content": content}
        else:
            turns.append(message)
    return turns


def _as_blocks(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content)


def _check_system(system: Any) -> None:
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list):
        raise InvalidRequest("system: Input should be a valid string or list of text blocks")
    for j, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise InvalidRequest(f"system.{j}: Input tag should be 'text'")
        if not block.get("text"):
            raise InvalidRequest(f"system.{j}: text content blocks must be non-empty")


def _check_tools(tools: Any) -> set[str]:
    if tools is None:
        return set()
    if not isinstance(tools, list):
        raise InvalidRequest("tools: Input should be a valid list")
    names: set[str] = set()
    for j, tool in enumerate(tools):
        name = tool.get("name") if isinstance(tool, dict) else None
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise InvalidRequest(
                f"tools.{j}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'"
            )
        if name in names:
            raise InvalidRequest(f"tools: Tool names must be unique. Duplicate: {name}")
        # Server tools carry a ``type`` (e.g. web_search_20250305) and no schema.
        if "type" not in tool and not isinstance(tool.get("input_schema"), dict):
            raise InvalidRequest(f"tools.{j}.custom.input_schema: Field required")
        names.add(name)
    return names


def _check_tool_choice(choice: Any, names: set[str]) -> None:
    if not isinstance(choice, dict) or choice.get("type") != "tool":
        return
    if choice.get("name") not in names:
        raise InvalidRequest(
            f"tool_choice: Tool '{choice.get('name')}' not found in the provided tools"
        )


def _check_roles(messages: list[Any]) -> None:
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise InvalidRequest(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        if i == 0 and role != "user":
            raise InvalidRequest('messages: first message must use the "user" role')


def _check_content(i: int, message: dict[str, Any], *, last: bool) -> None:
    content = message.get("content")
    # The one exception the API allows: an empty final assistant message (prefill).
    may_be_empty = last and message["role"] == "assistant"
    if isinstance(content, str):
        if not content and not may_be_empty:
            raise InvalidRequest(
                f"messages.{i}: all messages must have non-empty content except for the "
                "optional final assistant message"
            )
        return
    if not isinstance(content, list):
        raise InvalidRequest(f"messages.{i}.content: Input should be a valid string or list")
    if not content and not may_be_empty:
        raise InvalidRequest(
            f"messages.{i}: all messages must have non-empty content except for the "
            "optional final assistant message"
        )
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise InvalidRequest(f"messages.{i}.content.{j}: Input should be a content block")
        kind = block["type"]
        if kind == "text" and not block.get("text"):
            raise InvalidRequest(
                f"messages.{i}.content.{j}.text: text content blocks must be non-empty"
            )
        if kind == "tool_use" and message["role"] != "assistant":
            raise InvalidRequest(
                f"messages.{i}.content.{j}: tool_use blocks can only appear in assistant messages"
            )
        if kind == "tool_result" and message["role"] != "user":
            raise InvalidRequest(
                f"messages.{i}.content.{j}: tool_result blocks can only appear in user messages"
            )


def _blocks(message: dict[str, Any], kind: str) -> list[tuple[int, dict[str, Any]]]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [(j, b) for j, b in enumerate(content) if b.get("type") == kind]


def _check_tool_pairing(messages: list[dict[str, Any]]) -> None:
    for i, message in enumerate(messages):
        if message["role"] == "user":
            asked = {b.get("id") for _, b in _blocks(messages[i - 1], "tool_use")} if i else set()
            for j, block in _blocks(message, "tool_result"):
                if block.get("tool_use_id") not in asked:
                    raise InvalidRequest(
                        f"messages.{i}.content.{j}: unexpected `tool_use_id` found in "
                        f"`tool_result` blocks: {block.get('tool_use_id')}. Each `tool_result` "
                        "block must have a corresponding `tool_use` block in the previous message."
                    )
            continue
        ids = [b.get("id") for _, b in _blocks(message, "tool_use")]
        if len(set(ids)) != len(ids):
            raise InvalidRequest(f"messages.{i}: `tool_use` ids must be unique")
        answered = (
            {b.get("tool_use_id") for _, b in _blocks(messages[i + 1], "tool_result")}
            if i + 1 < len(messages)
            else set()
        )
        missing = [x for x in ids if x not in answered]
        if missing:
            raise InvalidRequest(
                f"messages.{i + 1 if i + 1 < len(messages) else i}: `tool_use` ids were found "
                f"without `tool_result` blocks immediately after: {', '.join(map(str, missing))}. "
                "Each `tool_use` block must have a corresponding `tool_result` block in the next "
                "message."
            )


def count_breakpoints(body: dict[str, Any]) -> int:
    """How many blocks carry ``cache_control`` (tools, system, message content)."""
    blocks: list[Any] = list(body.get("tools") or [])
    if isinstance(body.get("system"), list):
        blocks += body["system"]
    for message in body.get("messages") or []:
        if isinstance(message.get("content"), list):
            blocks += message["content"]
    return sum(1 for b in blocks if isinstance(b, dict) and b.get("cache_control"))


def _check_breakpoints(body: dict[str, Any]) -> None:
    found = count_breakpoints(body)
    if found > MAX_CACHE_BREAKPOINTS:
        raise InvalidRequest(
            f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {found}."
        )

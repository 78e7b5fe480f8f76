"""Offline models: deterministic policies and trace replay, never a real model's words.

Both implement the :class:`~subagents.model.base.Model` seam, answer every call with
``offline=True`` and a model name starting with ``offline`` or ``replay:``, and bill
nothing (their profile prices are zero). Usage is estimated locally with the same
rule the loop uses (:mod:`subagents.model.tokens`), so budgets and compaction
behave as they would with a real model.

- :class:`OfflineModel` asks a *policy*, a callable ``(ModelRequest) -> answer``
  where an answer is a ``Message``, a list of content blocks (dicts or block models)
  or one block. Policies live in a small registry (:func:`register_policy`,
  :func:`get_policy`) so kinds can ship their own (``research``, ``coding``); the
  ``echo`` policy here is the trivial one tests use. The built-in kinds' policies
  are imported on first use, so every name :func:`policy_names` lists resolves
  whether or not the kind's module was imported first (the fake API server's
  ``--policy research`` imports no kind).
- :class:`ReplayModel` replays the ``ModelCall.content`` of a member's
  ``trace.jsonl`` in order, and fails clearly when the loop asks for more turns
  than were recorded (the run diverged from the recording).
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import secrets
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from subagents.model.base import ModelError, ModelRequest, ModelResponse
from subagents.model.message import Message
from subagents.model.profiles import offline_profile
from subagents.trace import ModelCall, read_trace

from .tokens import estimate_block, estimate_message, estimate_text

PolicyAnswer = Message | list[Any] | dict[str, Any]
PolicyFn = Callable[[ModelRequest], PolicyAnswer | Awaitable[PolicyAnswer]]

_POLICIES: dict[str, PolicyFn] = {}
_POLICIES_LOCK = threading.Lock()
# Modules that register the built-in kinds' policies. They are small (no browser or
# SDK imports), but importing them eagerly here would be circular: they import this.
_BUILTIN_POLICIES = {
    "coding": "subagents.model.offline_coding",
    "lead": "subagents.model.offline_lead",
    "research": "subagents.model.offline_research",
}


def register_policy(name: str, fn: PolicyFn) -> PolicyFn:
    """Register ``fn`` as ``offline:<name>``; returns ``fn`` (usable as a decorator body)."""
    if not name or ":" in name:
        raise ValueError(f"a policy name must be non-empty and contain no ':', got {name!r}")
    with _POLICIES_LOCK:
        _POLICIES[name] = fn
    return fn


def policy_names() -> list[str]:
    """Names :func:`get_policy` resolves (registered or built in), sorted."""
    with _POLICIES_LOCK:
        return sorted(set(_POLICIES) | set(_BUILTIN_POLICIES))


def get_policy(name: str) -> PolicyFn:
    """The policy registered as ``name``; :class:`ModelError` naming the known ones if none."""
    with _POLICIES_LOCK:
        fn = _POLICIES.get(name)
    if fn is None and name in _BUILTIN_POLICIES:
        importlib.import_module(_BUILTIN_POLICIES[name])  # registers it at import
        with _POLICIES_LOCK:
            fn = _POLICIES.get(name)
    if fn is None:
        raise ModelError(
            f"no offline policy named {name!r}; registered: {', '.join(policy_names())} "
            "(a kind registers its own with subagents.model.offline.register_policy)"
        )
    return fn


def estimate_input(request: ModelRequest) -> int:
    """Local estimate of the input tokens of ``request`` (system, tools, messages)."""
    system = request.system
    total = estimate_text(system) if isinstance(system, str) else sum(map(estimate_block, system))
    total += sum(estimate_block(t) for t in request.tools)
    return total + sum(estimate_message(m) for m in request.messages)


def build_message(
    content: list[dict[str, Any]],
    *,
    model: str,
    input_tokens: int,
    stop_reason: str | None = None,
    message_id: str,
    usage: dict[str, int] | None = None,
) -> Message:
    """A :class:`Message` from content dicts, with local usage unless ``usage`` is given."""
    if stop_reason is None:
        has_tool = any(b.get("type") == "tool_use" for b in content)
        stop_reason = "tool_use" if has_tool else "end_turn"
    counted = {
        "input_tokens": input_tokens,
        "output_tokens": max(1, sum(estimate_block(b) for b in content)),
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    }
    return Message.model_validate(
        {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {**counted, **(usage or {})},
        }
    )


def answer_blocks(answer: PolicyAnswer) -> tuple[list[dict[str, Any]], str | None]:
    """A policy's answer as content dicts plus its stop_reason (None: decide from blocks)."""
    if not isinstance(answer, Message) and getattr(answer, "type", None) == "message":
        answer = Message.model_validate(answer)  # e.g. an SDK ``Message`` a test built
    if isinstance(answer, Message):
        return [b.model_dump(exclude_none=True) for b in answer.content], answer.stop_reason
    items = answer if isinstance(answer, list) else [answer]
    blocks = [b if isinstance(b, dict) else b.model_dump(exclude_none=True) for b in items]
    return blocks, None


class OfflineModel:
    """A deterministic policy behind the model seam; always labelled offline."""

    offline = True

    def __init__(self, policy: PolicyFn | str, name: str | None = None) -> None:
        if isinstance(policy, str):
            name = name or f"offline:{policy}"
            policy = get_policy(policy)
        name = name or "offline"
        if not name.startswith("offline"):
            raise ValueError(f"an offline model's name must start with 'offline', got {name!r}")
        self.name = name
        self.policy = policy
        self.profile = offline_profile(name)
        self._ids = itertools.count(1)
        # Every member has its own model: a random tag keeps tool-call and message ids
        # unique across members (and runs), as the API's are; the answers stay the same.
        self._tag = secrets.token_hex(4)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        answer = self.policy(request)
        if inspect.isawaitable(answer):
            answer = await answer
        blocks, stop_reason = answer_blocks(answer)
        n = next(self._ids)
        for j, block in enumerate(blocks):
            if block.get("type") == "tool_use" and not block.get("id"):
                block["id"] = f"toolu_offline_{self._tag}_{n:04d}_{j}"
        message = build_message(
            blocks,
            model=self.name,
            input_tokens=estimate_input(request),
            stop_reason=stop_reason,
            message_id=f"msg_offline_{self._tag}_{n:04d}",
        )
        return ModelResponse(message=message, offline=True)

    async def count_tokens(self, request: ModelRequest) -> int | None:
        return estimate_input(request)

    async def aclose(self) -> None:
        """Nothing to release: an offline model holds no connection."""


class ReplayModel:
    """Replays the model outputs recorded in a member's ``trace.jsonl``, in order."""

    offline = True

    def __init__(self, trace_path: str | Path) -> None:
        self.path = Path(trace_path)
        if not self.path.is_file():
            raise ModelError(
                f"replay trace not found: {self.path} (give the trace.jsonl of a member, "
                "e.g. runs/<run-id>/members/<member-id>/trace.jsonl)"
            )
        hint = (
            "give the trace.jsonl of a member, e.g. runs/<run-id>/members/<member-id>/trace.jsonl"
        )
        try:
            events = list(read_trace(self.path))
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelError(
                f"replay trace {self.path} cannot be read as a trace ({exc}); {hint}"
            ) from None
        self.calls: list[ModelCall] = [e for e in events if e.type == "model_call"]
        if not self.calls:
            raise ModelError(
                f"replay trace {self.path} records no model calls (is it a member's trace?); {hint}"
            )
        self.name = f"replay:{self.path}"
        self.profile = offline_profile(self.name)
        self.position = 0
        """How many recorded calls were replayed."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        if self.position >= len(self.calls):
            raise ModelError(
                f"replay of {self.path} ran out: {len(self.calls)} model calls were recorded "
                f"and call {self.position + 1} was asked for (the run diverged from the "
                "recording, or it was cut short)"
            )
        call = self.calls[self.position]
        self.position += 1
        usage = {
            "input_tokens": call.input_tokens or estimate_input(request),
            "cache_read_input_tokens": call.cache_read_tokens,
            "cache_creation_input_tokens": call.cache_write_tokens,
        }
        if call.output_tokens:
            usage["output_tokens"] = call.output_tokens
        message = build_message(
            [dict(b) for b in call.content],
            model=self.name,
            input_tokens=usage["input_tokens"],
            stop_reason=call.stop_reason,
            message_id=f"msg_replay_{self.position:04d}",
            usage=usage,
        )
        return ModelResponse(message=message, offline=True)

    async def count_tokens(self, request: ModelRequest) -> int | None:
        return estimate_input(request)

    async def aclose(self) -> None:
        """Nothing to release: an offline model holds no connection."""


def _task_text(request: ModelRequest) -> str:
    first = request.messages[0]["content"] if request.messages else ""
    if isinstance(first, str):
        return first
    return "\n".join(b.get("text", "") for b in first if b.get("type") == "text")


def _fill(schema: dict[str, Any], task: str) -> dict[str, Any]:
    """Smallest input satisfying ``schema``'s required fields; strings get the task."""
    defaults = {"string": task, "array": [], "object": {}, "integer": 0, "number": 0.0}
    result: dict[str, Any] = {}
    for key in schema.get("required", []):
        prop = schema.get("properties", {}).get(key, {})
        kind = prop.get("type", "string")
        if "enum" in prop:
            result[key] = prop["enum"][0]
        elif kind == "boolean":
            result[key] = False
        else:
            result[key] = defaults.get(kind if isinstance(kind, str) else "string", task)
    return result


def with_required_fields(request: ModelRequest, args: dict[str, Any]) -> dict[str, Any]:
    """``args`` for ``submit_result`` plus whatever else its schema in ``request``
    requires (a job's own result fields), filled as :func:`_fill` does, so an offline
    policy's answer passes a job that asks for more than the kind's result."""
    for tool in request.tools:
        if tool.get("name") == "submit_result":
            missing = _fill(tool.get("input_schema") or {}, _task_text(request))
            return {**{k: v for k, v in missing.items() if k not in args}, **args}
    return args


def echo_policy(request: ModelRequest) -> list[dict[str, Any]]:
    """Submits the task text via ``submit_result`` when that tool exists, else says it."""
    task = _task_text(request)
    tool = next((t for t in request.tools if t.get("name") == "submit_result"), None)
    last = request.messages[-1]["content"] if request.messages else ""
    already = isinstance(last, list) and any(b.get("type") == "tool_result" for b in last)
    if tool is None or already:
        return [{"type": "text", "text": task}]
    return [
        {"type": "tool_use", "name": "submit_result", "input": _fill(tool["input_schema"], task)}
    ]


register_policy("echo", echo_policy)

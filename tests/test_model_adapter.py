"""AnthropicModel through the real ``anthropic`` client against the fake server."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest

from subagents.fake_api import (
    FakeMessagesAPI,
    fault,
    overloaded,
    overloaded_mid_stream,
    rate_limited,
    reply,
    server_error,
    text,
    tool_use,
)
from subagents.model.base import Model, ModelError, ModelRequest
from subagents.model.claude import AnthropicModel, build_params
from subagents.model.governor import RateGovernor
from subagents.trace import Retry, TraceWriter, read_trace

pytestmark = pytest.mark.anyio
MODEL = "claude-sonnet-5"


def request(**kw: Any) -> ModelRequest:
    base: dict[str, Any] = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 64}
    base.update(kw)
    return ModelRequest(**base)


def make(api: FakeMessagesAPI, **kw: Any) -> AnthropicModel:
    kw.setdefault("backoff_s", 0.01)
    kw.setdefault("governor", RateGovernor())  # each test its own: no pause carried over
    return AnthropicModel(MODEL, api_key="test", base_url=api.url, **kw)


async def test_text_reply_with_usage_and_profile() -> None:
    with FakeMessagesAPI([text("Hello back.")]) as api:
        async with make(api) as model:
            assert isinstance(model, Model)
            response = await model.complete(request())
    assert response.message.content[0].text == "Hello back."
    assert response.message.usage.output_tokens > 0 and response.retries == 0
    assert response.offline is False and response.latency_s > 0
    assert model.profile.known and model.profile.context_window == 1_000_000
    assert api.requests[0]["stream"] is True  # always streamed


async def test_several_tool_uses_streamed() -> None:
    answer = reply(tool_use("read", {"path": "a.py" * 20}), tool_use("grep", {"pattern": "x"}))
    with FakeMessagesAPI([answer]) as api:
        async with make(api) as model:
            response = await model.complete(request())
    blocks = response.message.content
    assert [(b.name, b.input) for b in blocks] == [
        ("read", {"path": "a.py" * 20}),
        ("grep", {"pattern": "x"}),
    ]
    assert response.message.stop_reason == "tool_use"


async def test_429_retry_after_is_honoured_and_traced(tmp_path: Path) -> None:
    trace = TraceWriter(tmp_path / "trace.jsonl", run="r", member="m")
    seen: list[Retry] = []
    with FakeMessagesAPI([rate_limited(retry_after=0.4), text("ok")]) as api:
        async with make(api, trace=trace, on_retry=seen.append) as model:
            started = time.monotonic()
            response = await model.complete(request())
            elapsed = time.monotonic() - started
    trace.close()
    assert response.retries == 1 and elapsed >= 0.4
    assert seen[0].delay_s == pytest.approx(0.4) and "429" in seen[0].reason
    events = [e for e in read_trace(tmp_path / "trace.jsonl") if e.type == "retry"]
    assert len(events) == 1 and events[0].attempt == 1


async def test_529_then_success_counts_one_retry() -> None:
    with FakeMessagesAPI([overloaded(), text("ok")]) as api:
        async with make(api) as model:
            response = await model.complete(request())
    assert response.retries == 1 and [r.status for r in api.log] == [529, 200]


async def test_mid_stream_overload_before_first_delta_is_retried() -> None:
    seen: list[Retry] = []
    script = [overloaded_mid_stream(), overloaded_mid_stream(), text("finally")]
    with FakeMessagesAPI(script) as api:
        async with make(api, on_retry=seen.append) as model:
            response = await model.complete(request())
    assert response.message.content[0].text == "finally"
    assert response.retries == 2 and len(api.requests) == 3
    assert all("overloaded_error" in r.reason for r in seen)


async def test_retries_exhausted_give_retryable_model_error() -> None:
    with FakeMessagesAPI([server_error()] * 3) as api:
        async with make(api, max_retries=2) as model:
            with pytest.raises(ModelError) as info:
                await model.complete(request())
    assert info.value.retryable and "after 2 retries" in str(info.value)
    assert len(api.requests) == 3


async def test_overloads_do_not_spend_retries_while_the_governor_is_patient() -> None:
    script = [overloaded_mid_stream(), overloaded(), overloaded_mid_stream(), text("finally")]
    with FakeMessagesAPI(script) as api:
        async with make(api, max_retries=1, governor=RateGovernor()) as model:
            response = await model.complete(request())
    assert response.message.content[0].text == "finally" and response.retries == 3


async def test_overloads_fail_the_call_once_the_governor_runs_out_of_patience() -> None:
    with FakeMessagesAPI(lambda body: overloaded()) as api:
        governor = RateGovernor(patience_s=2.5)
        async with make(api, max_retries=0, governor=governor) as model:
            started = time.monotonic()
            with pytest.raises(ModelError) as info:
                await model.complete(request())
    # Pauses of 1 s then 2 s: the third answer comes after the patience ran out.
    assert info.value.retryable and info.value.status == 529
    assert 2.5 <= time.monotonic() - started < 6 and len(api.requests) == 3


async def test_bad_request_is_not_retried_and_says_why() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "x", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
                {"type": "tool_result", "tool_use_id": "t9", "content": "?"},
            ],
        },
    ]
    with FakeMessagesAPI([text("never")]) as api:
        async with make(api) as model:
            with pytest.raises(ModelError) as info:
                await model.complete(request(messages=messages))
    assert not info.value.retryable and info.value.status == 400
    assert "t9" in str(info.value) and len(api.requests) == 1


async def test_401_tells_to_set_the_key() -> None:
    with FakeMessagesAPI([text("never")], api_key="right") as api:
        async with make(api) as model:
            with pytest.raises(ModelError, match="ANTHROPIC_API_KEY") as info:
                await model.complete(request())
    assert info.value.status == 401 and not info.value.retryable


async def test_x_should_retry_false_is_obeyed() -> None:
    with FakeMessagesAPI([fault(400, "invalid_request_error", "nope"), text("x")]) as api:
        async with make(api) as model:
            with pytest.raises(ModelError, match="nope"):
                await model.complete(request())
    assert api.script.remaining == 1


def test_missing_key_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    with pytest.raises(ModelError, match="set ANTHROPIC_API_KEY"):
        AnthropicModel(MODEL)


def _marks(body: dict[str, Any]) -> list[str]:
    found = [f"tools.{i}" for i, t in enumerate(body.get("tools", [])) if "cache_control" in t]
    found += [f"system.{i}" for i, b in enumerate(body.get("system", [])) if "cache_control" in b]
    for i, m in enumerate(body["messages"]):
        if isinstance(m["content"], list):
            found += [
                f"messages.{i}.{j}" for j, b in enumerate(m["content"]) if "cache_control" in b
            ]
    return found


def _conversation() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "task: " + "context " * 800},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "data"}],
        },
    ]


TOOLS = [
    {"name": "read", "description": "Read.", "input_schema": {"type": "object"}},
    {"name": "grep", "description": "Grep.", "input_schema": {"type": "object"}},
]


async def test_cache_breakpoints_placed_and_prefix_read_from_cache() -> None:
    messages = _conversation()
    original = copy.deepcopy(messages)
    req = request(system="You are a careful engineer.", tools=TOOLS, messages=messages)
    with FakeMessagesAPI([tool_use("grep", {}, id="t2"), text("done")]) as api:
        async with make(api) as model:
            first = await model.complete(req)
            messages += [
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t2", "name": "grep", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "hit"}],
                },
            ]
            second = await model.complete(req.model_copy(update={"messages": messages}))
    assert _marks(api.requests[0]) == ["tools.1", "system.0", "messages.0.0", "messages.2.0"]
    assert _marks(api.requests[1]) == ["tools.1", "system.0", "messages.2.0", "messages.4.0"]
    assert messages[:3] == original  # the caller's context was not mutated
    assert first.message.usage.cache_creation_input_tokens > 1000
    assert second.message.usage.cache_read_input_tokens == (
        first.message.usage.cache_creation_input_tokens
    )


def test_never_more_than_four_breakpoints() -> None:
    mark = {"type": "ephemeral"}
    messages = _conversation()
    messages[0] = {"role": "user", "content": [
        {"type": "text", "text": "a", "cache_control": mark},
        {"type": "text", "text": "b", "cache_control": mark},
        {"type": "text", "text": "c", "cache_control": mark}]}  # fmt: skip
    params = build_params(request(system="s", tools=TOOLS, messages=messages), MODEL)
    assert _marks(params) == ["messages.0.0", "messages.0.1", "messages.0.2", "messages.2.0"]
    assert "cache_control" not in params["system"][0]  # the latest turn took the last slot
    off = build_params(
        request(system="s", tools=TOOLS, messages=_conversation()), MODEL, cache=False
    )
    assert _marks(off) == []


async def test_context_management_only_when_asked() -> None:
    edits = {"edits": [{"type": "compact_20260112"}, {"type": "clear_tool_uses_20250919"}]}
    with FakeMessagesAPI([text("a"), text("b")]) as api:
        async with make(api) as model:
            await model.complete(request())
            await model.complete(request(context_management=edits))
    plain, managed = api.log
    assert "context_management" not in plain.body and "anthropic-beta" not in plain.headers
    assert managed.body["context_management"] == edits
    betas = managed.headers["anthropic-beta"]
    assert "compact-2026-01-12" in betas and "context-management-2025-06-27" in betas


async def test_count_tokens_via_api_or_none() -> None:
    with FakeMessagesAPI([]) as api:
        async with make(api) as model:
            counted = await model.count_tokens(request(system="sys", tools=TOOLS))
    assert isinstance(counted, int) and counted > 0
    with FakeMessagesAPI([], count_tokens=False) as api:
        async with make(api) as model:
            assert await model.count_tokens(request()) is None


async def test_server_side_compaction_block_round_trips() -> None:
    answer = {"content": [{"type": "compaction", "content": "summary of earlier turns"},
                          {"type": "text", "text": "continuing"}]}  # fmt: skip
    edits = {"edits": [{"type": "compact_20260112"}]}
    with FakeMessagesAPI([answer]) as api:
        async with make(api) as model:
            response = await model.complete(request(context_management=edits))
    dumped = [b.model_dump(mode="json", exclude_none=True) for b in response.message.content]
    assert dumped == answer["content"]

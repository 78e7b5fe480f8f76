"""What the adapter puts on the wire, and what it costs per turn and per member.

Through the real ``anthropic`` client against the fake Messages API: the body is
handed over as bytes (the client has nothing to copy or encode), each message is
encoded once, a message the context replaced or extended is sent as it is now, and
a streamed answer is gathered into the same message the SDK's own helper builds.
"""

from __future__ import annotations

import json
import ssl
from typing import Any

import anthropic
import pytest
from anthropic._utils import _prepare

from subagents.fake_api import FakeMessagesAPI, reply, text, tool_use
from subagents.model.base import ModelRequest
from subagents.model.claude import AnthropicModel
from subagents.model.wire import BodyEncoder, replace_block
from subagents.tools.base import Tool, ToolOutput

pytestmark = pytest.mark.anyio
MODEL = "claude-sonnet-5"


def conversation(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "go"}]}]
    for t in range(turns):
        call = {"type": "tool_use", "id": f"toolu_{t}", "name": "shell", "input": {"n": t}}
        messages.append({"role": "assistant", "content": [call]})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{t}", "content": f"out {t}"}
        messages.append({"role": "user", "content": [result]})
    return messages


def request(messages: list[dict[str, Any]]) -> ModelRequest:
    return ModelRequest.model_construct(
        system="sys",
        messages=messages,
        tools=[{"name": "shell", "description": "run", "input_schema": {"type": "object"}}],
        max_tokens=64,
        temperature=None,
        tool_choice=None,
        context_management=None,
    )


def without(key: str, value: Any) -> Any:
    """``value`` with ``key`` dropped at every depth (cache_control; the ids the fake
    server numbers by arrival)."""
    if isinstance(value, dict):
        return {k: without(key, v) for k, v in value.items() if k != key}
    if isinstance(value, list):
        return [without(key, v) for v in value]
    return value


async def test_the_client_gets_bytes_it_need_not_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    walked: list[Any] = []
    real = _prepare.copy_tree

    def counting(data: object, **kw: Any) -> Any:
        walked.append(data)
        return real(data, **kw)

    monkeypatch.setattr(_prepare, "copy_tree", counting)
    messages = conversation(50)
    with FakeMessagesAPI([text("a"), text("b"), text("c")]) as api:
        async with AnthropicModel(MODEL, api_key="k", base_url=api.url) as model:
            for _ in range(3):
                await model.complete(request(messages))
    bodies = [d for d in walked if isinstance(d, dict) and "messages" in d]
    assert bodies == []  # the SDK never walked (copied) a conversation
    assert len(api.requests) == 3 and len(api.requests[2]["messages"]) == 101


def test_each_message_is_encoded_once_while_it_is_unchanged() -> None:
    encoder, messages, encoded = BodyEncoder(), conversation(1), 0
    for turn in range(2, 40):
        messages += conversation(turn)[-2:]
        before = dict(encoder._items)
        encoder.encode({"model": MODEL, "messages": messages})
        encoded += sum(1 for m in messages if id(m) not in before)
    assert encoded == len(messages)  # every message once, however many turns re-sent it


async def test_a_replaced_or_extended_message_is_sent_as_it_is_now() -> None:
    messages = conversation(6)
    with FakeMessagesAPI([text("1"), text("2"), text("3")]) as api:
        async with AnthropicModel(MODEL, api_key="k", base_url=api.url) as model:
            await model.complete(request(messages))
            # An offload replaces an old result; the closing note is appended in place.
            old = messages[4]["content"][0]
            replace_block(messages, 4, old, {**old, "content": "[tool result offloaded]"})
            await model.complete(request(messages))
            messages[-1]["content"].append({"type": "text", "text": "Limit reached."})
            await model.complete(request(messages))
            sent = [without("cache_control", body["messages"]) for body in api.requests]
    assert sent[1][4]["content"][0]["content"] == "[tool result offloaded]"
    assert sent[2][-1]["content"][-1]["text"] == "Limit reached."
    assert sent[2] == messages


async def test_a_streamed_answer_is_gathered_as_the_sdk_gathers_it() -> None:
    answer = reply(
        {"type": "thinking", "thinking": "Two lookups.", "signature": "sig"},
        text("I will look up both " * 5),
        tool_use("search", {"query": "asyncio cancellation " * 4, "limit": 5}),
        tool_use("search", {"query": "shield", "nested": {"a": [1, 2, 3]}}),
    )
    ours_request = request([{"role": "user", "content": "look it up"}])
    with FakeMessagesAPI([answer, answer], min_cache_tokens=10**9) as api:
        async with AnthropicModel(MODEL, api_key="k", base_url=api.url) as model:
            ours = (await model.complete(ours_request)).message
        async with anthropic.AsyncAnthropic(api_key="k", base_url=api.url) as client:
            params = {k: v for k, v in ours_request.model_dump().items() if v is not None}
            async with client.messages.stream(model=MODEL, **params) as stream:
                sdks = await stream.get_final_message()
    # Compared as the harness records a message: its JSON form without empty fields.
    mine = without("id", ours.model_dump(mode="json", exclude_none=True))
    theirs = without("id", sdks.model_dump(mode="json", exclude_none=True))
    for block in theirs["content"]:  # the SDK's helper's own extra field
        block.pop("parsed_output", None)
    assert mine == theirs
    assert [b.type for b in ours.content] == ["thinking", "text", "tool_use", "tool_use"]


def test_members_share_one_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[Any] = []
    real = ssl.SSLContext.load_verify_locations

    def counting(self: ssl.SSLContext, *a: Any, **kw: Any) -> None:
        loads.append(a)
        real(self, *a, **kw)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counting)
    models = [AnthropicModel(MODEL, api_key="k", base_url="http://127.0.0.1:9") for _ in range(4)]
    assert len(models) == 4 and len(loads) <= 1  # the CA bundle is read once, not per member


def test_tool_schemas_are_built_once_per_input_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import BaseModel, ConfigDict

    class CountIn(BaseModel):
        model_config = ConfigDict(extra="forbid")
        n: int

    class Count(Tool):
        name = "count"
        description = "Count."
        Input = CountIn

        async def run(self, args: Any, ctx: Any) -> ToolOutput:
            return ToolOutput(text=str(args.n))

    built: list[Any] = []
    real = CountIn.model_json_schema

    def counting(*a: Any, **kw: Any) -> dict[str, Any]:
        built.append(a)
        return real(*a, **kw)

    monkeypatch.setattr(CountIn, "model_json_schema", counting)
    definitions = [Count().definition() for _ in range(5)]
    assert len(built) == 1
    assert definitions[0] == definitions[4] and "title" not in definitions[0]["input_schema"]
    definitions[0]["input_schema"]["properties"]["n"]["type"] = "changed"
    assert Count().definition()["input_schema"]["properties"]["n"]["type"] == "integer"


async def test_history_before_a_rewrite_far_back_is_still_a_cache_read() -> None:
    """An offload or aging batch rewrites a message 30 blocks back: past the cache's
    20-block lookback from the latest breakpoint, so only a breakpoint at the end of
    the unchanged history keeps it a cache read."""
    messages = conversation(0)
    with FakeMessagesAPI(lambda body: text("ok")) as api:
        async with AnthropicModel(MODEL, api_key="k", base_url=api.url) as model:
            for turn in range(40):  # turn by turn, as the loop sends them
                messages += [
                    {**m, "content": [{**m["content"][0], "content": "x" * 400}]}
                    if m["role"] == "user"
                    else m
                    for m in conversation(turn + 1)[-2:]
                ]
                await model.complete(request(messages))
            old = messages[50]["content"][0]
            replace_block(messages, 50, old, {**old, "content": "[tool result offloaded]"})
            messages += conversation(41)[-2:]
            response = await model.complete(request(messages))
    body = api.requests[-1]
    assert "cache_control" in body["messages"][49]["content"][-1]
    # About the history before the rewrite (the fake API counts its own JSON form).
    prefix = sum(len(json.dumps(m)) for m in messages[:49]) // 4
    assert response.message.usage.cache_read_input_tokens >= 0.8 * prefix


async def test_the_client_runs_on_the_sdks_aiohttp_transport() -> None:
    """The SDK's aiohttp transport reads a turn for less CPU than its httpx default."""
    with FakeMessagesAPI([text("hi")]) as api:
        async with AnthropicModel(MODEL, api_key="k", base_url=api.url) as model:
            assert isinstance(model.client._client, anthropic.DefaultAioHttpClient)
            answer = await model.complete(request(conversation(2)))
    assert answer.message.content[0].text == "hi"  # type: ignore[union-attr]


def test_without_aiohttp_the_client_falls_back_to_httpx(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(**kw: Any) -> Any:
        raise RuntimeError("To use the aiohttp client you must have installed the extra")

    monkeypatch.setattr(anthropic, "DefaultAioHttpClient", missing)
    model = AnthropicModel(MODEL, api_key="k", base_url="http://127.0.0.1:9")
    assert isinstance(model.client._client, anthropic.DefaultAsyncHttpxClient)


def _marks_in(body: dict[str, Any]) -> int:
    blocks = [*body.get("tools", []), *body.get("system", [])]
    for message in body["messages"]:
        if isinstance(message["content"], list):
            blocks += message["content"]
    return sum(1 for b in blocks if "cache_control" in b)


async def test_marks_the_conversation_carries_are_counted_as_it_changes() -> None:
    """The messages' own cache_control marks are counted once per message and kept
    across requests: a rewrite that adds or removes one, or a shorter history after a
    compaction, is counted as it is now, so no request carries more than the four
    breakpoints the API takes, nor leaves one unused that the count thought taken."""
    mark = {"type": "ephemeral"}
    messages = conversation(3)
    messages[0] = {**messages[0], "content": [{**messages[0]["content"][0], "cache_control": mark}]}
    sent: list[int] = []
    with FakeMessagesAPI(lambda body: text("ok")) as api:
        async with AnthropicModel(MODEL, api_key="k", base_url=api.url) as model:

            async def call() -> None:
                await model.complete(request(messages))
                sent.append(_marks_in(api.requests[-1]))

            await call()  # the task's own mark, then latest, system, previous (tools: no room)
            old = messages[2]["content"][0]
            replace_block(messages, 2, old, {**old, "cache_control": mark})  # a second one
            await call()
            messages += conversation(4)[-2:]
            await call()
            old = messages[2]["content"][0]  # and gone again
            replace_block(messages, 2, old, {k: v for k, v in old.items() if k != "cache_control"})
            await call()
            del messages[1:5]  # a compaction: the history is shorter, its marks with it
            await call()
            messages[0] = {**messages[0], "content": [{"type": "text", "text": "go"}]}
            await call()
    assert sent == [4, 4, 4, 4, 4, 4]
    assert all(_marks_in(body) <= 4 for body in api.requests)


def test_pieces_join_to_the_whole_block_even_when_the_stream_stops_inside_it() -> None:
    from subagents.model.wire import StreamedMessage

    gathered = StreamedMessage()
    start = {"id": "m", "type": "message", "role": "assistant", "content": [], "usage": {}}
    gathered.add({"type": "message_start", "message": start})
    events = [
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": "He"},
        },
        *[
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": c}}
            for c in "llo, world"
        ],
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
        },
        *[
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "thinking_delta", "thinking": w},
            }
            for w in ("so ", "far")
        ],
    ]
    for event in events:
        gathered.add(event)
    content = gathered.final()["content"]
    assert content[0]["text"] == "Hello, world"
    assert content[1]["thinking"] == "so far"  # no content_block_stop came

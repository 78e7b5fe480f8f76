"""The fake Messages API, exercised through the real ``anthropic`` client."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import anthropic
import anyio
import pytest
from process_support import with_default_signals

from subagents.fake_api import (
    FakeMessagesAPI,
    overloaded,
    overloaded_mid_stream,
    rate_limited,
    reply,
    server_error,
    text,
    tool_use,
)
from subagents.fake_api.__main__ import load_script

pytestmark = pytest.mark.anyio
USER = [{"role": "user", "content": "hello"}]


_OPEN: list[anthropic.AsyncAnthropic] = []


def client(api: FakeMessagesAPI, retries: int = 2, key: str = "test") -> anthropic.AsyncAnthropic:
    c = anthropic.AsyncAnthropic(base_url=api.url, api_key=key, max_retries=retries)
    _OPEN.append(c)
    return c


def client_at(url: str) -> anthropic.AsyncAnthropic:
    c = anthropic.AsyncAnthropic(base_url=url, api_key="x", max_retries=0)
    _OPEN.append(c)
    return c


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    # An unclosed client is closed by the GC on whatever loop runs then - a later
    # test's - and its pooled connections belong to a closed loop.
    yield
    while _OPEN:
        await _OPEN.pop().close()


async def stream(c: anthropic.AsyncAnthropic, **kw: Any) -> tuple[Any, list[Any]]:
    params: dict[str, Any] = {"model": "claude-test", "max_tokens": 100, "messages": USER}
    params.update(kw)
    events = []
    async with c.messages.stream(**params) as s:
        async for event in s:
            events.append(event)
        return await s.get_final_message(), events


async def test_streams_keep_the_connection_open() -> None:
    """The real API streams chunked over a kept-alive connection: a client making
    turn after turn pays one TCP connect, not one per turn."""
    with FakeMessagesAPI([text("one " * 20), text("two " * 20), text("three")]) as api:
        c = client(api)
        for expected in ("one", "two", "three"):
            final, _ = await stream(c)
            assert final.content[0].text.startswith(expected)
        peers = {entry.peer for entry in api.log}
        assert len(api.log) == 3 and len(peers) == 1, peers


async def test_a_kept_alive_stream_answers_without_waiting_on_acks() -> None:
    """Small writes on a kept-alive connection must not wait for the client's delayed
    ACK (40 ms each): a turn against the fake API costs what the script says. Such a
    stall hits every call, so the fastest of ten calls shows it; a busy machine slows
    some calls, not all ten."""
    with FakeMessagesAPI(lambda body: text("ok " * 30)) as api:
        c = client(api)
        await stream(c)
        calls = []
        for _ in range(10):
            started = time.perf_counter()
            await stream(c)
            calls.append(time.perf_counter() - started)
    assert min(calls) < 0.030, f"{sorted(round(t * 1000) for t in calls)} ms a call"


async def test_plain_text_json_and_stream() -> None:
    with FakeMessagesAPI([text("Hi there."), text("Streamed " * 10)]) as api:
        c = client(api)
        msg = await c.messages.create(model="claude-test", max_tokens=50, messages=USER)
        assert msg.content[0].text == "Hi there."
        assert msg.stop_reason == "end_turn"
        assert msg.model == "claude-test"
        assert msg.usage.input_tokens > 0 and msg.usage.output_tokens > 0
        final, events = await stream(c)
        assert final.content[0].text == "Streamed " * 10
        deltas = [e for e in events if e.type == "content_block_delta"]
        assert len(deltas) > 1  # really chunked, reassembled by the SDK
        assert api.requests[1]["stream"] is True


async def test_tool_use_streams_input_json_delta() -> None:
    args = {"query": "asyncio cancellation " * 5, "limit": 3, "tags": ["a", "b"]}
    with FakeMessagesAPI([tool_use("search", args, id="toolu_1")]) as api:
        final, events = await stream(client(api))
    block = final.content[0]
    assert (block.type, block.id, block.name, block.input) == (
        "tool_use",
        "toolu_1",
        "search",
        args,
    )
    assert final.stop_reason == "tool_use"
    partial = [e.delta.partial_json for e in events if e.type == "content_block_delta"]
    assert partial[0] == "" and len(partial) > 2


async def test_several_tool_uses_in_one_response_get_distinct_ids() -> None:
    answer = reply(text("Two lookups."), tool_use("read", {"p": 1}), tool_use("read", {"p": 2}))
    with FakeMessagesAPI([answer]) as api:
        final, _ = await stream(client(api))
    kinds = [b.type for b in final.content]
    assert kinds == ["text", "tool_use", "tool_use"]
    assert [b.input for b in final.content[1:]] == [{"p": 1}, {"p": 2}]
    assert final.content[1].id != final.content[2].id
    assert final.stop_reason == "tool_use"


async def test_429_with_retry_after_then_success() -> None:
    with FakeMessagesAPI([rate_limited(retry_after=0.3), text("ok")]) as api:
        started = time.monotonic()
        final, _ = await stream(client(api))
        elapsed = time.monotonic() - started
    assert final.content[0].text == "ok"
    assert [r.status for r in api.log] == [429, 200]
    assert elapsed >= 0.3  # the SDK honoured retry-after


@pytest.mark.parametrize("failure", [overloaded(), server_error()], ids=["529", "500"])
async def test_overloaded_or_server_error_then_success(failure: Any) -> None:
    with FakeMessagesAPI([failure, text("ok")]) as api:
        msg = await client(api).messages.create(model="m", max_tokens=10, messages=USER)
    assert msg.content[0].text == "ok"
    assert [r.status for r in api.log] == [failure.status, 200]


async def test_error_status_surfaces_when_retries_run_out() -> None:
    with FakeMessagesAPI([overloaded(), overloaded()]) as api:
        with pytest.raises(anthropic.APIStatusError) as info:
            await client(api, retries=1).messages.create(model="m", max_tokens=10, messages=USER)
    assert info.value.status_code == 529
    assert len(api.requests) == 2


async def test_mid_stream_overload_is_an_error_event_the_sdk_does_not_retry() -> None:
    with FakeMessagesAPI([overloaded_mid_stream(), text("later")]) as api:
        with pytest.raises(anthropic.APIStatusError) as info:
            await stream(client(api))
        assert info.value.body["error"]["type"] == "overloaded_error"
        assert len(api.requests) == 1 and api.script.remaining == 1
        final, _ = await stream(client(api))
    assert final.content[0].text == "later"


async def test_unmatched_tool_result_is_rejected_with_400() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_a", "name": "t", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": "x"},
            {"type": "tool_result", "tool_use_id": "toolu_zzz", "content": "y"},
        ]},
    ]  # fmt: skip
    with FakeMessagesAPI([text("never")]) as api:
        with pytest.raises(anthropic.BadRequestError) as info:
            await client(api).messages.create(model="m", max_tokens=10, messages=messages)
        assert api.script.remaining == 1  # a rejected request consumes nothing
    assert "unexpected `tool_use_id`" in str(info.value) and "toolu_zzz" in str(info.value)
    assert "messages.2.content.1" in str(info.value)


async def test_unanswered_tool_use_is_rejected() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_a", "name": "t", "input": {}},
            {"type": "tool_use", "id": "toolu_b", "name": "t", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": "x"}]},
    ]  # fmt: skip
    with FakeMessagesAPI([text("never")]) as api:
        with pytest.raises(anthropic.BadRequestError, match=r"without `tool_result`.*toolu_b"):
            await client(api).messages.create(model="m", max_tokens=10, messages=messages)


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"messages": [{"role": "assistant", "content": "hi"}]}, "first message"),
        ({"messages": [{"role": "user", "content": ""}]}, "non-empty content"),
        ({"messages": [{"role": "user", "content": []}]}, "non-empty content"),
        ({"max_tokens": None}, "max_tokens: Field required"),
        ({"model": None}, "model: Field required"),
        ({"tools": [{"name": "bad name!", "input_schema": {}}]}, "tools.0.name"),
    ],
    ids=["starts-with-assistant", "empty-string", "empty-list", "no-max-tokens",
         "no-model", "bad-tool-name"],
)  # fmt: skip
async def test_malformed_requests_get_invalid_request_error(
    params: dict[str, Any], needle: str
) -> None:
    body: dict[str, Any] = {"model": "m", "max_tokens": 10, "messages": USER, **params}
    body = {k: v for k, v in body.items() if v is not None}
    with FakeMessagesAPI([text("never")]) as api:
        # post() bypasses the SDK's own required-argument checks to reach the server.
        with pytest.raises(anthropic.BadRequestError) as info:
            await client(api).post("/v1/messages", body=body, cast_to=anthropic.types.Message)
    assert needle in str(info.value)
    assert info.value.body["error"]["type"] == "invalid_request_error"


async def test_consecutive_same_role_messages_are_combined_into_one_turn() -> None:
    seen: list[dict[str, Any]] = []

    def policy(body: dict[str, Any]) -> Any:
        seen.append(body)
        return text("ok")

    messages = [
        {"role": "user", "content": "first"},
        {"role": "user", "content": [{"type": "text", "text": "second"}]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_a", "name": "t", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": "x"}]},
        {"role": "user", "content": "a reminder after the result"},
    ]  # fmt: skip
    with FakeMessagesAPI(policy) as api:
        answer = await client(api).messages.create(model="m", max_tokens=10, messages=messages)
    assert answer.content[0].text == "ok"
    assert api.log[-1].status == 200 and api.requests[0]["messages"] == messages
    turns = seen[0]["messages"]
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert [b["text"] for b in turns[0]["content"]] == ["first", "second"]
    assert [b["type"] for b in turns[2]["content"]] == ["tool_result", "text"]


async def test_a_tool_result_two_user_turns_late_is_still_unmatched() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_a", "name": "t", "input": {}}]},
        {"role": "user", "content": "no result here"},
        {"role": "assistant", "content": "thinking"},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": "x"}]},
    ]  # fmt: skip
    with FakeMessagesAPI([text("never")]) as api:
        with pytest.raises(anthropic.BadRequestError, match="without `tool_result`"):
            await client(api).messages.create(model="m", max_tokens=10, messages=messages)


async def test_models_list_and_get_answer_like_the_real_api() -> None:
    from subagents.model.profiles import KNOWN_PROFILES

    with FakeMessagesAPI([], api_key="k") as api:
        c = client(api, key="k")
        first = await c.models.list(limit=5)
        assert len(first.data) == 5 and first.has_more and first.last_id == first.data[-1].id
        listed = [m.id async for m in await c.models.list(limit=5)]  # follows after_id pages
        assert listed == list(KNOWN_PROFILES)
        back = await c.models.list(before_id=listed[7], limit=3)
        assert [m.id for m in back.data] == listed[4:7] and back.has_more
        haiku = await c.models.retrieve("claude-haiku-4-5")
        assert (haiku.type, haiku.display_name) == ("model", "Claude Haiku 4.5")
        assert (haiku.max_input_tokens, haiku.max_tokens) == (200_000, 64_000)
        assert haiku.created_at.year == 1970  # unknown release date: the epoch, as the API allows
        with pytest.raises(anthropic.NotFoundError) as missing:
            await c.models.retrieve("claude-nonexistent-9")
        assert missing.value.body["error"]["type"] == "not_found_error"
        with pytest.raises(anthropic.BadRequestError, match="limit"):
            await c.models.list(limit=0)
        calls = len(api.log)
        with pytest.raises(anthropic.AuthenticationError):
            await client(api, key="wrong").models.list()
    assert len(api.log) == calls + 1  # JSON errors, none of them retried
    assert api.requests == []  # model listing is not a messages request


def _cached_request(turns: list[dict[str, Any]]) -> dict[str, Any]:
    system = [
        {"type": "text", "text": "You are careful. " * 400, "cache_control": {"type": "ephemeral"}}
    ]
    return {"model": "m", "max_tokens": 10, "system": system, "messages": turns}


async def test_repeated_prefix_reads_from_cache() -> None:
    turns = [{"role": "user", "content": [{"type": "text", "text": "question one"}]}]
    with FakeMessagesAPI([text("a"), text("b")]) as api:
        c = client(api)
        first = await c.messages.create(**_cached_request(turns))
        turns2 = [*turns, {"role": "assistant", "content": "a"},
                  {"role": "user", "content": "question two"}]  # fmt: skip
        second = await c.messages.create(**_cached_request(turns2))
    assert first.usage.cache_read_input_tokens == 0
    assert first.usage.cache_creation_input_tokens > 1000
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert second.usage.cache_creation_input_tokens == 0


async def test_moving_last_turn_breakpoint_hits_previous_turn() -> None:
    mark = {"type": "ephemeral"}
    turn1 = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "long " * 2000, "cache_control": mark}],
        }
    ]
    turn2 = [
        {"role": "user", "content": [{"type": "text", "text": "long " * 2000}]},
        {"role": "assistant", "content": "noted"},
        {"role": "user", "content": [{"type": "text", "text": "next", "cache_control": mark}]},
    ]  # fmt: skip
    with FakeMessagesAPI([text("noted"), text("b")]) as api:
        c = client(api)
        one = await c.messages.create(model="m", max_tokens=5, messages=turn1)
        two = await c.messages.create(model="m", max_tokens=5, messages=turn2)
    assert two.usage.cache_read_input_tokens == one.usage.cache_creation_input_tokens > 0
    assert two.usage.cache_creation_input_tokens > 0  # the new turn is written for next time


async def test_more_than_four_breakpoints_rejected() -> None:
    mark = {"type": "ephemeral"}
    content = [{"type": "text", "text": f"b{i}", "cache_control": mark} for i in range(5)]
    with FakeMessagesAPI([text("never")]) as api:
        with pytest.raises(anthropic.BadRequestError, match="maximum of 4 blocks"):
            await client(api).messages.create(
                model="m", max_tokens=5, messages=[{"role": "user", "content": content}]
            )


async def test_count_tokens_matches_usage_and_consumes_nothing() -> None:
    with FakeMessagesAPI([text("x")]) as api:
        c = client(api)
        counted = await c.messages.count_tokens(model="m", messages=USER)
        msg = await c.messages.create(model="m", max_tokens=5, messages=USER)
    assert counted.input_tokens == msg.usage.input_tokens > 0


async def test_policy_callable_sees_each_request() -> None:
    def policy(request: dict[str, Any]) -> Any:
        return text(f"you sent {len(request['messages'])} messages")

    with FakeMessagesAPI(policy) as api:
        msg = await client(api).messages.create(model="m", max_tokens=5, messages=USER)
    assert msg.content[0].text == "you sent 1 messages"


async def test_exhausted_script_and_broken_policy_fail_clearly_without_retry() -> None:
    with FakeMessagesAPI([]) as api:
        with pytest.raises(anthropic.BadRequestError, match="script exhausted"):
            await client(api).messages.create(model="m", max_tokens=5, messages=USER)
        assert len(api.requests) == 1

    def broken(request: dict[str, Any]) -> Any:
        raise KeyError("nope")

    with FakeMessagesAPI(broken) as api:
        with pytest.raises(anthropic.BadRequestError, match="policy raised KeyError"):
            await client(api).messages.create(model="m", max_tokens=5, messages=USER)


async def test_latency_and_auth() -> None:
    with FakeMessagesAPI([text("slow", latency_s=0.3)], api_key="right") as api:
        with pytest.raises(anthropic.AuthenticationError):
            await client(api).messages.create(model="m", max_tokens=5, messages=USER)
        good = client(api, key="right")
        started = time.monotonic()
        await good.messages.create(model="m", max_tokens=5, messages=USER)
        assert time.monotonic() - started >= 0.3


async def test_sync_client_works_too() -> None:
    def call(url: str) -> Any:
        with anthropic.Anthropic(base_url=url, api_key="test") as c:
            with c.messages.stream(model="m", max_tokens=5, messages=USER) as s:
                return s.get_final_message()

    with FakeMessagesAPI([tool_use("t", {"a": 1})]) as api:
        final = await anyio.to_thread.run_sync(call, api.url)
    assert final.content[0].input == {"a": 1}


async def test_command_line_server_answers_with_an_offline_policy(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "subagents.fake_api", "--port", str(port)]
    async with await anyio.open_process(with_default_signals(command)) as process:
        try:
            assert process.stderr is not None
            banner = b""
            with anyio.fail_after(20):
                while b"\n" not in banner:
                    banner += await process.stderr.receive()
            assert b"fake Messages API on" in banner
            c = client_at(f"http://127.0.0.1:{port}")
            msg = await c.messages.create(model="m", max_tokens=9, messages=USER)
            assert msg.content[0].text == "hello"  # the echo policy says the task back
        finally:
            process.terminate()
    script = tmp_path / "script.json"
    script.write_text('[{"fault": "overloaded"}, {"content": [{"type": "text", "text": "x"}]}]')
    items = load_script(script)
    assert items[0].status == 529 and items[1]["content"][0]["text"] == "x"
    script.write_text('[{"fault": "nope"}]')
    with pytest.raises(SystemExit, match="fault must be one of"):
        load_script(script)


async def _cli_answer(policy: str, task: str) -> anthropic.types.Message:
    """Start the command-line server (a fresh interpreter, as a user does) on any free
    port, read its URL from the banner, and ask it one question."""
    command = [sys.executable, "-m", "subagents.fake_api", "--policy", policy, "--port", "0"]
    async with await anyio.open_process(with_default_signals(command)) as process:
        try:
            assert process.stderr is not None
            banner = b""
            with anyio.fail_after(20):
                while b"\n" not in banner:
                    banner += await process.stderr.receive()
            url = banner.decode().split("fake Messages API on ", 1)[1].split()[0]
            assert f"ANTHROPIC_BASE_URL={url}" in banner.decode()
            messages = [{"role": "user", "content": task}]
            return await client_at(url).messages.create(model="m", max_tokens=50, messages=messages)
        finally:
            process.terminate()


async def test_command_line_server_serves_the_kinds_policies() -> None:
    """--policy research / coding work although no kind module was imported."""
    research = await _cli_answer("research", "widget prices in Europe")
    (search,) = [b for b in research.content if b.type == "tool_use"]
    assert search.name == "search" and "widget" in search.input["query"]
    coding = await _cli_answer("coding", "make the tests pass")
    assert next(b.name for b in coding.content if b.type == "tool_use") == "glob"


async def test_command_line_rejects_bad_input_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from subagents.fake_api.__main__ import main
    from subagents.model.offline import policy_names

    assert main(["--policy", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no offline policy named 'nope'" in err
    assert all(name in err for name in policy_names())
    assert {"coding", "echo", "research"} <= set(policy_names())
    assert main(["--script", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing.json: cannot read the script" in err
    (tmp_path / "bad.json").write_text('[{"fault": "nope"}]')
    assert main(["--script", str(tmp_path / "bad.json")]) == 2
    assert "fault must be one of" in capsys.readouterr().err
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in err


async def test_default_port_is_not_fleet_views(capsys: pytest.CaptureFixture[str]) -> None:
    from coordinator.cli import build_parser
    from subagents.fake_api.__main__ import main

    view_port = build_parser("view").parse_args(["view", "some-run"]).port
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    default = int(help_text.split("port on 127.0.0.1 (default ", 1)[1].split(",")[0])
    assert default != view_port and default != 0
    assert "0 = any free port" in help_text


async def test_rate_limits_send_the_real_headers_and_a_429_with_retry_after() -> None:
    from subagents.fake_api import RateLimits

    limits = RateLimits(requests_per_minute=2, input_tokens_per_minute=100_000, minute_s=60)
    with FakeMessagesAPI(lambda body: text("ok"), limits=limits) as api:
        c = client(api).with_options(max_retries=0)
        first = await c.messages.with_raw_response.create(model="m", max_tokens=50, messages=USER)
        headers = first.headers
        assert headers["anthropic-ratelimit-requests-limit"] == "2"
        assert headers["anthropic-ratelimit-requests-remaining"] == "1"
        assert int(headers["anthropic-ratelimit-input-tokens-remaining"]) < 100_000
        # RFC 3339, in the future: when the bucket is full again (one request: 30 s).
        reset = datetime.fromisoformat(
            headers["anthropic-ratelimit-requests-reset"].replace("Z", "+00:00")
        )
        assert 25 < reset.timestamp() - time.time() <= 31
        await c.messages.create(model="m", max_tokens=50, messages=USER)
        with pytest.raises(anthropic.RateLimitError) as info:
            await c.messages.create(model="m", max_tokens=50, messages=USER)
    response = info.value.response
    assert 25 <= float(response.headers["retry-after"]) <= 30
    assert response.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert info.value.body["error"]["type"] == "rate_limit_error"
    assert [r.status for r in api.log] == [200, 200, 429]
    assert api.limiter is not None and api.limiter.rejected == 1


async def test_command_line_rate_limit_flags_are_checked_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from subagents.fake_api.__main__ import main

    for argv, says in [
        (["--rpm", "0"], "--rpm: input should be greater than 0, e.g. --rpm 50"),
        (["--overload", "5"], "give START:END in seconds"),
        (["--overload", "9:3"], "START must be before END"),
        (["--minute-s", "-1"], "e.g. --minute-s 6"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err

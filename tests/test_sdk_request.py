"""The model call's request prepared once per client (subagents/model/sdk_request.py):
the same bytes on the wire as ``client.post``, the same errors, the SDK's path kept
where the client does per-call work."""

from __future__ import annotations

import socket
import threading
from typing import Any

import anthropic
import pytest

from subagents.fake_api import FakeMessagesAPI, fault, overloaded, server_error, text
from subagents.fake_api.sse import stream_message
from subagents.model.base import ModelError, ModelRequest
from subagents.model.claude import AnthropicModel
from subagents.model.governor import RateGovernor
from subagents.model.sdk_request import DirectRequest

pytestmark = pytest.mark.anyio
MODEL = "claude-sonnet-5"
ANSWER = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": MODEL,
    "content": [{"type": "text", "text": "ok"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 3, "output_tokens": 1},
}


class RawServer:
    """Keeps each request's bytes as they arrived (request line, headers in their order
    and case, body) and answers with one streamed message; 127.0.0.1 only."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests: list[tuple[bytes, bytes]] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        data = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, data = data.split(b"\r\n\r\n", 1)
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                while len(data) < length:
                    data += conn.recv(65536)
                body, data = data[:length], data[length:]
                self.requests.append((head, body))
                events = b"".join(stream_message(dict(ANSWER)))
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    + f"content-length: {len(events)}\r\n\r\n".encode()
                    + events
                )

    def close(self) -> None:
        self.sock.close()


def request() -> ModelRequest:
    return ModelRequest(messages=[{"role": "user", "content": "hello"}], max_tokens=64)


def make(url: str, **kw: Any) -> AnthropicModel:
    kw.setdefault("governor", RateGovernor())
    return AnthropicModel(MODEL, api_key="test-key", base_url=url, backoff_s=0.01, **kw)


def sdk_path(model: AnthropicModel) -> AnthropicModel:
    """The same model sending through ``client.post``, as before the prepared request."""
    model._direct_request = None
    return model


async def test_the_prepared_request_is_the_sdks_byte_for_byte() -> None:
    server = RawServer()
    try:
        for how in (lambda m: m, sdk_path, lambda m: m):
            async with make(server.url) as model:
                how(model)
                for _ in range(2):  # the second call on a prepared request
                    response = await model.complete(request())
                    assert response.message.content[0].text == "ok"
    finally:
        server.close()
    direct, sdk, direct_again = (server.requests[i : i + 2] for i in (0, 2, 4))
    assert direct == sdk == direct_again
    head = sdk[0][0]
    assert head.startswith(b"POST /v1/messages HTTP/1.1\r\n")
    for header in (b"test-key\r\n", b"\r\nanthropic-version: ", b"\r\nuser-agent: Async"):
        assert header in head
    assert b"x-stainless-helper-method: stream" in head.lower()


async def test_a_body_of_another_length_gets_its_own_content_length() -> None:
    server = RawServer()
    try:
        async with make(server.url) as model:
            await model.complete(request())
            long = ModelRequest(messages=[{"role": "user", "content": "x" * 5000}], max_tokens=64)
            await model.complete(long)
    finally:
        server.close()
    for head, body in server.requests:
        assert f"content-length: {len(body)}".encode() in head.lower()
    assert len(server.requests[1][1]) > 5000


@pytest.mark.parametrize(
    "answer",
    [
        fault(400, "invalid_request_error", "messages: bad"),
        fault(401, "authentication_error", "invalid x-api-key"),
        fault(404, "not_found_error", "model: no such model"),
        overloaded(),
        server_error(),
    ],
    ids=["400", "401", "404", "529", "500"],
)
async def test_a_status_error_is_the_same_model_error(answer: Any) -> None:
    errors: list[ModelError] = []
    for how in (lambda m: m, sdk_path):
        with FakeMessagesAPI([answer]) as api:
            async with make(api.url, max_retries=0, patience_s=0) as model:
                how(model)
                with pytest.raises(ModelError) as caught:
                    await model.complete(request())
        errors.append(caught.value)
        assert isinstance(caught.value.__cause__, anthropic.APIStatusError)
    direct, sdk = errors
    assert (str(direct), direct.status, direct.retryable, direct.error_type) == (
        str(sdk),
        sdk.status,
        sdk.retryable,
        sdk.error_type,
    )
    assert type(direct.__cause__) is type(sdk.__cause__)


async def test_no_server_is_the_same_connection_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as held:
        url = f"http://127.0.0.1:{held.getsockname()[1]}"
    errors = []
    for how in (lambda m: m, sdk_path):
        async with make(url, max_retries=0) as model:
            how(model)
            with pytest.raises(ModelError) as caught:
                await model.complete(request())
        errors.append(caught.value)
        # an early failure (nothing streamed yet), caused by the client's own error
        assert type(caught.value.__cause__.__cause__) is anthropic.APIConnectionError
    assert str(errors[0]) == str(errors[1]) and errors[0].retryable and errors[1].retryable


async def test_a_retry_after_an_error_goes_out_again_on_the_prepared_request() -> None:
    with FakeMessagesAPI([server_error(), text("after")]) as api:
        async with make(api.url) as model:
            response = await model.complete(request())
            assert model._direct() is not None
    assert response.message.content[0].text == "after" and response.retries == 1
    assert len(api.requests) == 2 and api.requests[0] == api.requests[1]


def test_a_client_with_per_call_work_keeps_the_sdks_path() -> None:
    plain = anthropic.AsyncAnthropic(api_key="k", base_url="http://127.0.0.1:9")
    assert DirectRequest(plain, "/v1/messages", {}).usable()

    async def middleware(request: Any, call_next: Any) -> Any:
        return await call_next(request)

    with_middleware = anthropic.AsyncAnthropic(
        api_key="k", base_url="http://127.0.0.1:9", middleware=[middleware]
    )
    assert not DirectRequest(with_middleware, "/v1/messages", {}).usable()


async def test_the_sdks_path_still_runs_a_clients_middleware() -> None:
    seen: list[str] = []

    async def middleware(request: Any, call_next: Any) -> Any:
        seen.append(str(request.options.url))
        return await call_next(request)

    with FakeMessagesAPI([text("mw")]) as api:
        async with make(api.url) as model:
            await model.client.close()
            model.client = anthropic.AsyncAnthropic(
                api_key="test", base_url=api.url, max_retries=0, middleware=[middleware]
            )
            response = await model.complete(request())
    assert response.message.content[0].text == "mw" and seen == ["/v1/messages"]

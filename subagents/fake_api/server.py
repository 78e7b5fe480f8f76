"""The fake Messages API server: a real HTTP server on 127.0.0.1 in a thread.

Why stdlib ``ThreadingHTTPServer`` in a background thread rather than an
anyio/ASGI server: it has no event loop of its own to share, so the same object
serves sync tests, async tests (any backend) and the CLI alike; a handler that
sleeps to simulate latency blocks only its own thread; and it needs no extra
dependency in the shipped package. ``serve_forever`` polls every 50 ms so leaving
the context manager is quick.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Iterable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from subagents.fake_api.limits import Limiter, RateLimits
from subagents.fake_api.models import ModelsError, get_model, list_models
from subagents.fake_api.script import Fault, Policy, Reply, Script, ScriptExhausted, ScriptItem
from subagents.fake_api.sse import stream_fault, stream_message
from subagents.fake_api.usage import PromptCache, estimate_tokens
from subagents.fake_api.validate import InvalidRequest, validate_messages_request


class RecordedRequest(BaseModel):
    """One request as the server received it."""

    model_config = ConfigDict(extra="forbid")

    path: str
    headers: dict[str, str] = Field(default_factory=dict)
    """Lower-cased header names."""
    body: dict[str, Any] = Field(default_factory=dict)
    status: int = 0
    """HTTP status the server answered with."""
    error: str = ""
    """The error message sent back, if any."""
    peer: str = ""
    """The client's ``host:port``: requests over one kept-alive connection share it."""


class FakeMessagesAPI:
    """Scripted Messages API on ``http://127.0.0.1:<port>``; use as a context manager.

    ``with FakeMessagesAPI([text("hi")]) as api:
    client = anthropic.AsyncAnthropic(base_url=api.url, api_key="test")``.
    ``api.requests`` holds the bodies of every ``/v1/messages`` request (rejected
    ones included, in arrival order); ``api.log`` holds every request with headers
    and the status it got.
    """

    def __init__(
        self,
        script: Iterable[ScriptItem] | Policy = (),
        *,
        api_key: str | None = None,
        min_cache_tokens: int = 1024,
        model_name: str | None = None,
        count_tokens: bool = True,
        port: int = 0,
        limits: RateLimits | None = None,
    ) -> None:
        self.script = Script(script)
        self.limiter = Limiter(limits) if limits is not None else None
        """The organization's per-minute limits and overload windows (None: no limits);
        ``limiter.rejected`` / ``limiter.overloaded`` count the 429s and 529s sent."""
        self.api_key = api_key
        """When set, requests whose ``x-api-key`` (or ``authorization: Bearer``) differs
        get 401 ``authentication_error``."""
        self.cache = PromptCache(min_tokens=min_cache_tokens)
        self.model_name = model_name
        """Model string put in responses (default: the requested one)."""
        self.count_tokens = count_tokens
        """False makes ``/v1/messages/count_tokens`` answer 404, like a server without it."""
        self.requests: list[dict[str, Any]] = []
        self.log: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._counter = 0
        self.port = port
        """Port to bind on 127.0.0.1; 0 picks a free one."""
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------
    @property
    def url(self) -> str:
        """Base URL for the client (``base_url=api.url``)."""
        if self._server is None:
            raise RuntimeError("the fake API is not running; use it as a context manager")
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}"

    def start(self) -> FakeMessagesAPI:
        handler = type("_BoundHandler", (_Handler,), {"api": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-messages-api",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeMessagesAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- answering -------------------------------------------------------------
    def record(self, entry: RecordedRequest) -> None:
        with self._lock:
            self.log.append(entry)
            if entry.path == "/v1/messages":
                self.requests.append(entry.body)

    def next_id(self) -> int:
        with self._lock:
            self._counter += 1
            return self._counter

    def build_message(self, body: dict[str, Any], answer: Reply) -> dict[str, Any]:
        """The full response message: ids filled, usage computed, stop_reason set."""
        n = self.next_id()
        content = []
        for j, block in enumerate(answer.content):
            block = dict(block)
            if block.get("type") == "tool_use" and not block.get("id"):
                block["id"] = f"toolu_fake{n:04d}_{j}"
            content.append(block)
        usage: dict[str, Any] = dict(self.cache.account(body))
        usage["output_tokens"] = max(1, sum(estimate_tokens(b) for b in content))
        usage.update(answer.usage or {})
        return {
            "id": f"msg_fake{n:04d}",
            "type": "message",
            "role": "assistant",
            "model": self.model_name or body["model"],
            "content": content,
            "stop_reason": answer.final_stop_reason(),
            "stop_sequence": None,
            "usage": usage,
        }


def error_body(error_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


class _Handler(BaseHTTPRequestHandler):
    api: FakeMessagesAPI
    protocol_version = "HTTP/1.1"
    # A stream is many small writes on a kept-alive connection: with Nagle's algorithm
    # each waits for the client's delayed ACK (40 ms), as a streaming server never lets it.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: tests assert on ``api.log`` instead of stderr noise."""

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        entry = RecordedRequest(path=path, headers={k.lower(): v for k, v in self.headers.items()})
        host, port = self.client_address[:2]
        entry.peer = f"{host}:{port}"
        try:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise ValueError("the request body must be a JSON object")
            entry.body = body
        except ValueError as exc:
            self._fail(entry, 400, "invalid_request_error", f"Invalid JSON body: {exc}")
            return
        if not self._authorized(entry):
            return
        if path == "/v1/messages":
            self._messages(entry)
        elif path == "/v1/messages/count_tokens" and self.api.count_tokens:
            self._count_tokens(entry)
        else:
            self._fail(entry, 404, "not_found_error", f"Not found: {path}")

    def do_GET(self) -> None:
        """The models endpoints; any other path is a JSON 404, as the API answers."""
        path, _, query = self.path.partition("?")
        entry = RecordedRequest(path=path, headers={k.lower(): v for k, v in self.headers.items()})
        if not self._authorized(entry):
            return
        extra = self.api.model_name
        try:
            if path == "/v1/models":
                self._json(entry, 200, list_models(urllib.parse.parse_qs(query), extra))
            elif path.startswith("/v1/models/"):
                model_id = urllib.parse.unquote(path.removeprefix("/v1/models/"))
                self._json(entry, 200, get_model(model_id, extra))
            else:
                self._fail(entry, 404, "not_found_error", f"Not found: {path}")
        except ModelsError as exc:
            self._fail(entry, exc.status, exc.error_type, str(exc))

    def _authorized(self, entry: RecordedRequest) -> bool:
        """False (and a 401 sent) when a key is required and the request's differs."""
        keys = {entry.headers.get("x-api-key"), entry.headers.get("authorization", "")[7:]}
        if self.api.api_key is not None and self.api.api_key not in keys:
            self._fail(entry, 401, "authentication_error", "invalid x-api-key")
            return False
        return True

    def _count_tokens(self, entry: RecordedRequest) -> None:
        try:
            validate_messages_request(entry.body, count_tokens=True)
        except InvalidRequest as exc:
            self._fail(entry, 400, "invalid_request_error", str(exc))
            return
        usage = self.api.cache.account(entry.body, write=False)
        self._json(entry, 200, {"input_tokens": sum(usage.values())})

    def _messages(self, entry: RecordedRequest) -> None:
        body = entry.body
        limiter = self.api.limiter
        try:
            # The script sees the conversation as the model would: same-role turns combined.
            turns = validate_messages_request(body)
            if self._limited(entry):  # before the script: a refused request uses no reply
                return
            answer = self.api.script.next({**body, "messages": turns})
        except InvalidRequest as exc:
            self._fail(entry, 400, "invalid_request_error", str(exc))
            return
        except ScriptExhausted as exc:
            # 400 so that the client does not retry: the test itself is wrong.
            self._fail(entry, 400, "invalid_request_error", str(exc))
            return
        except Exception as exc:  # a broken policy must not look like a network fault
            message = f"fake API policy raised {type(exc).__name__}: {exc}"
            self._fail(entry, 400, "invalid_request_error", message)
            return
        time.sleep(answer.latency_s)
        if isinstance(answer, Fault):
            self._fault(entry, answer)
            return
        final = self.api.build_message(body, answer)
        headers = {}
        if limiter is not None:
            headers = limiter.spend_output(int(final["usage"].get("output_tokens", 0)))
        if body.get("stream"):
            self._stream(entry, stream_message(final), headers=headers)
        else:
            self._json(entry, 200, final, headers)

    def _limited(self, entry: RecordedRequest) -> bool:
        """True (and a 429 or 529 sent) when the fake organization's limits say no."""
        limiter = self.api.limiter
        if limiter is None:
            return False
        usage = self.api.cache.account(entry.body, write=False)
        uncached = usage["input_tokens"] + usage["cache_creation_input_tokens"]
        verdict = limiter.admit(uncached)
        if verdict.status == 200:
            return False
        kind = "rate_limit_error" if verdict.status == 429 else "overloaded_error"
        self._fail(
            entry,
            verdict.status,
            kind,
            verdict.message,
            retry_after=verdict.retry_after,
            headers=verdict.headers,
        )
        return True

    def _fault(self, entry: RecordedRequest, answer: Fault) -> None:
        body = entry.body
        if answer.mid_stream and body.get("stream"):
            started = self.api.build_message(body, Reply(content=[]))
            error = {"type": answer.error_type, "message": answer.message}
            self._stream(entry, stream_fault(started, error), error=answer.message)
        else:
            self._fail(entry, answer.status, answer.error_type, answer.message, answer.retry_after)

    # -- wire ------------------------------------------------------------------
    def _json(
        self,
        entry: RecordedRequest,
        status: int,
        payload: dict[str, Any],
        headers: dict[str, str] | None = None,
    ) -> None:
        data = json.dumps(payload).encode()
        entry.status = status
        self.api.record(entry)
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("request-id", f"req_fake{len(self.api.log):04d}")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _fail(
        self,
        entry: RecordedRequest,
        status: int,
        error_type: str,
        message: str,
        retry_after: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        entry.error = message
        headers = dict(headers or {})
        if retry_after is not None:
            headers["retry-after"] = f"{retry_after:g}"
            headers["retry-after-ms"] = str(int(retry_after * 1000))
        self._json(entry, status, error_body(error_type, message), headers)

    def _stream(
        self,
        entry: RecordedRequest,
        frames: Iterable[bytes],
        error: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        entry.status = HTTPStatus.OK
        entry.error = error
        self.api.record(entry)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        # Chunked, as the real API streams: the connection stays open for the next
        # request (a client pays one TCP connect per member, not one per turn).
        self.send_header("transfer-encoding", "chunked")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        for frame in frames:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

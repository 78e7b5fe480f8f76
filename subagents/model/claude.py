"""The real model adapter: the Anthropic Messages API through ``anthropic.AsyncAnthropic``.

Design choices:

- **Retries are ours, not the SDK's** (the client is built with ``max_retries=0``).
  The SDK retries 408/409/429/5xx/529 invisibly: the harness could neither count
  nor trace them. This module retries the same statuses, honouring ``retry-after-ms``
  / ``retry-after`` and ``x-should-retry`` as the SDK does, plus what the SDK never
  retries: an ``overloaded_error`` (or a dropped connection) arriving mid-stream
  after HTTP 200 but before the first content delta. Each retry is a
  :class:`subagents.trace.Retry` event and counts in ``ModelResponse.retries``.
  Once a delta has arrived the call is not repeated (those tokens are billed); it
  fails as a retryable :class:`ModelError` for the member to decide.
- **Always streaming**: a long answer never hits the SDK's non-streaming timeout
  guard, and the first-delta boundary above is observable.
- **Prompt caching** (:func:`subagents.model.wire.place_breakpoints`): up to four
  ``cache_control`` breakpoints, never more - the last tool, the last system block,
  the last block of the latest turn plus that of the previous turn (which
  guarantees a hit even when one turn appends more than the API's 20-block
  lookback), and, when the context rewrote an old message since the last call (an
  offload or aging batch), the end of the history before it, which is still a
  cache read. Breakpoints the caller already placed count against the four. The
  caller's request is never mutated: touched blocks are copied.
- **Server-side context management** (``compact_20260112``, ``clear_tool_uses_20250919``)
  goes through the beta endpoint with its beta header, only when the request asks.
- **The body is ours to serialize** (:mod:`subagents.model.wire`): the client would
  copy and re-encode the whole conversation on every call; instead each message is
  encoded once and the client gets the bytes (a request the client built once,
  :mod:`subagents.model.sdk_request`, sent by its own HTTP client; then the SDK's own
  stream reader), so a turn costs what is new in it. The beta path above keeps the
  SDK's request method (it is opt-in and rare).
- **One TLS context per process**: building one reads the CA bundle (about 20 ms of
  CPU); every member's client shares it instead of building its own.
- **One rate governor per key** (:mod:`subagents.model.governor`): every call asks
  it before going out and tells it how it ended (status, the ``anthropic-ratelimit-*``
  headers, the tokens used). A 429 or 529 pauses every member on the key for its
  ``retry-after`` and is retried without counting against ``max_retries`` while the
  governor's patience lasts: only other failures (5xx, dropped connections) spend
  retries. Time spent waiting is a ``rate_wait`` trace event.
- **aiohttp under the client**: the SDK's own aiohttp transport (its ``aiohttp``
  extra, ``anthropic.DefaultAioHttpClient``) sends a request and reads its stream for
  less CPU than the default httpx/h11 stack - about a sixth less per turn at 100-200
  turns, where the bodies are large (``bench/harness.py``).
"""

from __future__ import annotations

import functools
import json
import operator
import os
import random
import ssl
import time
from collections.abc import Callable
from typing import Any

import anthropic
import anyio
import httpx2
import pydantic
from anthropic.types import Message as SDKMessage

from subagents.model.base import ModelError, ModelProfile, ModelRequest, ModelResponse
from subagents.model.credentials import api_credentials
from subagents.model.governor import Governor, Permit, governor_for
from subagents.model.message import ContentBlock, Message, Usage
from subagents.model.profiles import profile_for
from subagents.model.tokens import estimate_bytes
from subagents.model.wire import BodyEncoder, MarkCounter, StreamedMessage, build_params
from subagents.trace import RateWait, Retry, TraceWriter, no_lone_surrogates

_CONTEXT_BETAS = {
    "compact_20260112": "compact-2026-01-12",
    "clear_tool_uses_20250919": "context-management-2025-06-27",
}
_RETRY_STATUSES = {408, 409, 429}
_DELTA_EVENTS = {"content_block_delta", "text", "input_json", "thinking", "citation"}
_STREAM_HEADERS = {"X-Stainless-Helper-Method": "stream", "X-Stainless-Stream-Helper": "messages"}
"""What the SDK's own ``messages.stream`` sends besides the body."""


def _http_client() -> Any:
    """The SDK's aiohttp client; its httpx one where aiohttp is missing (an environment
    installed before Fleet asked for the ``aiohttp`` extra: slower, not broken)."""
    tls = _tls_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    try:
        return anthropic.DefaultAioHttpClient(verify=tls)
    except RuntimeError:
        return anthropic.DefaultAsyncHttpxClient(verify=tls)


@functools.cache
def _tls_context(cafile: str | None, capdir: str | None) -> ssl.SSLContext:
    """The client's default TLS context, built once per CA setting (SSL_CERT_FILE/DIR)."""
    return httpx2.create_ssl_context()


class _EarlyStreamFailure(Exception):
    """Internal: the stream failed before any content arrived; safe to repeat."""


class AnthropicModel:
    """A Claude model (or any Anthropic-compatible server) behind the :class:`Model` seam."""

    offline = False

    def __init__(
        self,
        name: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int = 4,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        timeout_s: float = 600.0,
        cache: bool = True,
        trace: TraceWriter | None = None,
        on_retry: Callable[[Retry], None] | None = None,
        profile: ModelProfile | None = None,
        governor: Governor | None = None,
        patience_s: float | None = None,
    ) -> None:
        key, token = api_credentials(name, api_key)
        self.name = name
        self.profile = profile or profile_for(name)
        self.max_retries = max_retries
        """Retries per call, HTTP errors and mid-stream overloads together."""
        self.patience_s = patience_s
        """How long one call keeps waiting on 429/529 before it fails; None: the
        governor's patience (a member with a fallback model waits less: see
        :mod:`.fallback`)."""
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.cache = cache
        """Place prompt-caching breakpoints."""
        self.trace = trace
        self.on_retry = on_retry
        self.client = anthropic.AsyncAnthropic(
            api_key=key,
            auth_token=token,
            base_url=base_url or os.environ.get("ANTHROPIC_BASE_URL"),
            max_retries=0,
            timeout=timeout_s,
            # The SDK's default pool closes itself from __del__ on whatever event loop
            # runs at collection time; a model dropped without aclose() would then touch
            # sockets of a finished loop. A plain pool is just collected.
            http_client=_http_client(),
        )
        self._bodies = BodyEncoder()
        self._marks = MarkCounter()
        self._sent: list[Any] = []
        """The messages of the last request (to see where a rewrite begins)."""
        self.governor = governor or governor_for(str(self.client.base_url), key or token)
        """Admits every call; shared with every other model on the same key and endpoint."""
        self._last_size = 0
        """Bytes of the previous request (what is new since is uncached input)."""
        self._cache_hit = False
        """The previous call read from the prompt cache."""

    async def aclose(self) -> None:
        """Close the HTTP connection pool (call before the event loop ends)."""
        await self.client.close()

    async def __aenter__(self) -> AnthropicModel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the seam --------------------------------------------------------------
    async def complete(self, request: ModelRequest) -> ModelResponse:
        messages = request.messages
        unchanged = next(
            (i for i, same in enumerate(map(operator.is_, messages, self._sent)) if not same),
            min(len(messages), len(self._sent)),
        )
        self._sent = list(messages)
        params = build_params(
            request, self.name, cache=self.cache, unchanged=unchanged, marks=self._marks
        )
        body = None
        if "context_management" not in params:
            body = self._bodies.encode({**params, "stream": True})
        started = time.monotonic()
        estimate = self._uncached_estimate(params, body)
        attempt = limited = 0
        while True:
            permit = await self._admit(estimate, params.get("max_tokens"))
            try:
                message, headers = await self._stream_once(params, body)
            except (
                _EarlyStreamFailure,
                anthropic.APIStatusError,
                anthropic.APIConnectionError,
            ) as exc:
                status, headers, retry_after = _answer_of(exc)
                pause = self.governor.release(
                    permit, status=status, headers=headers, retry_after=retry_after
                )
                if self._governor_retries(exc, status, started):
                    limited += 1
                    self._report_retry(attempt + limited, exc, pause)
                    continue
                delay = self._retry_delay(exc, attempt)
                if delay is None:
                    raise self._as_model_error(exc, attempt + limited) from exc
                attempt += 1
                self._report_retry(attempt + limited, exc, delay)
                await anyio.sleep(delay)
            except BaseException:
                self.governor.cancel(permit)
                raise
            else:
                self._settle(permit, message, headers, len(body) if body else 0)
                break
        url = self.client.base_url
        return ModelResponse(
            message=message,
            latency_s=time.monotonic() - started,
            retries=attempt + limited,
            server_address=url.host,
            server_port=url.port or (443 if url.scheme == "https" else 80),
            streamed=True,
        )

    async def count_tokens(self, request: ModelRequest) -> int | None:
        """Input tokens as the API counts them; None if the endpoint is unavailable."""
        params = build_params(request, self.name, cache=False)
        fields = ("model", "messages", "system", "tools", "tool_choice")
        body = {k: v for k, v in params.items() if k in fields}
        try:
            result = await self.client.messages.count_tokens(**body)
        except (anthropic.APIError, ValueError):
            return None
        return int(result.input_tokens)

    # -- the governor ----------------------------------------------------------
    def _uncached_estimate(self, params: dict[str, Any], body: bytes | None) -> int:
        """Input tokens this call will count against the account's per-minute limit:
        what is new since the previous call when that call read the prompt cache, the
        whole request otherwise (about 4 bytes of JSON a token)."""
        size = len(body) if body is not None else len(json.dumps(params, default=str))
        if self._cache_hit and size >= self._last_size:
            return estimate_bytes(size - self._last_size)
        return estimate_bytes(size)

    async def _admit(self, estimate: int, max_tokens: int | None) -> Permit:
        """Wait for the governor; a wait is a ``rate_wait`` event (live table, trace)."""
        trace = self.trace

        def waiting(reason: str, expected: float) -> None:
            if trace is not None:
                trace.emit(RateWait(expected_s=round(expected, 3), reason=reason))

        permit = await self.governor.acquire(estimate, max_tokens, on_wait=waiting)
        if permit.waited_s >= 0.05 and trace is not None:
            trace.emit(RateWait(waited_s=round(permit.waited_s, 3), reason=permit.reason))
        return permit

    def _governor_retries(self, exc: Exception, status: int, started: float) -> bool:
        """A 429/529 is retried after the governor's pause, not counted as a retry,
        until the governor's patience for this call runs out."""
        if status not in (429, 529):
            return False
        if isinstance(exc, anthropic.APIStatusError):
            if exc.response.headers.get("x-should-retry") == "false":
                return False
        patience = self.governor.patience_s if self.patience_s is None else self.patience_s
        return time.monotonic() - started < patience

    def _settle(self, permit: Permit, message: Message, headers: Any, size: int) -> None:
        usage = message.usage
        uncached = usage.input_tokens + (usage.cache_creation_input_tokens or 0)
        self._cache_hit = bool(usage.cache_read_input_tokens)
        self._last_size = size
        self.governor.release(
            permit,
            status=200,
            headers=headers,
            input_tokens=uncached,
            output_tokens=usage.output_tokens,
        )

    # -- one attempt -----------------------------------------------------------
    async def _stream_once(self, params: dict[str, Any], body: bytes | None) -> tuple[Message, Any]:
        """The message and the response's headers."""
        if body is None:
            return await self._stream_beta(params)
        gathered = StreamedMessage()
        try:
            # The body is sent as it is; events come back as the dicts the client
            # decoded (AsyncStream[object]: no typed object built per event).
            direct = self._direct()
            if direct is not None:
                stream = await direct.stream(body)
            else:
                stream = await self.client.post(
                    "/v1/messages",
                    cast_to=SDKMessage,
                    content=body,
                    options={"headers": _STREAM_HEADERS},
                    stream=True,
                    stream_cls=anthropic.AsyncStream[object],
                )
            async with stream:
                async for event in stream:
                    gathered.add(event)  # type: ignore[arg-type]
        except (anthropic.APIStatusError, anthropic.APIConnectionError) as exc:
            _raise_early(exc, gathered.saw_delta)
            raise
        return _as_message(gathered.final()), stream.response.headers

    def _direct(self) -> Any:
        """The client's request prepared once (a :class:`.sdk_request.DirectRequest`), or
        None where the client does per-call work it would skip (then ``client.post``
        sends). Imported here, not at the top: the import of ``anthropic`` is another
        module's concern."""
        direct = getattr(self, "_direct_request", False)
        if direct is False:
            from subagents.model.sdk_request import DirectRequest

            direct = DirectRequest(self.client, "/v1/messages", _STREAM_HEADERS)
            direct = direct if direct.usable() else None
            self._direct_request = direct
        return direct

    async def _stream_beta(self, params: dict[str, Any]) -> tuple[Message, Any]:
        """Server-side context management: the SDK's beta stream method and header."""
        betas = sorted(
            {_CONTEXT_BETAS.get(e.get("type"), "") for e in params["context_management"]["edits"]}
            - {""}
        )
        saw_delta = False
        try:
            async with self.client.beta.messages.stream(**params, betas=betas) as stream:
                async for event in stream:
                    saw_delta = saw_delta or event.type in _DELTA_EVENTS
                final = await stream.get_final_message()
                headers = stream.response.headers
        except (anthropic.APIStatusError, anthropic.APIConnectionError) as exc:
            _raise_early(exc, saw_delta)
            raise
        return _as_message(final.to_dict()), headers

    # -- retry policy ----------------------------------------------------------
    def _retry_delay(self, exc: Exception, attempt: int) -> float | None:
        """Seconds to wait before the next attempt, or None when not to retry."""
        if attempt >= self.max_retries:
            return None
        backoff = min(self.max_backoff_s, self.backoff_s * 2**attempt)
        jittered = backoff * (0.5 + random.random() / 2)
        if isinstance(exc, _EarlyStreamFailure | anthropic.APIConnectionError):
            return jittered
        assert isinstance(exc, anthropic.APIStatusError)
        headers = exc.response.headers
        should = headers.get("x-should-retry")
        if should == "false" or (
            should != "true" and exc.status_code not in _RETRY_STATUSES and exc.status_code < 500
        ):
            return None
        retry_after = _retry_after(headers)
        if retry_after is not None and 0 <= retry_after <= 60:
            return retry_after
        return jittered

    def _report_retry(self, attempt: int, exc: Exception, delay: float) -> None:
        event = Retry(what="model_call", attempt=attempt, reason=_describe(exc), delay_s=delay)
        if self.trace is not None:
            self.trace.emit(event)
        if self.on_retry is not None:
            self.on_retry(event)

    def _as_model_error(self, exc: Exception, retries: int) -> ModelError:
        error = self._model_error(exc, retries)
        if isinstance(exc, anthropic.APIStatusError):
            error.error_type = _error_type(exc) or str(exc.status_code)
        else:
            error.error_type = "overloaded_error" if error.status == 529 else type(exc).__name__
        return error

    def _model_error(self, exc: Exception, retries: int) -> ModelError:
        after = f" after {retries} retries" if retries else ""
        if isinstance(exc, _EarlyStreamFailure):
            return ModelError(f"{self.name}: {exc}{after}", retryable=True, status=529)
        if isinstance(exc, anthropic.APIConnectionError):
            return ModelError(
                f"{self.name}: could not reach {self.client.base_url}{after}: {exc}",
                retryable=True,
            )
        assert isinstance(exc, anthropic.APIStatusError)
        status, detail = exc.status_code, _error_message(exc)
        hints = {
            401: "authentication failed: set ANTHROPIC_API_KEY to a valid key",
            403: f"this API key may not use {self.name!r}; check the key's permissions",
            404: f"model {self.name!r} or endpoint not found; check the model name",
            413: "the request is too large; lower the context budget",
        }
        if status in hints:
            return ModelError(f"{hints[status]} ({status}: {detail})", status=status)
        if status == 400:
            return ModelError(f"the API rejected the request (400): {detail}", status=400)
        if status == 200:
            return ModelError(
                f"{self.name}: the stream failed after output began: {detail}",
                retryable=True,
                status=status,
            )
        retryable = status in _RETRY_STATUSES or status >= 500
        return ModelError(
            f"{self.name}: HTTP {status}{after}: {detail}", retryable=retryable, status=status
        )


def _as_message(data: dict[str, Any]) -> Message:
    """Fleet's :class:`Message` of the API's answer (the SDK's types stay in this
    module); beta-only blocks (a server-side ``compaction`` block) and fields Fleet
    does not name are kept as they came, so they dump back to the same dict the API
    expects next turn. A block the API sent without a field Fleet's model requires is
    kept unvalidated too, as the SDK's ``Message.construct`` kept it.
    A lone surrogate the model wrote as a JSON escape becomes U+FFFD: no record of the
    run, nor the next request, could be encoded with it."""
    data = _clean(data)
    try:
        return Message.model_validate(data)
    except pydantic.ValidationError:
        pass
    content, usage = data.get("content", []), data.get("usage") or {}
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise ModelError(f"the API's answer has no list of content blocks: {str(content)[:200]}")
    try:
        counted = Usage.model_validate(usage)
    except pydantic.ValidationError:
        raise ModelError(f"the API's answer has no usable usage: {str(usage)[:200]}") from None
    blocks = [ContentBlock.model_construct(**b) for b in content]
    return Message.model_construct(**{**data, "content": blocks, "usage": counted})


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return no_lone_surrogates(value)
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


# -- error details -------------------------------------------------------------
def _answer_of(exc: Exception) -> tuple[int, Any, float | None]:
    """(HTTP status, response headers, retry-after) of a failed attempt, as the
    governor counts it: an overload mid-stream is a 529, no answer at all is 0."""
    if isinstance(exc, _EarlyStreamFailure):
        cause = exc.__cause__
        if isinstance(cause, anthropic.APIStatusError):
            return 529, cause.response.headers, None
        return 0, None, None
    if isinstance(exc, anthropic.APIStatusError):
        headers = exc.response.headers
        status = exc.status_code
        if status == 200 and _error_type(exc) == "overloaded_error":
            status = 529
        return status, headers, _retry_after(headers)
    return 0, None, None


def _raise_early(exc: Exception, saw_delta: bool) -> None:
    """A stream that failed before any content arrived may be repeated: say so."""
    if saw_delta:
        return
    if isinstance(exc, anthropic.APIStatusError):
        if exc.status_code == 200 and _error_type(exc) == "overloaded_error":
            raise _EarlyStreamFailure("overloaded_error mid-stream before the first delta") from exc
    elif isinstance(exc, anthropic.APIConnectionError):
        raise _EarlyStreamFailure(f"connection lost before the first delta: {exc}") from exc


def _error_type(exc: anthropic.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("type", ""))
    return ""


def _error_message(exc: anthropic.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", "")) or str(exc)
    return str(exc)


def _describe(exc: Exception) -> str:
    if isinstance(exc, anthropic.APIStatusError):
        return f"HTTP {exc.status_code} {_error_type(exc) or 'error'}: {_error_message(exc)}"
    return str(exc)


def _retry_after(headers: Any) -> float | None:
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return float(value) / scale
        except ValueError:
            continue  # an HTTP date: fall back to our own backoff
    return None

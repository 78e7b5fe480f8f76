"""One streamed Messages API request through the ``anthropic`` client's own lower-level
pieces, with what is the same for every call of a client prepared once.

``client.post(..., stream=True)`` does, per call, work whose result never changes for
Fleet's calls: it copies the request options (twice: for its retry loop, which Fleet
turns off, and per attempt), builds the headers layer by layer (the platform, the
credentials, the timeout, ``x-stainless-retry-count`` - always 0, as the SDK's own
retries are off), parses and merges the URL, merges the HTTP client's headers into
them, and wraps the response in an ``AsyncAPIResponse`` to reach the stream class.
Profiled at 100 turns (``bench/model_call.py``), that was about a third of the
client's part of a call.

:class:`DirectRequest` asks the client itself, once, for the request it would send
(``client._build_request`` with the options ``post`` makes), keeps its method, URL,
headers (all but ``content-length``, which is each body's) and extensions, and for
each call only builds an ``httpx2.Request`` of them with the body and sends it
through the client's own HTTP client (``client._client.send``: its transport, its
pool, its TLS context). The rest stays the SDK's:

- **the bytes on the wire**: the same request line and headers, in the same order,
  as ``client.post`` sends (``tests/test_sdk_request.py`` compares them raw);
- **the errors**: a failed connection or timeout becomes the client's own
  ``APIConnectionError`` / ``APITimeoutError`` (``_make_connection_error``,
  ``_make_timeout_error``), an HTTP error status its ``APIStatusError`` subclass
  (``_make_status_error_from_response``), an ``error`` event mid-stream its
  ``APIStatusError`` (the SDK's ``AsyncStream``), so the retry and governor logic in
  :mod:`.claude` sees exactly what it saw before;
- **the stream**: the SDK's ``AsyncStream`` (its SSE decoder) yields the events as
  dicts (``cast_to=object``: no typed object per event).

When the client does something per call that a prepared request would skip - a
middleware, or a credential provider's auth (``client.custom_auth``, a token that can
be refreshed) - :meth:`DirectRequest.usable` says no and the adapter goes through
``client.post`` as before. OpenTelemetry is no such thing: the client opens a span
only for its own methods (``messages.create``), never for ``client.post``, so
neither path makes one.

Why prepared per client and not per process: the headers carry the client's key and
base URL. Why not a client of our own (a bare aiohttp session was measured cheaper
still, ``bench/README.md``): the issue rules it out - the SDK's transport, auth,
headers and error types stay the SDK's.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx2
from anthropic._models import FinalRequestOptions

_STATIC = frozenset({b"content-length"})
"""Headers that belong to one body, not to the client."""


class DirectRequest:
    """A client's streamed ``POST`` to one path, prepared once (see the module docstring)."""

    def __init__(self, client: anthropic.AsyncAnthropic, path: str, headers: dict[str, str]):
        self.client = client
        self.path = path
        self.headers = headers
        """The call's own headers, as ``post(..., options={"headers": ...})`` takes them."""
        self._prepared: tuple[str, httpx2.URL, httpx2.Headers, dict[str, Any]] | None = None

    def usable(self) -> bool:
        """Whether the client adds nothing per call that a prepared request would skip."""
        client = self.client
        return not client._middleware and client.custom_auth is None

    async def _prepare(self) -> tuple[str, httpx2.URL, httpx2.Headers, dict[str, Any]]:
        client = self.client
        if client._platform is None:
            # What client.request does before its first request (a worker thread:
            # the platform look-up may block).
            from anthropic._base_client import get_platform
            from anthropic._utils import asyncify

            client._platform = await asyncify(get_platform)()
        options = FinalRequestOptions.construct(
            method="post", url=self.path, json_data=None, content=b"", files=None,
            headers=self.headers,
        )  # fmt: skip
        request = client._build_request(options)
        # A Headers object: a request copies its list as it is, without parsing again.
        headers = httpx2.Headers(
            [(k, v) for k, v in request.headers.raw if k.lower() not in _STATIC]
        )
        self._prepared = (request.method, request.url, headers, dict(request.extensions))
        return self._prepared

    async def stream(self, body: bytes) -> anthropic.AsyncStream[object]:
        """Send ``body``; the response's event stream (the caller closes it). Raises the
        client's own ``APIStatusError`` / ``APIConnectionError`` / ``APITimeoutError``."""
        client = self.client
        method, url, headers, extensions = self._prepared or await self._prepare()
        request = httpx2.Request(
            method, url, headers=headers, content=body, extensions=dict(extensions)
        )
        try:
            response = await client._client.send(request, stream=True)
        except httpx2.TimeoutException as err:
            raise client._transport_error(client._make_timeout_error(request, err), None) from err
        except anthropic.AnthropicError:
            raise
        except Exception as err:
            raise client._transport_error(
                client._make_connection_error(request, err), None
            ) from err
        if not response.is_success:
            try:
                await response.aread()
            finally:
                await response.aclose()
            raise client._make_status_error_from_response(response) from None
        return anthropic.AsyncStream(cast_to=object, response=response, client=client)

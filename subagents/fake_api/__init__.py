"""A fake Anthropic Messages API on 127.0.0.1, for testing jobs without a real model.

    from subagents.fake_api import FakeMessagesAPI, text, tool_use, reply, rate_limited

    with FakeMessagesAPI([tool_use("search", {"query": "x"}), rate_limited(), text("done")]) as api:
        client = anthropic.AsyncAnthropic(base_url=api.url, api_key="test")
        ...
        assert api.requests[0]["messages"][0]["role"] == "user"

Modules: :mod:`.script` (what to answer), :mod:`.validate` (the API's 400 rules),
:mod:`.sse` (streaming encoding), :mod:`.usage` (token estimate and prompt cache),
:mod:`.models` (``GET /v1/models``), :mod:`.limits` (per-minute rate limits and
overload bursts, with the real API's headers), :mod:`.server` (HTTP).
"""

from subagents.fake_api.limits import Overload, RateLimits
from subagents.fake_api.script import (
    Fault,
    Policy,
    Reply,
    Script,
    ScriptExhausted,
    ScriptItem,
    fault,
    overloaded,
    overloaded_mid_stream,
    rate_limited,
    reply,
    server_error,
    text,
    tool_use,
)
from subagents.fake_api.server import FakeMessagesAPI, RecordedRequest
from subagents.fake_api.usage import PromptCache, estimate_tokens

__all__ = [
    "FakeMessagesAPI",
    "Fault",
    "Overload",
    "Policy",
    "PromptCache",
    "RateLimits",
    "RecordedRequest",
    "Reply",
    "Script",
    "ScriptExhausted",
    "ScriptItem",
    "estimate_tokens",
    "fault",
    "overloaded",
    "overloaded_mid_stream",
    "rate_limited",
    "reply",
    "server_error",
    "text",
    "tool_use",
]

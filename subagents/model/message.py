"""Fleet's own model of one Messages API response: what the harness reads of it.

The ``anthropic`` package imports every type and resource it has when any of it is
imported, about three seconds of CPU on a small machine. A run on an offline model
never calls the API, and neither do ``fleet trace``, ``fleet runs`` or the tests'
``fleet run`` subprocesses; they should not pay that. So :class:`Message` here, not
``anthropic.types.Message``, is what :class:`~subagents.model.base.ModelResponse`
holds, and only :mod:`subagents.model.claude` (built for real or fake-API models)
imports the SDK, converting the SDK's answer into this model.

Why a loose model and not the SDK's typed union of blocks: every model and block
accepts fields it does not name (``extra="allow"``), so a block type the harness does
not know (a server tool's result, a beta ``compaction`` block) or a field added to
the API later survives the round trip unchanged. That matters: the harness dumps
``content`` (``model_dump(mode="json", exclude_none=True)``) into the conversation,
which goes back to the API next turn, and into the trace, which replay and resume
read. The blocks the harness does read (``text``, ``tool_use``, ``thinking``,
``redacted_thinking``) are checked for the fields it needs, so a malformed offline
answer fails at the seam with a clear error, as the SDK's model made it fail.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["ContentBlock", "Message", "Usage"]

# Fields a block of a known type must carry; others may carry anything.
_REQUIRED = {
    "text": ("text",),
    "tool_use": ("id", "name", "input"),
    "thinking": ("thinking", "signature"),
    "redacted_thinking": ("data",),
}


def _plain(value: Any) -> Any:
    """A pydantic model from elsewhere (an SDK ``Message`` a test or policy built) as
    the dict it dumps to; anything else unchanged."""
    dump = getattr(value, "model_dump", None)
    if isinstance(value, BaseModel) and callable(dump):
        return dump(mode="json", exclude_none=True)
    return value


class ContentBlock(BaseModel):
    """One content block of a response; unnamed fields are kept as they came."""

    model_config = ConfigDict(extra="allow")

    type: str
    id: str | None = None
    name: str | None = None
    input: Any = None
    text: str | None = None
    citations: list[Any] | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_other_models(cls, value: Any) -> Any:
        return _plain(value)

    @model_validator(mode="after")
    def _known_types_complete(self) -> ContentBlock:
        missing = [f for f in _REQUIRED.get(self.type, ()) if getattr(self, f) is None]
        if missing:
            raise ValueError(f"a {self.type!r} block needs {', '.join(missing)}")
        if self.type == "tool_use" and not isinstance(self.input, dict):
            raise ValueError("a 'tool_use' block's input must be an object")
        return self


class Usage(BaseModel):
    """Token counts of one response, as the API reports them."""

    model_config = ConfigDict(extra="allow")

    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class Message(BaseModel):
    """One assistant response: the fields of the Messages API's ``Message``."""

    model_config = ConfigDict(extra="allow")

    id: str = ""
    type: str = "message"
    role: str = "assistant"
    model: str = ""
    content: list[ContentBlock] = Field(default_factory=list)
    stop_reason: str | None = None
    stop_sequence: str | None = None
    usage: Usage = Field(default_factory=Usage)

    @model_validator(mode="before")
    @classmethod
    def _from_other_models(cls, value: Any) -> Any:
        return _plain(value)

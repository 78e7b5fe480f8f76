"""The model seam: what the harness needs from a model, in the Messages API format.

The Anthropic Messages API is the lingua franca: requests are Messages API
parameters and responses are Fleet's own :class:`~subagents.model.message.Message`
of the API's answer (so that nothing here imports the ``anthropic`` SDK). Adapters
(the real client, replay of a recorded trace, the offline policy) implement
:class:`Model`; the loop never knows which one it talks to.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from .errors import ModelError
from .message import Message
from .profiles import ModelProfile

__all__ = ["Model", "ModelError", "ModelProfile", "ModelRequest", "ModelResponse"]


class ModelRequest(BaseModel):
    """One Messages API call, as the loop builds it."""

    model_config = ConfigDict(extra="forbid")

    system: str | list[dict[str, Any]] = ""
    """System prompt (plain text, or content blocks with cache_control)."""
    messages: list[dict[str, Any]]
    """``MessageParam`` dicts, alternating user/assistant, tool results matched."""
    tools: list[dict[str, Any]] = Field(default_factory=list)
    """Tool definitions (name, description, input_schema)."""
    max_tokens: int = 4096
    """Output token limit of this call."""
    temperature: float | None = None
    tool_choice: dict[str, Any] | None = None
    """E.g. ``{"type": "tool", "name": "submit_result"}`` to force the final answer."""
    context_management: dict[str, Any] | None = None
    """Server-side context management edits, passed through when the job asks."""


class ModelResponse(BaseModel):
    """One model answer plus what it cost to get it."""

    model_config = ConfigDict(extra="forbid")

    message: Message
    """The response, with ``usage`` (input, output, cache read, cache creation)."""
    latency_s: float = 0.0
    """Wall time of the call, retries included."""
    retries: int = 0
    """How many times the call was retried (HTTP errors and mid-stream overloads)."""
    offline: bool = False
    """True for offline models (replay, offline policy): never a real model's words."""
    server_address: str = ""
    """Host the answer came from (the API's, or ``ANTHROPIC_BASE_URL``'s); empty offline."""
    server_port: int = 0
    """Its port (443 for https when the URL names none); 0 offline."""
    streamed: bool = False
    """The answer came as a stream of server-sent events."""


@runtime_checkable
class Model(Protocol):
    """Anything that answers Messages API requests.

    ``offline`` and :meth:`aclose` are part of the seam, not optional extras: the
    coordinator plans and writes reports without a model call when the model is
    offline, and closes every model it made before its event loop ends.
    """

    profile: ModelProfile
    offline: bool
    """True for offline models (replay, offline policies): never a real model's words."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """One model turn. Raises :class:`ModelError` when retries are exhausted."""
        ...

    async def count_tokens(self, request: ModelRequest) -> int | None:
        """Input tokens of ``request`` as the provider counts them, or None if unknown."""
        ...

    async def aclose(self) -> None:
        """Release what the model holds (an HTTP pool); a no-op for offline models."""
        ...

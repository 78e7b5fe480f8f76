"""What a member's model calls cost, and how one call is traced.

:class:`Usage` sums the API's own usage (the ground truth for tokens) over a
member's calls, compaction summaries included, and prices it with the model's
profile. :func:`model_call_event` turns one response into its ``ModelCall`` trace
event, so the loop and the closing call record calls the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..model.base import ModelProfile, ModelResponse
from ..trace import ModelCall


@dataclass
class Usage:
    """Tokens and cost summed over a member's model calls."""

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cost_usd: float = 0.0

    @property
    def total(self) -> int:
        return self.input + self.output + self.cache_read + self.cache_write

    def add(self, usage: Any, profile: ModelProfile) -> None:
        inp = usage.input_tokens or 0
        out = usage.output_tokens or 0
        cr = getattr(usage, "cache_read_input_tokens", None) or 0
        cw = getattr(usage, "cache_creation_input_tokens", None) or 0
        self.input, self.output = self.input + inp, self.output + out
        self.cache_read, self.cache_write = self.cache_read + cr, self.cache_write + cw
        self.cost_usd += (
            inp * profile.input_per_mtok
            + out * profile.output_per_mtok
            + cr * profile.cache_read_per_mtok
            + cw * profile.cache_write_per_mtok
        ) / 1_000_000


def model_call_event(
    response: ModelResponse,
    content: list[dict[str, Any]],
    *,
    span: str,
    parent: str,
    turn: int,
    default_model: str,
    request_model: str = "",
    max_tokens: int = 0,
    closing: bool = False,
) -> ModelCall:
    """The ``ModelCall`` event of one response (``content`` already dumped to dicts)."""
    message, usage = response.message, response.message.usage
    cache_read = usage.cache_read_input_tokens or 0
    cache_write = usage.cache_creation_input_tokens or 0
    return ModelCall(
        span=span,
        parent=parent,
        turn=turn,
        model=message.model or default_model,
        request_model=request_model or default_model,
        max_tokens=max_tokens,
        stream=response.streamed,
        stop_reason=message.stop_reason,
        input_tokens=usage.input_tokens or 0,
        output_tokens=usage.output_tokens or 0,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
        # The API's usage is the ground truth for what the context held.
        context_tokens=(usage.input_tokens or 0) + cache_read + cache_write,
        latency_s=round(response.latency_s, 4),
        retries=response.retries,
        offline=response.offline,
        content=content,
        **answered_by(response),
        closing=closing,
    )


def answered_by(response: ModelResponse) -> dict[str, Any]:
    """The ``ModelCall`` fields that say which response it was and who sent it."""
    return {
        "response_id": response.message.id or "",
        "server_address": response.server_address,
        "server_port": response.server_port,
    }

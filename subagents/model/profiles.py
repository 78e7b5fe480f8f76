"""Known model profiles: context window, output limit and prices per million tokens.

A model string is matched exactly, then by the longest known prefix, so dated
names (``claude-sonnet-4-5-20250929``) and provider spellings
(``anthropic/claude-haiku-4-5``, ``claude-opus-4-1@20250805``) find their family.
An unknown string gets conservative defaults (200k window, 8k output, Sonnet-class
prices so cost is not under-reported) with ``known=False`` and exactly one warning
per name: a missing profile is never silent. The 4.x models keep the default 200k
window even where a 1M-token beta exists, because the larger window needs a beta
header the job must ask for.
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any

from pydantic import BaseModel, ConfigDict

from .choice import is_offline_name


class ModelProfile(BaseModel):
    """What the harness must know about a model to budget its context and cost."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """Model string as sent to the API."""
    context_window: int = 200_000
    """Tokens the model accepts in one request (input + output)."""
    max_output: int = 8_192
    """Largest ``max_tokens`` the model accepts."""
    input_per_mtok: float = 3.0
    """USD per million uncached input tokens."""
    output_per_mtok: float = 15.0
    """USD per million output tokens."""
    cache_read_per_mtok: float = 0.3
    """USD per million input tokens read from the prompt cache."""
    cache_write_per_mtok: float = 3.75
    """USD per million input tokens written to the prompt cache."""
    known: bool = True
    """False when the name matched no profile and conservative defaults were used."""


log = logging.getLogger(__name__)


class UnknownModelWarning(UserWarning):
    """A model string matched no known profile; conservative defaults are used."""


def _p(name: str, window: int, out: int, inp: float, outp: float) -> ModelProfile:
    # Cache reads cost 0.1x input, 5-minute cache writes 1.25x input on every Claude model.
    return ModelProfile(
        name=name,
        context_window=window,
        max_output=out,
        input_per_mtok=inp,
        output_per_mtok=outp,
        cache_read_per_mtok=round(inp * 0.1, 4),
        cache_write_per_mtok=round(inp * 1.25, 4),
    )


KNOWN_PROFILES: dict[str, ModelProfile] = {
    p.name: p
    for p in [
        # 1M-token generation (platform.claude.com model pages, mid 2026).
        _p("claude-fable-5", 1_000_000, 128_000, 10.0, 50.0),
        _p("claude-mythos-5", 1_000_000, 128_000, 10.0, 50.0),
        _p("claude-opus-5-5", 1_000_000, 128_000, 4.0, 20.0),
        _p("claude-opus-5", 1_000_000, 128_000, 5.0, 25.0),
        _p("claude-sonnet-5", 1_000_000, 128_000, 2.0, 10.0),
        # Haiku 5.5 is priced in tiers "from" this rate; the lowest tier is recorded.
        _p("claude-haiku-5", 1_000_000, 128_000, 0.1, 0.5),
        # 200k-token generation (a 1M beta exists for some; it needs a beta header).
        _p("claude-opus-4-8", 200_000, 128_000, 5.0, 25.0),
        _p("claude-opus-4-7", 200_000, 128_000, 5.0, 25.0),
        _p("claude-opus-4-6", 200_000, 128_000, 5.0, 25.0),
        _p("claude-opus-4-5", 200_000, 64_000, 5.0, 25.0),
        _p("claude-opus-4-1", 200_000, 32_000, 15.0, 75.0),
        _p("claude-opus-4", 200_000, 32_000, 15.0, 75.0),
        _p("claude-sonnet-4-6", 200_000, 64_000, 3.0, 15.0),
        _p("claude-sonnet-4-5", 200_000, 64_000, 3.0, 15.0),
        _p("claude-sonnet-4", 200_000, 64_000, 3.0, 15.0),
        _p("claude-haiku-4-5", 200_000, 64_000, 1.0, 5.0),
        _p("claude-3-7-sonnet", 200_000, 64_000, 3.0, 15.0),
        _p("claude-3-5-haiku", 200_000, 8_192, 0.8, 4.0),
    ]
}
"""Profiles by family prefix; the longest matching prefix wins."""

OFFLINE_PROFILE = ModelProfile(
    name="offline",
    context_window=200_000,
    max_output=8_192,
    input_per_mtok=0.0,
    output_per_mtok=0.0,
    cache_read_per_mtok=0.0,
    cache_write_per_mtok=0.0,
)
"""Offline models (policies, replay): nothing is billed."""

_warned: set[str] = set()
_warned_lock = threading.Lock()


def _normalize(name: str) -> str:
    name = name.strip().lower()
    for prefix in ("anthropic/", "anthropic."):
        name = name.removeprefix(prefix)
    return name.split("@", 1)[0]


def normalized(name: str) -> str:
    """A model name as the profiles' prefixes are written."""
    return _normalize(name)


def offline_profile(name: str = "offline") -> ModelProfile:
    """The offline profile under ``name`` (``offline:research``, ``replay:...``)."""
    return OFFLINE_PROFILE.model_copy(update={"name": name})


def profile_for(name: str) -> ModelProfile:
    """The profile of ``name``; unknown names get defaults and one warning per name."""
    if is_offline_name(name):
        return offline_profile(name)
    key = _normalize(name)
    matches = [p for prefix, p in KNOWN_PROFILES.items() if key.startswith(prefix)]
    if matches:
        best = max(matches, key=lambda p: len(p.name))
        return best.model_copy(update={"name": name})
    with _warned_lock:
        first = name not in _warned
        _warned.add(name)
    if first:
        message = (
            f"model {name!r} has no known profile: assuming a 200,000-token window, "
            "8,192 output tokens and $3/$15 per million input/output tokens. "
            f"Known families: {', '.join(sorted(KNOWN_PROFILES))}."
        )
        log.warning(message)
        warnings.warn(message, UnknownModelWarning, stacklevel=2)
    return ModelProfile(name=name, context_window=200_000, max_output=8_192, known=False)


def cost_usd(profile: ModelProfile, usage: Any) -> float:
    """Dollar cost of one response's ``usage`` (a :class:`~.message.Usage`, the SDK's, or a dict)."""

    def get(field: str) -> int:
        value = usage.get(field) if isinstance(usage, dict) else getattr(usage, field, None)
        return int(value or 0)

    return (
        get("input_tokens") * profile.input_per_mtok
        + get("output_tokens") * profile.output_per_mtok
        + get("cache_read_input_tokens") * profile.cache_read_per_mtok
        + get("cache_creation_input_tokens") * profile.cache_write_per_mtok
    ) / 1_000_000

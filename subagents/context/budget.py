"""The working-set budget and the thresholds derived from it.

The budget is separate from the model's window: long contexts degrade attention
well before they overflow, so by default the budget is min(85% of the window,
150,000 tokens) and a 1M-token window still gets 150,000. Every threshold is a
fraction of the budget, so one knob moves them all together.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import ContextConfig


def working_set_budget(config: ContextConfig, context_window: int) -> int:
    """The budget in tokens for a model with ``context_window`` tokens."""
    if config.budget_tokens is not None:
        return min(config.budget_tokens, context_window)
    by_window = int(context_window * config.budget_window_fraction)
    return min(by_window, config.budget_cap_tokens)


@dataclass(frozen=True)
class Budget:
    """Token thresholds of one member, all derived from its working-set budget."""

    tokens: int
    """The working-set budget itself."""
    clip_at: int
    """Past this, old write/edit inputs become pointers."""
    trigger: int
    """Past this, older results are offloaded, then (if still over) the context is compacted."""
    offload_to: int
    """Over-budget offloading stops once the context is under this."""
    age_from: int
    """Past this, inline results the model has moved past may age into pointers."""

    @classmethod
    def from_config(cls, config: ContextConfig, context_window: int) -> Budget:
        tokens = working_set_budget(config, context_window)
        trigger = int(tokens * config.compact_fraction)
        # Clipping is the cheapest mechanism: it must never act later than compaction.
        clip_at = min(int(tokens * config.clip_fraction), trigger)
        offload_to = min(int(tokens * config.offload_target_fraction), clip_at)
        age_from = int(tokens * config.age_from_fraction)
        return cls(
            tokens=tokens,
            clip_at=clip_at,
            trigger=trigger,
            offload_to=offload_to,
            age_from=age_from,
        )

"""Model profiles: exact, dated and provider spellings match; unknown names warn once."""

from __future__ import annotations

import uuid
import warnings

import pytest

from subagents.model.profiles import UnknownModelWarning, cost_usd, profile_for


@pytest.mark.parametrize(
    ("name", "family_price"),
    [
        ("claude-sonnet-4-5-20250929", 3.0),
        ("claude-opus-4-1-20250805", 15.0),
        ("claude-opus-4-20250514", 15.0),
        ("claude-opus-4-5", 5.0),
        ("claude-opus-5-5", 4.0),
        ("claude-haiku-4-5@20251001", 1.0),
        ("anthropic/claude-sonnet-5", 2.0),
    ],
)
def test_known_models_match_by_longest_prefix(name: str, family_price: float) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        profile = profile_for(name)
    assert profile.known and profile.name == name
    assert profile.input_per_mtok == family_price
    assert profile.cache_read_per_mtok == pytest.approx(family_price * 0.1)


def test_unknown_model_warns_once_with_conservative_defaults() -> None:
    name = f"my-local-model-{uuid.uuid4().hex[:6]}"
    with pytest.warns(UnknownModelWarning, match=name) as record:
        first = profile_for(name)
        second = profile_for(name)
    assert len([w for w in record if name in str(w.message)]) == 1
    assert first == second and not first.known
    assert (first.context_window, first.max_output) == (200_000, 8_192)


def test_offline_profiles_are_free() -> None:
    for name in ("offline", "offline:research", "replay:runs/x/trace.jsonl"):
        profile = profile_for(name)
        assert profile.known and profile.name == name
        assert cost_usd(profile, {"input_tokens": 10**6, "output_tokens": 10**6}) == 0.0


def test_cost_counts_cache_reads_and_writes() -> None:
    profile = profile_for("claude-sonnet-4-5")
    usage = {
        "input_tokens": 1_000_000,
        "output_tokens": 100_000,
        "cache_read_input_tokens": 2_000_000,
        "cache_creation_input_tokens": 400_000,
    }
    assert cost_usd(profile, usage) == pytest.approx(3.0 + 1.5 + 0.6 + 1.5)

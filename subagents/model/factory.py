"""One factory from a model string (or a parsed :class:`ModelChoice`) to a :class:`Model`.

- ``offline``: the offline policy of the member's kind (``research`` for browser
  members, ``coding`` for coding members, ``lead`` for a lead, a policy registered
  under the kind's own name for other kinds), else ``echo`` with a warning;
- ``offline:<policy>``: that registered policy;
- ``replay:<path to trace.jsonl>``: replay of a recorded member;
- anything else: a real model through :class:`~subagents.model.claude.AnthropicModel`
  (key from ``ANTHROPIC_API_KEY``; unknown names warn once and get safe defaults).
"""

from __future__ import annotations

import logging
from typing import Any

from .base import Model
from .choice import ModelChoice, parse_model
from .offline import OfflineModel, ReplayModel, get_policy, policy_names

log = logging.getLogger(__name__)
_KIND_POLICIES = {"browser": "research", "coding": "coding", "lead": "lead"}


def kind_policy(kind: str | None) -> str:
    """The offline policy a member of ``kind`` gets from the plain ``offline`` model."""
    if not kind:
        return "echo"
    wanted = _KIND_POLICIES.get(kind, kind)
    if wanted in policy_names():
        return wanted
    log.warning("no offline %r policy is registered for %s members; using 'echo'", wanted, kind)
    return "echo"


def make_model(name: str | ModelChoice, *, kind: str | None = None, **options: Any) -> Model:
    """The model for ``name``; ``options`` go to :class:`AnthropicModel` (base_url,
    api_key, max_retries, trace, on_retry, ...) and are ignored by offline models."""
    choice = name if isinstance(name, ModelChoice) else parse_model(name)
    if choice.source == "offline":
        policy = choice.policy or kind_policy(kind)
        return OfflineModel(get_policy(policy), name=f"offline:{policy}")
    if choice.source == "replay":
        assert choice.trace is not None
        return ReplayModel(choice.trace)
    from .claude import AnthropicModel  # the SDK client is built only for real models

    return AnthropicModel(choice.name, **options)

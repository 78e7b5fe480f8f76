"""One factory from a model string to a :class:`~subagents.model_base.Model`.

- ``offline``: the offline policy of the member's kind (``research`` for browser
  members, ``coding`` for coding members) when one is registered, else ``echo``;
- ``offline:<policy>``: that registered policy;
- ``replay:<path to trace.jsonl>``: replay of a recorded member;
- anything else: a real model through :class:`~subagents.model.AnthropicModel`
  (key from ``ANTHROPIC_API_KEY``; unknown names warn once and get safe defaults).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from subagents.model import AnthropicModel
from subagents.model_base import Model, ModelError
from subagents.offline import OfflineModel, ReplayModel, get_policy, policy_names

log = logging.getLogger(__name__)
_KIND_POLICIES = {"browser": "research", "coding": "coding"}


def _kind_policy(kind: str | None) -> str:
    """The kind's offline policy, importing the kind's module so it can register it."""
    wanted = _KIND_POLICIES.get(kind or "")
    if wanted is None:
        return "echo"
    if wanted not in policy_names():
        try:
            importlib.import_module(f"subagents.kinds.{kind}")
        except ImportError:
            pass
    if wanted in policy_names():
        return wanted
    log.warning("no offline %r policy is registered for %s members; using 'echo'", wanted, kind)
    return "echo"


def make_model(name: str, *, kind: str | None = None, **options: Any) -> Model:
    """The model for ``name``; ``options`` go to :class:`AnthropicModel` (base_url,
    api_key, max_retries, trace, on_retry, ...) and are ignored by offline models."""
    name = name.strip()
    if not name:
        raise ModelError("empty model string: give a model name, 'offline' or 'replay:<trace>'")
    if name == "offline":
        policy = _kind_policy(kind)
        return OfflineModel(get_policy(policy), name=f"offline:{policy}")
    if name.startswith("offline:"):
        policy = name.removeprefix("offline:")
        return OfflineModel(get_policy(policy), name=name)
    if name.startswith("replay:"):
        return ReplayModel(name.removeprefix("replay:"))
    return AnthropicModel(name, **options)

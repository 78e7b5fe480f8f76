"""Which model a name stands for, parsed once.

A model string (job file, ``--model``, ``FLEET_MODEL``) is one of:

- ``auto``: Claude when ``ANTHROPIC_API_KEY`` is set (``FLEET_MODEL`` picks which,
  else :data:`DEFAULT_REAL_MODEL`), otherwise ``offline``; :func:`resolve_model`
  turns it into a concrete name, which is what a run records;
- ``offline``: the offline policy of the member's kind;
- ``offline:<policy>``: that registered offline policy;
- ``replay:<trace.jsonl>``: replay of a recorded member;
- anything else: a Claude model (or any Anthropic-compatible server) by name.

:func:`parse_model` turns a concrete name into a typed :class:`ModelChoice`; the
factory, the profiles and the coordinator read the choice instead of testing
prefixes each in its own way.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict

from .errors import ModelError

DEFAULT_REAL_MODEL = "claude-sonnet-5"
OFFLINE = "offline"
_OFFLINE_PREFIX = "offline:"
_REPLAY_PREFIX = "replay:"


class ModelChoice(BaseModel):
    """A parsed model string: where its answers come from and what it is called."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Literal["claude", "offline", "replay"]
    """``claude``: a real model over the Messages API; ``offline``: a deterministic
    policy; ``replay``: the model outputs recorded in a member's trace."""
    name: str
    """The name as recorded and shown (``claude-sonnet-5``, ``offline:research``)."""
    policy: str | None = None
    """For ``offline``: the policy asked for, or None for the member kind's own."""
    trace: str | None = None
    """For ``replay``: the path of the recorded ``trace.jsonl``."""

    @property
    def offline(self) -> bool:
        """True when no real model answers (offline policies and replays)."""
        return self.source != "claude"


def resolve_model(name: str) -> str:
    """``auto`` -> Claude when ANTHROPIC_API_KEY is set (``FLEET_MODEL`` picks which),
    else ``offline``; any other name is returned as it is."""
    if name != "auto":
        return name
    if os.environ.get("ANTHROPIC_API_KEY"):
        return os.environ.get("FLEET_MODEL") or DEFAULT_REAL_MODEL
    return OFFLINE


def is_offline_name(name: str) -> bool:
    """True for names no real model answers (``offline``, ``offline:*``, ``replay:*``)."""
    return name == OFFLINE or name.startswith((_OFFLINE_PREFIX, _REPLAY_PREFIX))


def parse_model(name: str) -> ModelChoice:
    """The :class:`ModelChoice` for ``name`` (``auto`` resolved first); raises
    :class:`ModelError` for an empty name, policy or trace path."""
    name = resolve_model(name.strip())
    if not name:
        raise ModelError("empty model string: give a model name, 'offline' or 'replay:<trace>'")
    if name == OFFLINE:
        return ModelChoice(source="offline", name=name)
    if name.startswith(_OFFLINE_PREFIX):
        policy = name.removeprefix(_OFFLINE_PREFIX)
        if not policy:
            raise ModelError("'offline:' names no policy: write 'offline' or 'offline:<policy>'")
        return ModelChoice(source="offline", name=name, policy=policy)
    if name.startswith(_REPLAY_PREFIX):
        trace = name.removeprefix(_REPLAY_PREFIX)
        if not trace:
            raise ModelError("'replay:' names no trace: write 'replay:<path to trace.jsonl>'")
        return ModelChoice(source="replay", name=name, trace=trace)
    return ModelChoice(source="claude", name=name)

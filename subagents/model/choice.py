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
prefixes each in its own way. The plain-string rules (``auto``, the offline prefixes)
live in :mod:`.names`, which loads nothing but the standard library.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from .errors import ModelError
from .names import (
    DEFAULT_REAL_MODEL,
    OFFLINE,
    OFFLINE_PREFIX,
    REPLAY_PREFIX,
    is_offline_name,
    resolve_model,
)

__all__ = [
    "DEFAULT_REAL_MODEL",
    "OFFLINE",
    "ModelChoice",
    "is_offline_name",
    "parse_model",
    "resolve_model",
]


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


def parse_model(name: str) -> ModelChoice:
    """The :class:`ModelChoice` for ``name`` (``auto`` resolved first); raises
    :class:`ModelError` for an empty name, policy or trace path."""
    name = resolve_model(name.strip())
    if not name:
        raise ModelError("empty model string: give a model name, 'offline' or 'replay:<trace>'")
    if name == OFFLINE:
        return ModelChoice(source="offline", name=name)
    if name.startswith(OFFLINE_PREFIX):
        policy = name.removeprefix(OFFLINE_PREFIX)
        if not policy:
            raise ModelError("'offline:' names no policy: write 'offline' or 'offline:<policy>'")
        return ModelChoice(source="offline", name=name, policy=policy)
    if name.startswith(REPLAY_PREFIX):
        trace = name.removeprefix(REPLAY_PREFIX)
        if not trace:
            raise ModelError("'replay:' names no trace: write 'replay:<path to trace.jsonl>'")
        return ModelChoice(source="replay", name=name, trace=trace)
    return ModelChoice(source="claude", name=name)

"""Model strings read as plain strings: ``auto`` resolved, offline names told apart.

Apart from :mod:`.choice` (which types a name as a pydantic :class:`ModelChoice`) so
that what decides, before anything else is loaded, whether a command will call the
Messages API (:mod:`.sdk_import`) needs nothing but the standard library.
"""

from __future__ import annotations

import os

DEFAULT_REAL_MODEL = "claude-sonnet-5"
OFFLINE = "offline"
OFFLINE_PREFIX = "offline:"
REPLAY_PREFIX = "replay:"


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
    return name == OFFLINE or name.startswith((OFFLINE_PREFIX, REPLAY_PREFIX))


def calls_the_api(name: str) -> bool:
    """True when ``name`` (``auto`` resolved, spaces stripped, as :func:`parse_model`
    reads it) is a model the Messages API answers; an empty name is not."""
    name = resolve_model(name.strip())
    return bool(name) and not is_offline_name(name)

"""Which model a name stands for: ``auto`` resolves to Claude or the offline model,
and offline models are told apart (they plan and synthesize without a model call)."""

from __future__ import annotations

import os
from typing import Any

from subagents.model_base import Model

DEFAULT_REAL_MODEL = "claude-sonnet-5"


def resolve_model(name: str) -> str:
    """``auto`` -> Claude when ANTHROPIC_API_KEY is set (``FLEET_MODEL`` picks which),
    else the offline model."""
    if name != "auto":
        return name
    if os.environ.get("ANTHROPIC_API_KEY"):
        return os.environ.get("FLEET_MODEL") or DEFAULT_REAL_MODEL
    return "offline"


def is_offline(model: Model | None) -> bool:
    if model is None:
        return True
    name = model.profile.name
    return (
        bool(getattr(model, "offline", False))
        or name == "offline"
        or name.startswith(("offline:", "replay:"))
    )


def default_make_model(name: str, **options: Any) -> Model:
    from subagents.models import make_model

    return make_model(name, **options)

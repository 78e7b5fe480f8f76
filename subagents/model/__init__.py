"""The model room: everything about the model behind a member, in one place.

- :mod:`.base`: the :class:`Model` seam (Messages API requests and responses,
  ``offline``, ``aclose()``), :class:`ModelProfile` and :class:`ModelError`;
- :mod:`.message`: Fleet's own model of a response (``ModelResponse.message``);
- :mod:`.choice`: a model string parsed once into a :class:`ModelChoice`
  (``auto`` resolved, ``offline[:policy]``, ``replay:<trace>``, a Claude name), with
  the plain-string rules in :mod:`.names` (standard library only);
- :mod:`.factory`: :func:`make_model`, from a name or a choice to a model;
- :mod:`.claude`: the real adapter over the official ``anthropic`` client, its
  credentials read by :mod:`.credentials` (without the SDK) and the SDK imported on a
  thread while a run starts by :mod:`.sdk_import`;
- :mod:`.offline`: offline models (policies, replay) and the policy registry, with
  the built-in kinds' policies in :mod:`.offline_research` and :mod:`.offline_coding`;
- :mod:`.profiles`: context windows, output limits and prices per model family.

The names below are loaded on first use (PEP 562), not when the package is: a
command that reads runs (``fleet trace``, ``fleet runs``) needs :mod:`.profiles` and
:class:`ModelError`, not the ``anthropic`` client, whose import takes about three
seconds of CPU. Only :mod:`.claude` imports the SDK, and :func:`make_model` imports
:mod:`.claude` only for a real (or fake-API) model, so a run on an offline model
never loads it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import Model, ModelError, ModelProfile, ModelRequest, ModelResponse
    from .choice import DEFAULT_REAL_MODEL, ModelChoice, parse_model, resolve_model
    from .factory import make_model

_HOMES = {
    "Model": ".base",
    "ModelError": ".base",
    "ModelProfile": ".base",
    "ModelRequest": ".base",
    "ModelResponse": ".base",
    "DEFAULT_REAL_MODEL": ".choice",
    "ModelChoice": ".choice",
    "parse_model": ".choice",
    "resolve_model": ".choice",
    "make_model": ".factory",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_REAL_MODEL",
    "Model",
    "ModelChoice",
    "ModelError",
    "ModelProfile",
    "ModelRequest",
    "ModelResponse",
    "make_model",
    "parse_model",
    "resolve_model",
]

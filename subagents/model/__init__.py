"""The model room: everything about the model behind a member, in one place.

- :mod:`.base`: the :class:`Model` seam (Messages API requests and responses,
  ``offline``, ``aclose()``), :class:`ModelProfile` and :class:`ModelError`;
- :mod:`.choice`: a model string parsed once into a :class:`ModelChoice`
  (``auto`` resolved, ``offline[:policy]``, ``replay:<trace>``, a Claude name);
- :mod:`.factory`: :func:`make_model`, from a name or a choice to a model;
- :mod:`.claude`: the real adapter over the official ``anthropic`` client;
- :mod:`.offline`: offline models (policies, replay) and the policy registry, with
  the built-in kinds' policies in :mod:`.offline_research` and :mod:`.offline_coding`;
- :mod:`.profiles`: context windows, output limits and prices per model family.
"""

from .base import Model, ModelError, ModelProfile, ModelRequest, ModelResponse
from .choice import DEFAULT_REAL_MODEL, ModelChoice, parse_model, resolve_model
from .factory import make_model

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

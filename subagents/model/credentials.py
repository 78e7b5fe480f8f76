"""The credentials of a Claude model, from the caller or the environment.

Apart from :mod:`.claude` so that the preflight can refuse a model with no key before
a run exists without importing the ``anthropic`` SDK: that import runs on a thread
beside the preflight (:mod:`.sdk_import`), and nothing before the first model call
waits for it.
"""

from __future__ import annotations

import os

from .errors import ModelError


def api_credentials(name: str, api_key: str | None = None) -> tuple[str | None, str | None]:
    """``(api key, auth token)`` for model ``name``: ``api_key``, else ANTHROPIC_API_KEY,
    else ANTHROPIC_AUTH_TOKEN (one of the two is set); raises :class:`ModelError` when
    there is neither, saying what to set."""
    key = api_key or os.environ.get("ANTHROPIC_API_KEY")
    token = None if key else os.environ.get("ANTHROPIC_AUTH_TOKEN")
    if not key and not token:
        raise ModelError(
            f"no API key for model {name!r}: set ANTHROPIC_API_KEY in the environment "
            "(or choose an offline model such as 'offline' or 'replay:<trace.jsonl>')"
        )
    return key, token

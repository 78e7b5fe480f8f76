"""``GET /v1/models`` and ``GET /v1/models/{id}``: the model list, shaped like the real API's.

Why the list is Fleet's known profiles: they are the models Fleet has a window, an
output limit and prices for, so a client that lists models and picks one gets a name
every other part of Fleet understands. The real API lists newest first; the profiles
are kept newest first too, so that order is kept. Release dates are not recorded, and
the API says ``created_at`` may be the epoch when the date is unknown: that is what
the fake sends rather than an invented date. Pagination follows the API (``limit``
1-1000, default 20; ``after_id`` / ``before_id`` cursors; ``has_more``, ``first_id``,
``last_id``); a bad parameter is a 400 ``invalid_request_error`` naming it.
"""

from __future__ import annotations

from typing import Any

from subagents.model.profiles import KNOWN_PROFILES

EPOCH = "1970-01-01T00:00:00Z"
DEFAULT_LIMIT = 20
MAX_LIMIT = 1000


class ModelsError(Exception):
    """A models request the API would refuse; ``status`` and ``error_type`` say how."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type


def display_name(model_id: str) -> str:
    """``claude-opus-4-6`` -> ``Claude Opus 4.6``; ``claude-3-5-haiku`` -> ``Claude 3.5 Haiku``."""
    words: list[str] = []
    for part in model_id.split("-"):
        if part.isdigit() and words and words[-1][-1].isdigit():
            words[-1] += f".{part}"
        else:
            words.append(part if part.isdigit() else part.capitalize())
    return " ".join(words)


def model_info(model_id: str) -> dict[str, Any]:
    """One ``ModelInfo`` object (``type: model``) for a known profile or an extra name."""
    profile = KNOWN_PROFILES.get(model_id)
    return {
        "type": "model",
        "id": model_id,
        "display_name": display_name(model_id),
        "created_at": EPOCH,
        "lifecycle": "active",
        "max_input_tokens": profile.context_window if profile else None,
        "max_tokens": profile.max_output if profile else None,
    }


def model_ids(extra: str | None = None) -> list[str]:
    """The listed ids, newest first; ``extra`` (the server's fixed model name) leads."""
    ids = list(KNOWN_PROFILES)
    if extra and extra not in ids:
        ids.insert(0, extra)
    return ids


def get_model(model_id: str, extra: str | None = None) -> dict[str, Any]:
    """The answer to ``GET /v1/models/{model_id}``; an unknown id is a 404."""
    if model_id not in model_ids(extra):
        raise ModelsError(404, "not_found_error", f"model: {model_id}")
    return model_info(model_id)


def list_models(query: dict[str, list[str]], extra: str | None = None) -> dict[str, Any]:
    """The answer to ``GET /v1/models`` for the parsed query string."""
    ids = model_ids(extra)
    limit = _limit(query)
    after, before = _cursor(query, "after_id", ids), _cursor(query, "before_id", ids)
    if after is not None and before is not None:
        raise ModelsError(
            400, "invalid_request_error", "after_id and before_id cannot both be given"
        )
    if before is not None:
        start = max(0, before - limit)
        page, has_more = ids[start:before], start > 0
    else:
        start = 0 if after is None else after + 1
        page, has_more = ids[start : start + limit], start + limit < len(ids)
    return {
        "data": [model_info(i) for i in page],
        "has_more": has_more,
        "first_id": page[0] if page else None,
        "last_id": page[-1] if page else None,
    }


def _limit(query: dict[str, list[str]]) -> int:
    raw = (query.get("limit") or [str(DEFAULT_LIMIT)])[-1]
    try:
        limit = int(raw)
    except ValueError:
        raise ModelsError(
            400, "invalid_request_error", f"limit: Input should be a valid integer, got {raw!r}"
        ) from None
    if not 1 <= limit <= MAX_LIMIT:
        raise ModelsError(
            400, "invalid_request_error", f"limit: Input should be between 1 and {MAX_LIMIT}"
        )
    return limit


def _cursor(query: dict[str, list[str]], name: str, ids: list[str]) -> int | None:
    values = query.get(name)
    value = values[-1] if values else None
    if value is None:
        return None
    if value not in ids:
        raise ModelsError(400, "invalid_request_error", f"{name}: no model with id {value!r}")
    return ids.index(value)

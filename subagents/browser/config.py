"""How a browser member's session behaves: timeouts, page chunking, the search page."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_SEARCH_URL = "http://corpus:8080/search?q={query}"
"""The offline corpus's search page (the corpus box's DNS alias on the run network)."""


class BrowserConfig(BaseModel):
    """Settings of one browser member's session (a browser member's ``MemberSpec.settings``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    search_url: str = DEFAULT_SEARCH_URL
    """Search page of an allowlisted site; ``{query}`` is replaced by the URL-encoded query."""
    connect_timeout_s: float = Field(default=20.0, gt=0)
    """Seconds to reach the box's CDP endpoint (Chromium may still be starting)."""
    action_timeout_s: float = Field(default=15.0, gt=0)
    """Seconds one click, type, scroll or read may take."""
    navigation_timeout_s: float = Field(default=30.0, gt=0)
    """Seconds one navigation (navigate, back, search, a submit) may take."""
    chunk_chars: int = Field(default=6_000, ge=500)
    """Characters of page text per ``read`` chunk (and shown by ``snapshot``)."""
    max_elements: int = Field(default=80, ge=5)
    """Interactive elements listed by ``snapshot`` (the rest: ``links`` or ``find``)."""
    max_links: int = Field(default=200, ge=5)
    """Links listed by ``links``."""
    viewport: tuple[int, int] = (1280, 800)
    """Viewport width and height in CSS pixels (screenshots have this size)."""

    @field_validator("search_url")
    @classmethod
    def _has_query(cls, v: str) -> str:
        if "{query}" not in v or not v.startswith(("http://", "https://")):
            raise ValueError(
                f"search_url {v!r} must be an http(s) URL containing '{{query}}', "
                f"e.g. {DEFAULT_SEARCH_URL!r}"
            )
        return v

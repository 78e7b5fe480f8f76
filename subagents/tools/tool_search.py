"""Deferred tool schemas: past a threshold, MCP tools are listed by name and loaded on demand.

Every tool definition is sent with every model call, and MCP servers can bring dozens
of tools with long schemas: 50 of them cost thousands of prompt tokens per turn
before the member has done anything (``bench/mcp_tools.py`` measures it). Past
:data:`DEFER_TOOLS` MCP tools or :data:`DEFER_TOKENS` tokens of their definitions,
they are *deferred*: the model is sent the built-in tools in full plus
``tool_search``, whose description lists each deferred tool's name and the first line
of its description. ``tool_search`` answers with the full schemas of the tools asked
for (by exact names, or by words matched against names and descriptions) and loads
them: from the next model call on they are sent in full, like any other tool.

Why client-side: the offline models and any Messages API endpoint see ordinary tool
definitions, and the trace shows what was loaded when. The cost is that a newly
loaded tool changes the tools part of the prompt, so the prompt cache is re-written
from there once per load, not once per turn. A deferred tool the model calls
without loading it still runs (the registry knows it); its schema errors come back
as usual.
"""

from __future__ import annotations

import json
import re
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from ..browser.dom import untrusted
from ..model.tokens import estimate_text
from .base import Tool, ToolContext, ToolOutput
from .registry import ToolRegistry

DEFER_TOOLS = 10
"""More MCP tools than this are deferred."""
DEFER_TOKENS = 5_000
"""MCP tool definitions estimated above this many tokens are deferred."""
SOURCE = "mcp://tool_search"
"""What the untrusted block of servers' listings and schemas is named."""


class ToolView:
    """The tool definitions the model is sent: all, minus deferred tools not yet loaded."""

    def __init__(self, registry: ToolRegistry, deferrable: list[Tool]) -> None:
        self.registry = registry
        tokens = estimate_text(json.dumps([t.definition() for t in deferrable]))
        defer = len(deferrable) > DEFER_TOOLS or tokens > DEFER_TOKENS
        self.deferred: dict[str, Tool] = {t.name: t for t in deferrable} if defer else {}
        self.loaded: list[str] = []

    def definitions(self) -> list[dict]:
        return [
            d
            for d in self.registry.definitions()
            if d["name"] not in self.deferred or d["name"] in self.loaded
        ]


class ToolSearchInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1)
    """Exact tool names (comma or space separated), or words to look for in names and
    descriptions."""
    max_results: int = Field(default=5, ge=1, le=20)
    """Most tools loaded by one search."""


class ToolSearch(Tool):
    """``tool_search``: load deferred tools' full schemas."""

    name: ClassVar[str] = "tool_search"
    description: ClassVar[str] = ""
    Input: ClassVar[type[BaseModel]] = ToolSearchInput

    def __init__(self, view: ToolView) -> None:
        self.view = view
        # Their names are checked (tools/mcp_announce.py); each first line and schema is
        # a server's text, so the listing and the answers sit in one untrusted block.
        listing = "\n".join(
            f"- {name}: {_first_line(getattr(tool, 'summary', tool.description))}"
            for name, tool in view.deferred.items()
        )
        self.description = (  # type: ignore[misc]
            "Load the full schema of tools listed here by name only, so that you can call "
            "them. Give their exact names (or words to search their descriptions); their "
            "schemas come back and they are callable from your next turn on. Tools, with "
            "the first line their servers give:\n" + untrusted(SOURCE, listing)
        )

    async def run(self, args: ToolSearchInput, ctx: ToolContext) -> ToolOutput:
        deferred = self.view.deferred
        names = [n for n in re.split(r"[\s,]+", args.query.strip()) if n]
        found = [n for n in names if n in deferred]
        if not found:
            words = [w.lower() for w in names]
            scored = []
            for name, tool in deferred.items():
                hay = f"{name} {tool.description}".lower()
                score = sum(1 for w in words if w in hay)
                if score:
                    scored.append((-score, name))
            found = [name for _, name in sorted(scored)]
        found = found[: args.max_results]
        if not found:
            return ToolOutput(
                text=f"No deferred tool matches {args.query!r}; the tools are listed in "
                "tool_search's description.",
                is_error=True,
            )
        for name in found:
            if name not in self.view.loaded:
                self.view.loaded.append(name)
        schemas = [deferred[n].definition() for n in found]
        return ToolOutput(
            text=f"Loaded {len(found)} tool(s); call them from your next turn on:\n"
            + untrusted(SOURCE, json.dumps(schemas, indent=1, ensure_ascii=False))
        )


def _first_line(text: str, limit: int = 120) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."

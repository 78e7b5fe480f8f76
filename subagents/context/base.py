"""What the loop needs from a member's context: the seam :class:`ContextLike`.

:class:`~subagents.context.manager.ContextManager` is the implementation; the loop,
its tool calls and :func:`~subagents.member.run_member` see only this protocol, so a
member can run with the mechanisms off (a context that passes everything through, as
the harness benchmark does).
"""

from __future__ import annotations

from typing import Any, Protocol

from ..tools.base import Tool


class ContextLike(Protocol):
    """What the loop needs from :class:`subagents.context.manager.ContextManager`."""

    summary_usage: list[Any]
    """Usage of the context's own model calls (compaction summaries), in order: they
    are the member's calls too, and count toward its tokens and cost."""

    def tools(self) -> list[Tool]:
        """The context's tools for the model (todo list, memory), if any."""
        ...

    async def start(self) -> str:
        """Load what the member starts with; the memory text for the first message."""
        ...

    async def prepare(
        self, messages: list[dict[str, Any]], *, turn: int, system: str, tools: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """The messages to send this turn, made to fit the budget."""
        ...

    def observe_usage(self, usage: Any, sent_messages: list[dict[str, Any]]) -> None:
        """The API's usage for the messages just sent (before the answer is appended)."""
        ...

    def estimate(
        self, messages: list[dict[str, Any]], system: Any, tools: list[dict[str, Any]]
    ) -> int:
        """Tokens a call with these messages, system and tools would send."""
        ...

    def context_management(self) -> dict[str, Any] | None:
        """Server-side context edits for the request, or None."""
        ...

    async def admit_tool_result(self, call_id: str, tool: str, text: str) -> tuple[str, str | None]:
        """A tool result as the model will see it, and where it was offloaded (or None)."""
        ...

    def note_files_written(self, paths: list[str]) -> None:
        """Files the member changed in its box."""
        ...

    def todo_items(self) -> list[dict[str, Any]]:
        """The member's todo list now (empty without one)."""
        ...

    async def finish(self) -> None:
        """Save what outlives the member (its memory), however it ended."""
        ...

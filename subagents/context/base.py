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

    def tools(self) -> list[Tool]: ...
    async def start(self) -> str: ...
    async def prepare(
        self, messages: list[dict[str, Any]], *, turn: int, system: str, tools: list[dict[str, Any]]
    ) -> list[dict[str, Any]]: ...
    def observe_usage(self, usage: Any, sent_messages: list[dict[str, Any]]) -> None: ...
    async def admit_tool_result(
        self, call_id: str, tool: str, text: str
    ) -> tuple[str, str | None]: ...
    def note_files_written(self, paths: list[str]) -> None: ...
    async def finish(self) -> None: ...

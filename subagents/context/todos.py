"""Todo-state and recitation: the plan as a mutable artifact, kept in recent attention.

The agent rewrites its whole list with ``write_todos`` (rewriting, not patching, is
what recites the objectives). The harness then appends the list to the end of the
context when it changed and every ``recite_every`` turns, so the plan sits where
attention is strongest instead of drifting into the middle of a long window. The
list lives outside the messages, so compaction cannot summarize it away: the new
context gets it verbatim. Opt-in per member (evals show it costs a little on short
tasks and helps on long multi-step ones), default on for coding members.

Recitation is appended as a text block to the last user message in place, so it
becomes part of the history at that point and the cached prefix before it is
untouched.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..model.wire import replace_block
from ..tools.base import Tool, ToolContext, ToolError, ToolOutput
from ..trace import Todos, TraceWriter
from .tokens import estimate_text

TODO_TAG = "todo_list"
SUPERSEDED = "(todo list shown here earlier; superseded by a later one)"
_STATUS_MARK = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]"}


class TodoItem(BaseModel):
    """One step of the plan."""

    model_config = ConfigDict(extra="forbid")

    content: str = Field(min_length=1, max_length=500)
    """What to do, as an imperative sentence."""
    status: Literal["pending", "in_progress", "completed"] = "pending"
    """pending, in_progress (at most one at a time) or completed."""


class TodoState:
    """The member's current list and when it was last recited."""

    def __init__(self, trace: TraceWriter | None = None) -> None:
        self.items: list[TodoItem] = []
        self.changed = False
        self.last_recited_turn: int | None = None
        self.trace = trace
        self.recitals: list[tuple[dict[str, Any], dict[str, Any]]] = []
        """(message, block) of each recitation still in the context, oldest first."""

    def replace(self, items: list[TodoItem]) -> None:
        self.items = list(items)
        self.changed = True
        if self.trace is not None:
            self.trace.emit(Todos(todos=[i.model_dump() for i in self.items]))

    def render(self) -> str:
        """The list as the model sees it."""
        lines = [f"{_STATUS_MARK[i.status]} {i.content}" for i in self.items]
        done = sum(i.status == "completed" for i in self.items)
        return (
            f"<{TODO_TAG} done={done} total={len(self.items)}>\n"
            + "\n".join(lines)
            + f"\n</{TODO_TAG}>"
        )

    def due(self, turn: int, every: int) -> bool:
        """Recite now? When the list changed, or ``every`` turns after the last time."""
        if not self.items:
            return False
        if self.changed or self.last_recited_turn is None:
            return True
        return turn - self.last_recited_turn >= every

    def recite(self, messages: list[dict[str, Any]], turn: int) -> dict[str, Any] | None:
        """Append the list to the last user message (replaced by a copy that has it);
        returns the new message (or None)."""
        if not messages or messages[-1].get("role") != "user":
            return None
        content = messages[-1].get("content") or []
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        text = "Current todo list (update it with write_todos as you progress):\n" + self.render()
        block = {"type": "text", "text": text}
        message = messages[-1] = {**messages[-1], "content": [*content, block]}
        self.recitals.append((message, block))
        self.changed = False
        self.last_recited_turn = turn
        if self.trace is not None:
            self.trace.emit(
                Todos(todos=[i.model_dump() for i in self.items], recited=True, turn=turn)
            )
        return message

    def retire_old_recitals(
        self, messages: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], int]:
        """Shrink every recitation but the latest to one line (they are superseded).

        Each message holding one is replaced by a copy. Returns the messages replaced
        and the tokens saved. Called under budget pressure only, since rewriting old
        blocks invalidates the cached prefix.
        """
        changed: list[dict[str, Any]] = []
        saved = 0
        old = {id(block): block for _, block in self.recitals[:-1]}
        for index, message in enumerate(messages):
            content = message.get("content")
            if not old or not isinstance(content, list):
                continue
            for block in content:
                # Same id, same object: ``old`` keeps every recital block alive.
                recital = old.pop(id(block), None)
                if recital is None or recital["text"] == SUPERSEDED:
                    continue
                saved += estimate_text(recital["text"]) - estimate_text(SUPERSEDED)
                changed.append(messages[index])
                replace_block(messages, index, recital, {**recital, "text": SUPERSEDED})
        self.recitals = self.recitals[-1:]
        return changed, saved


class WriteTodosInput(BaseModel):
    """Replace the whole todo list."""

    model_config = ConfigDict(extra="forbid")

    todos: list[TodoItem] = Field(max_length=50)
    """The complete list, in order: every step, with its current status."""


class WriteTodos(Tool):
    """The ``write_todos`` tool: the agent rewrites its plan."""

    name = "write_todos"
    description = (
        "Write your plan as a todo list. Send the COMPLETE list every time (it replaces "
        "the previous one), with each item's status: pending, in_progress or completed. "
        "Keep at most one item in_progress. Use it for tasks with several steps; mark "
        "items completed as soon as they are done. The list is shown back to you and "
        "survives context compaction."
    )
    Input = WriteTodosInput

    def __init__(self, state: TodoState) -> None:
        self.state = state

    async def run(self, args: WriteTodosInput, ctx: ToolContext) -> ToolOutput:
        active = [i for i in args.todos if i.status == "in_progress"]
        if len(active) > 1:
            raise ToolError(
                f"{len(active)} items are in_progress; keep at most one in_progress "
                "and mark the others pending or completed"
            )
        self.state.replace(args.todos)
        done = sum(i.status == "completed" for i in args.todos)
        return ToolOutput(text=f"Todo list updated: {done}/{len(args.todos)} completed.")

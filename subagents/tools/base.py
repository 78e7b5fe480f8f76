"""What a tool is: a pydantic input schema plus an async implementation.

Tools talk to the member's sandbox only (through :class:`ToolContext`). A tool
signals a problem the model can fix by raising :class:`ToolError`; the loop turns
that (and any other exception, and schema validation errors) into an
``is_error`` tool result, and the run goes on.
"""

from __future__ import annotations

import abc
import copy
import weakref
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

from sandbox.base import Sandbox

from ..rules.delegation import Delegation
from ..trace import TraceWriter, no_lone_surrogates

CALL_ID: ContextVar[str] = ContextVar("fleet_tool_call_id", default="")
"""The ``tool_use`` id of the call being run (set per call, so concurrent calls each
see their own): a tool whose effect must happen once per call - a lead's spawn - keys
it by this id."""


def current_call_id() -> str:
    """The id of the tool call this code runs for ("" outside a tool call)."""
    return CALL_ID.get()


class ToolError(Exception):
    """A failure the model should see as an error result (bad path, no match...)."""


class Blocked(ToolError):
    """A call a policy refused (a host off the egress allowlist): no other arguments
    can make it work. Counted apart, so a member whose every call was refused is not
    taken for a success (:class:`subagents.loop.tool_calls.ToolCalls`)."""


@dataclass
class ToolOutput:
    """A tool's answer: text for the model, plus what the trace should know."""

    text: str
    is_error: bool = False
    truncated: bool = False
    files_written: list[str] = field(default_factory=list)
    """Paths in the box this call created or changed (for post-compaction re-reads)."""
    attachments: list[dict[str, Any]] = field(default_factory=list)
    """Extra content blocks for the model (e.g. an image), rarely used."""
    blocked: bool = False
    """A policy refused the call (:class:`Blocked`)."""

    def __post_init__(self) -> None:
        # Bytes a box wrote that are not UTF-8 can arrive surrogate-escaped (a file
        # name, a grep line): no record or request could be encoded with them.
        self.text = no_lone_surrogates(self.text)


@dataclass
class ToolContext:
    """What a tool may touch: the member's own box, run directory and trace."""

    sandbox: Sandbox | None
    run_dir: Path
    trace: TraceWriter
    member: str
    state: dict[str, Any] = field(default_factory=dict)
    """Per-member mutable state shared by tools (todo list, browser page, ...)."""
    settings: BaseModel | None = None
    """The member's kind settings (``MemberSpec.settings``), for the kind's hooks."""
    delegate: Delegation | None = None
    """Who runs a lead's members (the coordinator); None for every other member."""


class Tool(abc.ABC):
    """One tool the model can call."""

    name: ClassVar[str]
    description: ClassVar[str]
    Input: ClassVar[type[BaseModel]]

    @abc.abstractmethod
    async def run(self, args: Any, ctx: ToolContext) -> ToolOutput | str:
        """Do the work; raise :class:`ToolError` for errors the model can act on."""

    def definition(self) -> dict[str, Any]:
        """The Messages API tool definition."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": copy.deepcopy(input_schema(self.Input)),
        }


_SCHEMAS: weakref.WeakKeyDictionary[type[BaseModel], dict[str, Any]] = weakref.WeakKeyDictionary()


def input_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema of a tool's input model, built once per model class (pydantic
    takes about a millisecond per tool, which every member paid for every tool); the
    caller gets the shared dict and must not change it."""
    schema = _SCHEMAS.get(model)
    if schema is None:
        schema = model.model_json_schema()
        schema.pop("title", None)
        _SCHEMAS[model] = schema
    return schema

"""What one member is asked to do: :class:`MemberSpec`, the unit of work, and its
:class:`Limits`.

A spec is plain data, JSON-ready and validated when it is made, so it can cross to
another process or node as it is: the kind's settings and the member's box travel
in it typed and built once (``settings``, apart from the task's inputs, and
``sandbox``, a :class:`~sandbox.spec.SandboxSpec`). What comes back is a
:class:`~subagents.results.outcome.MemberOutcome`; :func:`subagents.member.run_member` turns
the one into the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    Field,
    SerializeAsAny,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sandbox.spec import SandboxSpec
from sandbox.strict import Strict

from .context.config import ContextConfig
from .kinds import NoSettings, get_kind, kind_settings
from .results.result_schema import ResultSchema, member_part
from .rules.policy import ToolPolicy
from .tools.mcp import McpServerSpec
from .tools.registry import CustomToolSpec


class Limits(Strict):
    """How far one member may go before it must stop with what it has.

    One class for the job file's ``limits`` tables and the harness: the job file's
    bounds are the ones that hold. A member stopped by a limit ends ``incomplete``
    with a partial result from one closing call (see subagents/loop/closing.py); the
    coordinator hands the harness a deadline 10% (at most 60 s) earlier than the job's,
    so that call happens before the hard deadline, past which the member is
    ``timed_out``.
    """

    max_turns: int = Field(default=30, ge=1, le=1000)
    """Regular model calls at most (then the closing call)."""
    max_tokens: int | None = Field(default=None, ge=1_000)
    """Total tokens over all calls (input, cache and output) at most; None: no cap.
    A turn starts only when it and the closing call after it fit."""
    deadline_s: float = Field(default=600.0, gt=0, le=86_400)
    """Wall-clock seconds for one attempt, tool calls and the closing call included."""
    result_tokens: int = Field(default=2_000, ge=100, le=20_000)
    """Cap on the submitted result; over it the model is asked once to condense."""


HARNESS_TOOLS = frozenset({"submit_result", "write_todos", "memory", "read_saved", "tool_search"})
"""Tools the harness itself may give any member; a job's tool cannot take their names."""


def check_tool_names(kind: str, names: list[str]) -> None:
    """Refuse job-defined tool names that are used twice, taken by the kind's or the
    harness's own tools, or in the ``mcp__`` namespace of MCP servers' tools."""
    k = get_kind(kind)
    builtin = {t.name for t in k.tools(kind_settings(kind))} | HARNESS_TOOLS
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"two tools are named {name!r}; tool names must be unique")
        seen.add(name)
        if name in builtin:
            raise ValueError(
                f"tool {name!r} has the name of a built-in tool of {kind} members "
                f"({', '.join(sorted(builtin))}); give it another name"
            )
        if name.startswith("mcp__"):
            raise ValueError(
                f"tool {name!r}: names starting with 'mcp__' belong to MCP servers' tools"
            )


def _default_settings(data: dict[str, Any]) -> BaseModel:
    return kind_settings(data["kind"]) if "kind" in data else NoSettings()


def _default_box(data: dict[str, Any]) -> SandboxSpec:
    return SandboxSpec(kind=get_kind(data["kind"]).box_kind) if "kind" in data else SandboxSpec()


class MemberSpec(Strict):
    """Everything one member needs, serializable: the unit of work."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    """Member id: directory name, trace member id and box label."""
    kind: str
    """Member kind (``coding``, ``browser``); decides prompt, tools and result model."""
    settings: SerializeAsAny[BaseModel] = Field(default_factory=_default_settings)
    """The kind's own settings, an instance of its ``Kind.settings`` (a browser member's
    ``BrowserConfig``, a coding member's ``CodingSettings``); the kind's defaults when
    not given. For the harness and the kind's hooks: never shown to the model as data."""
    task: str = Field(min_length=1)
    """What the member must do; put verbatim at the start of its context."""
    inputs: dict[str, Any] = Field(default_factory=dict)
    """Named facts handed over with the task (shown to the model as JSON)."""
    model: str = "offline"
    """Model string (a known model, ``offline`` or ``replay:<trace>``)."""
    fallback_model: str | None = None
    """The model the member goes on with when its own stays overloaded
    (:mod:`subagents.model.fallback`); None: it fails as the model does."""
    limits: Limits = Field(default_factory=Limits)
    stated_deadline_s: float | None = None
    """The deadline the job stated, when ``limits.deadline_s`` is the harness's own
    earlier stop ahead of the coordinator's hard one: the number messages name (a user
    who wrote 4 s must not read 3.6 s)."""
    max_output_tokens: int = Field(default=8_192, ge=256)
    """Output limit of one model call (never above the model's own limit); a job sets
    it with ``[model].max_tokens``."""
    tool_timeout_s: float = Field(default=600.0, gt=0)
    """Host-side ceiling of one tool call (a shell command's own timeout is lower)."""
    sandbox: SandboxSpec = Field(default_factory=_default_box)
    """The box this member runs in; default the kind's box with its secure defaults.
    Its ``kind`` must be the member kind's box kind."""
    memory_dir: Path | None = None
    """Host directory of the member's explicit memory; None: no memory."""
    tools: list[CustomToolSpec] = Field(default_factory=list)
    """Job-defined tools (command templates in the box, or host callables)."""
    mcp: list[McpServerSpec] = Field(default_factory=list)
    """MCP servers whose tools the member gets (``mcp__<server>__<tool>``)."""
    policy: ToolPolicy = Field(default_factory=ToolPolicy)
    """Allow / ask / deny rules checked before every tool call (the job's and the
    member's, merged); the default lets every call run."""
    todos: bool | None = None
    """``write_todos`` and recitation on or off; None: the context config, then the kind."""
    context: ContextConfig = Field(default_factory=ContextConfig)
    """Budget, offload, clip, compaction and memory thresholds."""
    result_schema: dict[str, Any] | None = None
    """The job's whole result schema (a JSON Schema object), said once: the properties
    the kind's result lacks are the member's to fill in (added to ``submit_result``:
    :func:`~subagents.results.result_schema.member_part`), and the whole is checked
    against the result after the member ends
    (:func:`subagents.results.schema_check.problems`, by the coordinator). None: use
    ``inputs["result_schema"]`` if the caller put it there, else none."""

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, v: str) -> str:
        get_kind(v)  # raises UnknownKind (a ValueError) naming the known kinds
        return v

    @field_validator("settings", mode="before")
    @classmethod
    def _settings_of_the_kind(cls, v: Any, info: ValidationInfo) -> Any:
        kind = info.data.get("kind")
        return v if kind is None else kind_settings(kind, v)

    @model_validator(mode="after")
    def _box_fits_the_kind(self) -> MemberSpec:
        box_kind = get_kind(self.kind).box_kind
        if self.sandbox.kind != box_kind:
            raise ValueError(
                f"a {self.kind} member runs in a {box_kind!r} box, but sandbox.kind is "
                f"{self.sandbox.kind!r}; e.g. SandboxSpec(kind={box_kind!r}, memory='1g')"
            )
        return self

    @model_validator(mode="after")
    def _tools_fit_the_kind(self) -> MemberSpec:
        check_tool_names(self.kind, [t.name for t in self.tools])
        names = [s.name for s in self.mcp]
        if len(set(names)) != len(names):
            raise ValueError("two MCP servers have the same name; server names must be unique")
        return self

    @model_validator(mode="after")
    def _result_schema_fits_the_kind(self) -> MemberSpec:
        self.member_result_schema()  # raises naming what the member could never satisfy
        return self

    def job_schema(self) -> dict[str, Any] | None:
        """The job's whole result schema: ``result_schema``, else
        ``inputs["result_schema"]``; None: the job asks nothing beyond the kind's result."""
        raw = self.result_schema
        if raw is None:
            raw = self.inputs.get("result_schema")
        return raw

    def member_result_schema(self) -> ResultSchema | None:
        """The job's result fields the member's model fills in (its part of
        :meth:`job_schema`); None: none."""
        raw = self.job_schema()
        if raw is None:
            return None
        kind = get_kind(self.kind)
        return member_part(raw, kind.submit_schema, kind.result_model)

    def todos_enabled(self) -> bool:
        for choice in (self.todos, self.context.todos):
            if choice is not None:
                return choice
        return get_kind(self.kind).todos

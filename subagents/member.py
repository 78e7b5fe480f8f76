"""The member seam: a serializable spec in, a serializable outcome out.

A member is a pure unit of work - :class:`MemberSpec` (pydantic, JSON-ready) goes in,
:class:`MemberOutcome` comes out, and in between it touches only its own box, its own
memory directory and its own run subdirectory. That is what lets the coordinator run
members in a local task group today and on cluster nodes later.

:func:`run_member` never raises for the member's own failure. The task failing, a
limit reached, the model giving up, the box dying, even a bug in a tool: each becomes
a status with a reason. Only cancellation propagates (the caller asked for it), and
even then the memory is saved and ``MemberEnd`` is traced, shielded from the
cancellation, before it does.

=========== ===============================================================
status      meaning
=========== ===============================================================
ok          ``submit_result`` was accepted; ``result`` holds it
incomplete  a limit (turns, tokens, deadline) was reached, or the model
            stopped without a result after one reminder; ``progress`` says
            what was done, ``partial_result`` holds what the member submitted
            in its closing call (limits only, when there was room for one)
crashed     the box died (``SandboxCrashed``) or cannot be reached any more
            (``SandboxClosed``, ``SandboxUnavailable``); ``reason`` names why
failed      the model call failed for good (``retryable`` says whether a later
            attempt may succeed, e.g. overload), the harness hit a bug, or the
            kind judged the accepted result a failure (a coding member's test
            fails after its edit); then ``result`` is kept for reading
cancelled   the caller cancelled the member (set by the caller's bookkeeping;
            ``run_member`` itself re-raises the cancellation)
timed_out   reserved for callers that enforce their own outer deadline
=========== ===============================================================
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sandbox.base import Sandbox
from sandbox.errors import SandboxClosed, SandboxCrashed, SandboxUnavailable
from sandbox.spec import SandboxSpec

from .context.config import ContextConfig
from .kinds import Kind, NoSettings, get_kind, kind_settings
from .model.base import Model, ModelError
from .result_schema import ResultSchema, extend_model, parse_result_schema
from .tools.registry import CustomToolSpec
from .trace import ErrorEvent, MemberEnd, MemberStart, TraceWriter

if TYPE_CHECKING:
    from .loop import ContextLike

Status = Literal["ok", "failed", "timed_out", "crashed", "cancelled", "incomplete"]
LimitName = Literal["turns", "tokens", "deadline", "no_result"]
FINISH_TIMEOUT_S = 60.0
"""Longest wait for the memory save and result write when the member ends."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Limits(_Strict):
    """How far one member may go before it stops with a structured ``incomplete``."""

    max_turns: int = Field(default=30, ge=1, le=10_000)
    """Regular model calls at most (then one closing call, see subagents.closing)."""
    max_tokens: int | None = Field(default=None, ge=1_000)
    """Total tokens over all calls (input, cache and output) at most; None: no cap.
    A turn starts only when it and the closing call after it fit."""
    deadline_s: float = Field(default=600.0, gt=0)
    """Wall-clock seconds for the whole member, tool calls and closing call included."""
    result_tokens: int = Field(default=2_000, ge=100)
    """Cap on the submitted result; over it the model is asked once to condense."""
    max_output_tokens: int = Field(default=8_192, ge=256)
    """Output limit of one model call (never above the model's own limit)."""
    tool_timeout_s: float = Field(default=600.0, gt=0)
    """Host-side ceiling of one tool call (a shell command's own timeout is lower)."""


def _default_settings(data: dict[str, Any]) -> BaseModel:
    return kind_settings(data["kind"]) if "kind" in data else NoSettings()


class MemberSpec(_Strict):
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
    limits: Limits = Field(default_factory=Limits)
    sandbox: dict[str, Any] = Field(default_factory=dict)
    """``SandboxSpec`` fields overriding the kind's secure defaults."""
    memory_dir: Path | None = None
    """Host directory of the member's explicit memory; None: no memory."""
    tools: list[CustomToolSpec] = Field(default_factory=list)
    """Job-defined tools (command templates in the box, or host callables)."""
    todos: bool | None = None
    """``write_todos`` and recitation on or off; None: the context config, then the kind."""
    context: ContextConfig = Field(default_factory=ContextConfig)
    """Budget, offload, clip, compaction and memory thresholds."""
    result_schema: dict[str, Any] | None = None
    """Job-defined result fields (a JSON Schema object, see
    :mod:`subagents.result_schema`), added to the kind's result; None: use
    ``inputs["result_schema"]`` if the job put it there, else none."""

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

    @field_validator("sandbox")
    @classmethod
    def _sandbox_fields(cls, v: dict[str, Any]) -> dict[str, Any]:
        SandboxSpec(**v)
        return v

    @model_validator(mode="after")
    def _result_schema_fits_the_kind(self) -> MemberSpec:
        schema = self.job_result_schema()
        if schema is not None:
            kind = get_kind(self.kind)
            extend_model(kind.submit_schema, schema)  # raises naming a clashing field
            extend_model(kind.result_model, schema)
        return self

    def job_result_schema(self) -> ResultSchema | None:
        """The job's result fields: ``result_schema``, else ``inputs["result_schema"]``."""
        raw = self.result_schema
        if raw is None:
            raw = self.inputs.get("result_schema")
        return None if raw is None else parse_result_schema(raw)

    def sandbox_spec(self) -> SandboxSpec:
        """The box this member runs in: its kind's box with the overrides applied."""
        return SandboxSpec(**{"kind": get_kind(self.kind).box_kind, **self.sandbox})

    def todos_enabled(self) -> bool:
        for choice in (self.todos, self.context.todos):
            if choice is not None:
                return choice
        return get_kind(self.kind).todos


class Progress(_Strict):
    """What a member that did not finish got done (for the coordinator and a person)."""

    turns: int = 0
    """Model calls made."""
    last_actions: list[str] = Field(default_factory=list)
    """The most recent tool calls, oldest first (``tool(args) -> ok|error``)."""
    todos: list[dict[str, Any]] = Field(default_factory=list)
    """The member's todo list at the end, if it kept one."""
    last_text: str = ""
    """The model's last words (capped), which often say where it was."""


class MemberOutcome(_Strict):
    """How one member ended; JSON-ready, written to ``result.json``."""

    member: str
    """Member id."""
    kind: str = ""
    status: Status
    reason: str = ""
    """Why it ended this way, in words (empty for ``ok``)."""
    result: dict[str, Any] | None = None
    """The kind's result model, as JSON: set when status is ``ok``, and kept for a
    ``failed`` member whose accepted result its kind judged a failure (a coding
    member's patch and test run when the test fails). Only ``ok`` results count."""
    partial_result: dict[str, Any] | None = None
    """``incomplete`` members only: the best partial result the member submitted in
    the closing call after a limit stopped it (same schema as ``result``; it says
    itself what is unfinished). Not a finished answer."""
    limit: LimitName | None = None
    """Which limit ended an ``incomplete`` member."""
    progress: Progress | None = None
    """What was done, for members that did not finish."""
    result_truncated: bool = False
    """The result was over its cap even after condensing, and was cut (marked)."""
    retryable: bool = False
    """A later attempt may succeed (model overload, crashed box)."""
    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    duration_s: float = 0.0
    offline: bool = False
    """True when an offline model (replay, offline policy) produced this outcome."""


def make_context(
    spec: MemberSpec,
    kind: Kind,
    *,
    model: Model,
    sandbox: Sandbox | None,
    run_dir: Path,
    trace: TraceWriter,
) -> ContextLike:
    """The member's :class:`~subagents.context.manager.ContextManager`."""
    from .context.manager import ContextManager

    return ContextManager(
        spec.context,
        profile=model.profile,
        model=model,
        sandbox=sandbox,
        run_dir=run_dir,
        trace=trace,
        task=spec.task,
        memory_dir=spec.memory_dir,
        todos_enabled=spec.todos_enabled(),
        box_tools=kind.file_tools,
    )


async def run_member(
    spec: MemberSpec,
    *,
    sandbox: Sandbox | None,
    model: Model,
    run_dir: Path,
    trace: TraceWriter,
) -> MemberOutcome:
    """Run one member to its end and return how it ended (see the module docstring).

    ``run_dir`` is the member's own directory (``runs/<run>/members/<id>/``); the
    outcome is also written there as ``result.json``.
    """
    from .loop import AgentLoop

    started = time.monotonic()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    kind = get_kind(spec.kind)
    trace.emit(
        MemberStart(
            span=spec.id,
            parent=trace.run,
            kind=spec.kind,
            task=spec.task,
            model=model.profile.name,
            offline=model.offline,
            config={"limits": spec.limits.model_dump(), "todos": spec.todos_enabled()},
        )
    )
    loop: AgentLoop | None = None
    context: ContextLike | None = None
    outcome: MemberOutcome | None = None
    try:
        context = make_context(
            spec, kind, model=model, sandbox=sandbox, run_dir=run_dir, trace=trace
        )
        loop = AgentLoop(
            spec,
            kind,
            model=model,
            sandbox=sandbox,
            run_dir=run_dir,
            trace=trace,
            context=context,
        )
        outcome = await loop.run()
    except SandboxCrashed as exc:
        outcome = _ended(
            spec, loop, model, "crashed", f"sandbox crashed: {exc.reason}", retryable=True
        )
    except (SandboxClosed, SandboxUnavailable) as exc:
        outcome = _ended(
            spec, loop, model, "crashed", f"sandbox unavailable: {exc}", retryable=True
        )
    except ModelError as exc:
        outcome = _ended(
            spec, loop, model, "failed", f"model error: {exc}", retryable=exc.retryable
        )
    except anyio.get_cancelled_exc_class():
        outcome = _ended(spec, loop, model, "cancelled", "cancelled by the caller")
        raise
    except Exception as exc:
        # A bug in a tool, a kind hook or the harness must not take siblings down:
        # it is this member's failure, traced with its traceback.
        trace.emit(
            ErrorEvent(
                span=spec.id,
                error=type(exc).__name__,
                message="".join(traceback.format_exception(exc))[-4000:],
            )
        )
        outcome = _ended(
            spec, loop, model, "failed", f"internal error: {type(exc).__name__}: {exc}"
        )
    finally:
        # Shielded so a cancelled member still saves its memory and traces its end;
        # bounded so a hung save cannot hold the caller's cancellation forever.
        with anyio.CancelScope(shield=True), anyio.move_on_after(FINISH_TIMEOUT_S):
            await _finish(spec, context, outcome, started, run_dir, trace)
    return outcome


async def _finish(
    spec: MemberSpec,
    context: ContextLike | None,
    outcome: MemberOutcome | None,
    started: float,
    run_dir: Path,
    trace: TraceWriter,
) -> None:
    """Save memory, write result.json and trace MemberEnd - whatever happened."""
    if context is not None:
        try:
            await context.finish()
        except Exception as exc:
            trace.emit(
                ErrorEvent(
                    span=spec.id, error=type(exc).__name__, message=f"saving memory failed: {exc}"
                )
            )
    if outcome is None:  # an exception we did not classify (BaseException)
        return
    outcome.duration_s = round(time.monotonic() - started, 3)
    (run_dir / "result.json").write_text(outcome.model_dump_json(indent=2), encoding="utf-8")
    trace.emit(
        MemberEnd(
            span=spec.id,
            parent=trace.run,
            status=outcome.status,
            reason=outcome.reason,
            turns=outcome.turns,
            input_tokens=outcome.input_tokens,
            output_tokens=outcome.output_tokens,
            cache_read_tokens=outcome.cache_read_tokens,
            cache_write_tokens=outcome.cache_write_tokens,
            cost_usd=outcome.cost_usd,
            duration_s=outcome.duration_s,
            result=outcome.result,
            partial_result=outcome.partial_result,
            limit=outcome.limit,
            offline=outcome.offline,
        )
    )


def _ended(
    spec: MemberSpec,
    loop: Any,
    model: Model,
    status: Status,
    reason: str,
    *,
    retryable: bool = False,
) -> MemberOutcome:
    """An outcome for a member that ended early, with whatever the loop had done."""
    if loop is not None:
        return loop.outcome(status, reason, retryable=retryable)
    return MemberOutcome(
        member=spec.id,
        kind=spec.kind,
        status=status,
        reason=reason,
        retryable=retryable,
        offline=model.offline,
    )

"""The member seam: a serializable spec in, a serializable outcome out.

A member is a pure unit of work - :class:`MemberSpec` (pydantic, JSON-ready) goes in,
:class:`MemberOutcome` comes out, and in between it touches only its own box, its own
memory directory and its own run subdirectory. That is what lets the coordinator run
members in a local task group today and on cluster nodes later.

:func:`run_member` never raises for the member's own failure. The task failing, a
limit reached, the model giving up, the box dying, even a bug in a tool: each becomes
a status with a reason (the statuses and what each means: :mod:`subagents.results.outcome`).
Only cancellation propagates (the caller asked for it), and even then the memory is
saved and ``MemberEnd`` is traced, shielded from the cancellation, before it does.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from pathlib import Path

import anyio

from sandbox.base import Sandbox
from sandbox.errors import SandboxClosed, SandboxCrashed, SandboxUnavailable

from .context.base import ContextLike
from .context.manager import ContextManager
from .kinds import Kind, get_kind
from .loop.loop import AgentLoop
from .model.base import Model, ModelError
from .results.outcome import MemberOutcome, Status
from .rules.delegation import Delegation
from .rules.policy import Approver
from .spec import MemberSpec
from .tools.mcp import McpStartFailed
from .trace import ErrorEvent, MemberStart, TraceWriter

FINISH_TIMEOUT_S = 60.0
"""Longest wait for the memory save and result write when the member ends."""


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
    approver: Approver | None = None,
    delegate: Delegation | None = None,
    conversation_file: Path | None = None,
    on_turn_saved: Callable[[], None] | None = None,
) -> MemberOutcome:
    """Run one member to its end and return how it ended (see the module docstring).

    ``run_dir`` is the member's own directory (``runs/<run>/members/<id>/``); the
    outcome is also written there as ``result.json``. ``approver`` answers the asks of
    the member's tool policy (None: nobody to ask, the policy's ``ask_default``).
    ``delegate`` runs a lead's members (:mod:`subagents.rules.delegation`);
    ``conversation_file`` keeps the conversation durable, and a member whose file
    already holds one continues it; ``on_turn_saved`` is called after each turn saved
    there whole.
    """
    started = time.monotonic()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    kind = get_kind(spec.kind)
    trace.emit(_member_start(spec, model, trace))
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
            approver=approver,
            delegate=delegate,
            conversation_file=conversation_file,
            on_turn_saved=on_turn_saved,
        )
        outcome = await loop.run()
    except anyio.get_cancelled_exc_class():
        outcome = _ended(spec, loop, model, "cancelled", "cancelled by the caller")
        raise
    except Exception as exc:
        outcome = _failed(exc, spec, loop, model, trace)
    finally:
        # Shielded so a cancelled member still saves its memory and traces its end;
        # bounded so a hung save cannot hold the caller's cancellation forever.
        with anyio.CancelScope(shield=True), anyio.move_on_after(FINISH_TIMEOUT_S):
            await _finish(spec, context, outcome, started, run_dir, trace)
    return outcome


def _member_start(spec: MemberSpec, model: Model, trace: TraceWriter) -> MemberStart:
    """The member's first trace event: what it is, and the settings it runs with."""
    return MemberStart(
        span=spec.id,
        parent=trace.run,
        kind=spec.kind,
        task=spec.task,
        model=model.profile.name,
        offline=model.offline,
        config={
            "limits": {
                **spec.limits.model_dump(),
                "max_output_tokens": spec.max_output_tokens,
                "tool_timeout_s": spec.tool_timeout_s,
            },
            "todos": spec.todos_enabled(),
        },
    )


def _failed(
    exc: Exception, spec: MemberSpec, loop: AgentLoop | None, model: Model, trace: TraceWriter
) -> MemberOutcome:
    """How a member ends that raised: a lost box is a crash worth retrying, a model
    error as retryable as the model says, anything else this member's failure."""
    if isinstance(exc, SandboxCrashed):
        reason = f"sandbox crashed: {exc.reason}"
        return _ended(spec, loop, model, "crashed", reason, retryable=True)
    if isinstance(exc, SandboxClosed | SandboxUnavailable):
        reason = f"sandbox unavailable: {exc}"
        return _ended(spec, loop, model, "crashed", reason, retryable=True)
    if isinstance(exc, McpStartFailed):
        return _ended(spec, loop, model, "failed", str(exc))
    if isinstance(exc, ModelError):
        reason = f"model error: {exc}"
        return _ended(spec, loop, model, "failed", reason, retryable=exc.retryable)
    # A bug in a tool, a kind hook or the harness must not take siblings down:
    # it is this member's failure, traced with its traceback.
    trace.emit(
        ErrorEvent(
            span=spec.id,
            error=type(exc).__name__,
            message="".join(traceback.format_exception(exc))[-4000:],
        )
    )
    return _ended(spec, loop, model, "failed", f"internal error: {type(exc).__name__}: {exc}")


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
    trace.emit(outcome.end_event(span=spec.id, parent=trace.run))


def _ended(
    spec: MemberSpec,
    loop: AgentLoop | None,
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

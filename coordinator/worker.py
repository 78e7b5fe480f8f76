"""One member's life as a worker runs it: its own box, the harness, retries, its result.

A member is a :class:`MemberUnit` (serializable: it could be shipped to a node) run by
:func:`run_unit` with a worker's host-local :class:`Deps`: acquire its own box, run
the harness, release the box, and return a :class:`MemberOutcome` whatever happened.
An exception, the deadline passing, the box being killed or OOM-killed: each becomes
that member's status with a reason, never an exception - only cancellation
propagates. How many members run, and what their outcomes mean for the run, is
:mod:`coordinator.fanout`'s business, not this module's.

Deadlines. ``limits.deadline_s`` is the coordinator's *hard* wall-clock limit per
attempt. The harness gets a soft deadline 10% earlier, so a member that is merely
slow stops itself and reports what it did (its progress is kept in the outcome); the
hard limit is for members that hang (a stuck model call, a wedged box). Either way
the member's status is ``timed_out``: one event, one status.

Retries. Only failures a second attempt can fix are retried, with exponential
backoff: the box crashing (an OOM, a killed container, an engine hiccup) and the
model being overloaded - plus ``timed_out`` when the job asks. A member whose task
itself failed (an ``incomplete`` result, a bad request) is not retried: the same
inputs would fail the same way and cost the same again.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
from pydantic import BaseModel, ConfigDict

from sandbox.base import Sandbox, SandboxBackend
from sandbox.errors import SandboxCrashed, SandboxError
from sandbox.pool import SandboxPool
from sandbox.spec import SandboxSpec
from subagents.member import MemberOutcome, MemberSpec
from subagents.model.base import Model, ModelError
from subagents.trace import ErrorEvent, MemberEnd, Retry, SandboxEvent, TraceWriter

from .repo_copy import RepoTooLarge, staged_copy
from .schema_check import problems as schema_problems
from .spec import RetryPolicy

CANCELLED = anyio.get_cancelled_exc_class


class MemberUnit(BaseModel):
    """One member's unit of work: everything a worker (here or on a node) needs."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    """The run this member belongs to (labels its box)."""
    member_dir: str
    """The member's own run subdirectory."""
    spec: MemberSpec
    """What the harness runs."""
    retry: RetryPolicy
    deadline_s: float
    """Hard wall-clock limit of one attempt."""
    repo: str | None = None
    """Host directory copied into ``/workspace`` before the member starts (coding)."""
    result_schema: dict[str, Any] | None = None
    """Extra checks the member's result must pass (see :mod:`coordinator.schema_check`)."""


class RunMemberFn(Protocol):
    def __call__(
        self,
        spec: MemberSpec,
        *,
        sandbox: Sandbox | None,
        model: Model,
        run_dir: Path,
        trace: TraceWriter,
    ) -> Awaitable[MemberOutcome]: ...


@dataclass
class Deps:
    """Host-local things a worker uses; never serialized (a node builds its own)."""

    backend: SandboxBackend
    make_model: Callable[..., Model]
    """``make_model(name, kind=..., trace=...)`` (see :func:`subagents.model.make_model`)."""
    run_member: RunMemberFn | None = None
    """The harness; None means :func:`subagents.member.run_member`."""
    listeners: list[Callable[[Any], None]] = field(default_factory=list)
    """Trace listeners (live progress); called with every trace event."""
    journal: Callable[..., Any] | None = None
    """``journal(event, **fields)``; None: no journal (a bare worker)."""
    pools: dict[str, SandboxPool] = field(default_factory=dict)
    """Warm pools by box spec (JSON); a member whose spec has one takes a box from it."""
    demand: dict[str, int] = field(default_factory=dict)
    """Members per box spec still to take a box; a pool keeps no more idle than this."""

    async def acquire(self, spec: SandboxSpec, run: str, member: str) -> tuple[Sandbox, Any]:
        """A fresh box for ``member`` (from a warm pool when there is one) and its pool."""
        key = spec.model_dump_json()
        pool = self.pools.get(key)
        if pool is None:
            return await self.backend.create(spec, run=run, member=member), None
        box = await pool.acquire(member)
        # Stop warming boxes nobody will take: the pool refills to min_idle.
        self.demand[key] = max(0, self.demand.get(key, 0) - 1)
        pool.min_idle = min(pool.min_idle, self.demand[key])
        return box, pool

    def note(self, event: str, **fields: Any) -> None:
        if self.journal is not None:
            self.journal(event, **fields)


def retry_class(outcome: MemberOutcome) -> str | None:
    """Which retryable failure this is (``crashed``, ``overloaded``, ``timed_out``)."""
    if outcome.status == "crashed":
        return "crashed"
    if outcome.status == "timed_out":
        return "timed_out"
    if outcome.status == "failed" and outcome.retryable:
        return "overloaded"
    return None


def backoff(policy: RetryPolicy, attempt: int) -> float:
    """Wait before attempt ``attempt + 1`` (attempt counts from 1)."""
    return min(policy.backoff_s * 2 ** (attempt - 1), policy.backoff_max_s)


def failed_outcome(
    unit: MemberUnit, status: str, reason: str, started: float, **kw: Any
) -> MemberOutcome:
    return MemberOutcome(
        member=unit.spec.id,
        kind=unit.spec.kind,
        status=status,  # type: ignore[arg-type]
        reason=reason,
        duration_s=round(time.monotonic() - started, 3),
        **kw,
    )


async def _release(
    box: Sandbox | None, trace: TraceWriter, pool: SandboxPool | None, *, keep: bool
) -> None:
    """Remove the box whatever happened (shielded: cancellation must not leak boxes);
    a box whose spec says ``keep`` is only let go, and traced as ``keep``, not ``close``."""
    if box is None:
        return
    with anyio.CancelScope(shield=True):
        t0 = time.monotonic()
        try:
            await (pool.release(box) if pool is not None else box.close())
        except SandboxError:
            pass  # already gone (killed); gc removes any remains by label
        action = "keep" if keep and pool is None else "close"
        trace.emit(
            SandboxEvent(action=action, box=box.name, duration_s=round(time.monotonic() - t0, 3))
        )


async def _upload_repo(box: Sandbox, repo: Path) -> None:
    """Copy the project's files (not its virtualenv or caches) into ``/workspace``."""
    staged = await anyio.to_thread.run_sync(staged_copy, repo)
    try:
        await box.upload(Path(staged.name), "/workspace")
    finally:
        await anyio.to_thread.run_sync(staged.cleanup)


async def attempt_once(unit: MemberUnit, deps: Deps, trace: TraceWriter) -> MemberOutcome:
    """One attempt: box up, harness, box down. Never raises except on cancellation."""
    from subagents.member import run_member as default_run_member

    run_member = deps.run_member or default_run_member
    started = time.monotonic()
    box: Sandbox | None = None
    pool: SandboxPool | None = None
    ended_by_harness = False
    keep = False
    try:
        with anyio.fail_after(unit.deadline_s):
            t0 = time.monotonic()
            box_spec = unit.spec.sandbox_spec()
            keep = box_spec.keep
            box, pool = await deps.acquire(box_spec, unit.run_id, unit.spec.id)
            trace.emit(
                SandboxEvent(
                    action="create", box=box.name, duration_s=round(time.monotonic() - t0, 3)
                )
            )
            if unit.repo:
                await _upload_repo(box, Path(unit.repo))
            model = deps.make_model(unit.spec.model, kind=unit.spec.kind, trace=trace)
            try:
                outcome = await run_member(
                    unit.spec,
                    sandbox=box,
                    model=model,
                    run_dir=Path(unit.member_dir),
                    trace=trace,
                )
            finally:
                with anyio.CancelScope(shield=True):
                    await model.aclose()
            ended_by_harness = True
            if outcome.status == "incomplete" and outcome.limit == "deadline":
                # The harness noticed the (soft) deadline first; for the run it is the
                # same event as the hard one, so one status: timed_out, its progress kept.
                outcome = outcome.model_copy(update={"status": "timed_out"})
    except TimeoutError:
        outcome = failed_outcome(
            unit, "timed_out", f"deadline of {unit.deadline_s:g}s passed", started
        )
    except RepoTooLarge as exc:
        outcome = failed_outcome(unit, "failed", str(exc), started)
    except SandboxCrashed as exc:
        outcome = failed_outcome(
            unit, "crashed", f"sandbox crashed: {exc.reason}", started, retryable=True
        )
    except SandboxError as exc:
        outcome = failed_outcome(
            unit, "crashed", f"sandbox unavailable: {exc}", started, retryable=True
        )
    except ModelError as exc:
        outcome = failed_outcome(
            unit, "failed", f"model error: {exc}", started, retryable=exc.retryable
        )
    except CANCELLED():
        await _release(box, trace, pool, keep=keep)
        raise
    except Exception as exc:
        outcome = failed_outcome(unit, "failed", f"raised {type(exc).__name__}: {exc}", started)
    await _release(box, trace, pool, keep=keep)
    if outcome.status == "ok" and unit.result_schema:
        wrong = schema_problems(outcome.result or {}, unit.result_schema)
        if wrong:
            reason = "result does not satisfy the job's result_schema: " + "; ".join(wrong[:5])
            outcome = outcome.model_copy(update={"status": "failed", "reason": reason})
            trace.emit(ErrorEvent(error="ResultSchema", message=reason))
    if not ended_by_harness:
        # The harness did not get to trace its end (it raised, hung or never started).
        trace.emit(
            MemberEnd(
                span=unit.spec.id,
                status=outcome.status,
                reason=outcome.reason,
                duration_s=outcome.duration_s,
            )
        )
    return outcome


async def run_unit(unit: MemberUnit, deps: Deps) -> MemberOutcome:
    """All attempts of one member, with retries and backoff; writes its result.json."""
    mdir = anyio.Path(unit.member_dir)
    await mdir.mkdir(parents=True, exist_ok=True)
    trace = TraceWriter(Path(mdir) / "trace.jsonl", run=unit.run_id, member=unit.spec.id)
    trace.listeners.extend(deps.listeners)
    attempt = 0
    try:
        while True:
            attempt += 1
            deps.note("member_started", member=unit.spec.id, attempt=attempt)
            outcome = await attempt_once(unit, deps, trace)
            why = retry_class(outcome)
            if why in unit.retry.on and attempt < unit.retry.attempts:
                delay = backoff(unit.retry, attempt)
                deps.note(
                    "member_retry",
                    member=unit.spec.id,
                    attempt=attempt,
                    status=outcome.status,
                    reason=outcome.reason,
                    delay_s=delay,
                )
                trace.emit(
                    Retry(what="member", attempt=attempt, reason=outcome.reason, delay_s=delay)
                )
                await anyio.sleep(delay)
                continue
            break
    except CANCELLED():
        deps.note(
            "member_finished",
            member=unit.spec.id,
            status="cancelled",
            reason="cancelled",
            attempts=attempt,
        )
        trace.close()
        raise
    _write_result(mdir, outcome)
    deps.note(
        "member_finished",
        member=unit.spec.id,
        status=outcome.status,
        reason=outcome.reason,
        attempts=attempt,
        turns=outcome.turns,
        input_tokens=outcome.input_tokens,
        output_tokens=outcome.output_tokens,
    )
    trace.close()
    return outcome


def _write_result(mdir: anyio.Path, outcome: MemberOutcome) -> None:
    from .runs import _fsync_write

    _fsync_write(Path(mdir) / "result.json", outcome.model_dump_json(indent=2))

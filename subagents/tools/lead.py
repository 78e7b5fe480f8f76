"""The lead's tools: ``spawn``, ``wait`` and ``read_result``, through a delegation.

Each tool is a typed schema and a thin call to the member's
:class:`~subagents.rules.delegation.Delegation` (the coordinator): the schema is checked
here, like any tool's, so a malformed call is an error result the lead can fix; what
a request means - which kinds and how many members are allowed, what a result may
show - is the delegation's to decide, and it answers refusals as error results too.
The lead's fourth tool, ``finish``, is its result tool (:mod:`subagents.kinds.lead`).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from sandbox.strict import Strict

from ..rules.delegation import Delegation
from .base import Tool, ToolContext, ToolError, ToolOutput, current_call_id


class ClaimRef(Strict):
    """One claim of one member's result."""

    member: str = Field(min_length=1)
    """The member whose result holds the claim."""
    claim: int = Field(ge=0)
    """The claim's index in that member's claims (from 0)."""


class MemberRequest(Strict):
    """One member the lead asks for."""

    kind: str = Field(min_length=1)
    """``browser`` (researches documentation pages) or ``coding`` (works in a box with
    python3 and no network), as far as the lead may spawn them."""
    task: str = Field(min_length=1)
    """The member's whole brief: objective, the output wanted, where to look, and what
    is out of bounds. The member sees only this and ``inputs``."""
    inputs: dict[str, Any] = Field(default_factory=dict)
    """Named facts handed over with the task (shown to the member as JSON)."""
    id: str | None = None
    """Optional member id (lowercase letters, digits, - or _); default ``w<wave>-<n>``."""
    files: dict[str, str] = Field(default_factory=dict)
    """Coding members: small text files put in its ``/workspace`` (name -> content),
    e.g. the example to run."""
    check: str | None = None
    """Coding members: a command Fleet runs in the box after the member ends; its exit
    code is the finding (whether the documented behaviour held), not a gate."""
    checks_claim: ClaimRef | None = None
    """Coding members: the member claim this check puts to the test."""


class SpawnInput(Strict):
    members: list[MemberRequest] = Field(min_length=1, max_length=32)
    """The members of this wave (each runs in its own box, in parallel)."""


class WaitInput(Strict):
    until: Literal["any", "all"] = "any"
    """``any``: return as soon as a member you have not heard from finishes; ``all``:
    when every member spawned so far has finished."""
    timeout_s: float = Field(default=600.0, gt=0, le=3600)
    """Return after this long even if nothing finished (you then see who still runs)."""


class ReadResultInput(Strict):
    member: str = Field(min_length=1)
    """The id of a finished member."""


def _delegate(ctx: ToolContext) -> Delegation:
    if ctx.delegate is None:
        raise ToolError("this member has no one to delegate to: only a lead may use this tool")
    return ctx.delegate


class Spawn(Tool):
    name: ClassVar[str] = "spawn"
    description: ClassVar[str] = (
        "Start members, each in its own sandbox, in parallel: one call is one wave. Give "
        "each a self-contained task (objective, output wanted, sources and tools to use, "
        "boundaries). Returns their ids at once; use wait for their results. Refused, "
        "with the reason, past your member, wave or token limits."
    )
    Input: ClassVar[type[BaseModel]] = SpawnInput

    async def run(self, args: Any, ctx: ToolContext) -> ToolOutput:
        # Only what the lead said (kind and task always): the delegation validates it.
        members = [m.model_dump(exclude_none=True, exclude_defaults=True) for m in args.members]
        reply = await _delegate(ctx).spawn(members, call_id=current_call_id())
        return ToolOutput(reply.text, is_error=reply.is_error)


class Wait(Tool):
    name: ClassVar[str] = "wait"
    description: ClassVar[str] = (
        "Wait for members to finish. Returns each newly finished member's status and "
        "its distilled result (capped; a failed member with its reason), and who is "
        "still running."
    )
    Input: ClassVar[type[BaseModel]] = WaitInput

    async def run(self, args: Any, ctx: ToolContext) -> ToolOutput:
        reply = await _delegate(ctx).wait(until=args.until, timeout_s=args.timeout_s)
        return ToolOutput(reply.text, is_error=reply.is_error)


class ReadResult(Tool):
    name: ClassVar[str] = "read_result"
    description: ClassVar[str] = (
        "One finished member's whole result (wait shows a shortened one), e.g. to read "
        "every claim before citing it."
    )
    Input: ClassVar[type[BaseModel]] = ReadResultInput

    async def run(self, args: Any, ctx: ToolContext) -> ToolOutput:
        reply = await _delegate(ctx).read_result(args.member)
        return ToolOutput(reply.text, is_error=reply.is_error)


def lead_tools(settings: Any = None) -> list[Tool]:
    """The lead's delegation tools (its ``finish`` is added by the loop)."""
    return [Spawn(), Wait(), ReadResult()]

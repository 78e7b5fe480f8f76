"""How one member ended: :class:`MemberOutcome`, JSON-ready, written to ``result.json``.

=========== ===============================================================
status      meaning
=========== ===============================================================
ok          ``submit_result`` was accepted; ``result`` holds it
incomplete  a limit (turns, tokens, the run's budget) was reached, or the model stopped without
            a result after one reminder; ``progress`` says what was done,
            ``partial_result`` holds what the member submitted in its closing
            call (limits only, when there was room for one)
skipped     never started: the run's budget could not carry it (``limit`` is
            ``budget``; no box, no call; a resume with a raised line runs it)
timed_out   its deadline passed: the harness's own (``limit`` is
            ``deadline``; progress and partial result as for ``incomplete``)
            or a caller's outer one
crashed     the box died (``SandboxCrashed``) or cannot be reached any more
            (``SandboxClosed``, ``SandboxUnavailable``); ``reason`` names why
failed      the model call failed for good (``retryable`` says whether a later
            attempt may succeed, e.g. overload), the harness hit a bug, every
            tool call the member made was refused by policy (the job's tool
            policy or the egress allowlist: its result rests on nothing), or
            the kind judged the accepted result a failure (a coding member's
            test fails after its edit); then ``result`` is kept for reading
cancelled   the caller cancelled the member (set by the caller's bookkeeping;
            ``run_member`` itself re-raises the cancellation)
=========== ===============================================================
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Literal

from pydantic import Field, ValidationInfo, ValidatorFunctionWrapHandler, field_validator

from sandbox.strict import Strict

from ..kinds.results import MemberResult, parse_result, result_json
from ..trace import MemberEnd, TokenCounts

Status = Literal["ok", "failed", "timed_out", "crashed", "cancelled", "incomplete", "skipped"]
LimitName = Literal["turns", "tokens", "deadline", "no_result", "budget"]


class Progress(Strict):
    """What a member that did not finish got done (for the coordinator and a person)."""

    turns: int = 0
    """Model calls made."""
    last_actions: list[str] = Field(default_factory=list)
    """The most recent tool calls, oldest first (``tool(args) -> ok|error``)."""
    todos: list[dict[str, Any]] = Field(default_factory=list)
    """The member's todo list at the end, if it kept one."""
    last_text: str = ""
    """The model's last words (capped), which often say where it was."""


class AttemptRecord(Strict, TokenCounts):
    """One of a coding member's parallel attempts (``attempts = N``), as its member's
    ``result.json`` lists it; the attempt's own outcome is in ``attempts/N/result.json``."""

    attempt: int
    """Its number, from 1."""
    status: Status
    reason: str = ""
    verified: bool | None = None
    """Whether the job's test, re-run by Fleet after the attempt submitted, passed (None:
    no test, or it did not get that far)."""
    files_changed: list[str] = Field(default_factory=list)
    lines: int = 0
    """Lines its patch adds plus lines it removes."""
    patch: str = ""
    """Its patch, relative to the member's directory (``attempts/2/patch.diff``); "" when
    it left none."""
    same_as: int | None = None
    """An earlier attempt whose patch is the same change (whitespace at line ends aside)."""
    turns: int = 0
    cost_usd: float = 0.0
    duration_s: float = 0.0


class Choice(Strict, TokenCounts):
    """Which attempt's patch is the member's, and why."""

    attempt: int | None
    """The chosen attempt (None: no attempt left a patch that could be chosen)."""
    by: Literal["only", "reviewer", "rule", "none"]
    """``only``: one attempt qualified; ``reviewer``: the member's model chose among
    several; ``rule``: the fewest changed lines (no reviewer answer: an offline model,
    an error, the budget); ``none``: nothing to choose."""
    reason: str = ""
    cost_usd: float = 0.0
    """What the reviewer's call cost (its tokens are this record's)."""


class MemberOutcome(Strict, TokenCounts):
    """How one member ended; JSON-ready, written to ``result.json``."""

    member: str
    """Member id."""
    kind: str = ""
    status: Status
    reason: str = ""
    """Why it ended this way, in words (empty for ``ok``)."""
    result: MemberResult | None = None
    """The kind's result (:mod:`subagents.kinds.results`: a coding member's
    :class:`~subagents.kinds.results.CodingMemberResult`, ...): set when status is ``ok``,
    and kept for a ``failed`` member whose accepted result its kind judged a failure (a
    coding member's patch and test run when the test fails). Only ``ok`` results count."""
    partial_result: MemberResult | None = None
    """``incomplete`` and ``timed_out`` members only: the best partial result the member submitted in
    the closing call after a limit stopped it (same types as ``result``; a browser
    member's may be :class:`~subagents.kinds.results.UncheckedFindings`; it says itself
    what is unfinished). Not a finished answer."""
    limit: LimitName | None = None
    """Which limit ended an ``incomplete`` (or, ``deadline``, a ``timed_out``) member."""
    progress: Progress | None = None
    """What was done, for members that did not finish."""
    result_truncated: bool = False
    """The result was over its cap even after condensing, and was cut (marked)."""
    retryable: bool = False
    """A later attempt may succeed (model overload, crashed box)."""
    resumed_from: int | None = None
    """The turn this attempt went on from, its transcript's last completed turn
    (:mod:`subagents.durable`); None: it started at turn 0."""
    turns: int = 0
    cost_usd: float = 0.0
    duration_s: float = 0.0
    offline: bool = False
    """True when an offline model (replay, offline policy) produced this outcome."""
    not_copied: list[str] = Field(default_factory=list)
    """Paths of the member's ``repo`` left out of its box, each with why (a path
    through a symbolic link, a named pipe, a device); bounded, the rest counted."""
    model_switch: str | None = None
    """The member's model stayed overloaded and it went on with its fallback:
    ``"claude-a -> claude-b: <why>"`` (None: no switch)."""
    attempts: list[AttemptRecord] = Field(default_factory=list)
    """A member with ``attempts = N``: every attempt, in order (empty otherwise). The
    member's ``result`` is the chosen attempt's; its tokens, cost and turns are all the
    attempts' and the reviewer's together."""
    choice: Choice | None = None
    """A member with ``attempts = N``: which attempt was chosen, by whom and why."""

    @field_validator("result", "partial_result", mode="wrap")
    @classmethod
    def _typed_by_kind(
        cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
    ) -> MemberResult | None:
        """The result as its kind's model (see :mod:`subagents.kinds.results`): leniently,
        unless validated with a :class:`Received` context."""
        if value is None:
            return None
        # Not ``handler``: pydantic's own union would take the first model that fits,
        # whatever the outcome's kind.
        check = (info.context or {}).get(RECEIVED)
        received = check if isinstance(check, Received) else None
        return parse_result(
            str(info.data.get("kind", "")),
            value,
            partial=info.field_name == "partial_result",
            strict=received is not None,
            job_fields=received.job_fields if received is not None else (),
        )

    @classmethod
    def received(cls, data: Any, *, job_fields: Collection[str] = ()) -> MemberOutcome:
        """An outcome that arrived from someone not trusted (a node's reply), its result
        checked strictly: :class:`ValueError` (pydantic's, or a
        :class:`~subagents.kinds.results.ResultProblem`) naming what is wrong."""
        if isinstance(data, MemberOutcome):
            data = data.model_dump(mode="json")
        return cls.model_validate(data, context={RECEIVED: Received(frozenset(job_fields))})

    def end_event(self, **overrides: Any) -> MemberEnd:
        """The trace's ``member_end`` for this outcome: every field the event shares with
        the outcome (status, reason, tokens, cost, results, ...) taken from it, never
        copied one by one; ``overrides`` for what the event says otherwise (its span, an
        attempts member's own review tokens)."""
        shared = {k: getattr(self, k) for k in _END_FIELDS}
        shared["result"] = result_json(self.result)
        shared["partial_result"] = result_json(self.partial_result)
        return MemberEnd(**{**shared, **overrides})


_END_FIELDS = sorted((set(MemberEnd.model_fields) & set(MemberOutcome.model_fields)) - {"member"})
"""What ``member_end`` carries of an outcome: the fields both models have (the event's
``member`` is its trace's, set by the writer)."""

RECEIVED = "received"
"""The validation context's key under which :meth:`MemberOutcome.received` asks for
strictness."""


class Received:
    """Validation context: the outcome came from someone not trusted."""

    def __init__(self, job_fields: frozenset[str]) -> None:
        self.job_fields = job_fields
        """The job's own result fields (``result_schema``): no others are taken."""

"""What each built-in kind returns, and a member's result read back typed.

The kinds' own models (what the model submits and what the harness adds) live here,
not beside the kinds' tools, so that reading a result - ``fleet runs``, the report, a
resume - never imports Playwright or a box: :mod:`subagents.results.outcome` types
``MemberOutcome.result`` with them.

``MemberOutcome.result`` (and ``partial_result``) is a :data:`MemberResult`, chosen by
the outcome's ``kind``:

=========== ===================================================================
coding      :class:`CodingMemberResult` (a :class:`CodingResult`)
browser     :class:`BrowserMemberResult` (:class:`VerifiedFindings`); a partial
            result whose quote check did not run: :class:`UncheckedFindings`
lead        :class:`LeadMemberResult` (a :class:`LeadReport`)
another     :class:`OtherResult`: a kind registered by someone else (a test's, a
            benchmark's), its fields kept as JSON - its own model checked them
=========== ===================================================================

Why the outcome's ``kind`` picks the model and not a tag inside the result: the JSON on
disk (``result.json``, a node's reply, a checkpoint's transcript) has never carried one,
and a job's own result field may be called anything - a tag would collide with it. So
:func:`parse_result` is given the kind, tries that kind's models and nothing else: a
browser's findings under a coding outcome are not a coding result, whatever fits.

A job's ``result_schema`` adds fields of its own (:mod:`subagents.results.result_schema`).
They survive typed, in the models' extra bag (:attr:`JobFields.job_fields`), each
value one of the types a job may declare (:data:`JobValue`); the job's own schema
checks them where the job is known (the submit call; the coordinator on a node's
reply, :func:`subagents.results.schema_check.problems`).

Reading is lenient, receiving strict - as for the journal
(:mod:`coordinator.journal.entries`). A result read from disk that fits no model of its
kind (an older or damaged file, a cut result that broke a constraint) is kept as an
:class:`UnknownResult` with its raw JSON and what was wrong, never a crash and never
lost: it is written back as it was. Where the result has just arrived from someone not
trusted - a node's reply, a submit call - :func:`parse_result` with ``strict`` refuses
it instead (:class:`ResultProblem`): a result over :data:`RESULT_CHARS`, of another
kind's shape, or with a field neither the kind nor the job declares.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any, ClassVar, Literal, TypeAlias

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    model_serializer,
)

RESULT_CHARS = 4_000_000
"""Largest result read, as JSON: a coding result keeps up to 200,000 characters of
patch, which JSON escaping can grow several times; anything larger is not one."""

# -- coding --------------------------------------------------------------------------


class CodingReport(BaseModel):
    """What the coding model submits (the harness adds the patch)."""

    model_config = ConfigDict(extra="forbid")

    summary: str = Field(min_length=1)
    """What was changed and why, in a few sentences."""
    tests_run: list[str] = Field(default_factory=list)
    """Test or check commands that were run."""
    tests_passed: bool | None = None
    """Whether the last run of those tests passed (None: no tests were run)."""
    notes: list[str] = Field(default_factory=list)
    """Caveats, follow-ups, anything a reviewer should know."""


class VerifiedTests(BaseModel):
    """The job's test command, re-run by the harness after the model submitted."""

    model_config = ConfigDict(extra="forbid")

    command: str
    exit_code: int
    passed: bool
    output_tail: str = ""
    """Last part of the command's output."""
    gate: bool = True
    """Whether a failing run fails the member (False: the exit code is a finding)."""


class CodingResult(CodingReport):
    """A coding member's result: the report plus what the harness measured."""

    patch: str = ""
    """Unified diff of /workspace against its state before the first turn."""
    patch_truncated: bool = False
    """The patch was longer than the result keeps; the full one is in patch.diff."""
    files_changed: list[str] = Field(default_factory=list)
    """Paths (relative to /workspace) added, modified or deleted."""
    verified: VerifiedTests | None = None
    """The job's test command re-run after submission, when the job gave one."""
    collection_error: str | None = None
    """Why the patch could not be collected (the member then ends ``failed``)."""
    edits_archive: str | None = None
    """When the collection failed: the tar file in the member's run directory holding
    the files found changed (links as links; deleted and left-out paths are in notes)."""


# -- browser -------------------------------------------------------------------------


class Claim(BaseModel):
    """One finding, backed by a verbatim quote from the page it came from."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1)
    """The claim, in your own words."""
    source_url: str = Field(min_length=1)
    """URL of the page the quote was copied from (as shown in the tool results)."""
    quote: str = Field(min_length=1)
    """Exact text from that page supporting the claim ('...' marks omitted words)."""


class Findings(BaseModel):
    """What the browser model submits."""

    model_config = ConfigDict(extra="forbid")

    summary: str = Field(min_length=1)
    """The answer to the task in a few sentences."""
    claims: list[Claim] = Field(default_factory=list)
    """The supporting findings, each with its source and quote."""
    open_questions: list[str] = Field(default_factory=list)
    """What could not be settled, or needs another source."""
    confidence: Literal["low", "medium", "high"]
    """How well the sources support the summary."""


class VerifiedClaim(Claim):
    """A claim after the harness checked its quote."""

    verified: bool
    """True when the quote was found on a page this member fetched from ``source_url``."""
    note: str = ""
    """Why it is not verified (or where else the quote was found)."""


class VerifiedFindings(Findings):
    """A browser member's result: the findings with every quote checked."""

    claims: list[VerifiedClaim] = Field(default_factory=list)  # type: ignore[assignment]
    """The claims, each with ``verified`` and a note."""
    unverified: list[int] = Field(default_factory=list)
    """Indices (from 0) of claims whose quote could not be verified."""
    pages_fetched: int = 0
    """Distinct page texts this member read (kept in ``pages/``)."""


# -- lead ----------------------------------------------------------------------------


class Cite(BaseModel):
    """A member claim a report claim rests on."""

    model_config = ConfigDict(extra="forbid")

    member: str = Field(min_length=1)
    """The member's id."""
    claim: int | None = Field(default=None, ge=0)
    """The claim's index in that member's claims; None: the member's summary."""


class LeadClaim(BaseModel):
    """One claim of the report."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1)
    """The claim, in your words."""
    cites: list[Cite] = Field(default_factory=list)
    """The member claims it rests on."""


class LeadReport(BaseModel):
    """What the lead finishes with: the report's content."""

    model_config = ConfigDict(extra="forbid")

    summary: str = Field(min_length=1)
    """The answer to the question, in a few sentences."""
    claims: list[LeadClaim] = Field(default_factory=list)
    """The findings, each citing member claims."""
    open_questions: list[str] = Field(default_factory=list)
    """What stayed open."""


# -- a member's result, typed --------------------------------------------------------

JobValue: TypeAlias = bool | int | float | str | list[str] | None
"""A value of a job's own result field (:mod:`subagents.results.result_schema` allows no other)."""


class JobFields(BaseModel):
    """A kind's result with the job's own fields beside the kind's (in the extra bag)."""

    model_config = ConfigDict(extra="allow")

    __pydantic_extra__: dict[str, JobValue] = Field(init=False)  # type: ignore[assignment]
    kind: ClassVar[str]
    """The member kind whose result this is."""

    @property
    def job_fields(self) -> dict[str, JobValue]:
        """The job's own fields (``result_schema``), by name."""
        return dict(self.__pydantic_extra__ or {})


class CodingMemberResult(CodingResult, JobFields):
    """A coding member's result, with the job's fields."""

    model_config = ConfigDict(extra="allow")
    kind: ClassVar[str] = "coding"


class BrowserMemberResult(VerifiedFindings, JobFields):
    """A browser member's result (every quote checked), with the job's fields."""

    model_config = ConfigDict(extra="allow")
    kind: ClassVar[str] = "browser"


class UncheckedFindings(Findings, JobFields):
    """A browser member's partial result whose quote check did not run (the closing
    call's findings as submitted): no claim here is verified."""

    model_config = ConfigDict(extra="allow")
    kind: ClassVar[str] = "browser"


class LeadMemberResult(LeadReport, JobFields):
    """The lead's report, with the job's fields."""

    model_config = ConfigDict(extra="allow")
    kind: ClassVar[str] = "lead"


class OtherResult(BaseModel):
    """The result of a kind this module has no model for (registered elsewhere: a
    test's, a benchmark's); its own result model checked it when it was submitted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    data: dict[str, JsonValue]
    """The result's fields, as JSON."""

    @model_serializer
    def _as_written(self) -> dict[str, JsonValue]:
        return self.data


class UnknownResult(BaseModel):
    """A result read back that fits no model of its kind: an older or damaged file, or
    a result cut to its cap that broke a constraint. Kept, and written back, as it was."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    raw: JsonValue
    """The result as it was read."""
    problem: str
    """Why it is not a result of its kind, in words."""

    @model_serializer
    def _as_written(self) -> JsonValue:
        return self.raw


TypedResult: TypeAlias = (
    CodingMemberResult | BrowserMemberResult | UncheckedFindings | LeadMemberResult
)
MemberResult: TypeAlias = TypedResult | OtherResult | UnknownResult
"""What ``MemberOutcome.result`` and ``partial_result`` hold."""

_MODELS: dict[str, tuple[type[JobFields], ...]] = {
    "coding": (CodingMemberResult,),
    "browser": (BrowserMemberResult,),
    "lead": (LeadMemberResult,),
}
_PARTIAL_MODELS: dict[str, tuple[type[JobFields], ...]] = {
    **_MODELS,
    "browser": (BrowserMemberResult, UncheckedFindings),
}


class ResultProblem(ValueError):
    """A result received from someone not trusted (a node, a submit call) that is not a
    result of its member's kind; the message says which kind and what was wrong."""


def parse_result(
    kind: str,
    value: Any,
    *,
    partial: bool = False,
    strict: bool = False,
    job_fields: Collection[str] = (),
) -> MemberResult:
    """``value`` (JSON, or a result model) as the result of a ``kind`` member.

    ``partial``: a closing call's partial result (a browser one may be unchecked).
    Lenient (the default): what does not fit becomes an :class:`UnknownResult`.
    ``strict``: :class:`ResultProblem` instead, and a field neither the kind's model
    nor ``job_fields`` declares is refused too."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    problem = _shape_problem(value)
    models = (_PARTIAL_MODELS if partial else _MODELS).get(kind)
    if problem is None and models is None:
        try:
            return OtherResult(kind=kind, data=value)
        except ValidationError as exc:
            problem = _first(exc)
    elif problem is None and models is not None:
        errors = []
        for model in models:
            try:
                typed = model.model_validate(value)
            except ValidationError as exc:
                errors.append(_first(exc))
                continue
            unknown = sorted(set(typed.job_fields) - set(job_fields))
            if strict and unknown:
                problem = f"field(s) {', '.join(unknown)} neither the kind nor the job declares"
                break
            return typed  # type: ignore[return-value]
        problem = problem or errors[0]
    what = f"the {'partial ' if partial else ''}result of {kind or 'a'} member"
    if strict:
        raise ResultProblem(f"{what} is not one: {problem}")
    return UnknownResult(kind=kind, raw=_json_or_none(value), problem=str(problem))


def _shape_problem(value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"a JSON object was expected, not {type(value).__name__}"
    try:
        size = len(json.dumps(value, ensure_ascii=False))
    except (TypeError, ValueError) as exc:
        return f"not JSON ({exc})"
    if size > RESULT_CHARS:
        return f"{size} characters of JSON, over the {RESULT_CHARS} a result may have"
    return None


def _first(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"{where}: {first['msg']}" if where else first["msg"]


def _json_or_none(value: Any) -> JsonValue:
    """``value`` if it is JSON (what is kept of an unknown result; read from a file, it
    is), else None."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return None
    return value  # type: ignore[no-any-return]


def result_json(result: MemberResult | None) -> dict[str, Any] | None:
    """``result`` as the JSON object it is written as (None: none, or an unknown result
    that is not an object)."""
    data = None if result is None else result.model_dump(mode="json")
    return data if isinstance(data, dict) else None

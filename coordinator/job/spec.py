"""Job files as pydantic models: what a job may say (reading TOML: :mod:`.jobfile`).

A job names its members explicitly (``[[members]]``), or asks a research question
that the planner splits into ``research.members`` browser members, or both (a
mixed job) - or hands a question to a lead (``[lead]``) that spawns members itself,
in waves, within its limits. Every model rejects unknown keys (``extra="forbid"``) so a typo is an
error, never a silently ignored setting. Cross-field checks raise
:class:`FieldProblem` naming the field they are about, so the error a person sees
points at the right line.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sandbox.errors import SandboxSpecError
from sandbox.inbox.egress_proxy import Policy
from sandbox.inbox.egress_rules import entry_refusal, read_host, split_entry
from sandbox.spec import (
    BoxKind,
    NetworkPolicy,
    Runtime,
    SandboxSpec,
    check_image_reference,
    parse_size,
)
from sandbox.strict import Strict
from subagents.browser.config import BrowserConfig
from subagents.kinds import (
    BUILTIN_MEMBER_KINDS,
    get_kind,
    kind_is,
    member_kinds,
)
from subagents.results.result_schema import member_part
from subagents.rules.policy import MemberPolicy, ToolPolicy
from subagents.spec import Limits, check_tool_names
from subagents.spend.budget import CLOSING_TOKENS
from subagents.tools.mcp import McpServerSpec
from subagents.tools.registry import CustomToolSpec, load_callable

from .job_problems import FieldProblem, JobError, describe_validation
from .run_names import slug
from .work import MemberWork


def _a_member_kind(value: str) -> str:
    """``value`` when a job may name it as a member's kind: a built-in kind with a box or
    one the program registered (:func:`subagents.kinds.register_kind`)."""
    if value not in member_kinds():
        names = [repr(k) for k in member_kinds()]
        listed = (
            " or ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " or " + names[-1]
        )
        shown = (
            repr(value)
            if len(repr(value)) <= 80
            else f"{repr(value)[:60]}... ({len(value):,} characters)"
        )
        raise ValueError(f"{shown} is not allowed; input should be {listed}")
    return value


MemberKind = Annotated[str, AfterValidator(_a_member_kind)]
"""A member's kind, asked of the kind registry (no kind's module is imported for it)."""
RetryOn = Literal["crashed", "overloaded", "timed_out"]
_ID_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")


def attempt_id(member: str, attempt: int) -> str:
    """The id of a member's parallel attempt (``coder.2``): its directory is
    ``members/coder/attempts/2``; the dot is never in a member id."""
    return f"{member}.{attempt}"


def split_attempt(unit_id: str) -> tuple[str, int] | None:
    """``("coder", 2)`` for ``coder.2``; None for a member's own id."""
    member, dot, n = unit_id.rpartition(".")
    if not dot or not member or not n.isdigit():
        return None
    return member, int(n)


_SIZE_RE = re.compile(r"^\d+(\.\d+)?[kmgKMG]?$")


MAX_TEXT_CHARS = 100_000
"""Longest task, question, analyst instructions, and serialized ``inputs`` or
``result_schema``: about 25,000 tokens, a sixth of a member's default context budget.
Material larger than that belongs in the member's repo or on a page it reads."""
MAX_MEMBERS = 10_000
"""Most members one job may have (explicit plus research); ``max_parallel`` of them run
at once, the rest wait in the queue."""


def within_text_limit(what: str, text: str, hint: str) -> None:
    """``ValueError`` (one clear line) when ``text`` is past :data:`MAX_TEXT_CHARS`."""
    if len(text) > MAX_TEXT_CHARS:
        raise ValueError(
            f"{what} is {len(text):,} characters; at most {MAX_TEXT_CHARS:,} (about 25,000 "
            f"tokens) are allowed: {hint}"
        )


class _JobModel(Strict):
    """A part of a job. Built directly (``MemberJob(kind="coder")``), a bad field is a
    :class:`~coordinator.job.jobfile.JobError` naming it and what is allowed, as a job
    file's would be - not pydantic's error."""

    @classmethod
    def _invalid(cls, exc: ValidationError) -> Exception:
        return JobError(f"<{cls.__name__}>", describe_validation(exc, _fields_of(cls)))


def known_model(name: str | None) -> str | None:
    """A fallback model's name, if Fleet knows it (a Claude family it has prices for,
    or an offline model): a name it does not know would only fail when the switch comes."""
    if name is None:
        return None
    from subagents.model import ModelError, parse_model
    from subagents.model.profiles import KNOWN_PROFILES, normalized

    try:
        choice = parse_model(name)
    except ModelError as exc:
        raise ValueError(str(exc)) from None
    if choice.source == "replay":
        raise ValueError("a fallback is a live model, not a replay of a trace")
    if choice.source == "claude" and not any(
        normalized(choice.name).startswith(p) for p in KNOWN_PROFILES
    ):
        raise ValueError(
            f"{name!r} is not a model Fleet knows; known families: {', '.join(sorted(KNOWN_PROFILES))}"
        )
    return name


class ModelDefaults(_JobModel):
    """The model every member uses unless it names its own."""

    name: str = "auto"
    """Model string; ``auto`` = Claude when ANTHROPIC_API_KEY is set, else ``offline``."""
    max_tokens: int = Field(default=4096, ge=256, le=128_000)
    """Output token limit of one model call."""
    fallback: str | None = None
    """The model a member goes on with when its own stays overloaded (529, or 429 past
    the retries): from its next call, priced and budgeted as that model. None: no switch."""

    @field_validator("fallback")
    @classmethod
    def _fallback_known(cls, v: str | None) -> str | None:
        return known_model(v)


class Budget(_JobModel):
    """One budget for the whole run: every model call of every member (and the lead) is
    reserved against it before it goes out (:mod:`subagents.spend.budget`)."""

    usd: float | None = Field(default=None, gt=0, le=1_000_000, allow_inf_nan=False)
    """Hard line in US dollars, at the models' list prices (offline models cost 0)."""
    tokens: int | None = Field(default=None, ge=1_000, le=10_000_000_000)
    """Hard line in tokens: input + cache writes + output, with cache reads counted at
    their price relative to input (0.1 of a token on every Claude model)."""
    soft: float = Field(default=0.8, gt=0, lt=1, allow_inf_nan=False)
    """Fraction of the hard line past which the run warns (live output, journal
    ``budget_soft``, report)."""
    closing_max_tokens: int = Field(default=CLOSING_TOKENS, ge=256, le=16_384)
    """Output bound of a member's closing call (its partial result after a limit), and
    the room every started member holds for it (:data:`subagents.spend.budget.CLOSING_TOKENS`
    says why 1,024)."""

    @model_validator(mode="after")
    def _a_line(self) -> Budget:
        if self.usd is None and self.tokens is None:
            raise FieldProblem("usd", "a [budget] needs a hard line: usd, tokens or both")
        return self


class SandboxOverrides(_JobModel):
    """Per-member changes to the box's secure defaults (see ``sandbox.spec``)."""

    cpus: float | None = Field(default=None, gt=0, le=64)
    """CPU quota in cores."""
    memory: str | None = None
    """Memory limit, e.g. ``"512m"`` or ``"2g"``."""
    pids: int | None = Field(default=None, ge=16, le=65536)
    """Process limit in the box."""
    workspace_size: str | None = None
    """Size of the writable ``/workspace``."""
    tmpfs_size: str | None = None
    """Size of the writable ``/tmp`` (a coding member keeps its baseline snapshot there)."""
    image: str | None = None
    """Image reference instead of Fleet's image for the member's kind."""
    keep: bool = False
    """Keep the box after the member ends, for debugging."""
    runtime: Runtime | None = None
    """``runc`` or ``gvisor`` (gVisor's user-space kernel between the box and the
    host's); default the job's ``[sandbox] runtime``."""

    @field_validator("memory", "workspace_size", "tmpfs_size")
    @classmethod
    def _size(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not _SIZE_RE.match(v.strip()):
            raise ValueError(f"{v!r} is not a size")
        if parse_size(v) < 4 * 1024 * 1024:
            raise ValueError(f"{v!r} is too small (at least '4m')")
        return v.strip().lower()

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        return check_image_reference(v)

    def box(
        self, kind: BoxKind, *, network: NetworkPolicy, runtime: Runtime = "runc"
    ) -> SandboxSpec:
        """The member's box: its kind's secure defaults with these changes (the field
        names are ``SandboxSpec``'s), built once, here at the job boundary; ``runtime``
        is the job's, unless the member names its own."""
        changes = self.model_dump(exclude_none=True, exclude_defaults=True)
        changes.setdefault("runtime", runtime)
        return SandboxSpec(kind=kind, network=network, **changes)


class JobSandbox(_JobModel):
    """What every member's box gets unless the member says otherwise."""

    runtime: Runtime = "runc"
    """The boxes' OCI runtime: ``runc`` (the host kernel, behind seccomp) or ``gvisor``
    (gVisor's user-space kernel between the boxes and the host's; needs
    ``fleet setup --gvisor``). A member's ``sandbox.runtime`` overrides it."""


class MemoryProfile(_JobModel):
    """Explicit memory a member loads at start and may amend; nothing is inherited."""

    profile: str
    """Name of the memory profile; several members may share one."""
    dir: str | None = None
    """Host directory holding it (default ``<output_dir>/memory/<profile>``, beside the runs)."""

    @field_validator("profile")
    @classmethod
    def _profile_name(cls, v: str) -> str:
        if not _ID_RE.match(v):
            raise ValueError(f"{v!r} is not a profile name (lowercase letters, digits, - or _)")
        return v


class MemberJob(MemberWork, _JobModel):
    """One member as the job file names it: what the harness is asked (turned into its
    :class:`~subagents.spec.MemberSpec`) and, inherited, what the coordinator does
    before it starts (:class:`~coordinator.job.work.MemberWork`: repo, files, setup,
    attempts), flat in the job file's member table."""

    id: str | None = None
    """Directory and label name; default ``<kind>-<n>``."""
    kind: MemberKind
    """``browser`` (researches pages) or ``coding`` (works on files in its box)."""
    task: str = Field(min_length=1)
    """What the member must do, in words."""
    inputs: dict[str, str | int | float | bool | list[str]] = Field(default_factory=dict)
    """Named facts handed to the member with its task."""
    model: str | None = None
    """Model for this member; default the job's ``[model].name``."""
    fallback: str | None = None
    """This member's fallback model; default the job's ``[model].fallback``."""

    @field_validator("fallback")
    @classmethod
    def _fallback_known(cls, v: str | None) -> str | None:
        return known_model(v)

    limits: Limits = Field(default_factory=Limits)
    sandbox: SandboxOverrides = Field(default_factory=SandboxOverrides)
    memory: MemoryProfile | None = None
    result_schema: dict[str, Any] | None = None
    """JSON Schema (an object) the result must also satisfy, beyond the kind's model."""
    context: dict[str, Any] = Field(default_factory=dict)
    """Context-management thresholds (``subagents.context.config.ContextConfig`` fields,
    e.g. ``compact_fraction``, ``offload_result_tokens``); unset ones keep the defaults."""
    todos: bool | None = None
    """Todo list and its recitation on or off (default: on for coding, off for browser)."""
    test: str | None = None
    """Coding members: command that checks the work, run inside the box."""
    tools: list[CustomToolSpec] = Field(default_factory=list)
    """Job-defined tools (``[[members.tools]]``): a command template run in the member's
    box, or (``host = true`` only) a Python callable run on the host."""
    mcp: list[McpServerSpec] = Field(default_factory=list)
    """MCP servers (``[[members.mcp]]``): a stdio ``command`` started in the member's box,
    or a ``url`` reached through the run's egress allowlist."""
    policy: MemberPolicy | None = None
    """This member's tool policy, added to the job's ``[policy]`` (its rules join the
    job's; the settings it gives replace the job's)."""
    test_gate: bool = True
    """Coding members: a ``test`` that fails after the member submitted fails the
    member. False: its exit code is a finding, not a gate (a lead's check of a
    documented behaviour, where "the documentation is wrong" is a good answer)."""

    @field_validator("id")
    @classmethod
    def _id_shape(cls, v: str | None) -> str | None:
        if v is not None and not _ID_RE.match(v):
            raise ValueError(f"{v!r} is not a member id (lowercase letters, digits, - or _)")
        return v

    @field_validator("task")
    @classmethod
    def _task_not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("the task is blank")
        within_text_limit("the task", v, "put large material in the repo (coding) or in files")
        return v.strip()

    @field_validator("inputs")
    @classmethod
    def _inputs_size(cls, v: dict[str, Any]) -> dict[str, Any]:
        within_text_limit("inputs (as JSON)", json.dumps(v), "pass references, not the data")
        return v

    @field_validator("result_schema")
    @classmethod
    def _schema_is_object(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type") != "object":
            raise ValueError('a result schema must be a JSON Schema with type = "object"')
        if v is not None:
            within_text_limit("the result schema (as JSON)", json.dumps(v), "ask for less")
        return v

    @field_validator("context")
    @classmethod
    def _context_fields(cls, v: dict[str, Any]) -> dict[str, Any]:
        from subagents.context.config import ContextConfig

        try:
            ContextConfig.model_validate(v)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise ValueError(f"{where}: {err['msg'].removeprefix('Value error, ')}") from None
        return v

    @model_validator(mode="after")
    def _tools_usable(self) -> MemberJob:
        try:
            check_tool_names(self.kind, [t.name for t in self.tools])
        except ValueError as exc:
            raise FieldProblem("tools", str(exc)) from None
        for i, server in enumerate(self.mcp):
            if server.proxy is not None:
                raise FieldProblem(
                    f"mcp.{i}.proxy", "is set by Fleet (the run's egress proxy), not by a job"
                )
        for i, tool in enumerate(self.tools):
            if tool.callable is not None:
                try:  # importable now, or the member would fail at its start
                    load_callable(tool.callable)
                except ValueError as exc:
                    raise FieldProblem(f"tools.{i}.callable", str(exc)) from None
        return self

    @model_validator(mode="after")
    def _result_fields_fillable(self) -> MemberJob:
        if self.result_schema is None:
            return self
        kind = get_kind(self.kind)
        try:  # the member spec's own check, here where the job file can be named
            member_part(self.result_schema, kind.submit_schema, kind.result_model)
        except ValueError as exc:
            raise FieldProblem("result_schema", str(exc)) from None
        return self

    @model_validator(mode="after")
    def _coding_fields(self) -> MemberJob:
        coding_only = {
            "repo": bool(self.repo),
            "test": bool(self.test),
            "files": bool(self.files),
            "test_gate": not self.test_gate,
            "setup": self.setup is not None,
            "attempts": self.attempts != 1,
        }
        field = next((f for f, used in coding_only.items() if used), None)
        if not kind_is(self.kind, "returns_patch") and field is not None:
            raise FieldProblem(field, f"'{field}' is only for coding members (kind = \"coding\")")
        return self


class Research(_JobModel):
    """A research question the planner splits into one browser member per sub-question."""

    question: str = Field(min_length=1)
    """The question, in words."""

    @field_validator("question")
    @classmethod
    def _question_size(cls, v: str) -> str:
        within_text_limit("the question", v, "ask the question; leave the material out")
        return v

    members: int = Field(default=3, ge=1, le=32)
    """How many sub-questions (and browser members)."""
    limits: Limits = Field(default_factory=Limits)
    """Limits of each research member."""


LEAD_ID = "lead"
"""The lead's own id (its directory, trace and progress row); no member may take it."""


class Lead(_JobModel):
    """A question for a lead that spawns members in waves (instead of ``[research]``)."""

    question: str = Field(min_length=1)
    """The question, in words."""

    @field_validator("question")
    @classmethod
    def _question_size(cls, v: str) -> str:
        within_text_limit("the question", v, "ask the question; leave the material out")
        return v

    members: int = Field(default=3, ge=1, le=32)
    """The first wave's size (the offline lead's plan; a model lead's guide)."""
    max_members: int = Field(default=12, ge=1, le=256)
    """Members over all waves, at most; a spawn past it is refused."""
    max_waves: int = Field(default=3, ge=1, le=20)
    """Waves (spawn calls that start members), at most."""
    kinds: list[MemberKind] = Field(
        default_factory=lambda: list(BUILTIN_MEMBER_KINDS), min_length=1
    )
    """Member kinds the lead may spawn."""
    model: str | None = None
    """The lead's own model; default the job's ``[model].name``."""
    limits: Limits = Field(
        default_factory=lambda: Limits(max_turns=40, deadline_s=3600, result_tokens=4000)
    )
    """The lead's own limits (its turns, tokens, wall-clock time and report size)."""
    member_limits: Limits = Field(default_factory=lambda: Limits(max_tokens=200_000))
    """Limits of each member the lead spawns (``max_tokens`` is what the budget reserves
    for a running member)."""
    token_budget: int = Field(default=2_000_000, ge=10_000, le=1_000_000_000)
    """Tokens the whole run may use - the lead's and every member's; a spawn whose
    members could pass it is refused."""
    result_chars: int = Field(default=4000, ge=500, le=50_000)
    """Each member's result is cut to this many characters before the lead sees it."""
    context: dict[str, Any] = Field(default_factory=dict)
    """The lead's context-management thresholds (as a member's ``context``)."""

    @field_validator("context")
    @classmethod
    def _context_fields(cls, v: dict[str, Any]) -> dict[str, Any]:
        return MemberJob._context_fields(v)

    @model_validator(mode="after")
    def _fits(self) -> Lead:
        if self.members > self.max_members:
            raise FieldProblem(
                "members",
                f"the first wave ({self.members}) is more than max_members ({self.max_members})",
            )
        if self.member_limits.max_tokens is None:
            self.member_limits.max_tokens = min(200_000, self.token_budget)
        if self.member_limits.max_tokens > self.token_budget:
            raise FieldProblem(
                "member_limits.max_tokens",
                f"one member may use {self.member_limits.max_tokens} tokens, more than the "
                f"whole token_budget ({self.token_budget})",
            )
        self.kinds = list(dict.fromkeys(self.kinds))
        return self


_RETRY_DEFAULT: tuple[RetryOn, ...] = ("crashed", "overloaded")


class RetryPolicy(_JobModel):
    """Which failures are tried again, and how often. The task failing never is."""

    attempts: int = Field(default=2, ge=1, le=10)
    """Tries per member in all (1 = no retry)."""
    backoff_s: float = Field(default=1.0, ge=0, le=600)
    """Wait before the second try; doubles each further try."""
    backoff_max_s: float = Field(default=30.0, ge=0, le=3600)
    """Longest wait between tries."""
    on: list[RetryOn] = Field(default_factory=lambda: list(_RETRY_DEFAULT))
    """Failures that retry: ``crashed`` (box died), ``overloaded`` (model), ``timed_out``."""
    resume: Literal["auto", "always", "never"] = "auto"
    """Where a retry starts: ``auto`` goes on from the last completed turn after the
    model was overloaded, and starts over after a crashed box or a deadline (what was
    in the box may be what broke it); ``always`` goes on after every failure;
    ``never`` always starts over. ``fleet resume`` goes on from the last completed
    turn unless this is ``never``."""


class FanoutPolicy(_JobModel):
    """How members run together and when the run counts as a success."""

    max_parallel: int | None = Field(default=None, ge=1, le=256)
    """Members running at once; the rest wait in a queue. Left out: chosen from the
    members and what the engine's host holds (:mod:`coordinator.nodes.capacity`), and said
    in the run's first line."""
    min_success: int = Field(default=1, ge=0)
    """Quorum: members that must end ``ok`` for the run to succeed."""
    fail_fast: bool = False
    """Cancel the remaining members at the first member that fails for good (after its
    retries). Without it a failure never touches a sibling."""
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    warm_pool: bool = True
    """Start boxes ahead of need (while the plan is made and services start; for
    ``fleet run JOB``, the first wave's coding boxes while Fleet loads and checks the
    job: :mod:`coordinator.nodes.prewarm`), so a member takes a running box instead of
    waiting for one. A box is never reused. One coding box whose member calls the
    Messages API is started beside that member's first model call instead, which hides
    it (:func:`coordinator.nodes.node.open_pools`)."""


def url_host(url: str) -> tuple[str, int]:
    """The host and port the egress proxy would be asked for by ``url``; ValueError
    when its host is written in disguise (``http://0x7f000001/``, ``http://a@host/``:
    :func:`~sandbox.inbox.egress_rules.read_host`) or is one the proxy always refuses."""
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValueError(f"the port of {parts.netloc!r} is not a TCP port (1-65535)") from None
    why = entry_refusal(parts.netloc)
    if why:
        raise ValueError(f"its host can never be reached: {why}")
    return read_host(split_entry(parts.netloc)[0]).host, port


def _searchable(url: str, allow: list[str]) -> None:
    """Refuse a search URL whose host the egress proxy would refuse: every search of
    every browser member would fail, and the run would "succeed" with nothing found."""
    host, port = url_host(url.replace("{query}", "q"))
    if not Policy(allow, None, []).name_allowed(host, port):
        wanted = ", ".join(f'"{h}"' for h in [*allow, f"{host}:{port}"])
        raise ValueError(
            f"its host {host}:{port} is not in egress.allow ({', '.join(allow)}): the egress "
            f"proxy would refuse every search. Allow it: allow = [{wanted}] (fleet research: "
            f"--allow-domain {host}:{port})"
        )


def _reachable(url: str, allow: list[str]) -> None:
    """Refuse an MCP server URL whose host the run's egress allowlist does not list."""
    host, port = url_host(url)
    if not Policy(allow, None, []).name_allowed(host, port):
        raise ValueError(
            f"its host {host}:{port} is not in egress.allow ({', '.join(allow)}); an MCP "
            f"server is reached only through the run's egress allowlist. Allow it: "
            f'[egress] allow = [..., "{host}:{port}"]'
        )


class Egress(_JobModel):
    """Where browser members may connect (coding members never have a network)."""

    allow: list[str] = Field(default_factory=lambda: ["corpus:8080"])
    """Hosts (``name`` or ``name:port``) browser boxes may reach; ``corpus:8080`` is
    Fleet's offline corpus, started for the run when it is listed."""
    search_url: str | None = None
    """Search page with ``{query}``, on an allowed host (default: the corpus search)."""

    @field_validator("allow")
    @classmethod
    def _hosts(cls, v: list[str]) -> list[str]:
        try:
            return list(NetworkPolicy(egress="allowlist", allow=tuple(v)).allow)
        except SandboxSpecError as exc:  # one (field, message) pair per problem
            raise ValueError(exc.problems[0][1] if exc.problems else str(exc)) from None

    @field_validator("search_url")
    @classmethod
    def _query_placeholder(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return v
        if "{query}" not in v:
            raise ValueError("the search URL has no '{query}' placeholder")
        try:  # the browser members' own rule, checked here so a bad URL stops no member
            BrowserConfig(search_url=v)
        except ValidationError as exc:
            raise ValueError(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None
        allow = info.data.get("allow")
        if allow is None:  # allow was itself invalid, reported on its own
            url_host(v.replace("{query}", "q"))
        else:
            _searchable(v, allow)
        return v


class Synthesis(_JobModel):
    """The analyst step: it reads only the members' structured results."""

    enabled: bool = True
    instructions: str = ""
    """Extra instructions for the analyst (what the report should focus on)."""

    @field_validator("instructions")
    @classmethod
    def _instructions_size(cls, v: str) -> str:
        within_text_limit("the instructions", v, "say what the report should focus on")
        return v

    model: str | None = None
    """Analyst model; default the job's ``[model].name``."""
    max_result_chars: int = Field(default=8000, ge=500, le=100_000)
    """Each member's result is cut to this many characters before the analyst sees it."""


class Merge(_JobModel):
    """``[merge]``: the ok coding members' patches applied together in a fresh box from
    their repository, and a test run on the result (:mod:`coordinator.merge`)."""

    enabled: bool = True
    test: str | None = None
    """The command run on the merged tree; default: the members' ``test`` when they
    all have the same one (none: the merge is not tested, and not applied)."""
    order: list[str] = Field(default_factory=list)
    """Member ids, in the order their patches are applied (default: the job's order
    of its coding members on the repository); a later patch that conflicts with an
    earlier one is left out."""

    @field_validator("test")
    @classmethod
    def _test_size(cls, v: str | None) -> str | None:
        if v is not None:
            if not v.strip():
                raise ValueError("the merge test is blank; leave it out to use the members' test")
            within_text_limit("the merge test", v, "put a long script in a file of the repo")
        return v


class Job(_JobModel):
    """A whole job file."""

    name: str = Field(min_length=1, max_length=60)
    """Short name; used in the run id."""
    model: ModelDefaults = Field(default_factory=ModelDefaults)
    members: list[MemberJob] = Field(default_factory=list)
    research: Research | None = None
    lead: Lead | None = None
    fanout: FanoutPolicy = Field(default_factory=FanoutPolicy)
    egress: Egress = Field(default_factory=Egress)
    sandbox: JobSandbox = Field(default_factory=JobSandbox)
    synthesis: Synthesis = Field(default_factory=Synthesis)
    policy: ToolPolicy = Field(default_factory=ToolPolicy)
    """Allow / ask / deny rules on every member's tool calls (``subagents.rules.policy``)."""
    budget: Budget | None = None
    """The run's spending line (USD and/or tokens); none: only each member's limits.
    With ``[lead]``, a token line bounds the lead's ``token_budget`` too."""
    merge: Merge | None = None
    """Apply the coding members' patches together after they end (``[merge]``)."""
    output_dir: str = "runs"
    """Where run directories are created (relative to the current directory)."""

    @field_validator("name")
    @classmethod
    def _name_shape(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9 _.-]*$", v):
            raise ValueError(f"{v!r} has characters other than letters, digits, space, . _ -")
        return v

    @field_validator("members", mode="before")
    @classmethod
    def _not_too_many(cls, v: Any) -> Any:
        # Before each member is validated: a huge list is refused at once.
        if isinstance(v, list) and len(v) > MAX_MEMBERS:
            raise ValueError(
                f"the job has {len(v):,} members; at most {MAX_MEMBERS:,} are allowed: "
                "split it into several jobs"
            )
        return v

    @model_validator(mode="after")
    def _members_make_sense(self) -> Job:
        if self.lead is not None and (self.members or self.research is not None):
            where = "research" if self.research is not None else "members"
            raise FieldProblem(
                where,
                "a [lead] job has no [[members]] and no [research]: its lead spawns the "
                "members itself",
            )
        if not self.members and self.research is None and self.lead is None:
            raise FieldProblem(
                "members", "the job has no [[members]], no [research] and no [lead] question"
            )
        ids: set[str] = set()
        for i, m in enumerate(self.members):
            for j, server in enumerate(m.mcp):
                if server.url is not None:
                    try:
                        _reachable(server.url, self.egress.allow)
                    except ValueError as exc:
                        raise FieldProblem(f"members.{i}.mcp.{j}.url", str(exc)) from None
            if m.id is None:
                m.id = f"{m.kind}-{i + 1}"
            if m.id == LEAD_ID:
                raise FieldProblem(f"members.{i}.id", f"{LEAD_ID!r} is the lead's id; pick another")
            if m.id in ids:
                raise FieldProblem(
                    f"members.{i}.id", f"member id {m.id!r} is used twice; ids must be unique"
                )
            ids.add(m.id)
        total = self.member_count
        if total > MAX_MEMBERS:  # research members on top of explicit ones
            raise FieldProblem(
                "members", f"the job has {total:,} members; at most {MAX_MEMBERS:,} are allowed"
            )
        if self.fanout.min_success > total:
            raise FieldProblem(
                "fanout.min_success",
                f"it is {self.fanout.min_success} but the job has only {total} member(s)",
            )
        if self.merge is not None and self.merge.enabled:
            self.merged_members()  # raises FieldProblem naming what is wrong
        if self.lead is not None and self.budget is not None and self.budget.tokens:
            # The lead plans spawns against token_budget (what members may reserve);
            # [budget] is what may really be spent: the plan never promises more.
            lead = self.lead
            lead.token_budget = min(lead.token_budget, self.budget.tokens)
            if lead.member_limits.max_tokens is not None:
                lead.member_limits.max_tokens = min(
                    lead.member_limits.max_tokens, lead.token_budget
                )
        return self

    def merged_members(self) -> list[MemberJob]:
        """The members whose patches ``[merge]`` applies, in its order: at least two
        coding members, all on one repository."""
        merge = self.merge
        assert merge is not None
        coding = {m.id: m for m in self.members if kind_is(m.kind, "returns_patch") and m.repo}
        if merge.order:
            chosen = []
            for i, mid in enumerate(merge.order):
                if mid not in coding:
                    known = ", ".join(sorted(str(k) for k in coding)) or "none"
                    raise FieldProblem(
                        f"merge.order.{i}",
                        f"{mid!r} is not a coding member with a repo (those are: {known})",
                    )
                if merge.order.index(mid) != i:
                    raise FieldProblem(f"merge.order.{i}", f"{mid!r} is named twice")
                chosen.append(coding[mid])
        else:
            chosen = list(coding.values())
        repos = {os.path.normpath(str(m.repo)) for m in chosen}
        if len(repos) > 1:
            raise FieldProblem(
                "merge" if not merge.order else "merge.order",
                "the merged members work on different repositories "
                f"({', '.join(sorted(repos))}); merge those on one (name them in merge.order)",
            )
        if len(chosen) < 2:
            raise FieldProblem(
                "merge",
                "[merge] needs at least two coding members on one repository "
                f"(the job has {len(chosen)})",
            )
        return chosen

    def merge_test(self) -> str | None:
        """The merged tree's test: ``[merge].test``, else the merged members' one test."""
        assert self.merge is not None
        if self.merge.test is not None:
            return self.merge.test
        tests = {m.test for m in self.merged_members()}
        return tests.pop() if len(tests) == 1 else None

    @property
    def member_count(self) -> int:
        """Members the job runs (for a lead: at most this many)."""
        if self.lead is not None:
            return self.lead.max_members
        return len(self.members) + (self.research.members if self.research else 0)

    @property
    def question(self) -> str:
        """The job's question ([research] or [lead]), or ""."""
        if self.lead is not None:
            return self.lead.question
        return self.research.question if self.research else ""

    def slug(self) -> str:
        return slug(self.name)


def _fields_of(model: type[BaseModel]) -> Callable[[tuple[str | int, ...]], str]:
    """The fields a directly built model accepts, for an unknown key's error."""
    return lambda loc: ", ".join(model.model_fields)

"""Member kinds: a kind is a system prompt, tools, a result model, settings and defaults.

A :class:`Kind` is plain data plus a few optional hooks, so adding a kind is one small
module that calls :func:`register_kind` at import. The built-in kinds (``coding`` in
:mod:`subagents.kinds.coding`, ``browser`` in :mod:`subagents.kinds.browser`) are
imported on first use by :func:`get_kind`, so importing this package stays cheap and
a kind's heavy dependencies (Playwright) load only when a member of that kind runs.

A kind's own settings (a browser member's session, a coding member's check command)
are a pydantic model of its own, :attr:`Kind.settings`; a member carries them in
``MemberSpec.settings``, typed, apart from the task's inputs. They are for the
harness and the kind's hooks, not for the model: what the model should know of them
the kind says in words (:attr:`Kind.brief`).

``submit_model`` is what the model fills in through ``submit_result``; ``result_model``
is what the member returns. They differ when the harness, not the model, supplies
part of the answer - a coding member's patch is computed from the box by
``finalize``, never typed out by the model.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:  # the harness's parts, for the hooks' types only: asking a kind about
    # itself (its traits, :func:`trait`) imports neither them nor any kind's module
    from sandbox.spec import BoxKind

    from ..durable import Checkpoint, Restore
    from ..tools.base import Tool, ToolContext

    ToolsFactory = Callable[[Any], list[Tool]]
    """Builds a member's tools from its settings (an instance of the kind's ``settings``)."""
    Brief = Callable[[Any], str | None]
    Setup = Callable[[ToolContext], Awaitable[None]]
    Finalize = Callable[[dict[str, Any], ToolContext], Awaitable[dict[str, Any]]]
    Judge = Callable[[dict[str, Any]], str | None]


class NoSettings(BaseModel):
    """The settings of a kind that has none."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class Kind:
    """What makes a member a coding member or a browser member."""

    name: str
    """Kind name as a job names it (``coding``, ``browser``)."""
    system_prompt: str
    """The kind's instructions; the loop appends the harness rules."""
    tools: ToolsFactory
    """Builds the kind's tools for one member, from the member's settings."""
    result_model: type[BaseModel]
    """Schema of the member's final result."""
    submit_model: type[BaseModel] | None = None
    """Schema of ``submit_result``'s input; None means ``result_model``."""
    submit_description: str = (
        "Finish: submit your final, distilled result. Call it exactly once, when done."
    )
    """Description of the ``submit_result`` tool."""
    submit_name: str = "submit_result"
    """Name of the tool that ends the member with its result (the lead's is ``finish``)."""
    todos: bool = False
    """Whether the ``write_todos`` tool and recitation are on by default."""
    box_kind: BoxKind = "coding"
    """The sandbox kind a member of this kind runs in."""
    needs_box: bool = True
    """False for a kind whose tools touch no box (the lead: it delegates, on the
    coordinator's host); such a member runs with no sandbox at all."""
    returns_patch: bool = False
    """Its result is a change to a repository (a patch, what its test did), not findings
    to read: a report lists it among the code changes, never gives it to the analyst,
    and a lead's check of a documented behaviour is a member of such a kind."""
    reads_web: bool = False
    """It reads pages through the run's egress: the run's offline corpus (when the job
    allows it) is started for members of such a kind."""
    file_tools: bool = False
    """Its tools read and search box files (``read_file``, ``grep``), so a saved tool
    result is pointed to in the box; False: the member gets ``read_saved`` instead."""
    setup: Setup | None = None
    """Runs once before the first model call (e.g. snapshot the workspace)."""
    finalize: Finalize | None = None
    """Turns an accepted submission into the final result (e.g. add the patch)."""
    judge: Judge | None = None
    """Why a final result is not a success despite being accepted, or None when it is
    one: what the harness measured outranks what the model said (a coding member
    whose test fails after its edit ends ``failed``, its result kept)."""
    teardown: Setup | None = None
    """Runs once when the member ends, however it ends (e.g. close a browser connection)."""
    checkpoint: Checkpoint | None = None
    """Saves the box's state after a turn, so a resumed member's new box can be put
    back as it was (:mod:`subagents.durable`); None: the box holds nothing to keep."""
    restore: Restore | None = None
    """Puts a checkpoint back into a fresh box before a resumed member goes on."""
    settings: type[BaseModel] = NoSettings
    """The model of a member's settings of this kind (``MemberSpec.settings``; the hooks
    read them as ``ToolContext.settings``)."""
    brief: Brief | None = None
    """What the member's first message says of its settings, in words, or None: a
    coding member is told the check command Fleet will run after it submits."""

    @property
    def submit_schema(self) -> type[BaseModel]:
        return self.submit_model or self.result_model


class UnknownKind(ValueError):
    """A job named a kind that no module registers."""


_KINDS: dict[str, Kind] = {}
BUILTIN_TRAITS: dict[str, dict[str, Any]] = {
    "coding": {"box_kind": "coding", "todos": True, "returns_patch": True, "file_tools": True},
    "browser": {"box_kind": "browser", "reads_web": True},
    "lead": {"needs_box": False},
}
"""The built-in kinds' traits (their plain fields): each kind's module builds its
:class:`Kind` from these (:func:`builtin_traits`), and :func:`trait` answers from them
without importing the module - a browser kind's brings Playwright with it (about 0.2 s),
which a job's check, the early boxes and the report never need."""
_BUILTIN = tuple(BUILTIN_TRAITS)
BUILTIN_MEMBER_KINDS = ("browser", "coding")
"""The built-in kinds a job may name for a member (the lead is a run's own)."""
RESEARCH_KIND = "browser"
"""The kind of the members a ``[research]`` job plans: each reads the web for one
sub-question."""
_TRAITS = {f.name: f.default for f in dataclasses.fields(Kind) if f.type in ("bool", "BoxKind")}


def builtin_traits(name: str) -> dict[str, Any]:
    """The traits of the built-in kind ``name``, for its module's :class:`Kind`."""
    return dict(BUILTIN_TRAITS[name])


def trait(name: str, which: str) -> Any:
    """The trait ``which`` (a plain field of :class:`Kind`: ``box_kind``, ``needs_box``,
    ``returns_patch``, ``reads_web``, ...) of the kind called ``name``, without
    importing a built-in kind's module.

    Raises:
        UnknownKind: no kind of that name is registered or built in.
        KeyError: ``which`` is no trait.
    """
    if which not in _TRAITS:
        raise KeyError(f"{which!r} is not a trait of a kind; traits: {', '.join(sorted(_TRAITS))}")
    if name in _KINDS:
        return getattr(_KINDS[name], which)
    if name in BUILTIN_TRAITS:
        return BUILTIN_TRAITS[name].get(which, _TRAITS[which])
    raise UnknownKind(f"unknown member kind {name!r}; use one of: {', '.join(member_kinds())}")


def member_kinds() -> list[str]:
    """The kinds a job may name for a member: the built-in ones and every registered
    kind that runs in a box, sorted."""
    return sorted({*BUILTIN_MEMBER_KINDS, *(n for n, k in _KINDS.items() if k.needs_box)})


def register_kind(kind: Kind) -> Kind:
    """Make ``kind`` available to :func:`get_kind` (a later registration replaces it)."""
    _KINDS[kind.name] = kind
    return kind


def get_kind(name: str) -> Kind:
    """The kind called ``name``; built-in kinds are imported on first use."""
    if name not in _KINDS and name in _BUILTIN:
        try:
            importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    if name not in _KINDS:
        known = sorted(set(_KINDS) | set(_BUILTIN))
        raise UnknownKind(f"unknown member kind {name!r}; use one of: {', '.join(known)}")
    return _KINDS[name]


def kind_is(name: str, which: str) -> bool:
    """Whether the kind called ``name`` has the trait ``which`` (a boolean field of
    :class:`Kind`); False for a kind this process does not know (a run recorded by a
    newer Fleet)."""
    try:
        return bool(trait(name, which))
    except UnknownKind:
        return False


def kind_settings(kind: str, value: Any = None) -> BaseModel:
    """``value`` as the settings of a ``kind`` member (its defaults when None).

    Raises ValueError naming the kind's settings model when ``value`` is another
    kind's settings or does not validate against it.
    """
    model = get_kind(kind).settings
    if value is None:
        return model()
    if isinstance(value, model):
        return value
    if isinstance(value, BaseModel):
        raise ValueError(
            f"the settings of a {kind} member are {model.__name__}, not {type(value).__name__}"
        )
    return model.model_validate(value)


def known_kinds() -> list[str]:
    return sorted(set(_KINDS) | set(_BUILTIN))

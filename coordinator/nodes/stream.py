"""Every message of an attempt's stream from a cluster node, as one typed protocol.

A node runs one attempt as one streaming Ray call (:meth:`NodeService.attempt`); what
it yields is, in order, any number of

=========== =============================================== ==========================
kind        what                                            handled by
=========== =============================================== ==========================
events      a batch of the member's trace events            the member's trace
ask         a policy ask waiting for an answer              :mod:`.node_asks`
unask       an ask the node no longer waits for             :mod:`.node_asks`
reserve     a model call waiting for room in the budget     :mod:`.node_budget`
unreserve   a reservation the node no longer waits for      :mod:`.node_budget`
settle      how a reserved call ended                       :mod:`.node_budget`
release     the member ended: its held closing call is free :mod:`.node_budget`
durable     the transcript and checkpoint after a turn      :mod:`.node_durable`
=========== =============================================== ==========================

then one ``reply`` (:class:`~.shipping.NodeReply`: the outcome and the member's files).

Why one discriminated union (on ``kind``) and not ``(kind, payload)`` tuples read in
four modules: the node is less trusted than the coordinator, and each reader checked
its payload its own way, or not at all (a trace event that did not validate, an ask
whose request was not one, raised inside the coordinator's attempt). Here every
message is a pydantic model with ``extra="forbid"`` and is validated once, on receipt,
by :func:`receive` - a message of an unknown kind, or one that does not fit its kind
(a number that is not finite, a field too many, another kind's reply), is a
:class:`StreamError` that ends that attempt ``failed`` with the reason, and is never
acted on. The run goes on. Validating a reply checks its outcome as coming from
someone not trusted (:meth:`subagents.results.outcome.MemberOutcome.received`): its result is
its kind's, with only the job's own fields beside the kind's.

On the wire a message is its ``model_dump()`` (plain data: Ray pickles it, and no
object of the node's making is taken as one of ours). Bounds the models do not state -
a durable update's file names and sizes, a reservation id already in use - stay with
the module that owns them, as before.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated, Any, Literal, TypeAlias, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from subagents.results.outcome import RECEIVED, Received
from subagents.rules.policy import ApprovalRequest
from subagents.trace import TraceEvent

from .node_durable import DurableUpdate
from .shipping import NodeReply

EVENTS_PER_MESSAGE = 10_000
"""Most trace events in one batch (a node batches what its queue holds)."""
ID_CHARS = 64
"""Longest id a node may give an ask or a reservation."""

AskId = Annotated[str, Field(min_length=1, max_length=ID_CHARS)]
Number = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
"""A finite, non-negative amount (an int is one; a bool or a string is not)."""


class Message(BaseModel):
    """What every message is: strict about its fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def wire(self) -> dict[str, Any]:
        """The message as it travels (plain data)."""
        return self.model_dump()


class Events(Message):
    """A batch of the member's trace events, in the order they were traced."""

    kind: Literal["events"] = "events"
    events: list[TraceEvent] = Field(max_length=EVENTS_PER_MESSAGE)

    @staticmethod
    def batch(dumped: list[dict[str, Any]]) -> dict[str, Any]:
        """The wire form of events the node dumped as they were traced (an event is
        not read again after it is traced: a later change to it is not sent)."""
        return {"kind": "events", "events": dumped}


class Ask(Message):
    """A policy ask of the member, waiting on the node for the coordinator's answer."""

    kind: Literal["ask"] = "ask"
    id: AskId
    request: ApprovalRequest
    timeout_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None


class Unask(Message):
    """An ask the node no longer waits for (the member's deadline, the attempt stopped)."""

    kind: Literal["unask"] = "unask"
    id: AskId


class Spent(Message):
    """An amount of the run's budget."""

    usd: Number
    tokens: Number


class Reserve(Spent):
    """A model call waiting for room in the run's budget (the amount: its estimate)."""

    kind: Literal["reserve"] = "reserve"
    id: AskId
    closing: Annotated[bool, Field(strict=True)] = False
    hold: Spent | None = None
    """What a regular call keeps for its member's closing call (None: its estimate)."""
    per_out: Spent | None = None
    """A call whose output bound may be lowered to fit the line: one output token's
    amount (the estimate is then its input plus ``max_out`` of them)."""
    max_out: Annotated[int, Field(strict=True, ge=1, le=1_000_000)] | None = None
    min_out: Annotated[int, Field(strict=True, ge=1, le=1_000_000)] | None = None


class Unreserve(Message):
    """A reservation the node no longer waits for."""

    kind: Literal["unreserve"] = "unreserve"
    id: AskId


class Settle(Message):
    """How a reserved call ended."""

    kind: Literal["settle"] = "settle"
    id: AskId
    used: Spent | None
    """What the call spent, as the API reported it; None: it failed before any usage."""
    hold: Spent | None = None
    """The member's closing call as it stands after this call (None: as it was)."""


class Release(Message):
    """The member ended: its held closing call is free."""

    kind: Literal["release"] = "release"


class Durable(Message):
    """The member's transcript and checkpoint after a saved turn."""

    kind: Literal["durable"] = "durable"
    update: DurableUpdate


class Reply(Message):
    """How the attempt ended, with the member's files: the stream's last message."""

    kind: Literal["reply"] = "reply"
    reply: NodeReply


StreamMessage: TypeAlias = Annotated[
    Events | Ask | Unask | Reserve | Unreserve | Settle | Release | Durable | Reply,
    Field(discriminator="kind"),
]
"""Every message a node may send in an attempt's stream."""

_MESSAGE: TypeAdapter[StreamMessage] = TypeAdapter(StreamMessage)
KINDS = frozenset(str(m.model_fields["kind"].default) for m in get_args(get_args(StreamMessage)[0]))


class StreamError(ValueError):
    """A message from a node that is not one of the protocol's; the text says which kind
    and what was wrong, in one line."""


def receive(item: Any, *, job_fields: Collection[str] = ()) -> StreamMessage:
    """``item`` from a node's stream as its message; :class:`StreamError` when it is not
    one. ``job_fields``: the job's own result fields, the only ones a reply's result may
    add to its kind's."""
    kind = item.get("kind") if isinstance(item, dict) else None
    if not isinstance(kind, str) or kind not in KINDS:
        shown = repr(kind)[:40] if isinstance(kind, str) else f"a {type(item).__name__}"
        raise StreamError(f"a message of no known kind ({shown})")
    try:
        return _MESSAGE.validate_python(item, context={RECEIVED: Received(frozenset(job_fields))})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"][1:])  # after the kind's tag
        raise StreamError(f"a malformed {kind!r} message ({where}: {first['msg']})") from None

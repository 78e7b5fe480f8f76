"""Every message a node sends in an attempt's stream is one of the protocol's, checked on
the coordinator (``coordinator/nodes/stream.py``): a node is less trusted than the
coordinator, so a message of no known kind, or one that does not fit its kind, ends
that attempt ``failed`` with the reason - it is never acted on, and the run goes on.

The coordinator's real reading of a stream (``RayNodes._follow``) is driven here with
the items a node would yield, in place of Ray's transport (the Ray tests in
``test_cluster*.py`` run the same code across real nodes).
"""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import anyio
import pytest

import coordinator as fleet
from coordinator.job.spec import RetryPolicy
from coordinator.nodes.cluster import RayNodes, _Node
from coordinator.nodes.node_durable import DurableUpdate
from coordinator.nodes.shipping import NodeReply, NodeRequest
from coordinator.nodes.stream import (
    Ask,
    Durable,
    Events,
    Release,
    Reply,
    Reserve,
    Settle,
    Spent,
    StreamError,
    Unask,
    Unreserve,
    receive,
)
from coordinator.nodes.worker import MemberUnit
from subagents.results.outcome import MemberOutcome
from subagents.rules.policy import ApprovalRequest
from subagents.spec import MemberSpec
from subagents.trace import ModelCall, read_trace

EVENT = ModelCall(span="m/t1", model="offline", input_tokens=5).model_dump(exclude_none=True)
ASKED = {"call_id": "c", "tool": "shell", "input": {"command": "ls"}, "rule": "r"}
OK = {"member": "m", "kind": "coding", "status": "ok", "result": {"summary": "done"}}


def _files() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("patch.diff")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"diff"))
    return buf.getvalue()


def _reply(outcome: dict[str, Any] = OK) -> dict[str, Any]:
    return {"kind": "reply", "reply": {"outcome": outcome, "files": _files(), "memory": []}}


@pytest.fixture(autouse=True)
def cancelled(monkeypatch) -> list[Any]:
    """The calls the coordinator cancelled (``ray.cancel`` of a call that is no Ray
    call would start a local Ray instance)."""
    calls: list[Any] = []
    monkeypatch.setattr("coordinator.nodes.cluster._cancel", calls.append)
    return calls


def _follow(tmp_path: Path, items: list[Any], relay: dict[str, Any] | None = None):
    """What the coordinator makes of a node's stream of ``items``: the outcome, and the
    member's trace as written."""
    unit = MemberUnit(
        run_id="r",
        member_dir=str(tmp_path / "m"),
        spec=MemberSpec(id="m", kind="coding", task="t", model="offline", stated_deadline_s=60),
        retry=RetryPolicy(),
    )
    nodes = RayNodes("127.0.0.1:1")
    node = _Node(name="n1", info={}, actor=None, slots=1, free=1)
    from subagents.trace import TraceWriter

    trace = TraceWriter(tmp_path / "trace.jsonl", run="r", member="m")

    async def ready(item: Any) -> Any:
        return item

    async def call() -> AsyncIterator[Awaitable[Any]]:
        for item in items:
            yield ready(item)

    async def go() -> MemberOutcome:
        request = NodeRequest(unit=unit)
        t0 = time.monotonic()
        return await nodes._follow(node, unit, trace, t0, call(), request, relay or {})

    outcome = anyio.run(go)
    trace.close()
    return outcome, list(read_trace(tmp_path / "trace.jsonl"))


def test_a_good_stream_is_read_whole(tmp_path):
    update = DurableUpdate(names=["conversation.json"], files={"conversation.json": b"{}"})
    items = [Events.batch([EVENT]), Durable(update=update).wire(), _reply()]
    outcome, traced = _follow(tmp_path, items)
    assert outcome.status == "ok", outcome.reason
    assert isinstance(outcome.result, fleet.CodingMemberResult)
    assert [e.type for e in traced] == ["model_call"]
    assert (tmp_path / "m" / "conversation.json").read_bytes() == b"{}"
    assert (tmp_path / "m" / "patch.diff").read_bytes() == b"diff"


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ({"kind": "exfiltrate", "to": "http://evil"}, "a message of no known kind ('exfiltrate')"),
        (("events", [EVENT]), "a message of no known kind (a tuple)"),  # the old wire form
        ({"events": [EVENT]}, "no known kind (a dict)"),
        (
            Events.batch([{**EVENT, "input_tokens": "lots"}]),
            "a malformed 'events' message (events.0.model_call.input_tokens",
        ),
        (Events.batch([{**EVENT, "type": "rm_rf"}]), "a malformed 'events' message"),
        ({"kind": "ask", "id": "a1", "request": {"tool": "shell"}}, "malformed 'ask'"),
        ({"kind": "reserve", "id": "r1", "usd": 0, "tokens": 10}, "which this attempt does not"),
        ({"kind": "release", "member": "someone-else"}, "malformed 'release'"),
        ({"kind": "durable", "update": {"names": ["x"] * 9}}, "malformed 'durable'"),
        (_reply({**OK, "result": {"summary": "s", "claims": []}}), "malformed 'reply' message"),
        (_reply({**OK, "kind": "probe"}), "for probe member 'm'"),
        (
            Ask(id="a1", request=ApprovalRequest(**ASKED, member="m2")).wire(),
            "an 'ask' for member 'm2', not this attempt's 'm'",
        ),
        (Events.batch([{**EVENT, "member": "m2"}]), "an event of member 'm2' of run ''"),
        (Events.batch([{**EVENT, "member": "m", "run": "r2"}]), "of run 'r2', not this"),
    ],
    ids=[
        "unknown-kind",
        "old-tuple",
        "no-kind",
        "bad-event-field",
        "unknown-event",
        "ask-without-request",
        "reserve-without-budget",
        "release-with-field",
        "durable-too-many-names",
        "reply-of-another-kinds-shape",
        "reply-of-another-kind",
        "ask-for-another-member",
        "event-of-another-member",
        "event-of-another-run",
    ],
)
def test_a_message_that_is_not_the_protocols_ends_the_attempt_unread(
    tmp_path, cancelled, bad, said
):
    acted: list[Any] = []
    relay = {"ask": acted.append, "unask": acted.append}
    then = [] if isinstance(bad, dict) and bad.get("kind") == "reply" else [_reply()]
    outcome, traced = _follow(tmp_path, [Events.batch([EVENT]), bad, *then], relay)
    assert outcome.status == "failed" and said in outcome.reason, outcome.reason
    assert outcome.reason.startswith("node n1 sent ") and "\n" not in outcome.reason
    assert len(cancelled) == 1 or not then  # the node's call is stopped
    assert outcome.result is None and acted == []  # never acted on
    assert not (tmp_path / "m" / "patch.diff").exists()  # nothing of the attempt kept
    assert [e.type for e in traced][:1] == ["model_call"]  # what came before is kept
    assert traced[-1].type == "member_end" and traced[-1].status == "failed"


def test_nothing_is_taken_after_the_reply(tmp_path):
    outcome, _ = _follow(tmp_path, [_reply(), Events.batch([EVENT])])
    assert outcome.status == "failed" and "'events' message after its reply" in outcome.reason


def test_every_message_a_node_makes_reads_back_as_itself():
    request = ApprovalRequest(member="m", call_id="c", tool="shell", input={}, rule="r")
    reply = NodeReply(outcome=MemberOutcome.model_validate(OK), files=b"tar")
    sent = [
        Ask(id="a1", request=request, timeout_s=30.0),
        Unask(id="a1"),
        Reserve(id="r1", usd=0.5, tokens=1000, closing=True),
        Unreserve(id="r1"),
        Settle(id="r1", used=Spent(usd=0.25, tokens=900)),
        Settle(id="r2", used=None),
        Release(),
        Durable(update=DurableUpdate(names=["conversation.json"])),
        Reply(reply=reply),
    ]
    for msg in sent:
        assert receive(msg.wire()) == msg
    with pytest.raises(StreamError, match="no known kind"):
        receive(Release())  # a model object is not the wire form: only plain data is read


def test_an_ask_in_its_own_members_name_is_relayed(tmp_path):
    acted: list[Any] = []
    ask = Ask(id="a1", request=ApprovalRequest(**ASKED, member="m"), timeout_s=5.0)
    outcome, _ = _follow(tmp_path, [ask.wire(), _reply()], {"ask": acted.append})
    assert outcome.status == "ok", outcome.reason
    assert acted == [ask]

"""Trace ids and the offline label, end to end through ``run_member``.

Every event of a member's trace must say where it belongs (span, parent, turn) -
also the events emitted by code that does not know the turn, like the model
adapter's retries. An offline model's member is labelled offline everywhere a
person or a program would look (MemberOutcome, result.json, MemberStart, every
ModelCall, MemberEnd), and ``replay:<trace>`` made by ``make_model`` replays a
recorded member: the same tool calls, the same result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from loop_support import events, writer

from subagents.fake_api import FakeMessagesAPI, overloaded, overloaded_mid_stream, reply, tool_use
from subagents.member import run_member
from subagents.model.base import ModelRequest
from subagents.model.claude import AnthropicModel
from subagents.model.factory import make_model
from subagents.model.offline import register_policy
from subagents.results.outcome import MemberOutcome
from subagents.spec import MemberSpec

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_every_event_has_span_ids_and_retries_sit_under_their_model_call(
    tmp_path: Path,
) -> None:
    script = [
        overloaded(),
        reply(tool_use("add", {"a": 2, "b": 3}), tool_use("boom", {})),
        overloaded_mid_stream(),
        tool_use("submit_result", {"answer": "5"}),
    ]
    trace = writer(tmp_path)
    with FakeMessagesAPI(script) as api:
        async with AnthropicModel(
            "claude-sonnet-5", api_key="k", base_url=api.url, trace=trace, backoff_s=0.01
        ) as model:
            outcome = await run_member(
                MemberSpec(id="m1", kind="probe", task="Add 2 and 3."),
                sandbox=None,
                model=model,
                run_dir=tmp_path,
                trace=trace,
            )
    trace.close()
    assert outcome.status == "ok", outcome.reason
    evs = events(tmp_path / "trace.jsonl")
    missing = [e.type for e in evs if not (e.span and e.parent)]
    assert missing == [], f"events without span ids: {missing}"
    retries = [e for e in evs if e.type == "retry"]
    assert [(r.span, r.parent, r.turn) for r in retries] == [
        ("m1/t1/model", "m1/t1", 1),
        ("m1/t2/model", "m1/t2", 2),
    ]
    start, end = evs[0], evs[-1]
    assert (start.type, start.span, start.parent) == ("member_start", "m1", "run-1")
    assert (end.type, end.span, end.parent) == ("member_end", "m1", "run-1")


def _walk(request: ModelRequest) -> list[dict[str, Any]]:
    """Offline policy for the probe kind: two additions, then submit their sum."""
    results = [
        block["content"][0]["text"]
        for message in request.messages
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]
    if not results:
        return [
            {"type": "tool_use", "name": "add", "input": {"a": 2, "b": 3}},
            {"type": "tool_use", "name": "add", "input": {"a": 10, "b": 20}},
        ]
    if len(results) == 2:
        return [{"type": "tool_use", "name": "add", "input": {"a": int(results[0]), "b": 1}}]
    total = sum(int(r) for r in results)
    return [{"type": "tool_use", "name": "submit_result", "input": {"answer": str(total)}}]


register_policy("probe-walk", _walk)


async def _run(model_name: str, run_dir: Path) -> MemberOutcome:
    model = make_model(model_name, kind="probe")
    trace = writer(run_dir)
    try:
        return await run_member(
            MemberSpec(id="m1", kind="probe", task="Add things up.", model=model_name),
            sandbox=None,
            model=model,
            run_dir=run_dir,
            trace=trace,
        )
    finally:
        trace.close()


def _tool_calls(run_dir: Path) -> list[tuple[int, str, dict[str, Any]]]:
    return [(e.turn, e.tool, e.input) for e in events(run_dir / "trace.jsonl", "tool_call")]


def _assert_labelled_offline(run_dir: Path, outcome: MemberOutcome) -> None:
    assert outcome.offline
    assert json.loads((run_dir / "result.json").read_text())["offline"] is True
    evs = events(run_dir / "trace.jsonl")
    assert [e.offline for e in evs if e.type == "member_start"] == [True]
    assert [e.offline for e in evs if e.type == "member_end"] == [True]
    calls = [e for e in evs if e.type == "model_call"]
    assert calls and all(c.offline for c in calls)
    assert all(c.model.startswith(("offline", "replay:")) for c in calls)


async def test_replay_through_make_model_repeats_a_recorded_members_tool_calls(
    tmp_path: Path,
) -> None:
    recorded = await _run("offline:probe-walk", tmp_path / "rec")
    assert recorded.status == "ok" and recorded.result.data == {"answer": "41", "sources": []}
    _assert_labelled_offline(tmp_path / "rec", recorded)
    original = _tool_calls(tmp_path / "rec")
    assert [c[1] for c in original] == ["add", "add", "add", "submit_result"]

    replayed = await _run(f"replay:{tmp_path / 'rec' / 'trace.jsonl'}", tmp_path / "rep")
    assert replayed.status == "ok", replayed.reason
    assert _tool_calls(tmp_path / "rep") == original
    assert replayed.result == recorded.result and replayed.turns == recorded.turns
    _assert_labelled_offline(tmp_path / "rep", replayed)

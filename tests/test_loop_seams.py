"""The loop's use of the context manager and the job's result schema, end to end.

Each test runs a whole ``probe`` member (tests/loop_support.py) through the real
anthropic client against the fake Messages API server, with the real ContextManager,
and checks what the server received and what the member returned.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from loop_support import events, run_probe
from pydantic import ValidationError

from subagents.context.compaction import SUMMARY_SYSTEM
from subagents.context.config import ContextConfig
from subagents.fake_api import FakeMessagesAPI, Reply, reply, text, tool_use
from subagents.spec import Limits, MemberSpec

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def submit(**fields: Any) -> Reply:
    return tool_use("submit_result", fields)


def calls(api: FakeMessagesAPI) -> list[Any]:
    return [e for e in api.log if e.path.startswith("/v1/messages") and "count" not in e.path]


async def test_server_side_compaction_request_carries_the_managers_edits_and_beta(
    tmp_path: Path,
) -> None:
    config = ContextConfig(
        budget_tokens=10_000, server_side="compact", compaction_instructions="Keep bugs."
    )
    outcome, api = await run_probe(
        tmp_path, [tool_use("add", {"a": 1, "b": 2}), submit(answer="3")], context=config
    )
    assert outcome.status == "ok", outcome.reason
    for entry in calls(api):
        assert entry.body["context_management"] == {
            "edits": [
                {
                    "type": "compact_20260112",
                    "trigger": {"type": "input_tokens", "value": 9_000},
                    "instructions": "Keep bugs.",
                }
            ]
        }
        assert "compact-2026-01-12" in entry.headers["anthropic-beta"]


async def test_server_side_clearing_keeps_the_configured_recent_tool_uses(tmp_path: Path) -> None:
    config = ContextConfig(budget_tokens=20_000, server_side="clear_tool_uses")
    outcome, api = await run_probe(tmp_path, [submit(answer="3")], context=config)
    assert outcome.status == "ok", outcome.reason
    [entry] = calls(api)
    [edit] = entry.body["context_management"]["edits"]
    assert edit["type"] == "clear_tool_uses_20250919"
    assert edit["trigger"] == {"type": "input_tokens", "value": 17_000}
    assert edit["keep"] == {"type": "tool_uses", "value": 3}
    assert "context-management-2025-06-27" in entry.headers["anthropic-beta"]
    _, api = await run_probe(tmp_path / "plain", [submit(answer="3")])
    assert "context_management" not in calls(api)[0].body
    assert "anthropic-beta" not in calls(api)[0].headers


def _system(body: dict[str, Any]) -> str:
    system = body.get("system", "")
    return system if isinstance(system, str) else " ".join(b.get("text", "") for b in system)


async def test_compaction_summary_calls_count_in_the_member_totals(tmp_path: Path) -> None:
    summaries = turns = 0

    def policy(body: dict[str, Any]) -> Any:
        nonlocal summaries, turns
        if SUMMARY_SYSTEM in _system(body):
            summaries += 1
            return text("## Session intent\nFind the answer.\n## Next steps\nSubmit.")
        turns += 1
        if turns < 6:
            # Long reasoning each turn fills the small budget and forces a compaction.
            return reply(text("thinking " * 700), tool_use("add", {"a": 1, "b": 2}))
        return submit(answer="3")

    config = ContextConfig(budget_tokens=4_000, compact_fraction=0.8)
    outcome, _ = await run_probe(tmp_path, policy, context=config)
    assert outcome.status == "ok", outcome.reason
    assert summaries >= 1
    calls = events(tmp_path / "trace.jsonl", "model_call")
    assert sum(c.span.endswith("/compaction") for c in calls) == summaries
    assert outcome.input_tokens == sum(c.input_tokens for c in calls)
    assert outcome.output_tokens == sum(c.output_tokens for c in calls)
    assert outcome.cache_read_tokens == sum(c.cache_read_tokens for c in calls)
    assert outcome.cache_write_tokens == sum(c.cache_write_tokens for c in calls)
    end = events(tmp_path / "trace.jsonl", "member_end")[-1]
    assert end.input_tokens == outcome.input_tokens and end.cost_usd == outcome.cost_usd


async def test_incomplete_outcome_lists_the_members_todos(tmp_path: Path) -> None:
    todos = [
        {"content": "add the numbers", "status": "completed"},
        {"content": "check the sum", "status": "in_progress"},
    ]
    script = [tool_use("write_todos", {"todos": todos}), tool_use("add", {"a": 1, "b": 2})]
    outcome, _ = await run_probe(tmp_path, script, todos=True, limits=Limits(max_turns=2))
    assert outcome.status == "incomplete" and outcome.limit == "turns"
    assert outcome.progress is not None and outcome.progress.todos == todos


JOB_SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string"},
        "votes": {"type": "integer", "description": "How many sources agree."},
        "share": {"type": "number"},
        "confident": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "verdict": {"type": "string", "enum": ["yes", "no"]},
    },
    "required": ["answer", "votes", "verdict"],
}


def _submit_tool(request: dict[str, Any]) -> dict[str, Any]:
    return next(t for t in request["tools"] if t["name"] == "submit_result")


def _last_results(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for b in request["messages"][-1]["content"] if b.get("type") == "tool_result"]


async def test_job_result_schema_extends_submit_result_and_is_enforced(tmp_path: Path) -> None:
    script = [
        submit(answer="42", votes="many", tags=[], verdict="maybe"),
        submit(answer="42", votes=3, share=0.75, tags=["a", "b"], verdict="yes"),
    ]
    outcome, api = await run_probe(tmp_path, script, result_schema=JOB_SCHEMA)
    schema = _submit_tool(api.requests[0])["input_schema"]
    assert set(schema["properties"]) == {
        "answer", "sources", "votes", "share", "confident", "tags", "verdict"
    }  # fmt: skip
    assert set(schema["required"]) == {"answer", "votes", "verdict"}
    assert schema["properties"]["verdict"]["enum"] == ["yes", "no"]
    assert schema["properties"]["votes"]["type"] == "integer"
    assert schema["properties"]["votes"]["description"] == "How many sources agree."
    assert schema["properties"]["tags"]["anyOf"][0] == {
        "items": {"type": "string"},
        "minItems": 1,
        "type": "array",
    }
    [error] = _last_results(api.requests[1])
    assert error["is_error"] is True
    message = "".join(c["text"] for c in error["content"])
    assert all(name in message for name in ("votes", "tags", "verdict", "submit_result"))
    assert outcome.status == "ok", outcome.reason
    assert outcome.result.data == {
        "answer": "42",
        "sources": [],
        "votes": 3,
        "share": 0.75,
        "confident": None,
        "tags": ["a", "b"],
        "verdict": "yes",
    }


async def test_result_schema_handed_over_in_inputs_like_the_coordinator_does(
    tmp_path: Path,
) -> None:
    inputs = {"city": "Oslo", "result_schema": JOB_SCHEMA}
    outcome, api = await run_probe(
        tmp_path, [submit(answer="x"), submit(answer="x", votes=1, verdict="no")], inputs=inputs
    )
    [missing] = _last_results(api.requests[1])
    assert missing["is_error"] and "votes" in missing["content"][0]["text"]
    assert outcome.status == "ok" and outcome.result.data["votes"] == 1
    first = json.dumps(api.requests[0]["messages"][0])
    assert "Oslo" in first and "How many sources agree" not in first  # schema is the tool's


def test_unsupported_or_clashing_result_schema_is_refused_naming_the_field() -> None:
    nested = {"type": "object", "properties": {"where": {"type": "object"}}}
    with pytest.raises(ValidationError, match=r"properties\.where\.type"):
        MemberSpec(id="m1", kind="probe", task="t", result_schema=nested)
    clash = {"type": "object", "properties": {"answer": {"type": "integer"}}}
    with pytest.raises(ValidationError, match="'answer' has type integer"):
        MemberSpec(id="m1", kind="probe", task="t", inputs={"result_schema": clash})
    with pytest.raises(ValidationError, match="requires"):
        MemberSpec(
            id="m1",
            kind="probe",
            task="t",
            result_schema={
                "type": "object",
                "properties": {"a": {"type": "string"}},
                "required": ["b"],
            },
        )


async def test_result_schema_may_require_the_kinds_own_fields(tmp_path: Path) -> None:
    # The shape a job writes when it wants more of the kind's result: a kind field
    # made required, a job field with a minimum length.
    schema = {
        "type": "object",
        "required": ["said", "answer"],
        "properties": {"said": {"type": "string", "minLength": 10}},
    }
    script = [submit(answer="a", said="short"), submit(answer="a", said="long enough now")]
    outcome, api = await run_probe(tmp_path, script, result_schema=schema)
    [short] = _last_results(api.requests[1])
    assert short["is_error"] and "said" in short["content"][0]["text"]
    assert outcome.status == "ok" and outcome.result.data["said"] == "long enough now"


FORCED = {"type": "tool", "name": "submit_result"}


def forced_submit_or(regular: Any, **partial: Any) -> Any:
    """A model that works with ``regular`` and answers a forced submit with ``partial``."""

    def policy(body: dict[str, Any]) -> Any:
        return submit(**partial) if body.get("tool_choice") == FORCED else regular

    return policy


def _text(message: dict[str, Any]) -> str:
    return json.dumps(message["content"])


async def test_turn_limit_closing_call_returns_the_best_partial_result(tmp_path: Path) -> None:
    policy = forced_submit_or(
        tool_use("add", {"a": 1, "b": 1}), answer="partial: 2 of 3 sums done", sources=["add"]
    )
    outcome, api = await run_probe(tmp_path, policy, limits=Limits(max_turns=3, result_tokens=300))
    assert outcome.status == "incomplete" and outcome.limit == "turns"
    assert outcome.result is None  # a partial result is never the answer
    assert outcome.partial_result.data == {
        "answer": "partial: 2 of 3 sums done",
        "sources": ["add"],
    }
    assert len(api.requests) == 4 and outcome.turns == 3  # the closing call is not a turn
    closing = api.requests[3]
    assert closing["tool_choice"] == FORCED and closing["max_tokens"] == 1_300
    assert "limit of this task has been reached" in _text(closing["messages"][-1])
    assert [e.status for e in calls(api)] == [200] * 4  # the closing request is valid
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["status"] == "incomplete" and saved["partial_result"]["sources"] == ["add"]
    [end] = events(tmp_path / "trace.jsonl", "member_end")
    assert end.partial_result == outcome.partial_result.data and end.limit == "turns"
    model_calls = events(tmp_path / "trace.jsonl", "model_call")
    assert len(model_calls) == 4
    assert outcome.input_tokens == sum(c.input_tokens for c in model_calls)


async def test_token_limit_keeps_room_for_the_closing_call(tmp_path: Path) -> None:
    heavy = Reply(
        content=[{"type": "tool_use", "id": "", "name": "add", "input": {"a": 1, "b": 2}}],
        usage={"input_tokens": 2_000},
    )
    policy = forced_submit_or(heavy, answer="3, not yet checked twice")
    outcome, api = await run_probe(tmp_path, policy, limits=Limits(max_tokens=20_000, max_turns=50))
    assert outcome.status == "incomplete" and outcome.limit == "tokens"
    assert outcome.partial_result.data == {"answer": "3, not yet checked twice", "sources": []}
    assert api.requests[-1]["tool_choice"] == FORCED
    assert 3 <= len(api.requests) < 10
    total = outcome.input_tokens + outcome.output_tokens
    total += outcome.cache_read_tokens + outcome.cache_write_tokens
    assert total <= 20_000  # the cap holds, closing call included


async def test_deadline_closing_call_answers_the_interrupted_tool_calls(tmp_path: Path) -> None:
    policy = forced_submit_or(tool_use("sleep", {"seconds": 60}), answer="waited; no result yet")
    started = anyio.current_time()
    outcome, api = await run_probe(tmp_path, policy, limits=Limits(deadline_s=3.0))
    assert anyio.current_time() - started < 6
    assert outcome.status == "timed_out" and outcome.limit == "deadline"
    assert outcome.partial_result.data == {"answer": "waited; no result yet", "sources": []}
    closing = api.requests[-1]
    assert closing["tool_choice"] == FORCED
    last = closing["messages"][-1]
    [interrupted] = [b for b in last["content"] if b["type"] == "tool_result"]
    assert interrupted["is_error"] and "Not run" in _text(last)
    assert calls(api)[-1].status == 200


async def test_invalid_closing_submission_leaves_no_partial_result(tmp_path: Path) -> None:
    policy = forced_submit_or(tool_use("add", {"a": 1, "b": 1}), answer=7, colour="red")
    outcome, _ = await run_probe(tmp_path, policy, limits=Limits(max_turns=2))
    assert outcome.status == "incomplete" and outcome.partial_result is None
    assert "closing submission was invalid" in outcome.reason
    [closing_result] = [
        e for e in events(tmp_path / "trace.jsonl", "tool_result") if e.tool == "submit_result"
    ]
    assert closing_result.is_error and "answer" in closing_result.output

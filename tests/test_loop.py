"""The agent loop through the real anthropic client and the fake Messages API server.

Every test runs a whole member (``run_member``) of the ``probe`` kind (tests/loop_support.py)
with the real ContextManager, and checks the outcome plus what the server received.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from loop_support import anthropic_model, events, run_probe, writer
from pydantic import ValidationError

from subagents.fake_api import FakeMessagesAPI, Reply, fault, reply, text, tool_use
from subagents.loop.loop import NUDGE
from subagents.member import run_member
from subagents.results.result import estimate_tokens
from subagents.spec import Limits, MemberSpec
from subagents.tools.registry import CustomToolSpec

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def tool_results(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool_result blocks of the last user message of a recorded request."""
    last = request["messages"][-1]
    assert last["role"] == "user"
    return [b for b in last["content"] if b.get("type") == "tool_result"]


def result_text(block: dict[str, Any]) -> str:
    content = block["content"]
    return content if isinstance(content, str) else "".join(c.get("text", "") for c in content)


def submit(**fields: Any) -> Reply:
    return tool_use("submit_result", fields)


async def test_several_tool_calls_in_one_response_run_concurrently(tmp_path: Path) -> None:
    # The rendezvous tool only returns once all three calls are in flight together:
    # run one after another, the first would wait 5 s and fail.
    script = [
        reply(*(tool_use("rendezvous", {"who": w}) for w in "abc")),
        submit(answer="all met"),
    ]
    outcome, api = await run_probe(tmp_path, script)
    assert outcome.status == "ok", outcome.reason
    results = tool_results(api.requests[1])
    asked = [b["id"] for b in api.requests[1]["messages"][-2]["content"] if b["type"] == "tool_use"]
    assert [r["tool_use_id"] for r in results] == asked  # every call answered, in order
    assert all(not r.get("is_error") for r in results)
    assert [result_text(r) for r in results] == [f"{w} met 3 callers" for w in "abc"]
    trace = [e for e in events(tmp_path / "trace.jsonl") if e.type in ("tool_call", "tool_result")]
    first_result = next(i for i, e in enumerate(trace) if e.type == "tool_result")
    assert [e.type for e in trace[:first_result]].count("tool_call") == 3


async def test_bad_arguments_error_names_the_field_the_problem_and_the_expected_type(
    tmp_path: Path,
) -> None:
    script = [
        reply(
            tool_use("add", {"a": "seven"}),
            tool_use("add", {"a": 1, "b": 2, "c": 3}),
            submit(answer=42, sources="web"),
        ),
        submit(answer="3"),
    ]
    outcome, api = await run_probe(tmp_path, script)
    assert outcome.status == "ok" and outcome.result.data == {"answer": "3", "sources": []}
    wrong_type, extra, bad_submit = (result_text(e) for e in tool_results(api.requests[1]))
    assert "- a: Input should be a valid integer" in wrong_type
    assert "expected integer (got 'seven')" in wrong_type
    assert "- b: required argument missing; expected integer" in wrong_type
    assert "- c: not an argument of add (its arguments: a, b)" in extra
    assert "- answer: Input should be a valid string; expected string (got 42)" in bad_submit
    assert "- sources: Input should be a valid list; expected array of string" in bad_submit


async def test_tool_errors_and_bad_arguments_go_back_as_errors_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    script = [
        reply(
            tool_use("boom"),
            tool_use("add", {"a": "seven", "b": 2}),
            tool_use("refuse"),
            tool_use("no_such_tool", {"x": 1}),
        ),
        tool_use("add", {"a": 1, "b": 2}),
        submit(answer="3"),
    ]
    outcome, api = await run_probe(tmp_path, script)
    assert outcome.status == "ok"
    assert outcome.result.data == {"answer": "3", "sources": []}
    errors = tool_results(api.requests[1])
    assert [e.get("is_error") for e in errors] == [True] * 4
    boom, bad, refused, unknown = (result_text(e) for e in errors)
    assert "RuntimeError: the flux capacitor is empty" in boom
    assert "Invalid arguments for add" in bad and "- a:" in bad and "'seven'" in bad
    assert refused == "refused: try add instead"
    assert "Unknown tool 'no_such_tool'" in unknown and "add" in unknown
    ok = tool_results(api.requests[2])
    assert result_text(ok[0]) == "3" and not ok[0].get("is_error")
    traced = events(tmp_path / "trace.jsonl", "tool_result")
    assert sum(e.is_error for e in traced) == 4


async def test_invalid_result_is_an_error_and_the_model_tries_again(tmp_path: Path) -> None:
    script = [submit(answer=42, colour="red"), submit(answer="42")]
    outcome, api = await run_probe(tmp_path, script)
    assert outcome.status == "ok" and outcome.result.data == {"answer": "42", "sources": []}
    [err] = tool_results(api.requests[1])
    assert err["is_error"] is True
    msg = result_text(err)
    assert "answer" in msg and "colour" in msg and "submit_result" in msg


async def test_model_that_stops_without_submit_is_nudged_once_then_incomplete(
    tmp_path: Path,
) -> None:
    outcome, api = await run_probe(tmp_path, [text("The answer is 42."), text("Done.")])
    assert outcome.status == "incomplete"
    assert outcome.limit == "no_result"
    assert outcome.result is None  # the model's words are never taken as the answer
    assert outcome.progress is not None and outcome.progress.last_text == "Done."
    assert len(api.requests) == 2
    nudge = api.requests[1]["messages"][-1]
    assert nudge["role"] == "user" and NUDGE in json.dumps(nudge)
    end = events(tmp_path / "trace.jsonl", "member_end")[-1]
    assert end.status == "incomplete"


async def test_nudged_model_that_then_submits_ends_ok(tmp_path: Path) -> None:
    outcome, api = await run_probe(tmp_path, [text("Done."), submit(answer="late but here")])
    assert outcome.status == "ok" and outcome.result.data["answer"] == "late but here"
    assert len(api.requests) == 2
    nudge = api.requests[1]["messages"][-1]
    assert nudge["role"] == "user" and NUDGE in json.dumps(nudge)


async def test_oversized_result_is_condensed_once_then_truncated_with_marker(
    tmp_path: Path,
) -> None:
    big = "word " * 2_000  # about 2,500 tokens against a 200-token cap
    script = [submit(answer=big, sources=["a", "b"]), submit(answer=big, sources=["a", "b"])]
    outcome, api = await run_probe(tmp_path, script, limits=Limits(result_tokens=200))
    [first] = tool_results(api.requests[1])
    assert first["is_error"] is True and "cap is 200" in result_text(first)
    assert outcome.status == "ok" and outcome.result_truncated
    assert "truncated by Fleet" in outcome.result.data["answer"]
    assert outcome.result.data["sources"] == ["a", "b"]  # short fields survive
    assert estimate_tokens(json.dumps(outcome.result.data)) <= 200
    assert len(api.requests) == 2


async def test_condensed_result_is_accepted_whole(tmp_path: Path) -> None:
    script = [submit(answer="word " * 2_000), submit(answer="short")]
    outcome, _ = await run_probe(tmp_path, script, limits=Limits(result_tokens=200))
    assert outcome.status == "ok" and not outcome.result_truncated
    assert outcome.result.data["answer"] == "short"


async def test_turn_limit_gives_incomplete_outcome_with_progress(tmp_path: Path) -> None:
    outcome, api = await run_probe(
        tmp_path, lambda req: tool_use("add", {"a": 1, "b": 1}), limits=Limits(max_turns=3)
    )
    assert outcome.status == "incomplete" and outcome.limit == "turns"
    # Three turns, then the closing call forcing submit_result (this model ignores it),
    # which is a model call but not a turn: max_turns = 3 reads as 3 turns.
    assert outcome.turns == 3 and len(api.requests) == 4
    closing = [e.closing for e in events(tmp_path / "trace.jsonl", "model_call")]
    assert closing == [False, False, False, True]
    assert api.requests[3]["tool_choice"] == {"type": "tool", "name": "submit_result"}
    assert "3 turns" in outcome.reason and "did not call submit_result" in outcome.reason
    assert outcome.partial_result is None
    assert outcome.progress.last_actions == ['add({"a": 1, "b": 1}) -> ok'] * 3
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["status"] == "incomplete" and saved["limit"] == "turns"


async def test_token_limit_gives_incomplete_outcome(tmp_path: Path) -> None:
    heavy = Reply(
        content=[{"type": "tool_use", "id": "", "name": "add", "input": {"a": 1, "b": 2}}],
        usage={"input_tokens": 700},
    )
    outcome, api = await run_probe(
        tmp_path, lambda req: heavy, limits=Limits(max_tokens=1_000, max_turns=50)
    )
    assert outcome.status == "incomplete" and outcome.limit == "tokens"
    # A second 700-token turn plus a closing call cannot fit under 1,000 tokens, and
    # the 280 tokens left leave no room for the closing call either.
    assert outcome.turns == 1 and len(api.requests) == 1
    assert outcome.input_tokens == 700 and outcome.partial_result is None
    assert "no room" in outcome.reason


async def test_deadline_gives_timed_out_outcome_and_stops_running_tools(tmp_path: Path) -> None:
    started = anyio.current_time()
    outcome, _ = await run_probe(
        tmp_path, [tool_use("sleep", {"seconds": 60})], limits=Limits(deadline_s=1.0)
    )
    assert outcome.status == "timed_out" and outcome.limit == "deadline"
    assert anyio.current_time() - started < 10
    assert "deadline of 1 s" in outcome.reason
    end = events(tmp_path / "trace.jsonl", "member_end")[-1]
    assert end.status == "timed_out"


async def test_sandbox_crash_ends_member_crashed_with_reason(tmp_path: Path) -> None:
    outcome, _ = await run_probe(
        tmp_path, [reply(tool_use("crash"), tool_use("sleep", {"seconds": 30}))]
    )
    assert outcome.status == "crashed"
    assert "oom-killed" in outcome.reason and outcome.retryable
    assert json.loads((tmp_path / "result.json").read_text())["status"] == "crashed"


async def test_model_error_ends_member_failed_and_says_if_retryable(tmp_path: Path) -> None:
    outcome, _ = await run_probe(
        tmp_path, [fault(400, "invalid_request_error", "messages: roles must alternate")]
    )
    assert outcome.status == "failed"
    assert "roles must alternate" in outcome.reason and not outcome.retryable
    outcome, _ = await run_probe(
        tmp_path / "b", lambda req: fault(500, "api_error", "Internal server error")
    )
    assert outcome.status == "failed" and outcome.retryable


async def test_cancellation_propagates_after_member_end_is_traced(tmp_path: Path) -> None:
    with FakeMessagesAPI([tool_use("sleep", {"seconds": 60})]) as api:
        model = anthropic_model(api)
        with anyio.move_on_after(1.0) as scope:
            await run_member(
                MemberSpec(id="m1", kind="probe", task="t"),
                sandbox=None,
                model=model,
                run_dir=tmp_path,
                trace=writer(tmp_path),
            )
            pytest.fail("run_member returned although it was cancelled")
        await model.aclose()
    assert scope.cancelled_caught
    end = events(tmp_path / "trace.jsonl", "member_end")[-1]
    assert end.status == "cancelled"


async def test_host_callable_tool_runs_with_validated_arguments(tmp_path: Path) -> None:
    lookup = CustomToolSpec(
        name="lookup", description="Look a city up.", callable="loop_support:lookup", host=True
    )
    script = [
        reply(tool_use("lookup", {"city": "oslo"}), tool_use("lookup", {"town": "x"})),
        submit(answer="OSLO"),
    ]
    outcome, api = await run_probe(tmp_path, script, tools=[lookup])
    good, bad = tool_results(api.requests[1])
    assert json.loads(result_text(good).replace("'", '"')) == {"city": "OSLO", "year": 2024}
    assert bad["is_error"] and "city" in result_text(bad) and "town" in result_text(bad)
    lookup_def = next(t for t in api.requests[0]["tools"] if t["name"] == "lookup")
    assert lookup_def["input_schema"]["required"] == ["city"]
    assert outcome.status == "ok"


def test_host_callable_tool_needs_explicit_host_permission() -> None:
    with pytest.raises(ValidationError, match="host = true"):
        CustomToolSpec(name="lookup", description="d", callable="loop_support:lookup")


async def test_trace_spans_nest_member_turn_call(tmp_path: Path) -> None:
    script = [reply(tool_use("add", {"a": 1, "b": 2}), tool_use("boom")), submit(answer="3")]
    await run_probe(tmp_path, script)
    evs = events(tmp_path / "trace.jsonl")
    for e in evs:
        if e.type in ("tool_call", "tool_result"):
            assert e.parent == f"m1/t{e.turn}" and e.span == f"m1/t{e.turn}/{e.call_id}"
        elif e.type == "model_call":
            assert e.parent == f"m1/t{e.turn}" and e.span == f"m1/t{e.turn}/model"
        elif e.type in ("messages",):
            assert e.parent == "m1" and e.span == f"m1/t{e.turn}"
    assert {e.type for e in evs} >= {"member_start", "model_call", "tool_call", "member_end"}


async def test_empty_model_reply_is_nudged_and_the_next_request_stays_valid(
    tmp_path: Path,
) -> None:
    outcome, api = await run_probe(tmp_path, [Reply(content=[]), submit(answer="ok")])
    assert outcome.status == "ok"
    nudge = api.requests[1]["messages"][-1]
    assert nudge["role"] == "user" and NUDGE in json.dumps(nudge)
    assert [e.status for e in api.log if e.path == "/v1/messages"] == [200, 200]

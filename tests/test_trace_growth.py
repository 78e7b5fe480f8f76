"""Traces grow linearly with turns: each turn records only its new messages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from loop_support import ScriptedModel, events, writer

from subagents.member import run_member
from subagents.model.base import ModelRequest
from subagents.spec import Limits, MemberSpec

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def steps(turns: int):
    """A model that calls ``add`` until ``turns - 1`` calls were made, then submits."""

    def policy(request: ModelRequest, n: int) -> list[dict[str, Any]]:
        if n < turns:
            return [
                {"type": "text", "text": f"Step {n}: adding."},
                {"type": "tool_use", "id": f"call_{n}", "name": "add", "input": {"a": n, "b": 1}},
            ]
        block = {"answer": str(n), "sources": []}
        return [{"type": "tool_use", "id": f"call_{n}", "name": "submit_result", "input": block}]

    return policy


async def run_turns(tmp_path: Path, turns: int) -> Path:
    run_dir = tmp_path / f"t{turns}"
    outcome = await run_member(
        MemberSpec(id="m1", kind="probe", task="Count.", limits=Limits(max_turns=turns + 5)),
        sandbox=None,
        model=ScriptedModel(steps(turns)),
        run_dir=run_dir,
        trace=writer(run_dir),
    )
    assert outcome.status == "ok" and outcome.turns == turns
    return run_dir / "trace.jsonl"


async def test_200_turn_trace_is_about_twice_a_100_turn_trace(tmp_path: Path) -> None:
    small = await run_turns(tmp_path, 100)
    large = await run_turns(tmp_path, 200)
    ratio = large.stat().st_size / small.stat().st_size
    assert ratio <= 2.1, f"200-turn trace is {ratio:.2f}x the 100-turn trace"
    # No event repeats the context: the biggest event does not grow with the run.
    biggest = [max(len(line) for line in p.read_text().splitlines()) for p in (small, large)]
    assert biggest[1] <= biggest[0] * 1.1
    for event in events(large, "messages"):
        assert len(event.messages) == 1

"""The loop's use of the context manager and the job's result schema, end to end.

Each test runs a whole ``probe`` member (tests/loop_support.py) through the real
anthropic client against the fake Messages API server, with the real ContextManager,
and checks what the server received and what the member returned.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from loop_support import anthropic_model, writer

from subagents.context.config import ContextConfig
from subagents.fake_api import FakeMessagesAPI, Reply, tool_use
from subagents.member import MemberOutcome, MemberSpec, run_member

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def run_probe(
    tmp_path: Path, script: Any, **spec: Any
) -> tuple[MemberOutcome, FakeMessagesAPI]:
    with FakeMessagesAPI(script) as api:
        model = anthropic_model(api)
        try:
            outcome = await run_member(
                MemberSpec(id="m1", kind="probe", task="Find the answer.", **spec),
                sandbox=None,
                model=model,
                run_dir=tmp_path,
                trace=writer(tmp_path),
            )
        finally:
            await model.aclose()
    return outcome, api


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

"""Offline models (policies, replay) and the make_model factory."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from subagents.fake_api import FakeMessagesAPI, reply, text, tool_use
from subagents.model import offline, parse_model
from subagents.model.base import Model, ModelError, ModelRequest
from subagents.model.claude import AnthropicModel
from subagents.model.factory import make_model
from subagents.model.offline import OfflineModel, ReplayModel, get_policy, register_policy
from subagents.model.profiles import UnknownModelWarning
from subagents.trace import ModelCall, TraceWriter

pytestmark = pytest.mark.anyio

SUBMIT = {
    "name": "submit_result",
    "description": "Finish.",
    "input_schema": {
        "type": "object",
        "properties": {
            "summary": {"type": "string"},
            "claims": {"type": "array"},
            "confidence": {"type": "string", "enum": ["low", "high"]},
            "note": {"type": "string"},
        },
        "required": ["summary", "claims", "confidence"],
    },
}


def request(task: str = "Count the widgets.", **kw: Any) -> ModelRequest:
    return ModelRequest(messages=[{"role": "user", "content": task}], **kw)


async def test_echo_submits_the_task_and_is_labelled_offline() -> None:
    model = make_model("offline:echo")
    assert isinstance(model, Model) and model.profile.input_per_mtok == 0
    response = await model.complete(request(tools=[SUBMIT]))
    block = response.message.content[0]
    assert response.offline and response.message.model.startswith("offline")
    assert block.type == "tool_use" and block.name == "submit_result" and block.id
    assert block.input == {"summary": "Count the widgets.", "claims": [], "confidence": "low"}
    assert response.message.stop_reason == "tool_use"
    assert response.message.usage.input_tokens > 0 and response.message.usage.output_tokens > 0
    plain = await model.complete(request())
    assert plain.message.content[0].text == "Count the widgets."
    assert plain.message.stop_reason == "end_turn"


async def test_registered_async_policy_and_unknown_policy_error() -> None:
    name = f"probe{uuid.uuid4().hex[:6]}"

    async def policy(req: ModelRequest) -> list[dict[str, Any]]:
        return [{"type": "text", "text": f"{len(req.messages)} messages"}]

    register_policy(name, policy)
    assert get_policy(name) is policy
    response = await make_model(f"offline:{name}").complete(request())
    assert response.message.content[0].text == "1 messages"
    assert response.message.model == f"offline:{name}"
    with pytest.raises(ModelError, match=r"no offline policy named 'nope'.*echo"):
        make_model("offline:nope")
    with pytest.raises(ValueError, match="must start with 'offline'"):
        OfflineModel(policy, name="claude-sonnet-5")


async def test_plain_offline_uses_the_kind_policy_or_echo(monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_model("offline")
    assert isinstance(model, OfflineModel) and model.name == "offline:echo"
    # Restored after the test: the real coding policy must not be shadowed for others.
    monkeypatch.setitem(offline._POLICIES, "coding", get_policy("echo"))
    assert make_model("offline", kind="coding").name == "offline:coding"


def test_real_model_string_gives_the_adapter_and_unknown_warns_once() -> None:
    model = make_model("claude-haiku-4-5", api_key="test", base_url="http://127.0.0.1:9")
    assert isinstance(model, AnthropicModel) and model.profile.known
    name = f"acme-model-{uuid.uuid4().hex[:6]}"
    with pytest.warns(UnknownModelWarning) as record:
        make_model(name, api_key="test", base_url="http://127.0.0.1:9")
        again = make_model(name, api_key="test", base_url="http://127.0.0.1:9")
    assert len(record) == 1 and not again.profile.known


async def _record(tmp_path: Path) -> tuple[Path, list[Any]]:
    """A three-turn exchange through the real adapter, recorded as the loop records it."""
    script = [
        reply(text("Looking."), tool_use("search", {"query": "widgets"})),
        tool_use("read", {"path": "w.txt"}),
        text("There are 7 widgets."),
    ]
    path = tmp_path / "trace.jsonl"
    trace = TraceWriter(path, run="r1", member="m1")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Count the widgets."}]
    recorded = []
    with FakeMessagesAPI(script) as api:
        async with AnthropicModel("claude-sonnet-5", api_key="t", base_url=api.url) as model:
            for turn in range(1, 4):
                message = (await model.complete(ModelRequest(messages=messages))).message
                content = [b.model_dump(mode="json", exclude_none=True) for b in message.content]
                recorded.append(message)
                trace.emit(ModelCall(turn=turn, model=message.model, content=content,
                                     stop_reason=message.stop_reason,
                                     input_tokens=message.usage.input_tokens,
                                     output_tokens=message.usage.output_tokens))  # fmt: skip
                messages.append({"role": "assistant", "content": content})
                results = [{"type": "tool_result", "tool_use_id": b["id"], "content": "ok"}
                           for b in content if b["type"] == "tool_use"]  # fmt: skip
                messages.append({"role": "user", "content": results or "go on"})
    trace.close()
    return path, recorded


async def test_replay_reproduces_a_recorded_trace(tmp_path: Path) -> None:
    path, recorded = await _record(tmp_path)
    model = make_model(f"replay:{path}")
    assert isinstance(model, ReplayModel) and model.profile.output_per_mtok == 0
    for original in recorded:
        response = await model.complete(request())
        assert response.offline and response.message.model.startswith("replay:")
        assert response.message.content == original.content
        assert response.message.stop_reason == original.stop_reason
        assert response.message.usage.output_tokens == original.usage.output_tokens
    with pytest.raises(ModelError, match="3 model calls were recorded and call 4"):
        await model.complete(request())


def test_replay_of_a_missing_or_empty_trace_says_what_to_give(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"trace not found.*trace\.jsonl"):
        ReplayModel(tmp_path / "nope.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ModelError, match="no model calls"):
        ReplayModel(empty)


@pytest.mark.parametrize(
    ("name", "source", "canonical", "policy", "trace"),
    [
        ("offline", "offline", "offline", None, None),
        (" offline:research ", "offline", "offline:research", "research", None),
        (
            "replay:runs/r/members/a/trace.jsonl",
            "replay",
            "replay:runs/r/members/a/trace.jsonl",
            None,
            "runs/r/members/a/trace.jsonl",
        ),
        ("claude-haiku-4-5", "claude", "claude-haiku-4-5", None, None),
    ],
)
def test_a_model_string_is_parsed_once_into_a_typed_choice(
    name: str, source: str, canonical: str, policy: str | None, trace: str | None
) -> None:
    choice = parse_model(name)
    assert (choice.source, choice.name, choice.policy, choice.trace) == (
        source,
        canonical,
        policy,
        trace,
    )
    assert choice.offline is (source != "claude")


@pytest.mark.parametrize("name", ["", "  ", "offline:", "replay:"])
def test_a_model_string_that_names_nothing_is_refused(name: str) -> None:
    with pytest.raises(ModelError):
        parse_model(name)


def test_auto_resolves_to_claude_only_with_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    assert parse_model("auto").source == "offline"
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
    monkeypatch.setenv("FLEET_MODEL", "claude-haiku-4-5")
    assert parse_model("auto").name == "claude-haiku-4-5"


async def test_every_model_states_offline_and_closes() -> None:
    for model in (make_model("offline"), make_model("claude-haiku-4-5", api_key="t")):
        assert isinstance(model.offline, bool)
        await model.aclose()
    assert make_model("offline").offline and not make_model("claude-haiku-4-5", api_key="t").offline

"""What a run does not import: a run on an offline model, and every command that makes
no Messages API call, never loads the ``anthropic`` SDK (seconds of CPU at every start);
and Fleet's own response :class:`Message` reads what the SDK's wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic.types
import pytest

from subagents.model.message import Message

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
ROOT = EXAMPLES.parent
# Prints the anthropic modules the process holds after the code before it ran.
_REPORT = (
    "import sys, json; "
    "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'anthropic')))"
)


def _sdk_modules(code: str, tmp_path: Path) -> tuple[list[str], subprocess.CompletedProcess]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\n{_REPORT}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-3_000:]
    return json.loads(lines[-1]), done


def test_the_offline_models_and_the_commands_that_read_runs_never_import_the_sdk(
    tmp_path: Path,
) -> None:
    code = """
import asyncio
import coordinator.api, coordinator.cli
from subagents.model import make_model
from subagents.model.base import ModelRequest

async def turn(kind):
    model = make_model("offline", kind=kind)
    request = ModelRequest(messages=[{"role": "user", "content": "Count the widgets."}])
    response = await model.complete(request)
    assert response.offline and response.message.content, response
    await model.aclose()

for kind in ("browser", "coding", "lead", None):
    asyncio.run(turn(kind))
assert coordinator.cli.main(["runs", "--output-dir", "runs", "--json"]) == 0
"""
    modules, done = _sdk_modules(code, tmp_path)
    assert done.returncode == 0, done.stderr[-3_000:]
    assert modules == []


@pytest.mark.docker
def test_an_offline_fleet_run_never_imports_the_sdk(
    tmp_path: Path, images: dict[str, str], docker_client: Any, cleanup: list[Path]
) -> None:
    cleanup.append(tmp_path / "runs")
    job = EXAMPLES / "code.toml"
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "notes.txt").write_text("hello\n")
    # `fleet run` of a job naming `offline`, `fleet code` on `auto` without a key and
    # `fleet code --model offline` with one: none starts the SDK's early import
    # (subagents/model/sdk_import.py).
    code = (
        "import os\n"
        "from coordinator.cli import main\n"
        "from subagents.model import sdk_import\n"
        f"code = main(['run', {str(job)!r}, '--output-dir', 'runs', '--plain'])\n"
        "assert code == 0, code\n"
        f"code = main(['code', {str(repo)!r}, 'Read notes.txt.', '--output-dir', 'runs', "
        "'--plain'])\n"
        "assert code == 0, code\n"
        "os.environ['ANTHROPIC_API_KEY'] = 'k'\n"
        f"code = main(['code', {str(repo)!r}, 'Read notes.txt.', '--model', 'offline', "
        "'--output-dir', 'runs', '--plain'])\n"
        "assert code == 0, code\n"
        "assert sdk_import._thread is None\n"
    )
    modules, done = _sdk_modules(code, tmp_path)
    assert done.returncode == 0, done.stderr[-3_000:]
    assert done.stderr.count("succeeded: 1 of 1 members ok") == 3
    assert modules == []


def _sdk_message() -> anthropic.types.Message:
    """An answer as the SDK's model held it, with blocks Fleet reads and one it does not."""
    return anthropic.types.Message.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-5",
            "content": [
                {"type": "thinking", "thinking": "Look it up.", "signature": "sig"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Searching.", "citations": None},
                {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {}},
                {"type": "tool_use", "id": "tu_1", "name": "search", "input": {"q": "x"}},
            ],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {
                "input_tokens": 12,
                "output_tokens": 7,
                "cache_read_input_tokens": 3,
                "cache_creation_input_tokens": 0,
                "server_tool_use": {"web_search_requests": 1, "web_fetch_requests": 0},
            },
        }
    )


def test_fleets_message_records_what_the_sdks_recorded() -> None:
    sdk = _sdk_message()
    recorded = [b.model_dump(mode="json", exclude_none=True) for b in sdk.content]
    # From the SDK's object (the claude adapter's path) and from the dicts an older
    # trace or conversation holds (replay, resume): the same blocks come back out.
    for source in (sdk, sdk.model_dump(mode="json", exclude_none=True)):
        ours = Message.model_validate(source)
        assert [b.model_dump(mode="json", exclude_none=True) for b in ours.content] == recorded
        assert ours.model_dump(mode="json", exclude_none=True) == sdk.model_dump(
            mode="json", exclude_none=True
        )
        assert (ours.id, ours.model, ours.stop_reason) == ("msg_1", "claude-sonnet-5", "tool_use")
        assert (ours.usage.input_tokens, ours.usage.cache_read_input_tokens) == (12, 3)
        tool = ours.content[-1]
        assert (tool.type, tool.name, tool.input) == ("tool_use", "search", {"q": "x"})


@pytest.mark.parametrize(
    "block",
    [
        {"type": "tool_use", "name": "search", "input": {}},
        {"type": "tool_use", "id": "t", "name": "search", "input": "not an object"},
        {"type": "text"},
        {"type": "thinking", "thinking": "no signature"},
    ],
)
def test_a_block_the_harness_reads_is_refused_without_its_fields(block: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=block["type"]):
        Message.model_validate({"content": [block]})


def test_an_api_answer_the_model_refuses_is_kept_as_it_came() -> None:
    # The claude adapter keeps such an answer unvalidated, as it kept it with the
    # SDK's model: its blocks go back to the API next turn unchanged.
    from subagents.model.claude import _as_message

    odd = {"type": "tool_use", "name": "search", "input": {"q": "x"}}
    data = {"id": "m", "model": "claude-sonnet-5", "content": [odd], "usage": {"input_tokens": 4}}
    message = _as_message(data)
    assert [b.model_dump(exclude_none=True) for b in message.content] == [odd]
    assert (message.id, message.usage.input_tokens) == ("m", 4)


@pytest.mark.parametrize(
    ("content", "usage"),
    [("a string", {}), ([{"type": "text", "text": "x"}, 7], {}), ([], {"input_tokens": "many"})],
)
def test_an_api_answer_that_is_no_message_at_all_is_a_model_error(
    content: Any, usage: dict[str, Any]
) -> None:
    # Kept as it came only while it still has a message's shape: anything else is the
    # model call's failure, said in one line, not a TypeError deep in the loop.
    from subagents.model.claude import _as_message
    from subagents.model.errors import ModelError

    with pytest.raises(ModelError, match="the API's answer has no"):
        _as_message({"id": "m", "content": content, "usage": usage})


def test_a_node_preloads_the_sdk_only_for_a_run_with_a_real_model(tmp_path: Path) -> None:
    """A node actor imports what its run's members need when the run starts; the SDK
    (most of that import) only when one of them calls the Messages API."""
    code = """
import json, sys
from coordinator.job.spec import RetryPolicy
from coordinator.nodes.node_service import _preload
from coordinator.nodes.worker import MemberUnit
from subagents.spec import MemberSpec

def unit(model):
    spec = MemberSpec(id="m1", kind="coding", task="t", model=model)
    return MemberUnit(run_id="r", member_dir="d", spec=spec.model_copy(update={"stated_deadline_s": 60}), retry=RetryPolicy())

_preload([unit("offline"), unit("offline:echo")])
assert "subagents.member" in sys.modules
print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'anthropic')))
_preload([unit("offline"), unit("claude-sonnet-4-5")])
"""
    modules, done = _sdk_modules(code, tmp_path)
    assert done.returncode == 0, done.stderr[-3_000:]
    assert json.loads(done.stdout.strip().splitlines()[0]) == []
    assert "anthropic" in modules

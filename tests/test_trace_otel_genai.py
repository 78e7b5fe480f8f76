"""The GenAI semantic conventions on a real run, exported live and replayed by the CLI.

One ``fleet run`` through the real ``anthropic`` client against the fake Messages
API (one Claude member) plus two offline coding members with the same task, with
live OTLP export and content capture on; then ``fleet trace RUN --otlp URL
--otel-content`` replays the same run to a second collector. Both exports must say
the same, in the conventions' names and message schemas.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from conftest import remove_run
from otlp_collector import Collector, attributes

from coordinator.rundir.runs import RunDir
from subagents.fake_api import FakeMessagesAPI, fault, reply, text, tool_use

pytestmark = pytest.mark.docker
FLEET = str(Path(sys.executable).with_name("fleet"))
SAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sample-repo"
TASK = "Greet warmly: replace `Hello, {name}!` with `Hello and welcome, {name}!` in `greet.py`."


def _job(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(SAMPLE, repo)
    offline = (
        f'kind = "coding"\nmodel = "offline:coding"\ntask = {json.dumps(TASK)}\n'
        f"repo = {json.dumps(str(repo))}\n"
    )
    job = tmp_path / "otel.toml"
    job.write_text(
        'name = "otel-job"\n[model]\nname = "claude-haiku-4-5"\n'
        "[fanout]\nmax_parallel = 3\nmin_success = 3\n"
        '[[members]]\nid = "asker"\nkind = "coding"\ntask = "Say hi from the shell."\n'
        f'[[members]]\nid = "one"\n{offline}[[members]]\nid = "two"\n{offline}'
    )
    return job


SCRIPT = [
    reply(text("Looking at the workspace."), tool_use("shell", {"command": "echo hi"})),
    reply(text("Once more."), tool_use("shell", {"command": "echo again"})),
    fault(400, "invalid_request_error", "scripted refusal"),  # the member fails, so does the run
    fault(400, "invalid_request_error", "no report"),  # the analyst's call, after the members
]
ANSWERED = "claude-haiku-4-5-20261001"
"""The dated model the fake API says answered."""


def _spans(collector: Collector) -> list[tuple[str, dict[str, Any], Any]]:
    return [(s.name, attributes(s.attributes), s) for s in collector.spans()]


def _check(collector: Collector, run_id: str, port: int) -> None:
    spans = _spans(collector)
    assert {r["service.name"] for r in collector.resources()} == {"fleet"}
    assert {r["service.version"] for r in collector.resources()} == {metadata.version("fleet")}
    # The workflow: named by the job, not the run id; failed, with error.type.
    (workflow,) = [a for n, a, _ in spans if a["gen_ai.operation.name"] == "invoke_workflow"]
    assert [n for n, a, _ in spans if a is workflow] == ["invoke_workflow otel-job"]
    assert workflow["gen_ai.workflow.name"] == "otel-job" and workflow["fleet.run.id"] == run_id
    assert workflow["error.type"] == "failed"
    chats = {m: [a for _, a, _ in spans if a["gen_ai.operation.name"] == "chat"
                 and a["gen_ai.agent.id"] == f"{run_id}/{m}"]
             for m in ("asker", "one", "two")}  # fmt: skip
    # Claude through the fake API: who answered, which response, which conversation.
    *asked, refused = chats["asker"]
    assert len(asked) == 2
    # The call the API refused is a chat span too, with the API's error.
    assert refused["error.type"] == "invalid_request_error"
    assert refused["http.response.status_code"] == 400
    assert "gen_ai.response.id" not in refused
    for chat in asked:
        assert chat["gen_ai.request.model"] == "claude-haiku-4-5"
        assert chat["gen_ai.response.model"] == ANSWERED
        assert chat["gen_ai.provider.name"] == "anthropic"
        assert chat["gen_ai.conversation.id"] == f"{run_id}/asker"
        assert chat["gen_ai.response.id"].startswith("msg_fake")
        assert (chat["server.address"], chat["server.port"]) == ("127.0.0.1", port)
    first, second = asked
    (out,) = json.loads(first["gen_ai.output.messages"])
    assert out["role"] == "assistant" and out["finish_reason"] == "tool_call"
    said, call = out["parts"]
    assert said == {"type": "text", "content": "Looking at the workspace."}
    assert call["type"] == "tool_call" and call["name"] == "shell"
    assert call["arguments"] == {"command": "echo hi"} and call["id"].startswith("toolu_fake")
    history = json.loads(second["gen_ai.input.messages"])
    assert [m["role"] for m in history] == ["user", "assistant", "tool"]
    assert history[0]["parts"][0]["content"].startswith("Say hi from the shell.")
    (answer,) = history[2]["parts"]
    assert answer["type"] == "tool_call_response" and answer["id"] == call["id"]
    assert "hi" in answer["response"]
    (system,) = json.loads(first["gen_ai.system_instructions"])
    assert system["type"] == "text" and "How you work here" in system["content"]
    tools = {t["name"]: t for t in json.loads(first["gen_ai.tool.definitions"])}
    assert tools["shell"]["type"] == "function"
    assert tools["shell"]["parameters"]["type"] == "object"
    # Offline members are not Anthropic traffic, and no server answered them.
    for member in ("one", "two"):
        assert chats[member]
        assert {c["gen_ai.provider.name"] for c in chats[member]} == {"fleet.offline"}
        assert not any("server.address" in c for c in chats[member])
    # Two offline members with the same task: their tool-call ids never collide.
    calls = [a["gen_ai.tool.call.id"] for _, a, _ in spans
             if a["gen_ai.operation.name"] == "execute_tool"]  # fmt: skip
    assert len(calls) == len(set(calls)) > 4


def _check_coordinator(collector: Collector, run_id: str) -> None:
    """The coordinator's own model call (the analyst's, refused here) is a chat span
    of the run, and the workflow span ends after it."""
    spans = _spans(collector)
    (_, _, workflow), *_ = [x for x in spans if x[1]["gen_ai.operation.name"] == "invoke_workflow"]
    (analyst,) = [(a, s) for _, a, s in spans if a["gen_ai.operation.name"] == "invoke_agent"
                  and a["gen_ai.agent.name"] == "coordinator.analyst"]  # fmt: skip
    (chat,) = [(a, s) for _, a, s in spans if a["gen_ai.operation.name"] == "chat"
               and a["gen_ai.agent.id"] == f"{run_id}/coordinator.analyst"]  # fmt: skip
    assert analyst[1].parent_span_id == workflow.span_id
    assert chat[1].parent_span_id == analyst[1].span_id
    assert chat[0]["error.type"] == "invalid_request_error"
    assert chat[0]["gen_ai.request.model"] == "claude-haiku-4-5"
    assert workflow.end_time_unix_nano >= chat[1].end_time_unix_nano


def test_genai_spans_of_a_real_run_live_and_replayed(tmp_path, images, docker_client):
    out = tmp_path / "runs"
    live, replayed = Collector(), Collector()
    api = FakeMessagesAPI(SCRIPT, model_name=ANSWERED).start()
    try:
        env = os.environ | {
            "ANTHROPIC_API_KEY": "k",
            "ANTHROPIC_BASE_URL": api.url,
            "OTEL_EXPORTER_OTLP_ENDPOINT": live.url,
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true",
        }
        done = subprocess.run(
            [FLEET, "run", str(_job(tmp_path)), "--output-dir", str(out), "--plain"],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 1, done.stderr  # 2 of 3 ok, quorum 3
        (run,) = RunDir.list(out)
        port = int(api.url.rsplit(":", 1)[1])
        _check(live, run.id, port)
        _check_coordinator(live, run.id)
        again = subprocess.run(
            [FLEET, "trace", str(run.path), "--otlp", replayed.url, "--otel-content"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert again.returncode == 0, again.stderr
        _check(replayed, run.id, port)
    finally:
        api.stop()
        live.close()
        replayed.close()
        for run in RunDir.list(out):
            remove_run(docker_client, run.id)

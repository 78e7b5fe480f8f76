"""What the GenAI conventions ask of chat and tool spans, checked on spans a local
OTLP/HTTP collector received: a real member (the real ``anthropic`` client against the
fake Messages API, which answers with a dated model name) exported live, a failed
call, a re-export of the same run, and the standard ``OTEL_*`` variables.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tracegen
from loop_support import anthropic_model
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otlp_collector import Collector, attributes

from coordinator.traceview import load_run, otel
from subagents.fake_api import FakeMessagesAPI, fault, reply, text, tool_use
from subagents.member import run_member
from subagents.spec import MemberSpec
from subagents.trace import (
    MemberEnd,
    MemberStart,
    Messages,
    ModelCall,
    ToolCall,
    ToolResult,
    TraceWriter,
)

FLEET = str(Path(sys.executable).parent / "fleet")
RUN = "conventions-20261201-0001"
ASKED, ANSWERED = "claude-sonnet-5", "claude-sonnet-5-20260301"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    yield server
    server.close()


def _spans(collector: Collector) -> list[tuple[str, dict[str, Any], Any]]:
    return [(s.name, attributes(s.attributes), s) for s in collector.spans()]


async def _live_member(run_dir: Path, collector: Collector, script: list[Any]) -> None:
    """One probe member through the real client, its spans sent live to ``collector``."""
    live = otel.LiveRun(
        RUN, otel.make_provider(endpoint=collector.url, run_id=RUN), start=0.0, content=True
    )
    writer = TraceWriter(run_dir / "members" / "m1" / "trace.jsonl", run=RUN, member="m1")
    writer.listeners.append(live.listener("m1"))
    with FakeMessagesAPI(script, model_name=ANSWERED) as api:
        model = anthropic_model(api, ASKED)
        try:
            await run_member(
                MemberSpec(id="m1", kind="probe", task="Find the answer."),
                sandbox=None, model=model, run_dir=run_dir, trace=writer,
            )  # fmt: skip
        finally:
            await model.aclose()
            writer.close()
    live.close(max(s.last_ts for s in live.members.values()) + 1, "failed")


SCRIPT = [
    reply(text("Adding."), tool_use("add", {"a": 1, "b": 2})),
    fault(400, "invalid_request_error", "scripted refusal"),
]


@pytest.mark.anyio
async def test_chat_spans_follow_the_request_and_a_failed_call_has_its_own(
    tmp_path: Path, collector: Collector
) -> None:
    run_dir = tmp_path / RUN  # a run's directory is named by its id
    await _live_member(run_dir, collector, SCRIPT)
    spans = _spans(collector)
    (agent,) = [s for _, a, s in spans if a["gen_ai.operation.name"] == "invoke_agent"]
    chats = [(n, a, s) for n, a, s in spans if a["gen_ai.operation.name"] == "chat"]
    assert len(chats) == 2
    (name, ok, _), (failed_name, failed, failed_span) = sorted(
        chats, key=lambda c: c[2].start_time_unix_nano
    )
    # The span and gen_ai.request.model name what was asked for; the dated model
    # that answered is gen_ai.response.model.
    assert name == failed_name == f"chat {ASKED}"
    assert ok["gen_ai.request.model"] == failed["gen_ai.request.model"] == ASKED
    assert ok["gen_ai.response.model"] == ANSWERED
    assert ok["gen_ai.request.stream"] is True
    assert ok["gen_ai.request.max_tokens"] > 0
    # One vocabulary for why the model stopped, in the span and in its output message.
    (out,) = json.loads(ok["gen_ai.output.messages"])
    assert ok["gen_ai.response.finish_reasons"] == [out["finish_reason"]] == ["tool_call"]
    # The failed call: a chat span of its own, under the member, with the API's error.
    assert failed["error.type"] == "invalid_request_error"
    assert failed["http.response.status_code"] == 400
    assert failed_span.status.code == 2  # STATUS_CODE_ERROR
    assert failed_span.parent_span_id == agent.span_id
    assert "gen_ai.response.model" not in failed
    (tool,) = [a for _, a, _ in spans if a["gen_ai.operation.name"] == "execute_tool"]
    assert tool["gen_ai.tool.name"] == "add"
    assert tool["gen_ai.tool.description"] == "Add two integers."
    # Replayed from its trace on disk, the run is the same trace with the same spans.
    replayed = InMemorySpanExporter()
    otel.export_run(load_run(run_dir), exporter=replayed, content=True)
    again = {(s.context.trace_id, s.context.span_id, s.name) for s in replayed.get_finished_spans()}
    sent = {(int.from_bytes(s.trace_id, "big"), int.from_bytes(s.span_id, "big"), s.name)
            for _, _, s in spans if s.name.startswith(("chat", "execute_tool", "invoke_agent"))}  # fmt: skip
    assert sent and sent <= again


def test_the_same_run_exported_twice_is_one_trace(tmp_path: Path, collector: Collector) -> None:
    made = tracegen.make_run(tmp_path, members=2, turns=3, seed=9)
    for _ in range(2):
        done = subprocess.run([FLEET, "trace", str(made.run_dir), "--otlp", collector.url],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
    spans = collector.spans()
    assert len({s.trace_id for s in spans}) == 1
    ids = [s.span_id for s in spans]
    half = len(ids) // 2
    assert len(set(ids)) == half and sorted(ids[:half]) == sorted(ids[half:])
    # A different run is a different trace.
    other = tracegen.make_run(tmp_path, members=1, turns=1, seed=9, run_id="synthetic-2")
    exporter = InMemorySpanExporter()
    otel.export_run(load_run(other.run_dir), exporter=exporter)
    assert {s.context.trace_id.to_bytes(16, "big") for s in exporter.get_finished_spans()} != {
        spans[0].trace_id
    }


def test_the_standard_variables_name_the_service_and_the_traces_endpoint(
    monkeypatch: pytest.MonkeyPatch, collector: Collector
) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    # The traces-only variable is a full URL, used as it is (no /v1/traces appended).
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{collector.url}/ingest/spans")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "fleet-nightly")
    live = otel.live_from_env(RUN, start=100.0, name="env-job")
    assert live is not None
    live(MemberStart(ts=100.0, member="m1", kind="coding", task="t", model=ASKED))
    live(ModelCall(ts=101.0, member="m1", turn=1, model=ANSWERED, latency_s=0.5))
    live(MemberEnd(ts=102.0, member="m1", status="ok"))
    live.close(103.0, "succeeded")
    assert collector.posts and {p for p, _, _ in collector.posts} == {"/ingest/spans"}
    assert {r["service.name"] for r in collector.resources()} == {"fleet-nightly"}
    assert len(collector.spans()) == 3


def test_content_capture_keeps_the_task_when_the_history_is_too_long() -> None:
    exporter = InMemorySpanExporter()
    live = otel.LiveRun(RUN, otel.make_provider(exporter=exporter), start=0.0, content=True)
    listen = live.listener("m1")
    listen(MemberStart(ts=1.0, member="m1", kind="coding", task="t", model=ASKED))
    task = {"role": "user", "content": "THE TASK: rename the greeting."}
    listen(Messages(ts=1.0, member="m1", messages=[task]))
    for turn in range(1, 40):
        said = {"role": "assistant", "content": f"turn {turn} " + "x" * 600}
        heard = {"role": "user", "content": f"reply {turn} " + "y" * 600}
        listen(Messages(ts=1.0 + turn, member="m1", turn=turn, messages=[said, heard]))
    listen(ModelCall(ts=50.0, member="m1", turn=40, model=ANSWERED))
    live.close(51.0)
    (chat,) = [s for s in exporter.get_finished_spans() if s.name.startswith("chat")]
    sent = chat.attributes["gen_ai.input.messages"]
    assert len(sent) <= 8_000
    history = json.loads(sent)
    assert history[0]["parts"][0]["content"] == task["content"]
    assert history[-1]["parts"][0]["content"].startswith("reply 39 ")
    assert len(history) < 79  # some of the middle had to go


def _lead_run(run_dir: Path) -> None:
    """A lead that spawns two waves (m1, then m2), as a lead run writes them."""
    lead = TraceWriter(run_dir / "lead" / "trace.jsonl", run=run_dir.name, member="lead")
    lead.emit(MemberStart(ts=100.0, kind="lead", task="q", model=ASKED))
    entries = []
    for wave, (member, call, at) in enumerate((("m1", "s1", 101.0), ("m2", "s2", 110.0)), 1):
        lead.emit(ModelCall(ts=at, turn=wave, model=ANSWERED, latency_s=0.5))
        lead.emit(ToolCall(ts=at + 0.1, turn=wave, call_id=call, tool="spawn", input={}))
        lead.emit(ToolResult(ts=at + 0.2, turn=wave, call_id=call, tool="spawn", output="ok"))
        entry = {"event": "lead_spawn", "call_id": call, "wave": wave,
                 "members": [{"id": member, "kind": "coding", "task": "t"}]}  # fmt: skip
        entries.append(json.dumps(entry))
        member_trace = TraceWriter(
            run_dir / "members" / member / "trace.jsonl", run=run_dir.name, member=member
        )
        member_trace.emit(MemberStart(ts=at + 1, kind="coding", task="t", model=ASKED))
        member_trace.emit(ModelCall(ts=at + 2, turn=1, model=ANSWERED, latency_s=0.5))
        member_trace.emit(MemberEnd(ts=at + 3, status="ok"))
        member_trace.close()
    lead.emit(MemberEnd(ts=120.0, status="ok"))
    lead.close()
    (run_dir / "journal.jsonl").write_text("\n".join(entries) + "\n", encoding="utf-8")


def test_a_lead_runs_its_members_under_its_own_span(tmp_path: Path, collector: Collector) -> None:
    run_dir = tmp_path / "lead-run-20261201-0001"
    _lead_run(run_dir)
    done = subprocess.run([FLEET, "trace", str(run_dir), "--otlp", collector.url],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    spans = {s.name: s for s in collector.spans()}
    (workflow,) = [s for n, s in spans.items() if n.startswith("invoke_workflow")]
    lead = spans["invoke_agent lead"]
    assert lead.parent_span_id == workflow.span_id
    spawn_calls = {
        attributes(s.attributes)["gen_ai.tool.call.id"]: s
        for s in collector.spans() if s.name == "execute_tool spawn"
    }  # fmt: skip
    for member, wave, call in (("m1", 1, "s1"), ("m2", 2, "s2")):
        agent = spans[f"invoke_agent {member}"]
        assert agent.parent_span_id == lead.span_id
        assert attributes(agent.attributes)["fleet.lead.wave"] == wave
        (link,) = agent.links
        assert link.span_id == spawn_calls[call].span_id
        assert link.trace_id == workflow.trace_id

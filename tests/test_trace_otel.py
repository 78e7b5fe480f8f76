"""OpenTelemetry export: GenAI spans and attributes, in memory, live, and over OTLP/HTTP."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tracegen
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from otlp_collector import Collector

from coordinator.traceview import load_run, otel
from coordinator.traceview.otel_send import EXPORT_TIMEOUT_S
from subagents.trace import (
    Compaction,
    MemberEnd,
    MemberStart,
    MemoryFileSave,
    MemorySave,
    ModelCall,
    Retry,
    SandboxEvent,
    ToolCall,
    ToolResult,
    TraceWriter,
    read_trace,
)

FLEET = str(Path(sys.executable).parent / "fleet")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tracegen.Expected:
    return tracegen.make_run(tmp_path_factory.mktemp("runs"), members=3, turns=5, seed=5)


def _by_op(spans: list[Any], op: str) -> list[Any]:
    return [s for s in spans if s.attributes.get("gen_ai.operation.name") == op]


def test_spans_follow_the_genai_conventions(synthetic: tracegen.Expected) -> None:
    exporter = InMemorySpanExporter()
    count = otel.export_run(load_run(synthetic.run_dir), exporter=exporter)
    spans = list(exporter.get_finished_spans())
    assert count == len(spans)
    (workflow,) = _by_op(spans, "invoke_workflow")
    agents = {s.attributes["gen_ai.agent.name"]: s for s in _by_op(spans, "invoke_agent")}
    assert sorted(agents) == sorted(synthetic.members)
    for mid, exp in synthetic.members.items():
        agent = agents[mid]
        assert agent.parent.span_id == workflow.context.span_id
        assert agent.attributes["gen_ai.agent.id"] == f"{synthetic.run_id}/{mid}"
        chats = [s for s in _by_op(spans, "chat") if s.parent.span_id == agent.context.span_id]
        tools = [
            s for s in _by_op(spans, "execute_tool") if s.parent.span_id == agent.context.span_id
        ]
        assert len(chats) == exp.turns and len(tools) == exp.tool_calls
        total_in = exp.input_tokens + exp.cache_read_tokens + exp.cache_write_tokens
        assert sum(s.attributes["gen_ai.usage.input_tokens"] for s in chats) == total_in
        assert sum(s.attributes["gen_ai.usage.output_tokens"] for s in chats) == exp.output_tokens
        assert agent.attributes["gen_ai.usage.input_tokens"] == total_in
        assert (
            sum(s.attributes["gen_ai.usage.cache_read.input_tokens"] for s in chats)
            == exp.cache_read_tokens
        )
        assert all(s.name == "chat claude-sonnet-4-5" for s in chats)
        assert all(s.attributes["gen_ai.request.model"] == "claude-sonnet-4-5" for s in chats)
        assert all(s.attributes["gen_ai.tool.call.id"].startswith(f"toolu_{mid}_") for s in tools)
        assert all(s.name == "execute_tool " + s.attributes["gen_ai.tool.name"] for s in tools)
        errors = [s for s in tools if s.status.status_code is StatusCode.ERROR]
        failed_event = exp.status == "failed"
        assert len(errors) == exp.errors - failed_event
        names = [e.name for e in agent.events]
        assert names.count("fleet.compaction") == exp.compactions
        assert names.count("fleet.offload") == exp.offloads
        assert (agent.status.status_code is StatusCode.ERROR) == (exp.status != "ok")
        assert agent.start_time == int(exp.start * 1e9) and agent.end_time == int(exp.end * 1e9)
    # Without --otel-content no message content leaves the machine.
    content_keys = {
        "gen_ai.output.messages",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
    }
    assert not any(content_keys & set(s.attributes) for s in spans)


def test_content_only_when_asked(synthetic: tracegen.Expected) -> None:
    exporter = InMemorySpanExporter()
    otel.export_run(load_run(synthetic.run_dir), exporter=exporter, content=True)
    spans = list(exporter.get_finished_spans())
    chat = _by_op(spans, "chat")[0]
    tool = _by_op(spans, "execute_tool")[0]
    assert "checking the next source" in chat.attributes["gen_ai.output.messages"]
    assert tool.attributes["gen_ai.tool.call.arguments"].startswith("{")
    assert "gen_ai.tool.call.result" in tool.attributes


def test_live_listener_exports_while_the_member_runs(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    live = otel.LiveRun(
        "live-run-20261130-0001", otel.make_provider(exporter=exporter), start=100.0,
        name="live-job",
    )  # fmt: skip
    writer = TraceWriter(tmp_path / "trace.jsonl", run="live-run-20261130-0001", member="m1")
    writer.listeners.append(live.listener("m1"))
    writer.emit(MemberStart(ts=100.0, kind="browser", task="t", model="claude-haiku-4-5"))
    writer.emit(ModelCall(ts=102.0, turn=1, model="claude-haiku-4-5", input_tokens=10,
                          cache_read_tokens=90, output_tokens=5, latency_s=1.5))  # fmt: skip
    writer.emit(ToolCall(ts=102.1, turn=1, call_id="c1", tool="navigate", input={"url": "u"}))
    # The chat span is exported as soon as the call is traced, not at the run's end.
    assert [s.name for s in exporter.get_finished_spans()] == ["chat claude-haiku-4-5"]
    writer.emit(
        ToolResult(ts=103.0, turn=1, call_id="c1", tool="navigate", output="ok", duration_s=0.9)
    )
    writer.emit(Compaction(ts=103.5, turn=1, tokens_before=900, tokens_after=100, summary="s",
                           transcript_path="transcripts/c1.jsonl"))  # fmt: skip
    conflict = MemoryFileSave(path="notes.md", action="conflict")
    writer.emit(MemorySave(ts=103.8, profile="/p/shared", key="k", files=[conflict]))
    writer.emit(MemberEnd(ts=104.0, status="ok"))
    writer.close()
    live.close(105.0)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {
        "chat claude-haiku-4-5",
        "execute_tool navigate",
        "invoke_agent m1",
        "invoke_workflow live-job",  # the job's name: low cardinality, not the run id
    }
    workflow = spans["invoke_workflow live-job"]
    assert workflow.attributes["gen_ai.workflow.name"] == "live-job"
    assert workflow.attributes["fleet.run.id"] == "live-run-20261130-0001"
    assert "error.type" not in workflow.attributes
    chat = spans["chat claude-haiku-4-5"]
    assert chat.attributes["gen_ai.usage.input_tokens"] == 100
    assert (chat.start_time, chat.end_time) == (int(100.5e9), int(102e9))
    assert spans["invoke_agent m1"].attributes["gen_ai.request.model"] == "claude-haiku-4-5"
    events = spans["invoke_agent m1"].events
    assert [e.name for e in events] == ["fleet.compaction", "fleet.memory_save"]
    assert events[1].attributes["fleet.conflicts"] == 1
    assert len(list(read_trace(tmp_path / "trace.jsonl"))) == 7


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    yield server
    server.close()


def test_cli_exports_to_an_otlp_http_collector(
    synthetic: tracegen.Expected, collector: Collector
) -> None:
    done = subprocess.run([FLEET, "trace", str(synthetic.run_dir), "--otlp", collector.url],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert collector.posts
    assert all(p == "/v1/traces" and t == "application/x-protobuf" for p, t, _ in collector.posts)
    spans = collector.spans()
    names = [s.name for s in spans]
    exp = synthetic.members
    assert names.count("invoke_workflow synthetic") == 1
    assert sum(n.startswith("invoke_agent ") for n in names) == len(exp)
    assert sum(n.startswith("chat ") for n in names) == sum(e.turns for e in exp.values())
    assert sum(n.startswith("execute_tool ") for n in names) == sum(
        e.tool_calls for e in exp.values()
    )
    attrs = {
        kv.key: kv.value
        for kv in spans[names.index(next(n for n in names if n.startswith("chat ")))].attributes
    }
    assert attrs["gen_ai.operation.name"].string_value == "chat"
    assert attrs["gen_ai.usage.input_tokens"].int_value > 0
    # One line, the count the collector accepted; nothing else from the exporter.
    assert done.stderr == f"exported {len(spans)} spans to {collector.url}\n"


def test_cli_otlp_with_nothing_listening_fails_in_one_line(synthetic: tracegen.Expected) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        started = time.monotonic()
        done = subprocess.run([FLEET, "trace", str(synthetic.run_dir), "--otlp", url],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        took = time.monotonic() - started
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr  # no exporter retry lines
    line = done.stderr
    assert line.startswith(f"fleet: OTLP export to {url}/v1/traces failed: connection refused")
    assert "0 of " in line and "collector is running there" in line
    assert "exported" not in line and not done.stdout
    assert took < 4 * EXPORT_TIMEOUT_S  # gives up, does not hang


def test_cli_otlp_refused_by_the_collector_fails_in_one_line(
    synthetic: tracegen.Expected,
) -> None:
    refusing = Collector(status=404)
    try:
        done = subprocess.run([FLEET, "trace", str(synthetic.run_dir), "--otlp", refusing.url],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    finally:
        refusing.close()
    assert len(refusing.posts) == 1  # a 404 is not retried
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"OTLP export to {refusing.url}/v1/traces failed: HTTP 404" in done.stderr
    assert "0 of " in done.stderr


def test_cli_otlp_needs_an_http_url(synthetic: tracegen.Expected) -> None:
    done = subprocess.run([FLEET, "trace", str(synthetic.run_dir), "--otlp", "127.0.0.1:4318"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert "is not an http(s) URL" in done.stderr and "--otlp http://" in done.stderr


def test_a_retried_member_gets_one_sound_span_per_attempt(tmp_path: Path) -> None:
    """Each attempt is its own invoke_agent span under the run, covering its box start-up;
    the crashed one is an error, its open tool ends with it, the retry's calls are kept."""
    run_dir = tmp_path / "retried-run"
    writer = TraceWriter(run_dir / "members" / "m1" / "trace.jsonl", run="retried-run", member="m1")
    box = {"box": "b1"}
    writer.emit(SandboxEvent(ts=102.0, action="create", duration_s=2.0, **box))
    writer.emit(MemberStart(ts=102.1, kind="coding", task="t", model="claude-haiku-4-5"))
    writer.emit(ModelCall(ts=103.0, turn=1, model="claude-haiku-4-5", latency_s=0.5))
    writer.emit(ToolCall(ts=103.1, turn=1, call_id="c1", tool="shell", input={"command": "x"}))
    writer.emit(MemberEnd(ts=104.0, status="crashed", reason="sandbox crashed: oom"))
    writer.emit(SandboxEvent(ts=104.5, action="close", **box))
    writer.emit(Retry(ts=104.6, what="member", attempt=1, reason="sandbox crashed", delay_s=1.0))
    writer.emit(SandboxEvent(ts=107.0, action="create", duration_s=1.0, **box))
    writer.emit(MemberStart(ts=107.1, kind="coding", task="t", model="claude-haiku-4-5"))
    writer.emit(ModelCall(ts=108.0, turn=1, model="claude-haiku-4-5", latency_s=0.5))
    writer.emit(ToolCall(ts=108.1, turn=1, call_id="c2", tool="shell", input={"command": "x"}))
    writer.emit(ToolResult(ts=108.5, turn=1, call_id="c2", tool="shell", output="ok"))
    writer.emit(MemberEnd(ts=109.0, status="ok"))
    writer.emit(SandboxEvent(ts=109.5, action="close", **box))
    writer.close()
    exporter = InMemorySpanExporter()
    count = otel.export_run(load_run(run_dir), exporter=exporter)
    spans = list(exporter.get_finished_spans())
    assert count == len(spans) == 1 + 2 + 2 + 2
    (run_span,) = _by_op(spans, "invoke_workflow")
    agents = sorted(_by_op(spans, "invoke_agent"), key=lambda s: s.start_time)
    assert [a.attributes["fleet.member.attempt"] for a in agents] == [1, 2]
    assert [a.status.status_code for a in agents] == [StatusCode.ERROR, StatusCode.UNSET]
    assert agents[0].attributes["fleet.member.status"] == "crashed"
    # Box start-up included: the create event was written when the box was up.
    assert agents[0].start_time == int(100e9) and agents[0].end_time == int(104e9)
    assert agents[1].start_time == int(104.6e9) and agents[1].end_time == int(109e9)
    assert [e.name for e in agents[1].events] == ["fleet.retry"]
    assert run_span.start_time <= agents[0].start_time and run_span.end_time >= agents[1].end_time
    assert run_span.status.status_code == StatusCode.UNSET  # the member ended ok at last
    for parent in agents:
        assert parent.parent is not None and parent.parent.span_id == run_span.context.span_id
        kids = [s for s in spans if s.parent and s.parent.span_id == parent.context.span_id]
        assert sorted(s.attributes["gen_ai.operation.name"] for s in kids) == [
            "chat",
            "execute_tool",
        ]
        assert all(parent.start_time <= k.start_time <= k.end_time <= parent.end_time for k in kids)
    (open_tool,) = [
        s for s in _by_op(spans, "execute_tool") if s.status.status_code == StatusCode.ERROR
    ]
    assert open_tool.attributes["gen_ai.tool.call.id"] == "c1"

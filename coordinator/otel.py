"""OpenTelemetry export of runs, after the fact or live, with GenAI semantic conventions.

Spans: ``invoke_workflow <run>`` > ``invoke_agent <member>`` > ``chat <model>`` (one
per model call) and ``execute_tool <tool>`` (one per tool call). Offloads,
compactions, clips, retries and errors become span events on the member's span.
``gen_ai.usage.input_tokens`` counts every input token the model read, cache reads
and writes included (the convention's definition); the cache parts are also given
on their own (``gen_ai.usage.cache_read.input_tokens``,
``gen_ai.usage.cache_creation.input_tokens``). Message contents (model text, tool
arguments and results) go out only with ``content=True``: traces often leave the
machine, and page texts or code may not be meant to.

One code path serves both uses: :class:`LiveRun` turns trace events into spans as a
:class:`subagents.trace.TraceWriter` listener during a run, and :func:`export_run`
replays a finished run's events through the same listener. Span times always come
from the events' timestamps, so a replayed run has the same shape as a live one.

An after-the-fact export to an OTLP endpoint builds the spans in memory, then
:mod:`coordinator.otel_send` sends them and says what the collector accepted (or
raises :class:`~coordinator.otel_send.ExportFailed`).

Needs the ``otel`` extra (``opentelemetry-sdk``, ``opentelemetry-exporter-otlp-proto-http``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from opentelemetry import trace as ot
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from coordinator.otel_send import otlp_traces_url, send_spans
from coordinator.traceview.load import RunTrace
from subagents.trace import (
    Clip,
    Compaction,
    ErrorEvent,
    MemberEnd,
    MemberStart,
    MemorySave,
    ModelCall,
    Offload,
    Retry,
    SandboxEvent,
    ToolCall,
    ToolResult,
)

PROVIDER_NAME = "anthropic"
_MAX_ATTR = 8_000
"""Content attributes are cut to this many characters (collectors reject huge values)."""


def _ns(ts: float) -> int:
    return int(ts * 1e9)


def make_provider(
    *, endpoint: str | None = None, exporter: SpanExporter | None = None
) -> TracerProvider:
    """A tracer provider exporting to ``exporter`` (synchronously) or to OTLP/HTTP ``endpoint``."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    provider = TracerProvider(resource=Resource.create({"service.name": "fleet"}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        target = (
            OTLPSpanExporter(endpoint=otlp_traces_url(endpoint)) if endpoint else OTLPSpanExporter()
        )
        provider.add_span_processor(BatchSpanProcessor(target))
    return provider


def _clip(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text[:_MAX_ATTR]


class _MemberSpans:
    """The open spans of one member while its events stream in."""

    def __init__(self, live: LiveRun, member: str) -> None:
        self.live = live
        self.member = member
        self.agent: Span | None = None
        self.tools: dict[str, Span] = {}
        self.first_ts = 0.0
        self.last_ts = 0.0
        self.attempt = 1
        self.usage = [0, 0]

    def _agent(self, ts: float) -> Span:
        if self.agent is None:
            attrs: dict[str, Any] = {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.provider.name": PROVIDER_NAME,
                "gen_ai.agent.id": f"{self.live.run_id}/{self.member}",
                "gen_ai.agent.name": self.member,
                "gen_ai.conversation.id": f"{self.live.run_id}/{self.member}",
                "fleet.run.id": self.live.run_id,
            }
            attrs["fleet.member.attempt"] = self.attempt
            # The member's span starts when its box started being created (the create
            # event is written once the box is up, with how long that took), so the
            # span covers the sandbox's start-up too.
            self.agent = self.live.tracer.start_span(
                f"invoke_agent {self.member}", context=self.live.context, kind=SpanKind.INTERNAL,
                attributes=attrs, start_time=_ns(min(ts, self.first_ts or ts)),
            )  # fmt: skip
            self.live.agent_spans += 1
        return self.agent

    def __call__(self, ev: Any) -> None:
        # A retried member writes each attempt to the same trace: every attempt gets
        # its own invoke_agent span, ended by that attempt's member_end. Between
        # attempts only the box's close comes, which starts nothing.
        box = isinstance(ev, SandboxEvent)
        if self.agent is None and box and ev.action != "create":
            return
        start = ev.ts - ev.duration_s if box and ev.action == "create" else ev.ts
        self.first_ts = min(self.first_ts or start, start)
        self.last_ts = max(self.last_ts, ev.ts)
        if isinstance(ev, MemberStart):
            agent = self._agent(ev.ts)
            agent.set_attribute("gen_ai.agent.description", f"{ev.kind} member")
            agent.set_attribute("fleet.member.kind", ev.kind)
            agent.set_attribute("gen_ai.request.model", ev.model)
            return
        if isinstance(ev, ModelCall | ToolCall | ToolResult | MemberEnd):
            agent = self._agent(ev.ts)
        elif isinstance(ev, Offload | Compaction | Clip | Retry | ErrorEvent | MemorySave):
            agent = self._agent(ev.ts)
            agent.add_event(f"fleet.{ev.type}", attributes=_event_attrs(ev), timestamp=_ns(ev.ts))
            return
        else:
            return  # sandbox actions, message deltas, todos: no span of their own
        if isinstance(ev, ModelCall):
            self._chat(agent, ev)
        elif isinstance(ev, ToolCall):
            self._tool_start(agent, ev)
        elif isinstance(ev, ToolResult):
            self._tool_end(ev)
        else:
            self.finish(ev.ts, ev.status, ev.reason)

    def _chat(self, agent: Span, ev: ModelCall) -> None:
        total_in = ev.input_tokens + ev.cache_read_tokens + ev.cache_write_tokens
        self.usage[0] += total_in
        self.usage[1] += ev.output_tokens
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": PROVIDER_NAME,
            "gen_ai.request.model": ev.model,
            "gen_ai.response.model": ev.model,
            "gen_ai.usage.input_tokens": total_in,
            "gen_ai.usage.output_tokens": ev.output_tokens,
            "gen_ai.usage.cache_read.input_tokens": ev.cache_read_tokens,
            "gen_ai.usage.cache_creation.input_tokens": ev.cache_write_tokens,
            "gen_ai.agent.id": f"{self.live.run_id}/{self.member}",
            "fleet.turn": ev.turn,
            "fleet.context_tokens": ev.context_tokens,
            "fleet.retries": ev.retries,
        }
        if ev.stop_reason:
            attrs["gen_ai.response.finish_reasons"] = [ev.stop_reason]
        if self.live.content:
            attrs["gen_ai.output.messages"] = _clip([{"role": "assistant", "parts": ev.content}])
        span = self.live.tracer.start_span(
            f"chat {ev.model}", context=ot.set_span_in_context(agent), kind=SpanKind.CLIENT,
            attributes=attrs, start_time=_ns(ev.ts - ev.latency_s),
        )  # fmt: skip
        span.end(end_time=_ns(ev.ts))

    def _tool_start(self, agent: Span, ev: ToolCall) -> None:
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": ev.tool,
            "gen_ai.tool.call.id": ev.call_id,
            "gen_ai.tool.type": "function",
            "gen_ai.agent.id": f"{self.live.run_id}/{self.member}",
            "fleet.turn": ev.turn,
        }
        if self.live.content:
            attrs["gen_ai.tool.call.arguments"] = _clip(ev.input)
        self.tools[ev.call_id] = self.live.tracer.start_span(
            f"execute_tool {ev.tool}", context=ot.set_span_in_context(agent),
            kind=SpanKind.INTERNAL, attributes=attrs, start_time=_ns(ev.ts),
        )  # fmt: skip

    def _tool_end(self, ev: ToolResult) -> None:
        span = self.tools.pop(ev.call_id, None)
        if span is None:
            return
        span.set_attribute("fleet.tool.output_chars", ev.output_chars or len(ev.output))
        if ev.offloaded:
            span.set_attribute("fleet.tool.offloaded", ev.offloaded)
        if self.live.content:
            span.set_attribute("gen_ai.tool.call.result", _clip(ev.output))
        if ev.is_error:
            span.set_attribute("error.type", "tool_error")
            span.set_status(Status(StatusCode.ERROR, ev.output[:200]))
        span.end(end_time=_ns(ev.ts))

    def finish(self, ts: float, status: str, reason: str = "") -> None:
        """End the member's open spans (tools without a result end with it)."""
        for span in self.tools.values():
            span.set_status(Status(StatusCode.ERROR, "no result before the member ended"))
            span.end(end_time=_ns(ts))
        self.tools.clear()
        if self.agent is None:
            return
        self.agent.set_attribute("gen_ai.usage.input_tokens", self.usage[0])
        self.agent.set_attribute("gen_ai.usage.output_tokens", self.usage[1])
        self.agent.set_attribute("fleet.member.status", status)
        if status != "ok":
            self.agent.set_attribute("error.type", status)
            self.agent.set_status(Status(StatusCode.ERROR, reason or status))
        self.agent.end(end_time=_ns(ts))
        self.agent = None
        self.first_ts, self.usage, self.attempt = 0.0, [0, 0], self.attempt + 1


def _event_attrs(ev: Any) -> dict[str, Any]:
    if isinstance(ev, Offload):
        return {"fleet.path": ev.path, "fleet.tokens": ev.tokens, "fleet.reason": ev.reason}
    if isinstance(ev, Compaction):
        return {"fleet.tokens_before": ev.tokens_before, "fleet.tokens_after": ev.tokens_after,
                "fleet.path": ev.transcript_path}  # fmt: skip
    if isinstance(ev, Clip):
        return {"fleet.tokens_saved": ev.tokens_saved, "fleet.calls": len(ev.call_ids)}
    if isinstance(ev, Retry):
        return {"fleet.what": ev.what, "fleet.attempt": ev.attempt, "fleet.reason": ev.reason}
    if isinstance(ev, MemorySave):
        return {"fleet.path": ev.profile, "fleet.files": len(ev.files),
                "fleet.conflicts": len(ev.conflicts), "fleet.error": ev.error}  # fmt: skip
    return {"error.type": ev.error, "fleet.message": ev.message[:500]}


class LiveRun:
    """A run's ``invoke_workflow`` span and one listener per member.

    Attach :meth:`listener` to each member's ``TraceWriter.listeners``; call
    :meth:`close` when the run ends (it ends spans of members that never wrote
    ``member_end`` and flushes the exporter).
    """

    def __init__(
        self, run_id: str, provider: TracerProvider, *, start: float, content: bool = False,
        name: str = "",
    ) -> None:  # fmt: skip
        self.run_id = run_id
        self.provider = provider
        self.content = content
        self.tracer = provider.get_tracer("fleet")
        self.span = self.tracer.start_span(
            f"invoke_workflow {name or run_id}",
            attributes={"gen_ai.operation.name": "invoke_workflow", "fleet.run.id": run_id,
                        "gen_ai.provider.name": PROVIDER_NAME},
            start_time=_ns(start),
        )  # fmt: skip
        self.context = ot.set_span_in_context(self.span)
        self.members: dict[str, _MemberSpans] = {}
        self.agent_spans = 0
        """invoke_agent spans started (one per member attempt)."""
        self.failures = 0
        """Events the live export failed on (ignored so the run goes on)."""

    def listener(self, member: str) -> Callable[[Any], None]:
        """The callable to append to that member's ``TraceWriter.listeners``."""
        return self.members.setdefault(member, _MemberSpans(self, member))

    def __call__(self, ev: Any) -> None:
        """A listener for every member at once (events carry their member id).

        Telemetry must never break a run: an exporter or SDK failure is swallowed
        here, and the trace on disk stays the record.
        """
        try:
            self.listener(ev.member)(ev)
        except Exception:  # the run matters more than its telemetry
            self.failures += 1

    def close(self, end: float, status: str = "ok") -> None:
        for spans in self.members.values():
            spans.finish(max(spans.last_ts, 0.0) or end, "incomplete", "run ended first")
        self.span.set_attribute("fleet.run.status", status)
        if status not in ("ok", "succeeded"):
            self.span.set_status(Status(StatusCode.ERROR, status))
        self.span.end(end_time=_ns(end))
        self.provider.force_flush()
        self.provider.shutdown()


CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The GenAI instrumentations' switch for message content; honoured by live export."""


def live_from_env(run_id: str, *, start: float) -> LiveRun | None:
    """A :class:`LiveRun` exporting to ``$OTEL_EXPORTER_OTLP_ENDPOINT``, or None if unset.

    The SDK's exporter reads the endpoint (and headers, timeouts) from the standard
    ``OTEL_EXPORTER_OTLP_*`` variables; content is included when ``$CONTENT_ENV`` is true.
    """
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return None
    content = os.environ.get(CONTENT_ENV, "").strip().lower() in ("1", "true", "yes")
    return LiveRun(run_id, make_provider(), start=start, content=content)


def export_run(
    run: RunTrace, *, endpoint: str | None = None, exporter: SpanExporter | None = None,
    content: bool = False,
) -> int:  # fmt: skip
    """Replay a run's traces as spans; return how many spans were exported.

    With ``exporter`` every span goes to it as it ends. Otherwise they go to the OTLP/HTTP
    ``endpoint`` (or the ``OTEL_EXPORTER_OTLP_*`` one): the count is what the collector
    accepted, and :class:`ExportFailed` is raised when it did not accept them all.
    """
    if exporter is not None:
        return _replay(run, exporter, content)
    memory = InMemorySpanExporter()
    _replay(run, memory, content)
    return send_spans(memory.get_finished_spans(), endpoint)


def _replay(run: RunTrace, exporter: SpanExporter, content: bool) -> int:
    provider = make_provider(exporter=exporter)
    stamps = [ev.ts for m in run.members for ev in m.events]
    # A box's creation began before its event was written (the event carries how long).
    starts = [ev.ts - ev.duration_s for m in run.members for ev in m.events
              if isinstance(ev, SandboxEvent)]  # fmt: skip
    start, end = (min(stamps + starts), max(stamps)) if stamps else (0.0, 0.0)
    live = LiveRun(run.id, provider, start=start, content=content)
    count = 1
    for member in run.members:
        listen = live.listener(member.id)
        for ev in member.events:
            listen(ev)
            count += isinstance(ev, ModelCall | ToolCall)
    # Each member's last end event decides (earlier ones are attempts that were retried).
    last = {m.id: ev.status for m in run.members for ev in m.events if isinstance(ev, MemberEnd)}
    live.close(end, "ok" if set(last.values()) <= {"ok"} else "partial")
    return count + live.agent_spans

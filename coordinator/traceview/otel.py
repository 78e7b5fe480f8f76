"""OpenTelemetry export of runs, after the fact or live, with GenAI semantic conventions.

Spans: ``invoke_workflow <job name>`` > ``invoke_agent <member>`` > ``chat <model>``
(one per model call) and ``execute_tool <tool>`` (one per tool call). Offloads,
compactions, clips, retries and errors become span events on the member's span.

Names and attributes follow the GenAI conventions (read in their standalone
repository, semantic-conventions-genai). The workflow span is named by the job's
name, not the run id, so the name stays low-cardinality; it carries
``gen_ai.workflow.name`` and, because the conventions' first standalone release
renames that to ``gen_ai.agent.name`` on workflow spans, that too; the run id is
``fleet.run.id``. A run that did not succeed has ``error.type`` (its status) on the
workflow span, as a member that did not end ok has on its own. A chat span is named
by the model the request asked for (``gen_ai.request.model``, as the conventions
name it); the dated model that answered is ``gen_ai.response.model``. It has
``gen_ai.conversation.id`` (the member: ``<run>/<member>``), ``gen_ai.response.id``,
``server.address``/``server.port`` of the API that answered,
``gen_ai.request.max_tokens``, ``gen_ai.request.stream`` and
``gen_ai.response.finish_reasons`` in the conventions' words (the ones the output
message carries), not Anthropic's. A model call that got no answer is a chat span
too, with the API's error type as ``error.type`` and its HTTP status, so a failed
member's 400 is seen where it happened. Tool spans carry the tool's description.
The coordinator's own calls (planner, analyst) go through :class:`TracedModel` in a
live export: an ``invoke_agent coordinator.planner`` (or ``.analyst``) span with its
chat span. They are in no member's trace file, so a replay has no such spans.

In a lead run the lead spawns members in waves: each member's span is a child of
the lead's ``invoke_agent`` span (the lead waits on them: their work is part of its
turn), with ``fleet.lead.wave`` and a link to the lead's ``execute_tool spawn`` span
that started it. Which spawn started a member is the journal's ``lead_spawn``
entry: :meth:`LiveRun.spawned` takes it live, and a replay reads the journal.

Trace and span ids come from :class:`RunIds`: derived from the run id and each span's
place in the run (member, attempt, call), so exporting a run again - live, then
replayed - gives the same trace and the same spans, which a backend keeps once.
``service.name`` is ``fleet`` unless ``OTEL_SERVICE_NAME`` says otherwise, and live
export starts when either ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, as the OTLP exporter specification has it.
``gen_ai.provider.name`` is ``anthropic`` only for Claude: offline policies say
``fleet.offline`` and replays ``fleet.replay`` (the conventions allow custom
values), so no dashboard counts them as Anthropic traffic.

``gen_ai.usage.input_tokens`` counts every input token the model read, cache reads
and writes included (the convention's definition); the cache parts are also given
on their own (``gen_ai.usage.cache_read.input_tokens``,
``gen_ai.usage.cache_creation.input_tokens``). Message contents go out only with
``content=True``: traces often leave the machine, and page texts or code may not be
meant to. Then chat spans carry ``gen_ai.input.messages``,
``gen_ai.output.messages``, ``gen_ai.system_instructions`` and
``gen_ai.tool.definitions`` in the conventions' schemas (:mod:`.otel_messages`);
the member's span carries the last two as well; tool spans carry their arguments
and results. Input messages are rebuilt from the trace's message deltas: after a
compaction they restart from the task and the summary, and a result offloaded or
clipped later shows as it was when first appended.

One code path serves both uses: :class:`LiveRun` turns trace events into spans as a
:class:`subagents.trace.TraceWriter` listener during a run, and :func:`export_run`
replays a finished run's events through the same listener. Span times always come
from the events' timestamps, so a replayed run has the same shape as a live one.

An after-the-fact export to an OTLP endpoint builds the spans in memory, then
:mod:`coordinator.traceview.otel_send` sends them and says what the collector accepted (or
raises :class:`~coordinator.traceview.otel_send.ExportFailed`).

Needs the ``otel`` extra (``opentelemetry-sdk``, ``opentelemetry-exporter-otlp-proto-http``).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

from opentelemetry import trace as ot
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode

from coordinator.journal.entries import LeadSpawnEntry, RunFinishedEntry, RunInterruptedEntry
from coordinator.traceview import otel_messages as msg
from coordinator.traceview.load import LEAD_DIR, RunTrace
from coordinator.traceview.otel_send import otlp_traces_url, send_spans
from subagents.model.base import Model, ModelRequest, ModelResponse
from subagents.model.errors import ModelError
from subagents.spend.usage import model_call_event
from subagents.trace import (
    Clip,
    Compaction,
    ErrorEvent,
    MemberEnd,
    MemberStart,
    MemorySave,
    Messages,
    ModelCall,
    Offload,
    Prompt,
    Retry,
    SandboxEvent,
    ToolCall,
    ToolResult,
)

_MAX_ATTR = 8_000
"""Content attributes are cut to this many characters (collectors reject huge values)."""
DEFAULT_WORKFLOW = "fleet"
"""The workflow's name when the run's job has none on record."""


def provider_name(model: str, offline: bool) -> str:
    """``anthropic`` for Claude; ``fleet.offline`` / ``fleet.replay`` for offline models."""
    if not offline:
        return "anthropic"
    return "fleet.replay" if model.startswith("replay:") else "fleet.offline"


def _version() -> str:
    try:
        return metadata.version("fleet")
    except metadata.PackageNotFoundError:  # run from a checkout that was not installed
        return "0+unknown"


def _ns(ts: float) -> int:
    return int(ts * 1e9)


class RunIds(IdGenerator):
    """Trace and span ids derived from the run id and each span's place in the run.

    The same run exported twice (live, then replayed; or replayed again) is then one
    trace with the same spans, which a backend stores once, instead of two traces
    that look like two runs. W3C Trace Context only asks ids to be unique, and a
    hash of a unique run id is; :meth:`is_trace_id_random` says they are not random,
    so samplers that rely on random bits do not. A span started without a key
    (``key`` is None) gets a random id.
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.key: str | None = None
        self._random = RandomIdGenerator()

    def _hash(self, what: str, size: int) -> int:
        digest = hashlib.sha256(f"fleet\0{self.run_id}\0{what}".encode()).digest()
        return int.from_bytes(digest[:size], "big") or 1  # an all-zero id is invalid

    def generate_trace_id(self) -> int:
        return self._hash("trace", 16)

    def generate_span_id(self) -> int:
        if self.key is None:
            return self._random.generate_span_id()
        return self._hash(self.key, 8)

    def is_trace_id_random(self) -> bool:
        return False


def _resource() -> Resource:
    """``service.name`` is ``fleet`` unless ``OTEL_SERVICE_NAME`` (or ``service.name`` in
    ``OTEL_RESOURCE_ATTRIBUTES``) names another: the SDK's detector reads both, and
    attributes given here would override them."""
    attrs: dict[str, Any] = {"service.version": _version()}
    named = os.environ.get("OTEL_SERVICE_NAME", "").strip() or any(
        pair.split("=", 1)[0].strip() == "service.name"
        for pair in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",")
    )
    if not named:
        attrs["service.name"] = "fleet"
    return Resource.create(attrs)


def make_provider(
    *, endpoint: str | None = None, exporter: SpanExporter | None = None, run_id: str = ""
) -> TracerProvider:
    """A tracer provider exporting to ``exporter`` (synchronously) or to OTLP/HTTP ``endpoint``;
    with ``run_id``, its ids are that run's (:class:`RunIds`)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    ids = RunIds(run_id) if run_id else None
    provider = TracerProvider(resource=_resource(), id_generator=ids)
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        target = (
            OTLPSpanExporter(endpoint=otlp_traces_url(endpoint)) if endpoint else OTLPSpanExporter()
        )
        provider.add_span_processor(BatchSpanProcessor(target))
    return provider


def _fit(value: Any) -> str:
    """JSON content within the attribute cap, still valid JSON."""
    return msg.fit(value, _MAX_ATTR)


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
        self.provider = "anthropic"
        self.conversation: list[dict[str, Any]] = []
        """The member's messages so far (kept only when content is exported)."""
        self.prompt: Prompt | None = None
        self.tool_descriptions: dict[str, str] = {}
        """Each tool's description, from the member's prompt (not content: the
        conventions recommend it on every tool span)."""

    @property
    def conversation_id(self) -> str:
        return f"{self.live.run_id}/{self.member}"

    def _setup(self, ev: SandboxEvent) -> None:
        """The member's wait on its repository's setup (made, reused or failed): a span
        of its own beside the member's, in the run's trace."""
        detail = ev.detail
        attrs: dict[str, Any] = {
            "fleet.run.id": self.live.run_id,
            "gen_ai.agent.name": self.member,
            "fleet.setup.ok": bool(detail.get("ok")),
            "fleet.setup.reused": bool(detail.get("reused")),
        }
        if detail.get("key"):
            attrs["fleet.setup.key"] = str(detail["key"])
        span = self.live.start(
            f"setup/{self.member}/{self.attempt}", f"setup {self.member}",
            context=self.live.context, kind=SpanKind.INTERNAL, attributes=attrs,
            start_time=_ns(ev.ts - ev.duration_s),
        )  # fmt: skip
        if not detail.get("ok"):
            span.set_status(Status(StatusCode.ERROR, str(detail.get("reason", ""))[:500]))
        span.end(end_time=_ns(ev.ts))

    def _agent(self, ts: float) -> Span:
        if self.agent is None:
            attrs: dict[str, Any] = {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.provider.name": self.provider,
                "gen_ai.agent.id": self.conversation_id,
                "gen_ai.agent.name": self.member,
                "gen_ai.conversation.id": self.conversation_id,
                "fleet.run.id": self.live.run_id,
            }
            attrs["fleet.member.attempt"] = self.attempt
            context, links = self.live.context, []
            if spawn := self.live.spawns.get(self.member):
                # A lead's member runs inside the lead's work: under its span, linked
                # to the spawn call that started it.
                wave, call_id = spawn
                attrs["fleet.lead.wave"] = wave
                context = self.live.lead_context or context
                if (called := self.live.spawn_calls.get(call_id)) is not None:
                    links.append(Link(called))
            # The member's span starts when its box started being created (the create
            # event is written once the box is up, with how long that took), so the
            # span covers the sandbox's start-up too.
            self.agent = self.live.start(
                f"agent/{self.member}/{self.attempt}", f"invoke_agent {self.member}",
                context=context, kind=SpanKind.INTERNAL, links=links,
                attributes=attrs, start_time=_ns(min(ts, self.first_ts or ts)),
            )  # fmt: skip
            if self.member == LEAD_DIR:  # the lead's id is its directory's name
                self.live.lead_context = ot.set_span_in_context(self.agent)
            self.live.agent_spans += 1
        return self.agent

    def __call__(self, ev: Any) -> None:
        # A retried member writes each attempt to the same trace: every attempt gets
        # its own invoke_agent span, ended by that attempt's member_end. Between
        # attempts only the box's close comes, which starts nothing.
        box = isinstance(ev, SandboxEvent)
        if box and ev.action == "setup":
            self._setup(ev)
            return
        if self.agent is None and box and ev.action != "create":
            return
        start = ev.ts - ev.duration_s if box and ev.action == "create" else ev.ts
        self.first_ts = min(self.first_ts or start, start)
        self.last_ts = max(self.last_ts, ev.ts)
        if isinstance(ev, MemberStart):
            self.provider = provider_name(ev.model, ev.offline)
            self.conversation, self.prompt = [], None  # a new attempt starts afresh
            agent = self._agent(ev.ts)
            agent.set_attribute("gen_ai.agent.description", f"{ev.kind} member")
            agent.set_attribute("fleet.member.kind", ev.kind)
            agent.set_attribute("gen_ai.request.model", ev.model)
            return
        if isinstance(ev, Prompt):
            self.tool_descriptions = {
                str(t.get("name", "")): str(t["description"])
                for t in ev.tools if isinstance(t, dict) and t.get("description")
            }  # fmt: skip
        if isinstance(ev, Prompt | Messages | Compaction) and self.live.content:
            self._remember(ev)
        if isinstance(ev, Prompt | Messages):
            return
        if isinstance(ev, ModelCall | ToolCall | ToolResult | MemberEnd):
            agent = self._agent(ev.ts)
        elif isinstance(ev, Offload | Compaction | Clip | Retry | ErrorEvent | MemorySave):
            agent = self._agent(ev.ts)
            if isinstance(ev, ErrorEvent) and ev.model:
                self._failed_chat(agent, ev)
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

    def _remember(self, ev: Prompt | Messages | Compaction) -> None:
        """Keep what the next chat span's content attributes are made of."""
        if isinstance(ev, Prompt):
            self.prompt = ev
            if self.agent is not None:
                self.agent.set_attributes(self._prompt_attrs())
        elif isinstance(ev, Messages):
            self.conversation += ev.messages
        elif not ev.server_side:  # the history became the task plus the summary
            summary = {"role": "user", "content": ev.summary}
            self.conversation = [*self.conversation[:1], summary]

    def _prompt_attrs(self) -> dict[str, Any]:
        if self.prompt is None:
            return {}
        return {
            "gen_ai.system_instructions": _fit(msg.system_instructions(self.prompt.system)),
            "gen_ai.tool.definitions": _fit(msg.tool_definitions(self.prompt.tools)),
        }

    def _chat(self, agent: Span, ev: ModelCall) -> None:
        total_in = ev.input_tokens + ev.cache_read_tokens + ev.cache_write_tokens
        self.usage[0] += total_in
        self.usage[1] += ev.output_tokens
        attrs: dict[str, Any] = {
            "gen_ai.provider.name": provider_name(ev.model, ev.offline),
            "gen_ai.response.model": ev.model,
            "gen_ai.usage.input_tokens": total_in,
            "gen_ai.usage.output_tokens": ev.output_tokens,
            "gen_ai.usage.cache_read.input_tokens": ev.cache_read_tokens,
            "gen_ai.usage.cache_creation.input_tokens": ev.cache_write_tokens,
            "fleet.context_tokens": ev.context_tokens,
            "fleet.retries": ev.retries,
        }
        if ev.response_id:
            attrs["gen_ai.response.id"] = ev.response_id
        if ev.server_address:
            attrs["server.address"] = ev.server_address
            attrs["server.port"] = ev.server_port
        if ev.max_tokens:
            attrs["gen_ai.request.max_tokens"] = ev.max_tokens
        if ev.stream is not None:
            attrs["gen_ai.request.stream"] = ev.stream
        if ev.stop_reason:
            # The conventions' word, the one the output message carries too.
            attrs["gen_ai.response.finish_reasons"] = [msg.finish_reason(ev.stop_reason)]
        if self.live.content:
            attrs["gen_ai.output.messages"] = _fit(msg.output_messages(ev.content, ev.stop_reason))
        # Older traces did not record the request's model: the response's is the closest.
        self._chat_span(agent, ev, ev.request_model or ev.model, attrs, ev.latency_s)

    def _failed_chat(self, agent: Span, ev: ErrorEvent) -> None:
        """A model call that got no answer: a chat span with the API's error."""
        attrs: dict[str, Any] = {"gen_ai.provider.name": self.provider, "error.type": ev.error}
        if ev.status:
            attrs["http.response.status_code"] = ev.status
        span = self._chat_span(agent, ev, ev.model, attrs, ev.latency_s)
        span.set_status(Status(StatusCode.ERROR, ev.message[:200]))
        span.end(end_time=_ns(ev.ts))

    def _chat_span(
        self, agent: Span, ev: ModelCall | ErrorEvent, model: str, attrs: dict[str, Any],
        latency_s: float,
    ) -> Span:  # fmt: skip
        """A chat span named by the requested model; ended here unless it failed."""
        attrs |= {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model,
            "gen_ai.conversation.id": self.conversation_id,
            "gen_ai.agent.id": self.conversation_id,
            "fleet.turn": ev.turn,
        }
        if self.live.content:
            attrs["gen_ai.input.messages"] = _fit(msg.input_messages(self.conversation))
            attrs.update(self._prompt_attrs())
        span = self.live.start(
            f"chat/{self.member}/{self.attempt}/{ev.span}", f"chat {model}",
            context=ot.set_span_in_context(agent), kind=SpanKind.CLIENT,
            attributes=attrs, start_time=_ns(ev.ts - latency_s),
        )  # fmt: skip
        if isinstance(ev, ModelCall):
            span.end(end_time=_ns(ev.ts))
        return span

    def _tool_start(self, agent: Span, ev: ToolCall) -> None:
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": ev.tool,
            "gen_ai.tool.call.id": ev.call_id,
            "gen_ai.tool.type": "function",
            "gen_ai.agent.id": f"{self.live.run_id}/{self.member}",
            "fleet.turn": ev.turn,
        }
        if description := self.tool_descriptions.get(ev.tool):
            attrs["gen_ai.tool.description"] = description[:_MAX_ATTR]
        if self.live.content:
            attrs["gen_ai.tool.call.arguments"] = _fit(ev.input)
        span = self.tools[ev.call_id] = self.live.start(
            f"tool/{self.member}/{self.attempt}/{ev.call_id}", f"execute_tool {ev.tool}",
            context=ot.set_span_in_context(agent),
            kind=SpanKind.INTERNAL, attributes=attrs, start_time=_ns(ev.ts),
        )  # fmt: skip
        if self.member == LEAD_DIR and ev.tool == "spawn":
            self.live.spawn_calls[ev.call_id] = span.get_span_context()

    def _tool_end(self, ev: ToolResult) -> None:
        span = self.tools.pop(ev.call_id, None)
        if span is None:
            return
        span.set_attribute("fleet.tool.output_chars", ev.output_chars or len(ev.output))
        if ev.offloaded:
            span.set_attribute("fleet.tool.offloaded", ev.offloaded)
        if self.live.content:
            span.set_attribute("gen_ai.tool.call.result", ev.output[:_MAX_ATTR])
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
        self.tracer = provider.get_tracer("fleet", _version())
        ids = provider.id_generator
        self.ids = ids if isinstance(ids, RunIds) else None
        self._lock = threading.Lock()
        self._keys: dict[str, int] = {}
        workflow = name or DEFAULT_WORKFLOW
        self.span = self.start(
            "workflow", f"invoke_workflow {workflow}", kind=SpanKind.INTERNAL,
            attributes={"gen_ai.operation.name": "invoke_workflow",
                        "gen_ai.workflow.name": workflow, "gen_ai.agent.name": workflow,
                        "fleet.run.id": run_id},
            start_time=_ns(start),
        )  # fmt: skip
        self.context = ot.set_span_in_context(self.span)
        self.members: dict[str, _MemberSpans] = {}
        self.agent_spans = 0
        """invoke_agent spans started (one per member attempt)."""
        self.failures = 0
        """Events the live export failed on (ignored so the run goes on)."""
        self.spawns: dict[str, tuple[int, str]] = {}
        """A lead run: member id -> (its wave, the lead's spawn call id)."""
        self.spawn_calls: dict[str, SpanContext] = {}
        """The lead's spawn calls' spans, by call id."""
        self.lead_context: Any = None
        """The lead's (latest) ``invoke_agent`` span as a parent context."""

    def start(self, key: str, name: str, **kwargs: Any) -> Span:
        """Start a span whose id (with :class:`RunIds`) is derived from ``key``: the
        same place in the run gets the same id however often the run is exported.
        A key seen before gets a count appended, so ids stay unique."""
        with self._lock:
            seen = self._keys[key] = self._keys.get(key, 0) + 1
            if self.ids is not None:
                self.ids.key = f"{key}#{seen}"
            try:
                return self.tracer.start_span(name, **kwargs)
            finally:
                if self.ids is not None:
                    self.ids.key = None

    def spawned(self, entry: LeadSpawnEntry) -> None:
        """Note a journal ``lead_spawn`` entry, before its members' events come."""
        for member in entry.members:
            if member.id:
                self.spawns[member.id] = (entry.wave, entry.call_id)

    def traced(self, make_model: Callable[..., Model], agent: str) -> Callable[..., Model]:
        """``make_model`` whose models' calls are traced as ``agent``'s (:class:`TracedModel`)."""

        def make(*args: Any, **kwargs: Any) -> Model:
            return TracedModel(self, make_model(*args, **kwargs), agent)  # type: ignore[return-value]

        return make

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
            self.span.set_attribute("error.type", status)
            self.span.set_status(Status(StatusCode.ERROR, status))
        self.span.end(end_time=_ns(end))
        self.provider.force_flush()
        self.provider.shutdown()


class TracedModel:
    """The coordinator's own model (the planner's, the analyst's): each call becomes an
    ``invoke_agent <agent>`` span with its ``chat`` span under the workflow span, a
    failed call included. Members trace their calls themselves; this is for the
    calls no member makes. Everything else is the wrapped model's."""

    def __init__(self, live: LiveRun, model: Model, agent: str) -> None:
        self._live, self._model, self._agent = live, model, agent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        model = self._model
        requested = getattr(model, "name", "") or model.profile.name
        span = f"{self._agent}/t1/model"
        self._live(MemberStart(kind="coordinator", task="", model=requested,
                               offline=model.offline, member=self._agent))  # fmt: skip
        if self._live.content:
            system = request.system if isinstance(request.system, str) else "\n".join(
                str(b.get("text", "")) for b in request.system if isinstance(b, dict)
            )  # fmt: skip
            self._live(Prompt(system=system, tools=request.tools, member=self._agent))
            self._live(Messages(messages=request.messages, member=self._agent))
        started = time.monotonic()
        try:
            response = await model.complete(request)
        except ModelError as exc:
            self._live(ErrorEvent(error=exc.error_type or "model_error", message=str(exc)[:2_000],
                                  model=requested, status=exc.status or 0,
                                  latency_s=time.monotonic() - started, turn=1, span=span,
                                  member=self._agent))  # fmt: skip
            self._live(MemberEnd(status="failed", reason=str(exc)[:200], member=self._agent))
            raise
        content = [b.model_dump(mode="json", exclude_none=True) for b in response.message.content]
        call = model_call_event(response, content, span=span, parent=self._agent, turn=1,
                                default_model=model.profile.name, request_model=requested,
                                max_tokens=request.max_tokens)  # fmt: skip
        call.member = self._agent
        self._live(call)
        self._live(MemberEnd(status="ok", member=self._agent))
        return response


CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The GenAI instrumentations' switch for message content; honoured by live export."""


TRACES_ENDPOINT_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
"""Where spans go, by the OTLP exporter specification: the traces-only variable (a
full URL, used as is) wins over the general one (a base URL, ``/v1/traces`` appended)."""


def endpoint_from_env() -> str:
    """The OTLP traces endpoint the environment names, or "" when it names none."""
    return next((v for v in map(os.environ.get, TRACES_ENDPOINT_ENV) if v and v.strip()), "")


def live_from_env(run_id: str, *, start: float, name: str = "") -> LiveRun | None:
    """A :class:`LiveRun` exporting to ``$OTEL_EXPORTER_OTLP_ENDPOINT``, or None if unset.

    The SDK's exporter reads the endpoint (and headers, timeouts) from the standard
    ``OTEL_EXPORTER_OTLP_*`` variables; content is included when ``$CONTENT_ENV`` is true.
    """
    if not endpoint_from_env():
        return None
    content = os.environ.get(CONTENT_ENV, "").strip().lower() in ("1", "true", "yes")
    provider = make_provider(run_id=run_id)
    return LiveRun(run_id, provider, start=start, content=content, name=name)


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
    provider = make_provider(exporter=exporter, run_id=run.id)
    stamps = [ev.ts for m in run.members for ev in m.events]
    # A box's creation began before its event was written (the event carries how long).
    starts = [ev.ts - ev.duration_s for m in run.members for ev in m.events
              if isinstance(ev, SandboxEvent)]  # fmt: skip
    start, end = (min(stamps + starts), max(stamps)) if stamps else (0.0, 0.0)
    name = str((run.job or {}).get("name") or "")
    live = LiveRun(run.id, provider, start=start, content=content, name=name)
    for entry in run.journal:
        if isinstance(entry, LeadSpawnEntry):
            live.spawned(entry)
    count = 1
    for member in run.members:
        listen = live.listener(member.id)
        for ev in member.events:
            listen(ev)
            count += isinstance(ev, ModelCall | ToolCall)
    live.close(end, _run_status(run))
    return count + live.agent_spans


def _run_status(run: RunTrace) -> str:
    """How the run ended, as its journal says; from its members when it does not."""
    ended = [e.status for e in run.journal if isinstance(e, RunFinishedEntry | RunInterruptedEntry)]
    if ended:
        return ended[-1]
    # Each member's last end event decides (earlier ones are attempts that were retried).
    last = {m.id: ev.status for m in run.members for ev in m.events if isinstance(ev, MemberEnd)}
    return "ok" if set(last.values()) <= {"ok"} else "partial"

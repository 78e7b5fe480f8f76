"""Shared pieces of the loop tests: a probe kind with cheap tools, model builders.

``probe`` is a member kind registered only by these tests: tools whose behaviour is
known (a rendezvous that only completes when calls overlap, a tool that raises, one
that sleeps, one that adds) and a tiny result model, so the loop's own behaviour is
what the tests observe. ``anthropic_model(api)`` is the real adapter
(``subagents.model.AnthropicModel``) pointed at the fake Messages API server.
``ScriptedModel`` answers in-process; it is used only where the model is not the
subject (the trace-growth test, which makes hundreds of calls).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

import anyio
from pydantic import BaseModel, ConfigDict, Field

from sandbox.docker.backend import DockerBackend
from sandbox.errors import SandboxCrashed
from subagents.fake_api import FakeMessagesAPI
from subagents.kinds import Kind, register_kind
from subagents.member import run_member
from subagents.model.base import ModelProfile, ModelRequest, ModelResponse
from subagents.model.message import Message
from subagents.results.outcome import MemberOutcome
from subagents.spec import MemberSpec
from subagents.tools.base import Tool, ToolContext, ToolError, ToolOutput
from subagents.trace import TraceWriter, read_trace


class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    answer: str
    """The answer."""
    sources: list[str] = Field(default_factory=list)
    """Where it came from."""


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RendezvousIn(_In):
    who: str


class Rendezvous(Tool):
    """Completes only when ``expected`` calls are in flight at the same time."""

    name: ClassVar[str] = "rendezvous"
    description: ClassVar[str] = "Wait for the others."
    Input: ClassVar[type[BaseModel]] = RendezvousIn
    expected: ClassVar[int] = 3

    async def run(self, args: RendezvousIn, ctx: ToolContext) -> ToolOutput:
        state = ctx.state.setdefault("rendezvous", {"arrived": 0, "event": anyio.Event()})
        state["arrived"] += 1
        if state["arrived"] >= self.expected:
            state["event"].set()
        with anyio.fail_after(5):  # sequential execution would stall here and fail
            await state["event"].wait()
        return ToolOutput(text=f"{args.who} met {state['arrived']} callers")


class AddIn(_In):
    a: int
    b: int


class Add(Tool):
    name: ClassVar[str] = "add"
    description: ClassVar[str] = "Add two integers."
    Input: ClassVar[type[BaseModel]] = AddIn

    async def run(self, args: AddIn, ctx: ToolContext) -> str:
        return str(args.a + args.b)


class Boom(Tool):
    name: ClassVar[str] = "boom"
    description: ClassVar[str] = "Always fails."
    Input: ClassVar[type[BaseModel]] = _In

    async def run(self, args: Any, ctx: ToolContext) -> str:
        raise RuntimeError("the flux capacitor is empty")


class Refuse(Tool):
    name: ClassVar[str] = "refuse"
    description: ClassVar[str] = "Fails with a ToolError."
    Input: ClassVar[type[BaseModel]] = _In

    async def run(self, args: Any, ctx: ToolContext) -> str:
        raise ToolError("refused: try add instead")


class SleepIn(_In):
    seconds: float


class Sleep(Tool):
    name: ClassVar[str] = "sleep"
    description: ClassVar[str] = "Sleep."
    Input: ClassVar[type[BaseModel]] = SleepIn

    async def run(self, args: SleepIn, ctx: ToolContext) -> str:
        await anyio.sleep(args.seconds)
        return "slept"


class Crash(Tool):
    name: ClassVar[str] = "crash"
    description: ClassVar[str] = "The box dies."
    Input: ClassVar[type[BaseModel]] = _In

    async def run(self, args: Any, ctx: ToolContext) -> str:
        raise SandboxCrashed("box-1", "oom-killed", "memory limit 64m")


PROBE = register_kind(
    Kind(
        name="probe",
        system_prompt="You are a probe.",
        tools=lambda settings: [Rendezvous(), Add(), Boom(), Refuse(), Sleep(), Crash()],
        result_model=Answer,
        box_kind="coding",
    )
)


def lookup(city: str, year: int = 2024) -> dict[str, Any]:
    """A host callable tool (named by import path ``loop_support:lookup``)."""
    return {"city": city.upper(), "year": year}


def anthropic_model(api: Any, name: str = "claude-sonnet-5") -> Any:
    """The real adapter (AsyncAnthropic inside) talking to the fake server."""
    from subagents.model.claude import AnthropicModel

    # Short backoff: the fake server's faults should not slow the tests down.
    return AnthropicModel(
        name,
        base_url=api.url,
        api_key="test-key",
        max_retries=2,
        backoff_s=0.01,
        max_backoff_s=0.05,
    )


def events(path: Path, kind: str | None = None) -> list[Any]:
    evs = list(read_trace(path))
    return [e for e in evs if kind is None or e.type == kind]


def writer(run_dir: Path, member: str = "m1") -> TraceWriter:
    return TraceWriter(run_dir / "trace.jsonl", run="run-1", member=member)


def message(content: list[dict[str, Any]], *, input_tokens: int = 50) -> Message:
    stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
    return Message.model_validate(
        {
            "id": "msg",
            "type": "message",
            "role": "assistant",
            "model": "scripted",
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 20},
        }
    )


class ScriptedModel:
    """In-process model: ``policy(request, call_number) -> content blocks``."""

    offline = True

    def __init__(self, policy: Any, *, window: int = 200_000) -> None:
        self.policy = policy
        self.calls = 0
        self.profile = ModelProfile(name="scripted", context_window=window)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        return ModelResponse(message=message(self.policy(request, self.calls)), offline=True)

    async def count_tokens(self, request: ModelRequest) -> int | None:
        return None

    async def aclose(self) -> None:
        return None


class NoopContext:
    """Stand-in for the ContextManager seam where the real one is not the subject."""

    budget = 150_000

    def tools(self) -> list[Tool]:
        return []

    async def start(self) -> str:
        return ""

    async def prepare(self, messages: list[dict[str, Any]], **kw: Any) -> list[dict[str, Any]]:
        return messages

    def observe_usage(self, usage: Any, sent: list[dict[str, Any]]) -> None:
        pass

    async def admit_tool_result(self, call_id: str, tool: str, text: str) -> tuple[str, None]:
        return text, None

    def note_files_written(self, paths: list[str]) -> None:
        pass

    async def finish(self) -> None:
        pass


async def run_probe(
    tmp_path: Path, script: Any, **spec: Any
) -> tuple[MemberOutcome, FakeMessagesAPI]:
    """Run one ``probe`` member against the fake Messages API through the real client."""
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


async def scripted(
    box: Any, run_dir: Path, spec: MemberSpec, script: list[Any]
) -> tuple[MemberOutcome, FakeMessagesAPI]:
    """Run ``spec`` in ``box`` with the fake API answering from ``script``."""
    with FakeMessagesAPI(script) as api:
        model = anthropic_model(api)
        outcome = await run_member(
            spec, sandbox=box, model=model, run_dir=run_dir, trace=writer(run_dir, spec.id)
        )
        await model.aclose()
    return outcome, api


@asynccontextmanager
async def coding_box(
    client: Any, images: dict[str, str], run: str, files: dict[str, str]
) -> AsyncIterator[Any]:
    """A coding member's box with ``files`` (relative to /workspace) written in it."""
    spec = MemberSpec(id="coder", kind="coding", task="t").sandbox
    sandbox = await DockerBackend(client, images=images).create(spec, run=run, member="coder")
    async with sandbox:
        for path, text in files.items():
            await sandbox.write_file(f"/workspace/{path}", text)
        yield sandbox

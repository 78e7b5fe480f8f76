"""In-test stand-ins for the context-mechanism unit tests.

``MemoryBox`` (``tests/memory_box.py``) keeps a box's files in dicts, so the
mechanisms' message-list logic can be tested in milliseconds; it passes the sandbox
conformance suite but for the checks it lists, and the tests that count for the box
side run the same paths against the real Docker sandbox (tests/test_context_box.py).
``SummaryModel`` answers Messages requests in-process and records them. ``NoBoxes`` is
a backend that makes nothing, for tests of what sits on top of one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memory_box import MemoryBox

from sandbox.base import BoxInfo, Sandbox, SandboxBackend
from sandbox.errors import SandboxError
from sandbox.spec import SandboxSpec
from subagents.model.base import ModelError, ModelProfile, ModelRequest, ModelResponse
from subagents.model.message import Message


class NoBoxes(SandboxBackend):
    """A backend that makes nothing: enough to be registered and made."""

    def __init__(self, *, label: str = "") -> None:
        self.label = label

    async def create(self, spec: SandboxSpec, *, run: str, member: str) -> Sandbox:
        raise SandboxError("no boxes here")

    async def list_boxes(self, *, run: str | None = None) -> list[BoxInfo]:
        return []

    async def remove_run(self, run: str) -> int:
        return 0

    async def gc(
        self, *, live_runs: set[str] | None = None, now: float | None = None
    ) -> list[BoxInfo]:
        return []


def message(content: list[dict[str, Any]], *, input_tokens: int = 10) -> Message:
    """A response :class:`Message` holding ``content``."""
    stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
    return Message.model_validate(
        {
            "id": "msg_test",
            "type": "message",
            "role": "assistant",
            "model": "test-model",
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 5},
        }
    )


class SummaryModel:
    """Answers every request with ``summary`` (or raises ModelError when ``fail``)."""

    offline = False

    def __init__(self, summary: str = "", *, window: int = 200_000, fail: bool = False) -> None:
        self.profile = ModelProfile(name="test-model", context_window=window)
        self.summary = summary or (
            "## Session intent\nFinish the task.\n## Constraints\n-\n## Decisions\n-\n"
            "## Artifacts\n-\n## Unresolved problems\n-\n## Next steps\nContinue."
        )
        self.fail = fail
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        if self.fail:
            raise ModelError("overloaded", retryable=True, status=529)
        return ModelResponse(message=message([{"type": "text", "text": self.summary}]))

    async def count_tokens(self, request: ModelRequest) -> int | None:
        return None

    async def aclose(self) -> None:
        return None


class RefusingModel(SummaryModel):
    """A model that must not be called (the mechanisms should have made room)."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise AssertionError("the model was asked to summarize; offloading should have sufficed")


def context_manager(
    tmp_path: Path,
    config: Any = None,
    *,
    window: int = 200_000,
    todos: bool = False,
    task: str = "Do the task.",
) -> Any:
    """A real ContextManager on a MemoryBox, its summaries from a SummaryModel."""
    from subagents.context import ContextConfig, ContextManager
    from subagents.trace import TraceWriter

    model = SummaryModel(window=window)
    return ContextManager(
        config or ContextConfig(),
        profile=model.profile,
        model=model,
        sandbox=MemoryBox(),
        run_dir=tmp_path / "member",
        trace=TraceWriter(tmp_path / "trace.jsonl", run="r", member="m"),
        task=task,
        memory_dir=None,
        todos_enabled=todos,
    )

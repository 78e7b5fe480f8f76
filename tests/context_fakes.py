"""In-test stand-ins for the context-mechanism unit tests.

``MemoryBox`` keeps a box's files in a dict, so the mechanisms' message-list logic
can be tested in milliseconds; the tests that count for the box side run the same
paths against the real Docker sandbox (tests/test_context_box.py).
``SummaryModel`` answers Messages requests in-process and records them. ``NoBoxes`` is
a backend that makes nothing, for tests of what sits on top of one.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any

from sandbox.base import BoxInfo, ExecResult, FileInfo, Sandbox, SandboxBackend
from sandbox.errors import OutputLimitExceeded, SandboxCrashed, SandboxError
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


class MemoryBox(Sandbox):
    """A dict of files behind the Sandbox API; ``crashed=True`` makes every call fail."""

    def __init__(self) -> None:
        self.id = self.name = "memory-box"
        self.spec = SandboxSpec()
        self.files: dict[str, bytes] = {}
        self.crashed = False

    def _alive(self) -> None:
        if self.crashed:
            raise SandboxCrashed(self.name, "killed")

    async def exec(self, cmd: Any, **kw: Any) -> ExecResult:
        self._alive()
        if isinstance(cmd, list) and cmd[:3] == ["rm", "-rf", "--"]:
            target = self.resolve(cmd[3])
            for path in [p for p in self.files if p == target or p.startswith(target + "/")]:
                del self.files[path]
            return ExecResult(exit_code=0, stdout="", stderr="")
        return ExecResult(exit_code=127, stdout="", stderr="not supported by MemoryBox")

    async def read_file(self, path: str, *, limit: int = 64 * 1024 * 1024) -> bytes:
        self._alive()
        full = self.resolve(path)
        if full not in self.files:
            raise FileNotFoundError(path)
        data = self.files[full]
        if len(data) > limit:
            raise OutputLimitExceeded(f"{path} is over {limit}", limit=limit, size=len(data))
        return data

    async def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        self._alive()
        self.files[self.resolve(path)] = data.encode() if isinstance(data, str) else data

    async def list_dir(self, path: str) -> list[FileInfo]:
        raise NotImplementedError

    async def upload(self, local: Path, remote: str) -> None:
        self._alive()
        for item in Path(local).rglob("*"):  # noqa: ASYNC240 - tiny test dirs
            if item.is_file():
                rel = item.relative_to(local).as_posix()
                self.files[self.resolve(posixpath.join(remote, rel))] = item.read_bytes()

    async def download(self, remote: str, local: Path) -> None:
        raise NotImplementedError

    async def check(self) -> None:
        self._alive()

    async def close(self) -> None:
        pass


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

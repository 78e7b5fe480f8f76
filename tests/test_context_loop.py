"""The context mechanisms end to end: the real loop, the real ``anthropic`` client
against the fake Messages API on 127.0.0.1, and a real Docker box.

The scripted model is a policy on the fake server: it only sees what the harness
sends, so it can recover the needle only if the harness really saved a greppable
transcript and named it in the summary.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.docker.backend import DockerBackend, DockerSandbox
from sandbox.spec import SandboxSpec
from subagents.context import ContextConfig
from subagents.context.compaction import SUMMARY_SYSTEM, unmatched_tool_calls
from subagents.fake_api import FakeMessagesAPI, fault, reply, text, tool_use
from subagents.member import run_member
from subagents.model.base import ModelProfile
from subagents.model.claude import AnthropicModel
from subagents.spec import Limits, MemberSpec
from subagents.trace import TraceWriter, read_trace

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

TASK = (
    "Run the 60-step migration checklist (one shell step at a time) and report the "
    "rollout password printed at step 5. Constraint: never modify /workspace."
)
NEEDLE = "NEEDLE-58213"
PROFILE = ModelProfile(name="claude-test", context_window=200_000, max_output=8_192)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def box(docker_client, images, run_id: str) -> AsyncIterator[DockerSandbox]:
    backend = DockerBackend(docker_client, images=images)
    sandbox = await backend.create(SandboxSpec(), run=run_id, member="coder")
    async with sandbox:
        yield sandbox


def _texts(message: dict[str, Any]) -> list[str]:
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    out = []
    for block in content:
        if block.get("type") == "text":
            out.append(block["text"])
        elif block.get("type") == "tool_result":
            inner = block.get("content", "")
            out += [inner] if isinstance(inner, str) else [b.get("text", "") for b in inner]
    return out


def _system(body: dict[str, Any]) -> str:
    system = body.get("system", "")
    return system if isinstance(system, str) else " ".join(b.get("text", "") for b in system)


class MigrationPolicy:
    """60 shell steps (step 5 prints the needle), todos, then grep after compaction.

    The policy keeps no progress of its own: the step it runs next is read from
    what the harness sent (the latest ``step N:`` output, or the summary's "Steps
    1-N ran"), and the summary it writes is built from the messages it is asked to
    summarize. So a compaction that lost the progress or the goal shows up as a
    repeated or skipped step, or a wrong answer - goal drift.
    """

    def __init__(self) -> None:
        self.issued: list[int] = []
        self.transcript: str | None = None
        self.found: str | None = None
        self.summaries = 0

    @staticmethod
    def _done(messages: list[dict[str, Any]]) -> int:
        """The last step the context shows as run (0 if none)."""
        seen = [0]
        for message in messages:
            for chunk in _texts(message):
                seen += [int(n) for n in re.findall(r"step (\d+): ", chunk)]
                seen += [int(n) for n in re.findall(r"Steps 1-(\d+) ran", chunk)]
        return max(seen)

    def __call__(self, body: dict[str, Any]) -> Any:
        messages = body["messages"]
        if SUMMARY_SYSTEM in _system(body):
            self.summaries += 1
            done = self._done(messages)
            return text(
                "## Session intent\nRun the migration checklist and report the password.\n"
                f"## Artifacts\nSteps 1-{done} ran.\n## Next steps\nContinue with step "
                f"{done + 1}."
            )
        first = "\n".join(_texts(messages[0]))
        last = "\n".join(_texts(messages[-1]))
        if TASK not in first:
            return text("What should I be doing?")  # the goal is gone: drift
        match = re.search(r"saved at (\S+\.jsonl)", first)
        if match and self.transcript is None:
            self.transcript = match.group(1)
            return tool_use("grep", {"pattern": "NEEDLE-[0-9]+", "path": self.transcript})
        if self.transcript and self.found is None:
            hit = re.search(r"NEEDLE-[0-9]+", last)
            self.found = hit.group(0) if hit else "not found"
        step = self._done(messages) + 1
        if step > 60:
            return tool_use("submit_result", {"summary": f"Checklist done; password {self.found}."})
        self.issued.append(step)
        shell = tool_use("shell", {"command": self._command(step)})
        if step == 1:
            todos = [
                {"content": "run the 60 checklist steps", "status": "in_progress"},
                {"content": "report the rollout password", "status": "pending"},
            ]
            return reply(tool_use("write_todos", {"todos": todos}), shell)
        return shell

    @staticmethod
    def _command(n: int) -> str:
        if n == 5:
            return f"echo 'step 5: rollout password is {NEEDLE}'"
        return f"echo 'step {n}: ok'; head -c 3000 /dev/zero | tr '\\0' '.'; echo"


async def test_sixty_step_task_survives_compaction_at_15_percent_of_the_window(
    box: DockerSandbox, tmp_path: Path
) -> None:
    policy = MigrationPolicy()
    spec = MemberSpec(
        id="coder",
        kind="coding",
        task=TASK,
        limits=Limits(max_turns=120, deadline_s=300),
        todos=True,
        # Trigger at 20% of the 150,000-token budget = 30,000 tokens = 15% of the window.
        context=ContextConfig(compact_fraction=0.2),
    )
    run_dir = tmp_path / "members" / "coder"
    trace = TraceWriter(run_dir / "trace.jsonl", run="r", member="coder")
    with FakeMessagesAPI(policy) as api:
        async with AnthropicModel(
            "claude-test", api_key="t", base_url=api.url, profile=PROFILE
        ) as model:
            outcome = await run_member(spec, sandbox=box, model=model, run_dir=run_dir, trace=trace)
    trace.close()
    assert outcome.status == "ok", outcome.reason
    # Every step exactly once, in order: compaction lost neither progress nor goal.
    assert policy.issued == list(range(1, 61)) and policy.summaries >= 1
    assert outcome.result is not None and NEEDLE in outcome.result.summary

    compactions = [e for e in read_trace(trace.path) if e.type == "compaction"]
    assert compactions and all(e.tokens_before > 30_000 > e.tokens_after for e in compactions)
    assert compactions[0].transcript_path == policy.transcript
    host_copy = run_dir / "transcripts" / Path(policy.transcript).name
    assert NEEDLE in host_copy.read_text()

    agent_requests = [b for b in api.requests if SUMMARY_SYSTEM not in _system(b)]
    for body in agent_requests:
        assert unmatched_tool_calls(body["messages"]) == []
        assert body["messages"][0]["content"][0]["text"] == TASK  # the goal, verbatim, always
    after = [b for b in agent_requests if "compaction_summary" in "".join(_texts(b["messages"][0]))]
    assert after, "no request was sent from a compacted context"
    first_after = "\n".join(_texts(after[0]["messages"][0]))
    assert "[~] run the 60 checklist steps" in first_after  # todos survived
    assert NEEDLE not in first_after  # summarized away, recovered only by grep
    # The peak context the harness sent stayed near the trigger, far under the budget.
    assert max(len(str(b["messages"])) for b in agent_requests) < 40_000 * 4


async def test_memory_is_saved_to_the_host_when_the_member_fails(
    box: DockerSandbox, tmp_path: Path
) -> None:
    memory = tmp_path / "memory"
    memory.mkdir()
    (memory / "MEMORY.md").write_text("Deploys happen on Tuesdays.\n")
    script = [
        tool_use(
            "memory",
            {"command": "create", "path": "/memories/lesson.md", "file_text": "Port is 5432.\n"},
        ),
        fault(400, "invalid_request_error", "prompt is too long"),
    ]
    spec = MemberSpec(id="coder", kind="coding", task="Find the port.", memory_dir=memory)
    run_dir = tmp_path / "members" / "coder"
    trace = TraceWriter(run_dir / "trace.jsonl", run="r", member="coder")
    with FakeMessagesAPI(script) as api:
        async with AnthropicModel(
            "claude-test", api_key="t", base_url=api.url, profile=PROFILE, max_retries=0
        ) as model:
            outcome = await run_member(spec, sandbox=box, model=model, run_dir=run_dir, trace=trace)
    trace.close()
    assert outcome.status == "failed" and "model error" in outcome.reason
    assert (memory / "lesson.md").read_text() == "Port is 5432.\n"
    assert (memory / "MEMORY.md").read_text() == "Deploys happen on Tuesdays.\n"
    first = api.requests[0]["messages"][0]["content"]
    assert first[0]["text"] == "Find the port."
    assert (
        "Deploys happen on Tuesdays." in first[-1]["text"] and "may be stale" in first[-1]["text"]
    )
    writes = [e for e in read_trace(trace.path) if e.type == "memory_write"]
    assert [(w.command, w.path) for w in writes] == [("create", "/memories/lesson.md")]

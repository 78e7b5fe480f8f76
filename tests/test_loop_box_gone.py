"""A member whose real Docker box disappears mid-run ends ``crashed``, retryable.

The scripted model (a policy on the fake Messages API server) pauses at its second
turn while the test removes or closes the box, then asks for a shell command: the
tool call meets a box that is gone, and the member must end ``crashed`` with
``retryable=True`` (a new box may well succeed) - not ``failed``, not an error
result the model is asked to work around, and without hanging.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from loop_support import anthropic_model, events, writer

from sandbox.docker.backend import DockerBackend, DockerSandbox
from subagents.fake_api import FakeMessagesAPI, tool_use
from subagents.member import run_member
from subagents.results.outcome import MemberOutcome
from subagents.spec import Limits, MemberSpec

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def box(docker_client, images, run_id: str) -> AsyncIterator[DockerSandbox]:
    spec = MemberSpec(id="coder", kind="coding", task="t").sandbox
    sandbox = await DockerBackend(docker_client, images=images).create(
        spec, run=run_id, member="coder"
    )
    async with sandbox:
        yield sandbox


class PauseAtSecondTurn:
    """Turn 1: a shell command; turn 2: wait until the test says go, then another."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.go = threading.Event()
        self.calls = 0

    def __call__(self, body: dict[str, Any]) -> Any:
        self.calls += 1
        if self.calls == 2:
            self.reached.set()
            self.go.wait(30)
        return tool_use("shell", {"command": f"echo turn {self.calls}"})


async def run_and_break(
    box: DockerSandbox, tmp_path: Path, breaker: Callable[[], Any]
) -> MemberOutcome:
    policy = PauseAtSecondTurn()
    spec = MemberSpec(id="coder", kind="coding", task="Echo twice.", limits=Limits(deadline_s=60))
    outcome: MemberOutcome | None = None
    with FakeMessagesAPI(policy) as api:
        model = anthropic_model(api)

        async def member() -> None:
            nonlocal outcome
            outcome = await run_member(
                spec, sandbox=box, model=model, run_dir=tmp_path, trace=writer(tmp_path, "coder")
            )

        try:
            with anyio.fail_after(90):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(member)
                    assert await anyio.to_thread.run_sync(policy.reached.wait, 30)
                    await breaker()
                    policy.go.set()
        finally:
            policy.go.set()
            await model.aclose()
    assert outcome is not None
    assert policy.calls == 2  # the member stopped at the dead box, it did not go on
    return outcome


async def test_box_removed_mid_run_ends_member_crashed_and_retryable(
    box: DockerSandbox, docker_client, tmp_path: Path
) -> None:
    async def remove() -> None:
        container = docker_client.containers.get(box.id)
        await anyio.to_thread.run_sync(lambda: container.remove(force=True))

    outcome = await run_and_break(box, tmp_path, remove)
    assert outcome.status == "crashed", outcome.reason
    assert outcome.retryable
    assert outcome.reason.startswith("sandbox "), outcome.reason
    assert outcome.result is None and outcome.turns == 2
    results = events(tmp_path / "trace.jsonl", "tool_result")
    assert len(results) == 1 and "turn 1" in results[0].output  # no error result for turn 2
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["status"] == "crashed" and saved["retryable"] is True


async def test_box_closed_mid_run_ends_member_crashed_and_retryable(
    box: DockerSandbox, tmp_path: Path
) -> None:
    outcome = await run_and_break(box, tmp_path, box.close)
    assert outcome.status == "crashed", outcome.reason
    assert outcome.retryable
    assert "sandbox unavailable" in outcome.reason and "closed" in outcome.reason
    end = events(tmp_path / "trace.jsonl", "member_end")[-1]
    assert end.status == "crashed"


async def test_box_that_can_no_longer_start_processes_ends_member_crashed(
    box: DockerSandbox, docker_client, tmp_path: Path
) -> None:
    """Processes Fleet did not start take the whole pids limit: the next command cannot
    run, and the member must not go on (or end ``ok``) as if it had."""

    async def fill() -> None:
        filler = "while :; do sleep 1000 & done 2>/dev/null"
        api = docker_client.api
        exec_id = api.exec_create(box.id, ["sh", "-c", filler], user="1000:1000")
        api.exec_start(exec_id, detach=True)
        await anyio.sleep(3)

    outcome = await run_and_break(box, tmp_path, fill)
    assert outcome.status == "crashed", outcome.reason
    assert outcome.retryable
    assert outcome.reason == "sandbox crashed: process-limit", outcome.reason

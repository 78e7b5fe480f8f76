"""A resumed browser member opens again the page it had open: real browser boxes, real
Chromium, the corpus box, the real harness keeping its transcript and checkpoint
(:mod:`subagents.durable`), and a scripted offline model.

The first attempt opens a page, then its model fails for good; the second attempt,
in a fresh box whose browser has never opened anything, goes on from the transcript,
and its first look at the browser (``snapshot``) is that page.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from browser_support import CORPUS, browser_spec, corpus_box

from sandbox.docker.backend import DockerBackend
from subagents.durable import TRANSCRIPT
from subagents.member import run_member
from subagents.model.base import ModelRequest
from subagents.model.errors import ModelError
from subagents.model.offline import OfflineModel, with_required_fields
from subagents.spec import MemberSpec
from subagents.trace import TraceWriter, read_trace

pytestmark = [pytest.mark.docker, pytest.mark.chromium, pytest.mark.anyio, pytest.mark.slow]
PAGE = f"{CORPUS}/site/form.html"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _results(request: ModelRequest) -> list[Any]:
    return [
        b
        for m in request.messages
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]


def _first_life(request: ModelRequest) -> list[dict[str, Any]]:
    """Opens the page, then fails for good (as a model whose retries ran out)."""
    if not _results(request):
        return [{"type": "tool_use", "name": "navigate", "input": {"url": PAGE}}]
    raise ModelError("the model is gone for good")


def _second_life(request: ModelRequest) -> list[dict[str, Any]]:
    """Looks at the browser first, then submits."""
    if len(_results(request)) < 2:
        return [{"type": "tool_use", "name": "snapshot", "input": {}}]
    done = with_required_fields(request, {"summary": "looked again", "claims": []})
    return [{"type": "tool_use", "name": "submit_result", "input": done}]


async def test_a_resumed_browser_members_first_look_is_the_page_it_had_open(
    docker_client, images: dict[str, str], run_id: str, tmp_path: Path
) -> None:
    backend = DockerBackend(docker_client, images=images)
    spec = MemberSpec(id="b", kind="browser", task="Look at the form.", limits={"max_turns": 6})
    member_dir = tmp_path / "members" / "b"
    trace = TraceWriter(member_dir / "trace.jsonl", run=run_id, member="b")
    corpus = await corpus_box(backend, run_id, images)
    try:
        outcomes = []
        for life in (_first_life, _second_life):
            box = await backend.create(browser_spec(), run=run_id, member="b")
            try:
                outcomes.append(
                    await run_member(
                        spec,
                        sandbox=box,
                        model=OfflineModel(life),
                        run_dir=member_dir,
                        trace=trace,
                        conversation_file=member_dir / TRANSCRIPT,
                    )
                )
            finally:
                await box.close()
    finally:
        trace.close()
        with anyio.CancelScope(shield=True):
            await corpus.close()
    first, second = outcomes
    assert first.status == "failed" and "gone for good" in first.reason, first.reason
    assert second.status == "ok", second.reason
    events = list(read_trace(member_dir / "trace.jsonl"))
    (mark,) = [e for e in events if e.type == "resumed"]
    looked = next(e for e in events[events.index(mark) :] if e.type == "tool_result")
    # Its first look at the browser: the page it had open, not a blank tab.
    assert looked.tool == "snapshot" and not looked.is_error, looked.output[:500]
    assert PAGE in looked.output and "Sample form" in looked.output, looked.output[:500]
    assert mark.turn == 1 and mark.restored == f"page reloaded: {PAGE}", mark
    assert second.resumed_from == 1

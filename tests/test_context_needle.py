"""At the end of a 60-page run, what the member needs is still within its reach.

The real loop and context manager, the real ``anthropic`` client against the fake
Messages API on 127.0.0.1. A reader without file tools (like a browser member, so it
gets ``read_saved``) reads 60 pages of 15,000 tokens, each with one fact in its middle
(never in a preview), keeping a todo list. The policy on the fake server only sees
what the harness sends: at the end it must find the task verbatim, the todo list,
and page 0's fact - inline, or through the path its pointer names, read back with
``read_saved``. Aging (``subagents/context/aging.py``) shrinks each page once the
model has read it, so this is the test that it loses nothing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, ClassVar

import pytest
from loop_support import anthropic_model, writer
from pydantic import BaseModel, ConfigDict

from subagents.context import ContextConfig
from subagents.context.compaction import SUMMARY_SYSTEM
from subagents.fake_api import FakeMessagesAPI, reply, text, tool_use
from subagents.kinds import Kind, register_kind
from subagents.member import run_member
from subagents.spec import Limits, MemberSpec
from subagents.tools.base import Tool, ToolContext, ToolOutput
from subagents.trace import ModelCall, read_trace

pytestmark = pytest.mark.anyio

PAGES = 60
TASK = "Read the sixty pages of the audit and report the key of page 0."
LINE = "0123456789 abcdefghij klmnopqrst uvwxyz ABCDEFGHIJ KLMNOPQRST UVWXYZ 0123456789\n"
TODO = "collect every page's key"


def fact(n: int) -> str:
    return f"fact of page {n}: the key is K{n}-{n * 7919 % 10_007}"


class PageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int


class Page(Tool):
    """Page ``n``: 15,000 tokens, its fact in the middle."""

    name: ClassVar[str] = "page"
    description: ClassVar[str] = "Read one page of the audit."
    Input: ClassVar[type[BaseModel]] = PageIn

    async def run(self, args: PageIn, ctx: ToolContext) -> ToolOutput:
        half = LINE * 375  # 7,500 tokens
        return ToolOutput(text=f"page {args.n}\n{half}{fact(args.n)}\n{half}")


class Report(BaseModel):
    model_config = ConfigDict(extra="forbid")
    summary: str


register_kind(
    Kind(
        name="pages-reader",
        system_prompt="You read pages.",
        tools=lambda settings: [Page()],
        result_model=Report,
    )
)


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content", "")
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if isinstance(b, dict))


class Reader:
    """Reads the pages in order; at the end checks what it was sent, and says so."""

    def __init__(self) -> None:
        self.step = 0
        self.checks: dict[str, bool] = {}
        self.read_back: str | None = None

    def __call__(self, body: dict[str, Any]) -> Any:
        system = body.get("system", "")
        if not isinstance(system, str):
            system = "".join(b.get("text", "") for b in system)
        if SUMMARY_SYSTEM in system:
            return text("## Session intent\nread the pages\n## Next steps\ngo on")
        messages = body["messages"]
        step, self.step = self.step, self.step + 1
        if step == 0:
            todos = [{"content": TODO, "status": "in_progress"}]
            return reply(tool_use("write_todos", {"todos": todos}), tool_use("page", {"n": 0}))
        if step < PAGES:
            return tool_use("page", {"n": step})
        sent = json.dumps(messages)
        if step == PAGES:
            self.checks["task"] = TASK in json.dumps(messages[0])
            self.checks["todos"] = TODO in sent
            first = self._page0(messages)
            self.checks["page 0 inline"] = fact(0) in first
            path = re.search(r"Full content: (\S+)", first)
            if path is None:
                return tool_use("submit_result", {"summary": "page 0 is gone"})
            self.read_back = path.group(1)
            return tool_use("read_saved", {"path": path.group(1), "pattern": "fact of page 0:"})
        answer = _result_text(messages[-1]["content"][0])
        self.checks["page 0 read back"] = fact(0) in answer
        return tool_use("submit_result", {"summary": answer[-200:]})

    @staticmethod
    def _page0(messages: list[dict[str, Any]]) -> str:
        call_id = None
        for message in messages:
            for block in message.get("content") or []:
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "tool_use" and block.get("input") == {"n": 0}:
                    call_id = block["id"]
                if block.get("type") == "tool_result" and block.get("tool_use_id") == call_id:
                    return _result_text(block)
        return ""


async def test_an_early_page_is_reachable_after_sixty_pages(tmp_path: Path) -> None:
    policy = Reader()
    spec = MemberSpec(
        id="reader",
        kind="pages-reader",
        task=TASK,
        model="claude-sonnet-5",
        limits=Limits(max_turns=PAGES + 5, deadline_s=600),
        context=ContextConfig(todos=True),
    )
    with FakeMessagesAPI(policy) as api:
        model = anthropic_model(api)
        trace = writer(tmp_path, "reader")
        try:
            outcome = await run_member(
                spec, sandbox=None, model=model, run_dir=tmp_path, trace=trace
            )
        finally:
            await model.aclose()
        trace.close()
    assert outcome.status == "ok", outcome.reason
    # The page was aged (not kept whole), and nothing was lost: the pointer names a
    # file, and reading that file back gives the fact.
    assert policy.checks == {
        "task": True,
        "todos": True,
        "page 0 inline": False,
        "page 0 read back": True,
    }
    assert policy.read_back is not None and policy.read_back.startswith("offloads/")
    calls = [e for e in read_trace(tmp_path / "trace.jsonl") if isinstance(e, ModelCall)]
    sizes = [c.input_tokens + c.cache_read_tokens + c.cache_write_tokens for c in calls]
    # Keeping the three newest pages whole, this member sent 3.37M tokens, peak 68k.
    assert sum(sizes[: PAGES + 1]) <= 1_800_000 and max(sizes) <= 50_000

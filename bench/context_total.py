"""What a member's context costs in input tokens: the total over a run, its peak, and
whether an early page's fact is still reachable at the end (issue 43, goal 1).

    .venv/bin/python bench/context_total.py [--pages 60] [--cases 15000:1m,25000:200k]

One member reads ``--pages`` pages, one ``visit`` call each, then looks for a fact that
appeared only in the middle of the first page, and submits. It runs as in a run:
:func:`~subagents.member.run_member` with the real loop and context manager, its own
:class:`~subagents.model.claude.AnthropicModel` (the official ``anthropic`` client,
streaming) against the fake Messages API in *another process* (this script with
``--serve``), default :class:`~subagents.context.ContextConfig`. The model's window is
the case's: ``claude-sonnet-5`` (1M) or ``claude-sonnet-4-6`` (200k); both give the
150,000-token working-set budget. The member is a reader without file tools (like a
browser member), so what its context saves it reads back with ``read_saved``.

Counted as the fake API counts what it received (uncached + cache read + cache write,
the compaction summary calls included), for the workload's own calls: the ``pages``
page calls and the call after the last page (where a member would submit; here it
starts the needle search, whose one or two extra calls are not counted, so the total
is that of ``pages + 1`` calls as in the issue). The peak is the largest single call.

The needle: the fake model finds page 0's result in what it was sent (by the id of
the call that fetched page 0, as a model would). If the fact is there, it is found
inline; if the result is a pointer, the model reads the file the pointer names with
``read_saved`` (pattern search) and checks the fact is in the answer. "lost" means
neither worked: the figure does not count then.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import anyio
from pydantic import BaseModel, ConfigDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from context import LINE, METER, BenchResult  # the in-process "bench" kind and its result
from harness import fake_server, serve_policy, system_text

from subagents.context.compaction import SUMMARY_SYSTEM
from subagents.context.config import ContextConfig
from subagents.kinds import Kind, get_kind, register_kind
from subagents.member import run_member
from subagents.model.factory import make_model
from subagents.spec import Limits, MemberSpec
from subagents.tools.base import Tool, ToolContext, ToolOutput
from subagents.trace import ModelCall, Offload, TraceWriter, read_trace

MODELS = {"1m": "claude-sonnet-5", "200k": "claude-sonnet-4-6"}
PLAN = re.compile(r"PLAN\[(\d+):(\d+):(\w+)\]")
"""``PLAN[pages:size:nonce]`` in the member's task: what the fake model asks for."""
PEER = {
    ("15000", "1m"): 18_244_983,
    ("25000", "200k"): 753_111,
}
"""Deep Agents 0.7.32 on the same workloads, as recorded in issue 43 (not re-run here)."""


def fact(page: int, nonce: str) -> str:
    return f"fact of page {page}: the key is K{page}-{nonce}"


class VisitInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    page: int
    tokens: int
    nonce: str


class Visit(Tool):
    """A page of ``tokens`` tokens whose one fact sits in its middle (not in a preview)."""

    name: ClassVar[str] = "visit"
    description: ClassVar[str] = "Read one page."
    Input: ClassVar[type[BaseModel]] = VisitInput

    async def run(self, args: VisitInput, ctx: ToolContext) -> ToolOutput:
        with METER:
            half = LINE * max(1, args.tokens // 40)
            return ToolOutput(text=f"page {args.page}\n{half}{fact(args.page, args.nonce)}\n{half}")


register_kind(
    Kind(
        name="bench-pages",
        system_prompt=get_kind("bench").system_prompt,
        tools=lambda settings: [Visit()],
        result_model=BenchResult,
    )
)


# -- the fake model, in its own process ------------------------------------------------
def _page0_text(messages: list[dict[str, Any]]) -> str | None:
    """The text of page 0's tool result as the member sent it, found by its call id."""
    call_id = None
    for message in messages:
        for block in message.get("content") or []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use" and block.get("input", {}).get("page") == 0:
                call_id = block.get("id")
            if block.get("type") == "tool_result" and block.get("tool_use_id") == call_id:
                content = block.get("content")
                if isinstance(content, list):
                    return "".join(c.get("text", "") for c in content)
                return str(content)
    return None


def _last_result(messages: list[dict[str, Any]]) -> str:
    for block in messages[-1].get("content") or []:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            content = block.get("content")
            if isinstance(content, list):
                return "".join(c.get("text", "") for c in content)
            return str(content)
    return ""


def serve() -> None:
    """Serve the page plan on 127.0.0.1 until stdin closes; print the URL first."""
    from subagents.fake_api import text, tool_use

    steps: dict[str, int] = {}
    lock = threading.Lock()

    def policy(body: dict[str, Any]) -> Any:
        if SUMMARY_SYSTEM in system_text(body):
            return text("## Session intent\nbench\n## Next steps\ngo on")
        messages = body["messages"]
        found = PLAN.search(json.dumps(messages[0]))
        assert found is not None, "no PLAN[...] in the task"
        pages, size, nonce = int(found.group(1)), int(found.group(2)), found.group(3)
        with lock:
            step = steps.get(found.group(0), 0)
            steps[found.group(0)] = step + 1
        if step < pages:
            return tool_use("visit", {"page": step, "tokens": size, "nonce": nonce})
        needle = fact(0, nonce)
        if step == pages:
            first = _page0_text(messages) or ""
            if needle in first:
                return tool_use("submit_result", {"summary": f"inline: {needle}"})
            path = re.search(r"Full content: (\S+)", first)
            if path is None:
                return tool_use("submit_result", {"summary": "lost: no pointer"})
            args = {"path": path.group(1), "pattern": "fact of page 0:"}
            return tool_use("read_saved", args)
        if needle in _last_result(messages):
            return tool_use("submit_result", {"summary": f"read back: {needle}"})
        return tool_use("submit_result", {"summary": "lost: not in the file"})

    serve_policy(policy)


# -- one member ---------------------------------------------------------------------
@dataclass
class Figures:
    total: int
    """Input tokens of the workload's calls (pages + 1), summary calls included."""
    peak: int
    """Largest single call of those, as the API counted it."""
    cache_read: int
    calls: int
    offloads: int
    needle: str


async def run_case(pages: int, size: int, window: str, config: ContextConfig) -> Figures:
    nonce = os.urandom(4).hex()
    spec = MemberSpec(
        id="bench",
        kind="bench-pages",
        task=f"Read the pages and report their facts. PLAN[{pages}:{size}:{nonce}]",
        model=MODELS[window],
        limits=Limits(max_turns=pages + 5, deadline_s=3_600),
        context=config,
    )
    with tempfile.TemporaryDirectory() as tmp:
        trace = TraceWriter(Path(tmp) / "trace.jsonl", run="bench", member="bench")
        model = make_model(spec.model, kind=spec.kind, trace=trace)
        try:
            outcome = await run_member(
                spec, sandbox=None, model=model, run_dir=Path(tmp), trace=trace
            )
        finally:
            await model.aclose()
        trace.close()
        events = list(read_trace(Path(tmp) / "trace.jsonl"))
    assert outcome.status == "ok", outcome.reason
    calls = [e for e in events if isinstance(e, ModelCall) and e.turn <= pages + 1]
    sizes = [c.input_tokens + c.cache_read_tokens + c.cache_write_tokens for c in calls]
    data = getattr(outcome.result, "data", None) or {}
    summary = str(data.get("summary", ""))
    return Figures(
        total=sum(sizes),
        peak=max(sizes),
        cache_read=sum(c.cache_read_tokens for c in calls),
        calls=len(calls),
        offloads=sum(1 for e in events if isinstance(e, Offload)),
        needle=summary.split(":")[0] if fact(0, nonce) in summary else f"LOST ({summary})",
    )


def table(pages: int, cases: list[tuple[str, str]], config: ContextConfig) -> list[str]:
    rows = [
        "| pages x tokens | window | total input tokens | peak call | cache read share "
        "| calls | offloads | needle (page 0's fact) | Deep Agents 0.7.32 (issue 43) | ratio |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for size, window in cases:
        f = anyio.run(run_case, pages, int(size), window, config)
        peer = PEER.get((size, window)) if pages == 60 else None
        ratio = f"{f.total / peer:.2f}x" if peer else "-"
        rows.append(
            f"| {pages} x {int(size):,} | {window} | {f.total:,} | {f.peak:,} | "
            f"{f.cache_read / f.total:.0%} | {f.calls} | {f.offloads} | {f.needle} | "
            f"{f'{peer:,}' if peer else '-'} | {ratio} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=60)
    parser.add_argument(
        "--cases", default="15000:1m,25000:200k", help="SIZE:WINDOW,... (window 1m or 200k)"
    )
    parser.add_argument(
        "--config", default="{}", help="ContextConfig fields as JSON (default: the defaults)"
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    config = ContextConfig.model_validate(json.loads(args.config))
    cases = [tuple(c.split(":")) for c in args.cases.split(",")]
    with fake_server(__file__):
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
        print("\n".join(table(args.pages, cases, config)))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()

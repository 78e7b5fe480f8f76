"""What a member's context costs in input tokens: the total over a run, its peak, and
whether an early page's fact is still reachable at the end (issue 43, goal 1).

    .venv/bin/python bench/context_total.py [--pages 60] [--cases 15000:1m,25000:200k]
        [--config JSON] [--peer /tmp/peer-venv/bin/python]

One member reads ``--pages`` pages, one ``visit`` call each (the page's one fact in
its middle, never in a preview), then looks for the fact that appeared only on the
first page, and submits. It runs as in a run: :func:`~subagents.member.run_member`
with the real loop and context manager, its own
:class:`~subagents.model.claude.AnthropicModel` (the official ``anthropic`` client,
streaming) against the fake Messages API in *another process* (this script with
``--serve``), :class:`~subagents.context.ContextConfig` defaults unless ``--config``
names fields. The model's window is the case's: ``claude-sonnet-5`` (1M) or
``claude-sonnet-4-6`` (200k); both give the 150,000-token working-set budget. The
member is a reader without file tools (like a browser member), so what its context
saves it reads back with ``read_saved``.

Counted by the server, from the bodies it receives (every prompt block by the fake
API's rule, cached or not: the prompt cache moves tokens between uncached, cache read
and cache write, never out of the total), for the workload's own calls: the page
calls, the call after the last page (where a member would submit; here it starts the
needle search, whose extra calls are not counted), and any summary call among them.
The peak is the largest single call. The cache read share comes from Fleet's trace.

The needle: the fake model finds page 0's result in what it was sent (by the id of
the call that fetched page 0, as a model would). If the fact is there it is found
inline; if the result is a pointer, the model reads the file the pointer names back
with the harness's own tool and checks the fact is in the answer. "LOST" means
neither worked: the figure does not count then.

``--peer PYTHON`` also runs LangChain Deep Agents on the same workload against the
same server (``bench/context_total_peer.py`` under that interpreter: a throwaway
virtualenv with ``deepagents``, never the project's lock); its needle is read back
through its own pointers (an evicted result's file, or the history file its summary
names) with its own ``grep``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
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
from subagents.fake_api.usage import estimate_tokens, prompt_blocks
from subagents.kinds import Kind, get_kind, register_kind
from subagents.member import run_member
from subagents.model.factory import make_model
from subagents.results.outcome import MemberOutcome
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

    tally = Path(os.environ["CONTEXT_TOTAL_TALLY"])

    def policy(body: dict[str, Any]) -> Any:
        size_sent = sum(estimate_tokens(_uncached(b)) for b in prompt_blocks(body))
        tools = {t.get("name") for t in body.get("tools") or []}
        messages = body["messages"]
        # The task's plan, wherever the context keeps it (after a summary: the summary).
        found = PLAN.search(json.dumps(messages))
        if SUMMARY_SYSTEM in system_text(body) or not tools or found is None:
            _note(tally, {"summary": True, "tokens": size_sent})  # a summarizer's call
            plan = found.group(0) if found else ""
            return text(f"## Session intent\nbench {plan}\n## Next steps\ngo on")
        pages, size, nonce = int(found.group(1)), int(found.group(2)), found.group(3)
        with lock:
            step = steps.get(found.group(0), 0)
            steps[found.group(0)] = step + 1
        _note(tally, {"step": step, "tokens": size_sent})
        reply = _answer(step, pages, size, nonce, messages)
        if "submit_result" not in tools and reply["name"] == "submit_result":
            return text(reply["input"]["summary"])  # a peer ends with its final text
        return tool_use(reply["name"], reply["input"])

    serve_policy(policy)


def _uncached(block: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k != "cache_control"}


def _note(tally: Path, line: dict[str, Any]) -> None:
    with tally.open("a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


def _answer(
    step: int, pages: int, size: int, nonce: str, messages: list[dict[str, Any]]
) -> dict[str, Any]:
    """The next call of the plan: a page, then the needle search, then the end."""

    def call(name: str, **args: Any) -> dict[str, Any]:
        return {"name": name, "input": args}

    if step < pages:
        return call("visit", page=step, tokens=size, nonce=nonce)
    needle = fact(0, nonce)
    if step == pages:
        first = _page0_text(messages) or ""
        if needle in first:
            return call("submit_result", summary=f"inline: {needle}")
        ours = re.search(r"Full content: (\S+)", first)
        if ours is not None:
            return call("read_saved", path=ours.group(1), pattern="fact of page 0:")
        # Deep Agents' pointers: an evicted result's file, or (page 0 summarized away)
        # the conversation history its summary names; searched with its grep tool.
        history = r"history has been saved to (\S+?) should"
        peer = re.search(r"saved in the filesystem at this path: (\S+)", first) or re.search(
            history, json.dumps(messages)
        )
        if peer is not None:
            return call(
                "grep", pattern="fact of page 0:", path=peer.group(1), output_mode="content"
            )
        return call("submit_result", summary="lost: no pointer")
    if needle in _last_result(messages):
        return call("submit_result", summary=f"read back: {needle}")
    return call("submit_result", summary="lost: not in the file")


# -- one member ---------------------------------------------------------------------
@dataclass
class Figures:
    total: int
    """Input tokens of the workload's calls (pages + 1), summary calls included."""
    peak: int
    """Largest single call of those."""
    calls: int
    """Calls counted: the workload's own and any summary calls among them."""
    needle: str
    offloads: int | None = None
    cache_read: int | None = None
    """Of ``total``, read from the simulated prompt cache (Fleet's runs: its trace)."""


def counted(tally: Path, since: int, pages: int) -> tuple[int, int, int]:
    """(total, peak, calls) of what the server received since byte ``since``: every
    call up to the one after the last page, summary calls among them included."""
    with tally.open(encoding="utf-8") as lines:
        lines.seek(since)
        calls = [json.loads(line) for line in lines]
    last = next(i for i, c in enumerate(calls) if c.get("step") == pages)
    mine = calls[: last + 1]
    return sum(c["tokens"] for c in mine), max(c["tokens"] for c in mine), len(mine)


def needle_word(summary: str, nonce: str) -> str:
    return summary.split(":")[0] if fact(0, nonce) in summary else f"LOST ({summary[:60]})"


def run_fleet(pages: int, size: int, window: str, config: ContextConfig) -> Figures:
    nonce = os.urandom(4).hex()
    spec = MemberSpec(
        id="bench",
        kind="bench-pages",
        task=f"Read the pages and report their facts. PLAN[{pages}:{size}:{nonce}]",
        model=MODELS[window],
        limits=Limits(max_turns=pages + 5, deadline_s=3_600),
        context=config,
    )
    tally = Path(os.environ["CONTEXT_TOTAL_TALLY"])
    since = tally.stat().st_size
    outcome, events = anyio.run(member, spec)
    assert outcome.status == "ok", outcome.reason
    total, peak, calls = counted(tally, since, pages)
    traced = [e for e in events if isinstance(e, ModelCall) and e.turn <= pages + 1]
    data = getattr(outcome.result, "data", None) or {}
    return Figures(
        total=total,
        peak=peak,
        calls=calls,
        needle=needle_word(str(data.get("summary", "")), nonce),
        offloads=sum(1 for e in events if isinstance(e, Offload)),
        cache_read=sum(c.cache_read_tokens for c in traced),
    )


async def member(spec: MemberSpec) -> tuple[MemberOutcome, list[Any]]:
    """Run one member as a run does; its outcome and trace events."""
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
        return outcome, list(read_trace(Path(tmp) / "trace.jsonl"))


def run_peer(python: str, pages: int, size: int, window: str) -> Figures:
    """Deep Agents on the same workload, in its own virtualenv (never the project's),
    against the same fake server: ``bench/context_total_peer.py`` under ``python``."""
    nonce = os.urandom(4).hex()
    tally = Path(os.environ["CONTEXT_TOTAL_TALLY"])
    since = tally.stat().st_size
    script = Path(__file__).with_name("context_total_peer.py")
    task = f"Read the pages and report their facts. PLAN[{pages}:{size}:{nonce}]"
    done = subprocess.run(
        [python, str(script), "--model", MODELS[window], "--task", task],
        capture_output=True,
        text=True,
        timeout=3_600,
        check=True,
    )
    total, peak, calls = counted(tally, since, pages)
    return Figures(total=total, peak=peak, calls=calls, needle=needle_word(done.stdout, nonce))


def table(
    pages: int, cases: list[tuple[str, str]], config: ContextConfig, peer: str | None
) -> list[str]:
    rows = [
        "| pages x tokens | window | harness | total input tokens | peak call | cache read "
        "| calls counted | offloads | needle (page 0's fact) | Deep Agents (issue 43) | ratio |",
        "|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for size, window in cases:
        runs = [("Fleet", run_fleet(pages, int(size), window, config))]
        if peer:
            runs.append(("Deep Agents 0.7.32", run_peer(peer, pages, int(size), window)))
        recorded = PEER.get((size, window)) if pages == 60 else None
        for name, f in runs:
            ratio = f"{f.total / recorded:.2f}x" if recorded else "-"
            share = "-" if f.cache_read is None else f"{f.cache_read / f.total:.0%}"
            rows.append(
                f"| {pages} x {int(size):,} | {window} | {name} | {f.total:,} | {f.peak:,} | "
                f"{share} | {f.calls} | {'-' if f.offloads is None else f.offloads} | "
                f"{f.needle} | {f'{recorded:,}' if recorded else '-'} | {ratio} |"
            )
        if peer:
            rows.append(
                f"| | | Fleet / Deep Agents here | {runs[0][1].total / runs[1][1].total:.2f}x | | | | | | | |"
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
    parser.add_argument(
        "--peer", metavar="PYTHON", help="also run Deep Agents with this venv's python"
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    config = ContextConfig.model_validate(json.loads(args.config))
    cases = [tuple(c.split(":")) for c in args.cases.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        tally = Path(tmp) / "tally.jsonl"
        tally.touch()
        os.environ["CONTEXT_TOTAL_TALLY"] = str(tally)  # the server process inherits it
        with fake_server(__file__):
            print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
            rows = table(args.pages, cases, config, args.peer)  # type: ignore[arg-type]
            print("\n".join(rows))


if __name__ == "__main__":
    main()

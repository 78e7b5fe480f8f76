"""What a lead costs and what it keeps out of its own context, against the static pipeline.

Runs the same question twice through the real ``fleet research`` CLI, offline on the
corpus (real boxes, real Chromium, the offline lead and members): once as the static
pipeline (``--members N``: plan, N browser members, the analyst) and once with
``--lead`` (the offline lead: wave 1 from the same plan, then its follow-ups). From the
lead run's files it measures:

* the lead's context over waves: the context it sent at each model call (its trace's
  ``model_call`` events), the largest after each wave, against its context budget
  (the harness's working-set budget for its model) - and against what its members read
  in all (their input tokens), which is what the lead would hold if it read their work;
* the distillation ratio: tokens the members consumed (input, cache and output) to
  tokens of member results the lead was shown (its ``wait`` and ``read_result``
  answers, estimated as the harness estimates text); the goal is at least 20:1;
* the wall time of the lead run against the static one, and the part after wave 1
  (from the lead's second spawn to the run's end): what a second wave costs.

Usage: ``.venv/bin/python bench/lead.py [--question Q] [--members 3] [--repeat 1]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)  # bench/sandbox.py would shadow the sandbox package

from coordinator.rundir.runs import RunDir  # noqa: E402
from subagents.context.budget import Budget  # noqa: E402
from subagents.context.config import ContextConfig  # noqa: E402
from subagents.context.tokens import estimate_text  # noqa: E402
from subagents.model.profiles import profile_for  # noqa: E402
from subagents.trace import ModelCall, ToolResult, read_trace  # noqa: E402

FLEET = str(Path(sys.executable).with_name("fleet"))
QUESTION = (
    "How do Python's asyncio tasks get cancelled, and how does a program shield work "
    "from cancellation?"
)


def run(args: list[str], out: Path) -> tuple[float, RunDir]:
    """One ``fleet research`` run; its wall time and run directory."""
    t0 = time.monotonic()
    done = subprocess.run(
        [FLEET, "research", *args, "--output-dir", str(out), "--plain"],
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"fleet research {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    (rd,) = RunDir.list(out)
    return wall, rd


def tokens(outcome: dict[str, Any]) -> int:
    keys = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    return sum(int(outcome.get(k) or 0) for k in keys)


def measure(rd: RunDir) -> dict[str, Any]:
    """The lead run's figures (see the module docstring)."""
    events = list(read_trace(rd.path / "lead" / "trace.jsonl"))
    waves, per_wave, peak = 0, {}, 0
    for ev in events:
        if isinstance(ev, ToolResult) and ev.tool == "spawn" and not ev.is_error:
            waves += 1
        if isinstance(ev, ModelCall):
            per_wave[waves] = max(per_wave.get(waves, 0), ev.context_tokens)
            peak = max(peak, ev.context_tokens)
    model = next((e.model for e in events if isinstance(e, ModelCall)), "offline")
    budget = Budget.from_config(ContextConfig(), profile_for(model).context_window).tokens
    conversation = json.loads((rd.path / "lead" / "conversation.json").read_text())
    calls = {
        b["id"]: b["name"]
        for m in conversation["messages"]
        for b in m["content"]
        if b.get("type") == "tool_use"
    }
    shown = sum(
        estimate_text("".join(p.get("text", "") for p in b.get("content") or []))
        for m in conversation["messages"]
        for b in m["content"]
        if b.get("type") == "tool_result" and calls.get(b["tool_use_id"]) in ("wait", "read_result")
    )
    results = {m: o.model_dump(mode="json") for m, o in rd.outcomes().items()}
    consumed = sum(tokens(r) for r in results.values())
    read = sum(int(r.get("input_tokens") or 0) + int(r.get("cache_read_tokens") or 0)
               for r in results.values())  # fmt: skip
    spawns = [e.ts for e in rd.journal.read() if e.event == "lead_spawn"]
    end = next(e.ts for e in reversed(rd.journal.read()) if e.event == "run_finished")
    return {
        "waves": len(spawns),
        "members": len(results),
        "lead_context_by_wave": per_wave,
        "lead_peak_context": peak,
        "lead_budget": budget,
        "members_read": read,
        "members_consumed": consumed,
        "lead_shown_of_results": shown,
        "distillation": round(consumed / max(1, shown), 1),
        "after_wave_1_s": round(end - spawns[1], 1) if len(spawns) > 1 else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--question", default=QUESTION)
    ap.add_argument("--members", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=1)
    opts = ap.parse_args()
    statics, leads, figures = [], [], []
    with tempfile.TemporaryDirectory(prefix="fleet-bench-lead-") as tmp:
        for i in range(opts.repeat):
            q, n = opts.question, str(opts.members)
            wall, _ = run([q, "--members", n], Path(tmp) / f"static-{i}")
            statics.append(wall)
            wall, rd = run([q, "--lead", "--members", n], Path(tmp) / f"lead-{i}")
            leads.append(wall)
            figures.append(measure(rd))
    f = figures[-1]
    print(f"question: {opts.question}")
    print(f"lead run: {f['waves']} waves, {f['members']} members")
    by_wave = ", ".join(
        f"after wave {w}: {t:,}" for w, t in sorted(f["lead_context_by_wave"].items())
    )
    print(f"lead context (tokens sent per call, largest): {by_wave}")
    print(
        f"lead peak context {f['lead_peak_context']:,} of its {f['lead_budget']:,}-token budget "
        f"({100 * f['lead_peak_context'] / f['lead_budget']:.1f}%); members read "
        f"{f['members_read']:,} tokens ({f['members_read'] / max(1, f['lead_peak_context']):.0f}x "
        "the lead's peak)"
    )
    print(
        f"distillation: members consumed {f['members_consumed']:,} tokens, the lead was shown "
        f"{f['lead_shown_of_results']:,} of their results: {f['distillation']}:1 (goal >= 20:1)"
    )
    static, led = statistics.median(statics), statistics.median(leads)
    print(
        f"wall time (median of {opts.repeat}): static pipeline {static:.1f} s, lead {led:.1f} s "
        f"({led / static:.2f}x); after wave 1 the lead run took {f['after_wave_1_s']} s more"
    )


if __name__ == "__main__":
    main()

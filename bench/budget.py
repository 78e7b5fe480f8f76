"""One budget for a fan-out: what a run spends against its hard line.

``--members`` coding members (real boxes, the real ``anthropic`` client) run ``--turns``
shell steps each against the fake Messages API on 127.0.0.1, through ``fleet run``,
under ``[budget] usd = --usd``. Two ways, one after the other:

- ``reserved``: this tree - every call reserved against the budget before it goes out
  (its input at the input price, its ``max_tokens`` of output) and settled after;
- ``counted``: the same budget with every reservation made zero, so a call goes out
  whenever what was spent so far is under the line (counting only after the answer, as a
  budget without reservations does).

Printed per way: spent against the hard line, the most one call cost, and how many
members ended ok / stopped by the budget.

Usage: ``.venv/bin/python bench/budget.py [--members 16] [--turns 12] [--usd 0.10 | --tokens N] [--max-tokens 256]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)
sys.path.insert(1, str(ROOT / "tests"))  # the coding policy of the tests

MODEL = "claude-sonnet-5"


def _policy(turns: int) -> Any:
    from fleet_policies import coding_policy

    from subagents.fake_api import tool_use

    inner = coding_policy(turns=turns)

    def policy(body: dict[str, Any]) -> Any:
        if (body.get("tool_choice") or {}).get("name") == "submit_result":
            return tool_use("submit_result", {"summary": "stopped", "tests_run": [], "notes": []})
        return inner(body)

    return policy


def _run(way: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from coordinator.cli import main
    from coordinator.rundir.runs import RunDir
    from subagents import budget
    from subagents.model.profiles import profile_for
    from subagents.spend.usage import Usage
    from subagents.trace import read_trace

    if way == "counted":
        real = (budget.BudgetedModel._input, budget.BudgetedModel._output)

        def nothing(self: Any, _n: int) -> budget.Amount:
            return budget.Amount()

        budget.BudgetedModel._input = nothing  # type: ignore[method-assign]
        budget.BudgetedModel._output = nothing  # type: ignore[method-assign]
    job = out / way / "job.toml"
    job.parent.mkdir(parents=True)
    text = f'name = "bench"\noutput_dir = "{out / way / "runs"}"\n'
    text += f'[model]\nname = "{MODEL}"\nmax_tokens = {args.max_tokens}\n'
    text += f"[fanout]\nmax_parallel = {args.members}\nmin_success = 0\n"
    line = f"tokens = {args.tokens}" if args.tokens else f"usd = {args.usd}"
    text += f"[synthesis]\nenabled = false\n[budget]\n{line}\n"
    for i in range(args.members):
        text += f'[[members]]\nid = "m{i + 1}"\nkind = "coding"\ntask = "List the files."\n'
    job.write_text(text)
    try:
        main(["run", str(job), "--plain"])
    except SystemExit:
        pass
    if way == "counted":
        budget.BudgetedModel._input, budget.BudgetedModel._output = real  # type: ignore[method-assign]
    (run,) = RunDir.list(out / way / "runs")
    profile = profile_for(MODEL)
    costs = []
    tokens = 0.0
    for trace in (run.path / "members").glob("*/trace.jsonl"):
        for e in read_trace(trace):
            if e.type == "model_call":
                tokens += e.input_tokens + e.cache_write_tokens + e.output_tokens
                tokens += e.cache_read_tokens * 0.1
                u = Usage()
                u.add(
                    type(
                        "U",
                        (),
                        {
                            "input_tokens": e.input_tokens,
                            "output_tokens": e.output_tokens,
                            "cache_read_input_tokens": e.cache_read_tokens,
                            "cache_creation_input_tokens": e.cache_write_tokens,
                        },
                    ),
                    profile,
                )
                costs.append(u.cost_usd)
    results = [json.loads(p.read_text()) for p in (run.path / "members").glob("*/result.json")]
    return {
        "tokens": tokens,
        "spent": sum(costs),
        "max_call": max(costs),
        "ok": sum(r["status"] == "ok" for r in results),
        "budget": sum(r.get("limit") == "budget" for r in results),
        "partial": sum(bool(r.get("partial_result")) for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=16)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--usd", type=float, default=0.10)
    parser.add_argument("--tokens", type=int, default=None, help="a token line instead of --usd")
    parser.add_argument("--max-tokens", type=int, default=256, help="[model] max_tokens")
    args = parser.parse_args()
    from subagents.fake_api import FakeMessagesAPI

    api = FakeMessagesAPI(_policy(args.turns)).start()
    os.environ["ANTHROPIC_API_KEY"] = "bench-key"
    os.environ["ANTHROPIC_BASE_URL"] = api.url
    hard = f"{args.tokens:,} tokens" if args.tokens else f"${args.usd:g}"
    print(
        f"{args.members} members x {args.turns} turns, max_tokens {args.max_tokens}, hard line {hard}"
    )
    print(
        "| way | spent | spent / hard line | most one call cost | ok | stopped (budget) | with partial result |"
    )
    print("|---|---|---|---|---|---|---|")
    try:
        with tempfile.TemporaryDirectory(prefix="fleet-bench-budget-") as tmp:
            for way in ("reserved", "counted"):
                r = _run(way, args, Path(tmp))
                spent = f"{r['tokens']:,.0f} tokens" if args.tokens else f"${r['spent']:.4f}"
                share = r["tokens"] / args.tokens if args.tokens else r["spent"] / args.usd
                print(
                    f"| {way} | {spent} | {share:.0%} | "
                    f"${r['max_call']:.4f} | {r['ok']} | {r['budget']} | {r['partial']} |",
                    flush=True,
                )
    finally:
        api.stop()


if __name__ == "__main__":
    main()

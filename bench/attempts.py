"""Parallel attempts: what three cost against one, in wall time and in the review's tokens.

Each run is the real ``fleet code REPO TASK --test CMD --attempts N --plain`` process on a
copy of ``examples/sample-repo``; its members talk to the fake Messages API (in another
process, on 127.0.0.1) through the real ``anthropic`` client, every call answered after
500 ms. An attempt takes 5 turns with one box exec each, then edits ``greet.py`` its own
way (so the patches differ and the reviewer is called), then submits: about 3.5 s of
model latency, as in ``bench/fanout.py``; Fleet re-runs the test in each attempt's box.
The reviewer (one call, all candidates at once) answers after the same 500 ms. The fake
API counts tokens from the bytes it is sent (``subagents/fake_api/usage.py``), so the
review's share is that of the real prompts' sizes.

Printed, as medians over ``--rounds`` (each round runs 1 attempt, then 3):

1. wall time of 3 attempts against 1. Goal: <= 1.3x (they run at once).
2. the reviewer's tokens (input + output) against the three attempts' own. Goal: <= 15%.

Usage: ``.venv/bin/python bench/attempts.py [--rounds 5] [--attempts 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT / "tests")  # bench/sandbox.py would shadow the package
sys.path.insert(1, str(ROOT))

FLEET = str(Path(sys.executable).with_name("fleet"))
LATENCY_S = 0.5
TURNS = 5
TEST = "python3 test_greet.py"
OLD = 'return f"Hello, {name}!"'
WORDS = ("there", "again", "and welcome", "friend", "at last", "once more", "indeed", "all")


def policy(body: dict[str, Any]) -> Any:
    from subagents.fake_api import tool_use

    if "You review candidate patches" in json.dumps(body.get("system", "")):
        first = json.dumps(body["messages"][0])
        n = int(re.findall(r"## Attempt (\d)", first)[-1])
        return tool_use(
            "choose_attempt", {"attempt": n, "reason": "the plainest wording"}, latency_s=LATENCY_S
        )
    found = re.search(r"Attempt (\d) of", json.dumps(body["messages"][0]))
    n = int(found.group(1)) if found else 1
    step = sum(
        1
        for m in body.get("messages") or []
        if m.get("role") == "user" and isinstance(m.get("content"), list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    )
    if step < TURNS:
        return tool_use("shell", {"command": f"echo step {step}"}, latency_s=LATENCY_S)
    if step == TURNS:
        new = f'return f"Hello {WORDS[(n - 1) % len(WORDS)]}, {{name}}!"'
        args = {"path": "greet.py", "old_string": OLD, "new_string": new}
        return tool_use("edit_file", args, latency_s=LATENCY_S)
    report = {"summary": f"attempt {n} reworded the greeting", "tests_run": [TEST], "notes": []}
    return tool_use("submit_result", report, latency_s=LATENCY_S)


def serve() -> None:
    """The fake Messages API with :func:`policy`, until stdin closes."""
    from subagents.fake_api import FakeMessagesAPI

    api = FakeMessagesAPI(policy).start()
    api.record = lambda entry: None  # type: ignore[method-assign]  # keep no bodies
    print(api.url, flush=True)
    sys.stdin.read()
    api.stop()


def timed(base: Path, attempts: int) -> tuple[float, dict[str, Any]]:
    """(wall seconds, the member's result.json) of one ``fleet code`` run."""
    repo = base / f"repo-{time.monotonic_ns()}"
    shutil.copytree(ROOT / "examples" / "sample-repo", repo)
    out = base / "runs"
    args = ["code", str(repo), "Make the greeting warmer.", "--test", TEST]
    args += ["--attempts", str(attempts), "--output-dir", str(out), "--plain"]
    t0 = time.monotonic()
    done = subprocess.run([FLEET, *args], capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"bench: fleet code failed:\n{done.stdout}\n{done.stderr[-3000:]}")
    latest = max(out.iterdir(), key=lambda p: p.stat().st_mtime)
    result = json.loads((latest / "members" / "coder" / "result.json").read_text())
    return wall, result


def tokens(record: dict[str, Any]) -> int:
    keys = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    return sum(int(record.get(k) or 0) for k in keys)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--attempts", type=int, default=3)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return 0
    from process_support import served_api

    with served_api([sys.executable, __file__, "--serve"]):
        return measure(args)


def measure(args: argparse.Namespace) -> int:
    ones, many, shares, by = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="fleet-bench-attempts-") as tmp:
        base = Path(tmp)
        timed(base, 1)  # warm-up: images, imports, the page cache
        for r in range(args.rounds):
            one, _ = timed(base, 1)
            wall, result = timed(base, args.attempts)
            ones.append(one)
            many.append(wall)
            spent = sum(tokens(a) for a in result["attempts"])
            review = tokens(result["choice"])
            shares.append(review / spent)
            by.append(result["choice"]["by"])
            print(
                f"round {r + 1}: 1 attempt {one:.2f}s  {args.attempts} attempts {wall:.2f}s "
                f"({wall / one:.2f}x)  review {review:,} tokens of the attempts' {spent:,} "
                f"({review / spent:.1%}, chosen by {by[-1]})",
                flush=True,
            )
    med = statistics.median
    ratio = med(many) / med(ones)
    share = med(shares)
    print(f"\nload average {os.getloadavg()[0]:.2f}; medians over {args.rounds} rounds")
    print("| figure | measured | goal | met |")
    print("|---|---|---|---|")
    print(
        f"| wall time, {args.attempts} attempts vs 1 | {med(many):.2f} s vs {med(ones):.2f} s "
        f"({ratio:.2f}x) | <= 1.3x | {'yes' if ratio <= 1.3 else 'no'} |"
    )
    print(
        f"| the review's tokens vs the attempts' own | {share:.1%} (chosen by "
        f"{', '.join(sorted(set(by)))}) | <= 15% | {'yes' if share <= 0.15 else 'no'} |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A coding member's `fleet run` SIGKILLed at turn 40 of 50, then `fleet resume`.

Real boxes, the real harness, the real ``anthropic`` client against the fake Messages
API on 127.0.0.1. Each of the member's 50 turns appends ``line k`` to
``/workspace/log.txt``; the whole ``fleet run`` process is SIGKILLed once 40 tool
results are in its trace. Prints the member's model calls after the resume (goal: at
most 12; before this work a resumed member started at turn 0: 51), the turn it went on
from, whether the workspace it went on with was the one at that turn (the checkpoint
on disk at the kill holds lines 0 .. turn-1), and whether the final patch holds every
line exactly once.

    .venv/bin/python bench/resume.py [--steps 50] [--kill-at 40]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT / "tests")
sys.path.insert(1, str(ROOT))
FLEET = [str(Path(sys.executable).with_name("fleet"))]
TASK = "Append the lines."


def _member_calls(api: Any) -> int:
    return sum(1 for r in api.requests if TASK in json.dumps(r["messages"][0]))


def _results(trace: Path) -> int:
    from subagents.trace import read_trace

    return sum(1 for e in read_trace(trace) if e.type == "tool_result") if trace.exists() else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--kill-at", type=int, default=40)
    args = ap.parse_args()
    from fleet_policies import appending_policy

    from coordinator.runs import RunDir
    from subagents.fake_api import FakeMessagesAPI
    from subagents.trace import read_trace

    api = FakeMessagesAPI(appending_policy(args.steps, latency_s=0.2)).start()
    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-resume-"))
    job = tmp / "job.toml"
    job.write_text(
        f'name = "resume"\noutput_dir = "{tmp / "runs"}"\n[model]\nname = "claude-sonnet-5"\n'
        f'[[members]]\nid = "m"\nkind = "coding"\ntask = "{TASK}"\n'
        f"[members.limits]\nmax_turns = {args.steps + 10}\n"
    )
    env = {**os.environ, "ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url}
    try:
        proc = subprocess.Popen(
            [*FLEET, "run", str(job), "--plain"], env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        while proc.poll() is None:
            found = list((tmp / "runs").glob("*/members/m/trace.jsonl"))
            if found and _results(found[0]) >= args.kill_at:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        (run,) = RunDir.list(tmp / "runs")
        mdir = run.path / "members" / "m"
        before = _member_calls(api)
        kept = {
            int(m.group(1)): p.read_bytes()
            for p in mdir.iterdir()
            if (m := re.fullmatch(r"checkpoint-(\d+)\.bin", p.name))
        }
        t0 = time.monotonic()
        done = subprocess.run(
            [*FLEET, "resume", str(run.path), "--plain"], env=env, capture_output=True, text=True
        )
        took = time.monotonic() - t0
        if done.returncode != 0:
            print(done.stderr[-3000:])
            return 1
        after = _member_calls(api) - before
        (mark,) = [e for e in read_trace(mdir / "trace.jsonl") if e.type == "resumed"]
        base = kept.get(max((t for t in kept if t <= mark.turn), default=-1))
        at_turn = re.findall(rb"^\+line (\d+)$", base, re.M) if base is not None else []
        workspace_equal = [int(x) for x in at_turn] == list(range(mark.turn))
        patch = run.result("m")["result"]["patch"]
        lines = re.findall(r"^\+line (\d+)$", patch, re.M)
        print(f"killed after {before} model calls; resumed from turn {mark.turn} ({mark.restored})")
        print(f"model calls after the resume: {after} (goal <= 12; from turn 0: {args.steps + 1})")
        print(f"workspace at the resume equals turn {mark.turn}'s: {workspace_equal}")
        print(
            f"final patch: every line once, in order: {lines == [str(k) for k in range(args.steps)]}"
        )
        print(f"fleet resume took {took:.1f} s; status {run.result('m')['status']}")
    finally:
        api.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

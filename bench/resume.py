"""A coding member's `fleet run` SIGKILLed at turn 40 of 50, then `fleet resume`.

Real boxes, the real harness, the real ``anthropic`` client against the fake Messages
API on 127.0.0.1. Each of the member's 50 turns appends ``line k`` to
``/workspace/log.txt``; the whole ``fleet run`` process is SIGKILLed once 40 tool
results are in its trace. Prints the member's model calls after the resume (goal: at
most 12; before this work a resumed member started at turn 0: 51), the turn it went on
from, whether the workspace it went on with was the one at that turn (the checkpoint
on disk at the kill holds lines 0 .. turn-1), and whether the final patch holds every
line exactly once.

With ``--cluster`` the run is ``fleet run --cluster`` / ``fleet resume --cluster`` on
a Ray cluster of two nodes started on this machine for the bench (``tests/ray_support.py``:
loopback only, token authentication on, stopped at the end); the member's transcript
and checkpoint are then the copies its node sent to the coordinator.

    .venv/bin/python bench/resume.py [--steps 50] [--kill-at 40] [--when transcript|trace] [--cluster]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT / "tests")
sys.path.insert(1, str(ROOT))
FLEET = [str(Path(sys.executable).with_name("fleet"))]
CODER = "careful software engineer"
"""Opens the coding member's system prompt."""
TASK = "Append the lines."


def _member_calls(api: Any) -> int:
    return sum(1 for r in api.requests if CODER in json.dumps(r.get("system")))


def _done(mdir: Path, when: str) -> int:
    """Tool results of the member so far: in its trace, or in its saved transcript."""
    from subagents.trace import read_trace

    if when == "trace":
        trace = mdir / "trace.jsonl"
        return sum(1 for e in read_trace(trace) if e.type == "tool_result") if trace.exists() else 0
    try:
        messages = json.loads((mdir / "conversation.json").read_bytes())["messages"]
    except (OSError, ValueError, KeyError):
        return 0
    return sum(
        1
        for m in messages
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    )


@contextlib.contextmanager
def _where(cluster: bool, env: dict[str, str]) -> Iterator[list[str]]:
    """The flags that put the run on a cluster of this machine (none: this machine)."""
    if not cluster:
        yield []
        return
    from ray_support import environment, ray_cluster

    saved = dict(os.environ)
    os.environ.update(env)  # the nodes' model clients read their own environment
    try:
        with ray_cluster(nodes=2) as found, environment(found.env):
            env.update(os.environ)  # the cluster's token, for fleet
            yield ["--cluster", found.address]
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--kill-at", type=int, default=40)
    ap.add_argument(
        "--when",
        choices=["transcript", "trace"],
        default="transcript",
        help="kill once turn N is in the member's transcript (default), or as soon as its "
        "tool result is in the trace (before the turn's checkpoint is written)",
    )
    ap.add_argument("--cluster", action="store_true", help="on a Ray cluster of this machine")
    args = ap.parse_args()
    from fleet_policies import appending_policy

    from subagents.fake_api import FakeMessagesAPI

    api = FakeMessagesAPI(appending_policy(args.steps, latency_s=0.2)).start()
    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-resume-"))
    job = tmp / "job.toml"
    job.write_text(
        f'name = "resume"\noutput_dir = "{tmp / "runs"}"\n[model]\nname = "claude-sonnet-5"\n'
        f'[[members]]\nid = "m"\nkind = "coding"\ntask = "{TASK}"\n'
        f"[members.limits]\nmax_turns = {args.steps + 10}\n"
    )
    env = {**os.environ, "ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url}
    env.pop("FLEET_CLUSTER", None)
    try:
        with _where(args.cluster, env) as where:
            return _measure(args, job, env, where, api)
    finally:
        api.stop()


def _measure(args: Any, job: Path, env: dict[str, str], where: list[str], api: Any) -> int:
    from coordinator.rundir.runs import RunDir
    from subagents.kinds.results import CodingResult
    from subagents.trace import read_trace

    tmp = job.parent
    proc = subprocess.Popen(
        [*FLEET, "run", str(job), "--plain", *where], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    while proc.poll() is None:
        found = list((tmp / "runs").glob("*/members/m"))
        if found and _done(found[0], args.when) >= args.kill_at:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    # A call sent just before the kill reaches the server's log a moment later.
    time.sleep(1)
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
        [*FLEET, "resume", str(run.path), "--plain", *where],
        env=env,
        capture_output=True,
        text=True,
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
    outcome = run.outcome("m")
    patch = outcome.result.patch if outcome and isinstance(outcome.result, CodingResult) else ""
    lines = re.findall(r"^\+line (\d+)$", patch, re.M)
    print(f"killed after {before} model calls; resumed from turn {mark.turn} ({mark.restored})")
    print(f"model calls after the resume: {after} (goal <= 12; from turn 0: {args.steps + 1})")
    print(f"workspace at the resume equals turn {mark.turn}'s: {workspace_equal}")
    print(f"final patch: every line once, in order: {lines == [str(k) for k in range(args.steps)]}")
    print(f"fleet resume took {took:.1f} s; status {outcome.status if outcome else 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

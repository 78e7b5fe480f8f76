"""A member goes on from its last completed turn: ``fleet run`` SIGKILLed mid-member,
then ``fleet resume`` - real boxes, the real harness, the real ``anthropic`` client
against the fake Messages API on 127.0.0.1. A crashed box's retry starts over unless
the job says ``resume = "always"``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fleet_policies import appending_policy

from coordinator.rundir.runs import RunDir
from subagents.trace import read_trace

pytestmark = pytest.mark.docker
FLEET = [str(Path(sys.executable).with_name("fleet"))]
CODER = "careful software engineer"
"""Opens the coding member's system prompt."""


def _job(tmp_path: Path, *, retry: str = "", memory: str = "", repo: str = "") -> Path:
    sandbox = f'\nsandbox = {{ memory = "{memory}" }}' if memory else ""
    sandbox += f'\nrepo = "{repo}"' if repo else ""
    text = (
        f'name = "t"\noutput_dir = "{tmp_path / "runs"}"\n[model]\nname = "claude-sonnet-5"\n'
        f"[fanout]\n[fanout.retry]\nbackoff_s = 0\n{retry}\n"
        f'[[members]]\nid = "m"\nkind = "coding"\ntask = "Append the lines."{sandbox}\n'
    )
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def _tool_results(trace: Path) -> int:
    if not trace.exists():
        return 0
    return sum(1 for e in read_trace(trace) if e.type == "tool_result")


def _run_to_the_end(api: Any, job: Path) -> RunDir:
    """``fleet run JOB`` to its end; its one run, whose member ended ``ok``."""
    env = {**os.environ, "ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url}
    done = subprocess.run(
        [*FLEET, "run", str(job), "--plain"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = RunDir.list(job.parent / "runs")
    assert run.outcome("m").status == "ok"
    return run


def _member_calls(api: Any) -> list[dict[str, Any]]:
    """The coding member's requests (the analyst's also name its task)."""
    return [r for r in api.requests if CODER in json.dumps(r.get("system"))]


def _patch_lines(run: RunDir) -> list[str]:
    patch = run.outcome("m").result.patch
    return [ln[1:] for ln in patch.splitlines() if ln.startswith("+line ")]


def test_sigkilled_member_resumes_from_its_last_turn_with_its_workspace(
    tmp_path, images, fake_api, cleanup
):
    steps, kill_after = 14, 9
    api = fake_api(appending_policy(steps, latency_s=0.3))
    cleanup.append(tmp_path / "runs")
    # A repository, and a temporary directory of the run's own: its staged copy is seen.
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "app.py").write_text("TOKEN = 'from the repository'\n")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url}
    env["TMPDIR"] = str(tmp)
    proc = subprocess.Popen(
        [*FLEET, "run", str(_job(tmp_path, repo="repo")), "--plain"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    trace = tmp_path / "runs"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            found = list(trace.glob("*/members/m/trace.jsonl"))
            if found and _tool_results(found[0]) >= kill_after:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else ""
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        # A call sent just before the kill reaches the server's log a moment later.
        time.sleep(1)
    finally:
        if proc.poll() is None:
            proc.kill()
    (run,) = RunDir.list(tmp_path / "runs")
    calls_before = len(_member_calls(api))
    assert kill_after <= calls_before < steps, calls_before
    # The kill ran no cleanup: the copy of the repository is left, beside its lock.
    (left,) = [p for p in tmp.glob("fleet-repo-*") if p.is_dir()]
    assert (left / "app.py").exists()

    resumed = subprocess.run(
        [*FLEET, "resume", str(run.path), "--plain"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert run.outcome("m").status == "ok"
    # The resume's staging swept the dead run's copy, and its own went as it ended.
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("fleet-repo-")]
    calls_after = len(_member_calls(api)) - calls_before
    (mark,) = [
        e for e in read_trace(run.path / "members" / "m" / "trace.jsonl") if e.type == "resumed"
    ]
    assert mark.turn >= kill_after - 1
    # The turns left (an interrupted call is one of them) and the submission - not
    # every turn again (steps + 1 before).
    assert calls_after == steps - mark.turn + 1, calls_after
    # Every line once, in order: the workspace was put back as it was, and no completed
    # call ran again (a pending one ran on the box as it was before it).
    assert _patch_lines(run) == [f"line {k}" for k in range(steps)]
    events = list(read_trace(run.path / "members" / "m" / "trace.jsonl"))
    assert "workspace restored" in mark.restored
    i = events.index(mark)
    ran_after = [
        e.input["command"] for e in events[i:] if e.type == "tool_call" and e.tool == "shell"
    ]
    assert all(int(c.split()[2]) >= mark.turn for c in ran_after), ran_after
    assert run.outcome("m").resumed_from == mark.turn
    # The transcript and checkpoints went with the final outcome.
    assert not list((run.path / "members" / "m").glob("checkpoint-*"))
    assert not (run.path / "members" / "m" / "conversation.json").exists()
    shown = subprocess.run(
        [*FLEET, "trace", str(run.path), "m"], env=env, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    assert f"resumed from turn {mark.turn}" in shown.stdout, shown.stdout[-2000:]
    report = (run.path / "report.md").read_text()
    assert f"resumed from turn {mark.turn}" in report


@pytest.mark.parametrize("resume", ["auto", "always"])
def test_a_crashed_box_starts_over_unless_the_job_says_always(
    tmp_path, images, fake_api, cleanup, resume
):
    steps, oom_at = 5, 3
    api = fake_api(appending_policy(steps, oom_at=oom_at))
    cleanup.append(tmp_path / "runs")
    job = _job(tmp_path, retry=f'on = ["crashed"]\nresume = "{resume}"', memory="256m")
    run = _run_to_the_end(api, job)
    assert _patch_lines(run) == [f"line {k}" for k in range(steps)]
    events = list(read_trace(run.path / "members" / "m" / "trace.jsonl"))
    marks = [e for e in events if e.type == "resumed"]
    calls = _member_calls(api)
    first_of_retry = calls[oom_at + 1]  # the call after the one that killed the box
    if resume == "auto":
        assert marks == []
        assert len(first_of_retry["messages"]) == 1  # turn 0 again
        assert len(calls) - (oom_at + 1) == steps + 1  # every turn again
    else:
        (mark,) = marks
        assert mark.turn == oom_at  # the crashing call's turn had not completed
        assert "workspace restored" in mark.restored
        assert len(first_of_retry["messages"]) > 1
        # The call that killed the box again, the turns left and the submission.
        assert len(calls) - (oom_at + 1) == (steps - oom_at) + 1
        # The call that killed the box is answered as interrupted, not run again.
        answered = first_of_retry["messages"][-1]["content"]
        assert answered[0]["is_error"] and "interrupted" in json.dumps(answered)


def test_a_retry_after_the_model_gave_up_goes_on_from_the_last_turn(
    tmp_path, images, fake_api, cleanup
):
    from subagents.fake_api import fault

    steps, fail_at, failures = 5, 3, 5  # the first call, then the adapter's 4 retries
    appending = appending_policy(steps)
    served: list[int] = []

    def policy(body: dict[str, Any]) -> Any:
        if CODER in json.dumps(body.get("system")) and len(served) < failures:
            if sum(m["role"] == "assistant" for m in body["messages"]) == fail_at:
                served.append(1)
                return fault(500, "api_error", "internal error", retry_after=0.05)
        return appending(body)

    api = fake_api(policy)
    cleanup.append(tmp_path / "runs")
    job = _job(tmp_path, retry='on = ["overloaded"]')
    run = _run_to_the_end(api, job)
    assert any(e.event == "member_retry" for e in run.journal.read())
    assert _patch_lines(run) == [f"line {k}" for k in range(steps)]
    events = list(read_trace(run.path / "members" / "m" / "trace.jsonl"))
    (mark,) = [e for e in events if e.type == "resumed"]
    assert mark.turn == fail_at and mark.pending_tools == 0
    # The failed calls, then the turns left and the submission - not turn 0 again.
    assert len(_member_calls(api)) == fail_at + failures + (steps - fail_at) + 1

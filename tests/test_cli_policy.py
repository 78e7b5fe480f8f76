"""Tool policies through the real CLI: a denied call, an ask answered by ``fleet
approve`` from another process while a sibling that never waited finishes, an ask
nobody answers in time, an ask with no terminal, an ask that outlives the member's
deadline, and keys pressed at the run's own terminal. Real boxes, the real harness,
the real ``anthropic`` client against the fake Messages API."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from scripted_calls import tool_results
from terminal_support import at_a_terminal

from coordinator.cli import main
from coordinator.rundir.runs import RunDir
from subagents.fake_api import tool_use
from subagents.trace import read_trace

pytestmark = pytest.mark.docker
FLEET = [str(Path(sys.executable).with_name("fleet"))]


def policy(body: dict[str, Any]) -> Any:
    """``[rm]`` members run ``rm -rf build`` (twice with ``[rm2]``) then ``ls``; others
    run ``echo`` once; then each submits. ``[slow]``: each answer takes a second."""
    task = json.dumps(body["messages"][0])
    # A call a killed run never ran (answered "Not run: ..." on resume) is made again,
    # as a model would: it is not a step done.
    step = sum(1 for r in tool_results(body) if "Not run: this member" not in json.dumps(r))
    plan = ["mkdir -p build && echo made", "echo hello"]
    if "[rm]" in task:
        plan = ["mkdir -p build && echo made", "rm -rf build", "ls -d build || echo gone"]
    if "[rm2]" in task:
        plan = ["mkdir -p build", "rm -rf build", "rm -rf other", "echo done"]
    if "[bypass]" in task:
        plan = [*BYPASSES, "ls /workspace/pwn || echo absent"]
    if "[walled]" in task:
        plan = [f"touch /workspace/pwn{i}" for i in range(3)]
    delay = 1.0 if "[slow]" in task else 0.0  # still working when its sibling asks
    if step < len(plan):
        return tool_use("shell", {"command": plan[step]}, latency_s=delay)
    return tool_use(
        "submit_result", {"summary": f"{step} steps", "tests_run": [], "notes": []}, latency_s=delay
    )


# Ways around `deny = ["shell:touch *"]` that the old reading of a line let through.
BYPASSES = [
    "{ touch /workspace/pwn; }",
    "if true; then touch /workspace/pwn; fi",
    "nice -n 5 touch /workspace/pwn",
    "timeout 5 touch /workspace/pwn",
    "env -i PATH=/usr/bin touch /workspace/pwn",
    "echo /workspace/pwn | xargs touch",
    "/usr/bin/touch /workspace/pwn",
    "bash -lc 'touch /workspace/pwn'",
    "t''ouch /workspace/pwn",
    "f() { touch /workspace/pwn; }; f",
    "c=touch; $c /workspace/pwn",
    "echo 'touch /workspace/pwn' | sh",
]


def _job(tmp_path: Path, members: str, policy_table: str = "") -> Path:
    text = (
        f'name = "p"\noutput_dir = "{tmp_path / "runs"}"\n[model]\nname = "claude-sonnet-5"\n'
        f"[fanout]\nretry = {{ attempts = 1 }}\n{policy_table}\n{members}"
    )
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def _member(mid: str, task: str, extra: str = "") -> str:
    return f'[[members]]\nid = "{mid}"\nkind = "coding"\ntask = "{task}"\n{extra}\n'


def _shell_outputs(run: RunDir, member: str) -> dict[str, tuple[bool, str]]:
    trace = list(read_trace(run.member_dir(member) / "trace.jsonl"))
    calls = {e.call_id: e.input.get("command") for e in trace if e.type == "tool_call"}
    return {calls[e.call_id]: (e.is_error, e.output) for e in trace if e.type == "tool_result"}


def _journal(run: RunDir, event: str) -> list[dict[str, Any]]:
    return [e for e in run.journal.read() if e.event == event]


def _run_denying(
    tmp_path: Path, fake_api: Any, cleanup: Any, task: str, rule: str, code: int
) -> RunDir:
    """A one-member run under ``deny = [rule]`` that ends with exit ``code``."""
    fake_api(policy)
    cleanup.append(tmp_path / "runs")
    job = _job(tmp_path, _member("coder", task), f'[policy]\ndeny = ["{rule}"]')
    assert main(["run", str(job), "--plain"]) == code
    (run,) = RunDir.list(tmp_path / "runs")
    return run


def test_a_denied_call_is_an_error_result_and_never_runs(tmp_path, images, fake_api, cleanup):
    run = _run_denying(tmp_path, fake_api, cleanup, "[rm] tidy up", "shell:rm *", 0)
    outputs = _shell_outputs(run, "coder")
    is_error, text = outputs["rm -rf build"]
    assert is_error and "not permitted" in text and "'shell:rm *'" in text
    assert "build" in outputs["ls -d build || echo gone"][1]  # rm never ran
    (decision,) = _journal(run, "policy_decision")
    assert decision.member == "coder" and decision.action == "deny"
    assert decision.allowed is False and decision.input == {"command": "rm -rf build"}
    events = [e for e in read_trace(run.member_dir("coder") / "trace.jsonl") if e.type == "policy"]
    assert [(e.tool, e.rule, e.allowed) for e in events] == [("shell", "shell:rm *", False)]
    shown = subprocess.run(
        [*FLEET, "trace", str(run.path), "coder"], capture_output=True, text=True
    ).stdout
    assert "[POLICY] shell refused (deny, rule 'shell:rm *')" in shown


def test_spellings_around_a_deny_rule_are_refused_in_the_box(tmp_path, images, fake_api, cleanup):
    run = _run_denying(tmp_path, fake_api, cleanup, "[bypass] try", "shell:touch *", 0)
    outputs = _shell_outputs(run, "coder")
    for line in BYPASSES:
        is_error, text = outputs[line]
        assert is_error and "not permitted" in text and "'shell:touch *'" in text, line
    is_error, text = outputs["ls /workspace/pwn || echo absent"]
    assert not is_error and "No such file" in text and "absent" in text  # touch never ran
    refused = [d for d in _journal(run, "policy_decision") if not d.allowed]
    assert len(refused) == len(BYPASSES)
    assert run.outcome("coder").status == "ok"  # one call ran: not every call refused


def test_a_member_whose_every_call_a_policy_refused_ends_failed(
    tmp_path, images, fake_api, cleanup
):
    run = _run_denying(tmp_path, fake_api, cleanup, "[walled] try", "shell:touch *", 1)
    result = run.outcome("coder")
    assert result.status == "failed"
    assert result.reason.startswith("every tool call was refused by policy (3 of 3), e.g. ")
    assert "shell is not permitted here" in result.reason
    assert result.result.summary == "3 steps"  # kept for reading
    assert run.state().members == {"coder": "failed"}


def test_an_ask_answered_by_fleet_approve_while_the_sibling_never_waits(
    tmp_path, images, fake_api, cleanup
):
    fake_api(policy)
    out = tmp_path / "runs"
    cleanup.append(out)
    members = _member("asker", "[rm] tidy up", 'policy = { ask = ["shell:rm *"] }')
    members += _member("sibling", "[slow] say hello")
    job = _job(tmp_path, members)
    proc = waiting_run(job)
    try:
        run = _wait_for(lambda: next(iter(RunDir.list(out)), None), 60)
        # The sibling ends while the asker still waits for its answer.
        _wait_for(lambda: run.state().members.get("sibling") == "ok", 90)
        assert run.state().members.get("asker") == "running"
        listing = subprocess.run(
            [*FLEET, "approve", str(run.path), "--wait", "30"], capture_output=True, text=True
        )
        assert "asker wants shell" in listing.stdout and "rm -rf build" in listing.stdout
        answered = subprocess.run(
            [*FLEET, "approve", run.id, "--output-dir", str(out), "--yes"],
            capture_output=True,
            text=True,
        )
        assert answered.returncode == 0 and ": yes - asker wants shell" in answered.stdout
        _, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "approval needed: asker wants shell" in err and f"fleet approve {run.id}" in err
    outputs = _shell_outputs(run, "asker")
    assert outputs["rm -rf build"][0] is False
    assert "gone" in outputs["ls -d build || echo gone"][1]  # the approved rm ran
    entries = run.journal.read()
    asked = next(e for e in entries if e.event == "approval_requested")
    decided = next(e for e in entries if e.event == "policy_decision")
    sibling_done = next(
        e for e in entries if e.event == "member_finished" and e.member == "sibling"
    )
    assert asked.ts < sibling_done.ts < decided.ts
    assert decided.by == "fleet approve" and decided.allowed is True
    assert decided.waited_s > 0
    shown = subprocess.run(
        [*FLEET, "trace", str(run.path), "asker"], capture_output=True, text=True
    ).stdout
    assert "[POLICY] shell allowed (ask, rule 'shell:rm *') by fleet approve after" in shown


@pytest.mark.parametrize(
    ("flags", "timeout", "by", "allowed"),
    [
        (["--wait-approval"], "ask_timeout_s = 1", "timeout", False),
        ([], "", "no terminal", False),
        (["--approve-all"], "", "approve-all", True),
    ],
)
def test_an_ask_nobody_answers_gets_the_ask_default(
    tmp_path, images, fake_api, cleanup, flags, timeout, by, allowed
):
    fake_api(policy)
    cleanup.append(tmp_path / "runs")
    table = f'[policy]\nask = ["shell:rm *"]\n{timeout}'
    job = _job(tmp_path, _member("coder", "[rm] tidy up"), table)
    started = time.monotonic()
    assert main(["run", str(job), "--plain", *flags]) == 0
    (run,) = RunDir.list(tmp_path / "runs")
    assert run.outcome("coder").status == "ok"  # a refused call is not a failed member
    (decision,) = _journal(run, "policy_decision")
    assert (decision.by, decision.allowed) == (by, allowed)
    is_error, text = _shell_outputs(run, "coder")["rm -rf build"]
    assert is_error is not allowed
    if by == "timeout":
        assert "nobody answered within 1 s" in text and decision.waited_s >= 1
        assert time.monotonic() - started < 60
    if by == "no terminal":
        assert "nobody can be asked in this run" in text


def test_a_pending_ask_counts_against_the_members_deadline(tmp_path, images, fake_api, cleanup):
    fake_api(policy)
    cleanup.append(tmp_path / "runs")
    extra = 'policy = { ask = ["shell:rm *"] }\nlimits = { deadline_s = 12 }'
    job = _job(tmp_path, _member("coder", "[rm] tidy up", extra))
    assert main(["run", str(job), "--plain", "--wait-approval"]) == 1
    (run,) = RunDir.list(tmp_path / "runs")
    result = run.outcome("coder")
    assert result.status == "timed_out"
    assert "waiting for a person's approval of shell" in result.reason
    (abandoned,) = _journal(run, "approval_abandoned")
    assert abandoned.member == "coder" and abandoned.reason == "member stopped"
    assert list((run.path / "approvals").glob("*.answer.json"))  # closed, on disk


def test_resume_asks_again_what_the_killed_run_never_answered(tmp_path, images, fake_api, cleanup):
    fake_api(policy)
    out = tmp_path / "runs"
    cleanup.append(out)
    job = _job(tmp_path, _member("coder", "[rm] tidy up"), '[policy]\nask = ["shell:rm *"]')
    first = subprocess.Popen(
        [*FLEET, "run", str(job), "--plain", "--wait-approval"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        run = _wait_for(lambda: next(iter(RunDir.list(out)), None), 60)
        _wait_for(lambda: _journal(run, "approval_requested"), 90)
    finally:
        first.kill()  # SIGKILL: the ask is left unanswered on disk
    first.wait()
    resumed = subprocess.Popen(
        [*FLEET, "resume", str(run.path), "--plain", "--wait-approval"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(lambda: len(_journal(run, "approval_requested")) == 2, 90)
        answered = subprocess.run(
            [*FLEET, "approve", str(run.path), "--yes"], capture_output=True, text=True
        )
        assert answered.returncode == 0, answered.stdout
        _, err = resumed.communicate(timeout=90)
    finally:
        resumed.kill()
    assert resumed.returncode == 0, err
    (abandoned,) = _journal(run, "approval_abandoned")
    assert "resumed" in abandoned.reason and abandoned.member == "coder"
    (decision,) = _journal(run, "policy_decision")
    assert decision.by == "fleet approve" and decision.allowed is True
    assert run.outcome("coder").status == "ok"


def test_keys_at_the_runs_terminal_answer_asks_and_always_holds_for_the_rule(
    tmp_path, images, fake_api, cleanup
):
    fake_api(policy)
    cleanup.append(tmp_path / "runs")
    job = _job(tmp_path, _member("coder", "[rm2] tidy up"), '[policy]\nask = ["shell:rm *"]')
    with at_a_terminal([*FLEET, "run", str(job)], 90) as term:
        term.until(b"waiting for approval (1)")
        assert b"coder wants shell" in term.screen and b"rm -rf build" in term.screen
        term.type(b"a")  # yes, and always for 'shell:rm *'
        assert term.finish() == 0, term.screen[-2000:]
    (run,) = RunDir.list(tmp_path / "runs")
    decisions = [(d.by, d.allowed, d.always) for d in _journal(run, "policy_decision")]
    assert decisions == [("terminal", True, True), ("always", True, False)]
    outputs = _shell_outputs(run, "coder")
    assert outputs["rm -rf build"][0] is False and outputs["rm -rf other"][0] is False


def waiting_run(job: Path) -> subprocess.Popen[str]:
    """``fleet run JOB --plain --wait-approval`` started, its progress lines piped."""
    return subprocess.Popen(
        [*FLEET, "run", str(job), "--plain", "--wait-approval"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(probe: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"gave up after {timeout} s waiting for {probe}")

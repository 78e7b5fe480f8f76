"""A coding member's parallel attempts through the real ``fleet`` process: real boxes,
the real ``anthropic`` client against a fake Messages API whose attempts differ (one
breaks the test, two pass with different patches), the reviewer's choice, every record
that shows it - and one attempt's crash costing the others nothing."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fleet_policies import OOM_BOX
from process_support import popen

from coordinator.rundir.runs import RunDir
from subagents.fake_api import FakeMessagesAPI, tool_use
from subagents.loop.loop import INTERRUPTED
from subagents.trace import read_trace

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parent.parent
FLEET = str(Path(sys.executable).with_name("fleet"))
SAMPLE = ROOT / "examples" / "sample-repo"
TEST = "python3 test_greet.py"
OLD = 'return f"Hello, {name}!"'
EDITS = {
    1: 'return f"Hello there, {name}!"',  # passes, two lines
    2: 'return f"Goodbye, {name}!"',  # breaks the test (it wants "Hello...")
    3: '# A warmer greeting.\n    return f"Hello there, {name}!"',  # passes, three lines
}
REASON = "attempt 3 says why the greeting changed"
CODER = "careful software engineer"
"""Opens the coding member's system prompt."""


def _attempt(body: dict[str, Any]) -> int:
    first = json.dumps((body.get("messages") or [{}])[0])
    found = re.search(r"Attempt (\d) of", first)
    return int(found.group(1)) if found else 1


def _done(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The inputs of the calls answered so far, in order - not those a resume answered
    as interrupted (never run): a model calls those again, and so does this one."""
    asked: dict[str, dict[str, Any]] = {}
    done = []
    for m in body.get("messages") or []:
        content = m.get("content")
        if not isinstance(content, list):
            continue
        for b in content:
            if b.get("type") == "tool_use":
                asked[b.get("id")] = b.get("input") or {}
            elif b.get("type") == "tool_result" and b.get("tool_use_id") in asked:
                text = json.dumps(b.get("content"))
                if not (b.get("is_error") and INTERRUPTED[:40] in text):
                    done.append(asked[b["tool_use_id"]])
    return done


class Attempts:
    """A fake model whose attempt N makes ``EDITS[N]`` then submits; ``crash`` attempts
    OOM-kill their box instead; the reviewer chooses ``choose``. Each step follows from
    the calls answered so far (:func:`_done`), so a call a resume answered as interrupted
    is made again, as a model would."""

    def __init__(
        self,
        choose: int = 3,
        crash: tuple[int, ...] = (),
        held: set[int] | None = None,
        every: int | None = None,
    ) -> None:
        self.choose, self.crash = choose, crash
        self.held = set(held or ())
        """Attempts that wait (``echo wait``, 0.3 s a call) until taken out of this set."""
        self.every = every
        """Every attempt makes ``EDITS[every]`` (None: its own)."""
        self.reviews: list[dict[str, Any]] = []
        self.calls: dict[int, int] = {}

    def __call__(self, body: dict[str, Any]) -> Any:
        if "You review candidate patches" in json.dumps(body.get("system", "")):
            self.reviews.append(body)
            return tool_use("choose_attempt", {"attempt": self.choose, "reason": REASON})
        n, done = _attempt(body), _done(body)
        if CODER in json.dumps(body.get("system", "")):  # not the analyst's
            self.calls[n] = self.calls.get(n, 0) + 1
        if n in self.held:
            return tool_use("shell", {"command": f"echo wait {len(done)}"}, latency_s=0.3)
        step = sum(1 for d in done if not str(d.get("command", "")).startswith("echo wait"))
        if step == 0 and n in self.crash:
            return tool_use("shell", {"command": OOM_BOX})
        if step == 0:
            return tool_use(
                "edit_file",
                {"path": "greet.py", "old_string": OLD, "new_string": EDITS[self.every or n]},
            )
        if step == 1:
            return tool_use("shell", {"command": TEST})
        return tool_use(
            "submit_result",
            {"summary": f"attempt {n} edited greet.py", "tests_run": [TEST], "notes": []},
        )


def _code(
    tmp_path: Path, policy: Any, runs: Path, *flags: str
) -> tuple[subprocess.CompletedProcess[str], RunDir]:
    repo = tmp_path / "repo"
    if not repo.exists():
        shutil.copytree(SAMPLE, repo)
    api = FakeMessagesAPI(policy).start()
    try:
        env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
        env |= {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": api.url}
        args = ["code", str(repo), "Make the greeting warmer.", "--test", TEST, *flags]
        done = subprocess.run(
            [FLEET, *args, "--output-dir", str(runs), "--plain"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        api.stop()
    (run,) = RunDir.list(runs)
    return done, run


def _fleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FLEET, *args], capture_output=True, text=True, timeout=120)


def test_three_attempts_the_reviewer_chooses_among_those_whose_test_passed(
    tmp_path, images, runs_dir
):
    policy = Attempts(choose=3)
    done, run = _code(tmp_path, policy, runs_dir, "--attempts", "3")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    # The member: ok, its patch the chosen attempt's, every attempt listed.
    outcome = run.outcome("coder")
    assert outcome.status == "ok"
    assert (outcome.choice.attempt, outcome.choice.by, outcome.choice.reason) == (
        3,
        "reviewer",
        REASON,
    )
    assert [(a.attempt, a.status, a.verified) for a in outcome.attempts] == [
        (1, "ok", True),
        (2, "failed", False),
        (3, "ok", True),
    ]
    assert [a.lines for a in outcome.attempts] == [2, 2, 3]
    assert all(a.files_changed == ["greet.py"] for a in outcome.attempts)
    member = run.path / "members" / "coder"
    for n in (1, 2, 3):
        assert (
            EDITS[n].splitlines()[-1].strip() in (member / f"attempts/{n}/patch.diff").read_text()
        )
    assert (member / "patch.diff").read_bytes() == (member / "attempts/3/patch.diff").read_bytes()
    assert "A warmer greeting" in outcome.result.patch
    # Everything spent counts: the attempts' and the review's.
    spent = sum(a.input_tokens for a in outcome.attempts) + outcome.choice.input_tokens
    assert outcome.input_tokens == spent and outcome.choice.input_tokens > 0
    # The reviewer saw the two passing attempts, never the one whose test failed.
    (review,) = policy.reviews
    prompt = json.dumps(review["messages"])
    assert "## Attempt 1" in prompt and "## Attempt 3" in prompt and "## Attempt 2" not in prompt
    assert "Goodbye" not in prompt
    # Shown: the table, the journal, fleet runs, fleet trace (the member and one attempt).
    assert re.search(r"^3\s+ok\s+passed\s+1\s+3\s+.*chosen$", done.stdout, re.M), done.stdout
    assert re.search(r"^2\s+failed\s+FAILED", done.stdout, re.M)
    assert f"chosen: attempt 3, by the reviewer: {REASON}" in done.stdout
    state = run.state()
    assert state.members == {"coder": "ok"}
    assert state.attempts == {"coder.1": "ok", "coder.2": "failed", "coder.3": "ok"}
    listed = json.loads(_fleet("runs", "--output-dir", str(runs_dir), "--json").stdout)
    assert [(r["ok"], r["members"]) for r in listed] == [(1, 1)]
    one = json.loads(_fleet("trace", str(run.path), "coder.2", "--json").stdout)
    assert one["rollup"]["status"] == "failed" and one["dir"] == "members/coder/attempts/2"
    chosen = [e for e in read_trace(member / "trace.jsonl") if e.type == "attempts_chosen"]
    assert [(e.attempt, e.by, e.candidates) for e in chosen] == [(3, "reviewer", [1, 3])]
    # Each attempt had its own box: three boxes were labelled with their attempt.
    started = [e for e in run.journal.read() if e.event == "member_started"]
    assert sorted(e.member for e in started) == ["coder", "coder.1", "coder.2", "coder.3"]


def test_an_attempt_whose_box_dies_costs_the_others_nothing(tmp_path, images, runs_dir):
    policy = Attempts(crash=(1,))
    done, run = _code(tmp_path, policy, runs_dir, "--attempts", "3")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    outcome = run.outcome("coder")
    statuses = [(a.attempt, a.status) for a in outcome.attempts]
    assert statuses[0] == (1, "crashed") and statuses[1:] == [(2, "failed"), (3, "ok")]
    assert (outcome.status, outcome.choice.attempt, outcome.choice.by) == ("ok", 3, "only")
    assert policy.reviews == []  # one candidate: no review
    assert "chosen: attempt 3, by the only candidate" in done.stdout


def test_when_no_attempt_passes_the_member_fails_and_nothing_is_applied(tmp_path, images, runs_dir):
    policy = Attempts(every=2)  # each attempt's change breaks the test
    done, run = _code(tmp_path, policy, runs_dir, "--attempts", "3", "--apply")
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    outcome = run.outcome("coder")
    assert outcome.status == "failed" and outcome.choice.attempt is None
    assert outcome.reason.startswith("none of 3 attempts was chosen")
    assert "chosen: none" in done.stdout and "not applied" in done.stdout
    assert "Hello, {name}" in (tmp_path / "repo" / "greet.py").read_text()


def test_a_resumed_run_finishes_only_the_attempts_that_had_not_ended(tmp_path, images, runs_dir):
    repo = tmp_path / "repo"
    shutil.copytree(SAMPLE, repo)
    job = tmp_path / "job.toml"
    job.write_text(
        f'name = "tries"\noutput_dir = "{runs_dir}"\n[model]\nname = "claude-sonnet-5"\n'
        "[fanout.retry]\nbackoff_s = 0\n"
        f'[[members]]\nid = "coder"\nkind = "coding"\ntask = "Make the greeting warmer."\n'
        f'repo = "{repo}"\ntest = "{TEST}"\nattempts = 3\n'
        "limits = { max_turns = 1000 }\n"  # attempt 2's waits are not its end
    )
    policy = Attempts(choose=3, held={2})  # 2 waits until the run is killed
    api = FakeMessagesAPI(policy).start()
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    env |= {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": api.url}
    try:
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        proc = popen([FLEET, "run", str(job), "--plain"], env=env, **quiet)
        try:
            member = None
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and proc.poll() is None:
                runs = RunDir.list(runs_dir)
                member = runs[0].path / "members" / "coder" if runs else None
                ended = member is not None and all(
                    (member / f"attempts/{n}/result.json").exists() for n in (1, 3)
                )
                if ended and policy.calls.get(2, 0) >= 4:
                    break
                time.sleep(0.05)
            assert proc.poll() is None, "the run ended before it could be killed"
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
        (run,) = RunDir.list(runs_dir)
        assert not (run.path / "members/coder/result.json").exists()
        before = dict(policy.calls)
        policy.held.clear()  # the resumed attempt 2 goes on to its edit
        resumed = subprocess.run(
            [FLEET, "resume", str(run.path), "--plain"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        api.stop()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # Attempts 1 and 3 had ended: not a call more, not a start more; attempt 2 went on.
    assert policy.calls[1] == before[1] and policy.calls[3] == before[3]
    assert policy.calls[2] > before[2]
    starts = [e.member for e in run.journal.read() if e.event == "member_started"]
    assert (starts.count("coder.1"), starts.count("coder.2"), starts.count("coder.3")) == (1, 2, 1)
    outcome = run.outcome("coder")
    assert outcome.status == "ok" and outcome.choice.attempt == 3
    # Attempt 2 went on to its (failing) end after the resume; 1 and 3 kept theirs.
    assert [a.status for a in outcome.attempts] == ["ok", "failed", "ok"]
    assert run.state().attempts == {"coder.1": "ok", "coder.2": "failed", "coder.3": "ok"}
    (review,) = policy.reviews
    assert "## Attempt 1" in json.dumps(review) and "## Attempt 3" in json.dumps(review)

"""What a person approves is what they were shown, through the real CLI: a command
whose tail hides behind 150 spaces, one carrying terminal escapes and a bidi override,
and one too long to print are shown whole (the long one in a review file with its
sha256, which a yes must name); a bare ``--yes`` with several asks pending answers
none; a yes given to a changed request is a no; each answer is told and journalled
with who gave it. Real boxes, the real harness, the real ``anthropic`` client against
the fake Messages API."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from scripted_calls import tool_results
from terminal_support import at_a_terminal
from test_cli_policy import (
    FLEET,
    _job,
    _journal,
    _member,
    _shell_outputs,
    _wait_for,
    waiting_run,
)

from coordinator.oversight.approvals import ApprovalQueue
from coordinator.rundir.runs import RunDir
from subagents.fake_api import tool_use

pytestmark = pytest.mark.docker

TAIL = "rm -f notes.txt" + " " * 150 + "; echo PWN > x"
ESCAPES = "rm -f notes.txt; echo '\x1b]0;PWNED\x07\x1b[2J\x1b[1A\u202etxt.exe\u200b' > y"
LONG = "rm -f notes.txt; echo " + "A" * 6000 + " > z"
COMMANDS = {"[tail]": TAIL, "[escapes]": ESCAPES, "[long]": LONG}
TAIL_SHOWN = "rm -f notes.txt\u27e8150 spaces\u27e9; echo PWN > x"
ESCAPES_SHOWN = "\\u001b]0;PWNED\\u0007\\u001b[2J\\u001b[1A\\u202etxt.exe\\u200b"


def asking(body: dict[str, Any]) -> Any:
    """Each member makes notes.txt, runs the command its task names (an ask), shows x."""
    task = json.dumps(body["messages"][0])
    command = next(c for marker, c in COMMANDS.items() if marker in task)
    plan = ["touch notes.txt", command, "cat x 2>/dev/null || echo no x"]
    step = len(tool_results(body))
    if step < len(plan):
        return tool_use("shell", {"command": plan[step]})
    return tool_use("submit_result", {"summary": "done", "tests_run": [], "notes": []})


def _asks_job(tmp_path: Path, *markers: str) -> Path:
    members = "".join(_member(m.strip("[]"), f"{m} tidy up") for m in markers)
    return _job(tmp_path, members, '[policy]\nask = ["shell:rm *"]')


def _approve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FLEET, "approve", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )


def test_asks_are_shown_whole_and_a_yes_answers_only_what_was_shown(
    tmp_path, images, fake_api, cleanup
):
    fake_api(asking)
    out = tmp_path / "runs"
    cleanup.append(out)
    job = _asks_job(tmp_path, "[tail]", "[escapes]", "[long]")
    proc = waiting_run(job)
    try:
        run = _wait_for(lambda: next(iter(RunDir.list(out)), None), 60)
        queue = ApprovalQueue(run.path / "approvals")
        _wait_for(lambda: len(queue.pending()) == 3, 120)
        ids = {r["member"]: r["id"] for r in queue.pending()}
        listing = _approve(str(run.path))
        assert listing.returncode == 0
        assert TAIL_SHOWN in listing.stdout and ESCAPES_SHOWN in listing.stdout
        assert "\x1b" not in listing.stdout and "\u202e" not in listing.stdout
        # The long one: not printed, but whole in a review file whose sha256 is shown.
        review = run.path / "approvals" / f"{ids['long']}.review.txt"
        sha = hashlib.sha256(review.read_bytes()).hexdigest()
        assert "A" * 6000 in review.read_text() and "A" * 200 not in listing.stdout
        assert f"{review} (sha256 {sha})" in listing.stdout

        # A bare yes with three asks pending answers none, and lists them.
        bare = _approve(str(run.path), "--yes")
        assert bare.returncode == 2 and all(i in bare.stderr for i in ids.values())
        assert "\x1b" not in bare.stderr and len(queue.pending()) == 3
        # The long one needs the sha256 of what was reviewed.
        assert _approve(str(run.path), "--yes", "--id", ids["long"]).returncode == 2
        wrong = _approve(str(run.path), "--yes", "--id", ids["long"], "--sha256", "0" * 16)
        assert wrong.returncode == 2 and len(queue.pending()) == 3
        done = _approve(str(run.path), "--yes", "--id", ids["long"], "--sha256", sha[:16])
        assert done.returncode == 0, done.stderr
        yes = _approve(str(run.path), "--yes", "--id", ids["tail"])
        assert yes.returncode == 0 and TAIL_SHOWN in yes.stdout
        # A request changed after it was shown: the yes names the change, not the ask.
        path = run.path / "approvals" / f"{ids['escapes']}.request.json"
        changed = json.loads(path.read_text()) | {"input": {"command": "rm -f notes.txt"}}
        path.write_text(json.dumps(changed))
        assert _approve(str(run.path), "--yes").returncode == 0  # the only one left
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    # The run's own lines: each ask whole, each answer with who gave it.
    assert f'approval needed: tail wants shell {{"command": "{TAIL_SHOWN}"}}' in err
    assert ESCAPES_SHOWN in err and "\x1b" not in err and "\u202e" not in err
    pid_user = r"by fleet approve[^(]*\(pid \d+, user [^)]+\) at \d\d:\d\d:\d\d"
    for member, word in (("tail", "approved"), ("long", "approved"), ("escapes", "refused")):
        assert re.search(rf"ask {ids[member]} of {member} \(shell\) {word} {pid_user}", err)
    answered = {e.member: e for e in _journal(run, "approval_answered")}
    assert answered["tail"].allowed and answered["long"].allowed
    assert not answered["escapes"].allowed
    assert "another argument" in answered["escapes"].by
    assert re.fullmatch(r"pid \d+, user .+", answered["tail"].who)
    # What ran is what was approved: the whole tail of it.
    assert _shell_outputs(run, "tail")["cat x 2>/dev/null || echo no x"][1].endswith("\nPWN")
    assert _shell_outputs(run, "escapes")[ESCAPES][0] is True  # refused: it never ran


def test_the_runs_terminal_and_the_approve_prompt_show_escapes_made_visible(
    tmp_path, images, fake_api, cleanup
):
    fake_api(asking)
    out = tmp_path / "runs"
    cleanup.append(out)
    job = _asks_job(tmp_path, "[escapes]")
    with at_a_terminal([*FLEET, "run", str(job)], 180) as run_term:
        run_term.until(b"waiting for approval (1)")
        (run,) = RunDir.list(out)
        with at_a_terminal([*FLEET, "approve", str(run.path)], 30) as approve_term:
            approve_term.until(b"allow?")
            approve_term.type(b"y\n")
            assert approve_term.finish() == 0, approve_term.screen[-2000:]
        assert run_term.finish() == 0, run_term.screen[-2000:]
    prompt, screen = approve_term.screen, run_term.screen
    for raw in (prompt, screen):
        # The model's own sequences (set title, clear screen) never reach the terminal.
        assert b"\x1b]0;" not in raw and b"\x1b[2J" not in raw
        assert "\u202e".encode() not in raw and "\u200b".encode() not in raw
    assert ESCAPES_SHOWN in prompt.decode().replace("\r\n", "\n")
    assert ESCAPES_SHOWN in _unwrapped(screen)
    assert "approved by fleet approve (pid" in _unwrapped(screen)


def _unwrapped(screen: bytes) -> str:
    """The progress table's text without its cursor moves and row breaks."""
    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]|\r?\n", "", screen.decode("utf-8", "replace"))

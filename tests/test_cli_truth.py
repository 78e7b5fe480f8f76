"""One truth per run and member: the exit code, ``fleet runs``, ``result.json``, the
journal, the report and ``fleet trace`` say the same thing about how a run and each
of its members ended - checked through the real ``fleet`` process, offline.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fleet_policies import coding_policy
from process_support import popen

from coordinator.rundir.runs import RunDir
from subagents.fake_api import FakeMessagesAPI, tool_use
from subagents.trace import read_trace

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parent.parent
FLEET = str(Path(sys.executable).with_name("fleet"))
SAMPLE = ROOT / "examples" / "sample-repo"


def fleet(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """The real ``fleet`` process, offline (no API key in its environment)."""
    base = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    return subprocess.run(
        [FLEET, *args], env=base | env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def run_against(
    policy: Any, job: Path, out: Path
) -> tuple[subprocess.CompletedProcess[str], FakeMessagesAPI]:
    """``fleet run JOB`` through the real ``anthropic`` client against a fake Messages
    API answering with ``policy``; the finished process and the (stopped) server."""
    api = FakeMessagesAPI(policy).start()
    try:
        keys = {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": api.url}
        return fleet("run", str(job), "--output-dir", str(out), "--plain", **keys), api
    finally:
        api.stop()


def _coder(mid: str, task: str) -> str:
    return (
        f'[[members]]\nid = "{mid}"\nkind = "coding"\ntask = {json.dumps(task)}\n'
        f'repo = "{SAMPLE}"\ntest = "python3 test_greet.py"\n'
    )


def _trace_status(run: RunDir, member: str) -> str:
    ends = [e for e in read_trace(run.path / "members" / member / "trace.jsonl")]
    return [e.status for e in ends if e.type == "member_end"][-1]


def _runs_json(out: Path) -> dict[str, Any]:
    listed = fleet("runs", "--output-dir", str(out), "--json")
    return {r["id"]: r for r in json.loads(listed.stdout)}


def test_a_coding_member_whose_test_fails_after_its_edit_is_failed_everywhere(
    tmp_path, images, runs_dir
):
    job = tmp_path / "job.toml"
    job.write_text(
        'name = "two-coders"\n[model]\nname = "offline"\n[fanout]\nmin_success = 2\n'
        + _coder("warm", "Replace `Hello, {name}!` with `Hello again, {name}!` in `greet.py`.")
        + _coder("curt", "Replace `Hello, {name}!` with `Hi, {name}!` in `greet.py`.")
    )
    done = fleet("run", str(job), "--output-dir", str(runs_dir), "--plain")
    assert done.returncode == 1, done.stderr
    assert "failed: 1 of 2 members ok" in done.stderr
    (run,) = RunDir.list(runs_dir)
    # The member: failed with the reason, its patch and test run kept for reading.
    outcome = run.outcome("curt")
    assert outcome.status == "failed"
    assert outcome.reason.startswith("test failed after edit: 'python3 test_greet.py' exit 1")
    assert outcome.result.verified.passed is False
    assert '+    return f"Hi, {name}!"' in (run.path / "members/curt/patch.diff").read_text()
    assert run.outcome("warm").status == "ok"
    # The journal, the trace, `fleet runs`, `fleet trace` and the report agree.
    assert run.state().members == {"warm": "ok", "curt": "failed"}
    assert _trace_status(run, "curt") == "failed"
    listed = _runs_json(runs_dir)[run.id]
    assert (listed["status"], listed["ok"], listed["members"]) == ("failed", 1, 2)
    traced = json.loads(fleet("trace", str(run.path), "--json").stdout)
    assert {m["member"]: m["status"] for m in traced["members"]} == {"curt": "failed", "warm": "ok"}
    report = json.loads((run.path / "report.json").read_text())
    assert [m["member"] for m in report["failed"]] == ["curt"]
    assert {c["member"]: c["status"] for c in report["code"]} == {"warm": "ok", "curt": "failed"}
    assert "**Its test fails**" in (run.path / "report.md").read_text()


def test_the_docs_one_coder_example_passes_its_own_test(tmp_path, images, runs_dir):
    text = (ROOT / "docs" / "job-files.md").read_text()
    block = next(
        m.group(1)
        for m in re.finditer(r"```toml\n(.*?)```", text, re.S)
        if 'name = "one-coder"' in m.group(1)
    )
    # The example names the sample repository relative to docs/.
    (tmp_path / "docs").mkdir()
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    job = tmp_path / "docs" / "one-coder.toml"
    job.write_text(block)
    done = fleet("run", str(job), "--output-dir", str(runs_dir), "--plain")
    assert done.returncode == 0, done.stderr
    (run,) = RunDir.list(runs_dir)
    (outcome,) = run.outcomes().values()
    assert outcome.status == "ok" and outcome.result.verified.passed is True


def _tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        b
        for m in body.get("messages") or []
        if m.get("role") == "user" and isinstance(m.get("content"), list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]


def _text(block: dict[str, Any]) -> str:
    content = block.get("content", "")
    if isinstance(content, str):
        return content
    return "\n".join(c.get("text", "") for c in content if c.get("type") == "text")


def reads_back_what_its_pointer_says(body: dict[str, Any]) -> Any:
    """A browser member that searches, gets its result offloaded, then reads it back
    with whatever tool the pointer names - as a model told only the pointer would."""
    results = _tool_results(body)
    if not results:
        return tool_use("search", {"query": "asyncio shield cancellation"})
    if len(results) == 1:
        pointer = _text(results[0])
        path = re.search(r"Full content: (\S+)", pointer)
        tool = re.search(r"Read it in pieces \((\w+) with", pointer)
        assert path and tool, pointer
        return tool_use(tool.group(1), {"path": path.group(1), "pattern": "shield"})
    return tool_use(
        "submit_result",
        {"summary": "read back", "claims": [], "open_questions": [], "confidence": "low"},
    )


@pytest.mark.chromium
def test_a_browser_member_reads_back_its_offloaded_result_with_the_tool_its_pointer_names(
    tmp_path, images, runs_dir
):
    job = tmp_path / "job.toml"
    job.write_text(
        'name = "offload-reader"\n[model]\nname = "claude-sonnet-5"\n'
        '[[members]]\nid = "reader"\nkind = "browser"\n'
        'task = "What does asyncio.shield protect?"\n'
        "context = { offload_result_tokens = 300 }\n"
    )
    done, api = run_against(reads_back_what_its_pointer_says, job, runs_dir)
    assert done.returncode == 0, done.stderr
    # The member's last request (the analyst's comes after it).
    last = next(b for b in reversed(api.requests) if len(_tool_results(b)) == 2)
    pointer, read_back = (_text(b) for b in _tool_results(last))
    assert "read_saved" in pointer and "read_file" not in pointer
    tools = {t["name"] for t in last["tools"]}
    assert "read_saved" in tools and "read_file" not in tools
    assert not _tool_results(last)[1].get("is_error"), read_back
    assert "containing 'shield'" in read_back and "shield" in read_back.lower()
    (run,) = RunDir.list(runs_dir)
    assert run.outcome("reader").status == "ok"


def _shell_then_sleep_then_submit(body: dict[str, Any]) -> Any:
    """A coding member that prints a long line, then runs a command past its deadline."""
    task = json.dumps(body["messages"][0])
    step = len(_tool_results(body))
    if "[quick]" in task or step >= 2:
        return tool_use("submit_result", {"summary": f"stopped after {step} steps"})
    command = "seq -s ' ' 1 400" if step == 0 else "sleep 60"
    return tool_use("shell", {"command": command})


def _start(args: list[str], api_url: str) -> subprocess.Popen[str]:
    env = os.environ | {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": api_url}
    return subprocess.Popen(
        [FLEET, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_for(check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError("timed out waiting")


def _table(text: str) -> dict[str, list[str]]:
    """``fleet trace RUN``'s rows by member (status is the third column)."""
    rows = {}
    for line in text.splitlines():
        cells = line.split()
        if len(cells) > 3 and cells[0] in ("slow", "next"):
            rows[cells[0]] = cells
    return rows


def test_trace_agrees_with_the_journal_on_a_timed_out_member_and_a_queued_one(
    tmp_path, images, runs_dir
):
    api = FakeMessagesAPI(_shell_then_sleep_then_submit).start()
    job = tmp_path / "job.toml"
    job.write_text(
        'name = "deadline"\n[model]\nname = "claude-sonnet-5"\n[fanout]\nmax_parallel = 1\n'
        '[[members]]\nid = "slow"\nkind = "coding"\ntask = "count, then wait"\n'
        "limits = { deadline_s = 12 }\n"
        '[[members]]\nid = "next"\nkind = "coding"\ntask = "[quick] done"\n'
    )
    try:
        run_proc = _start(["run", str(job), "--output-dir", str(runs_dir), "--plain"], api.url)
        run = _wait_for(lambda: (RunDir.list(runs_dir) or [None])[0])
        _wait_for(lambda: run.state().members.get("slow") == "running")
        # --follow while `next` waits for the one slot: queued, and the wall time so far.
        follow = subprocess.Popen(
            [FLEET, "trace", str(run.path), "--follow", "--interval", "0.2"],
            stdout=subprocess.PIPE,
            text=True,
        )
        out, _ = follow.communicate(timeout=120)
        run_proc.communicate(timeout=120)
    finally:
        api.stop()
    assert follow.returncode == 0 and run_proc.returncode == 0
    first, last = out.split("following ")[0], out.split("following ")[1]
    assert _table(first)["next"][2] == "queued", out
    wall = re.search(r"wall (\S+)", first)
    assert wall and not wall.group(1).startswith("-"), first
    # The timed-out member is timed_out in every record, the trace's own end included.
    assert _table(last)["slow"][2] == "timed_out" and _table(last)["next"][2] == "ok"
    assert run.state().members == {"slow": "timed_out", "next": "ok"}
    assert run.outcome("slow").status == "timed_out"
    # It stopped itself before the hard limit (box start-up included) and handed in
    # what it had.
    assert run.outcome("slow").partial_result.summary == "stopped after 2 steps"
    # The reason names the deadline the job file says, not the harness's earlier stop.
    assert run.outcome("slow").reason.startswith("deadline_s = 12 s reached after ")
    assert _trace_status(run, "slow") == "timed_out"
    traced = json.loads(fleet("trace", str(run.path), "--json").stdout)
    assert {m["member"]: m["status"] for m in traced["members"]} == {
        "next": "ok",
        "slow": "timed_out",
    }
    # With the default --limit, a cut line still says where the whole of it is.
    detail = fleet("trace", str(run.path), "slow").stdout
    seq = next(line for line in detail.splitlines() if "<- ok" in line)
    assert re.search(r"\[full: members/slow/trace\.jsonl:\d+\]", seq), seq


def test_a_member_fail_fast_stopped_before_it_started_is_cancelled_in_every_record(
    tmp_path, images, runs_dir
):
    job = tmp_path / "job.toml"
    job.write_text(
        'name = "stop"\n[model]\nname = "claude-sonnet-5"\n'
        "[fanout]\nmax_parallel = 1\nfail_fast = true\n"
        '[[members]]\nid = "bad"\nkind = "coding"\ntask = "[bad-request]"\n'
        '[[members]]\nid = "next"\nkind = "coding"\ntask = "never gets a slot"\n'
    )
    done, _ = run_against(coding_policy(), job, runs_dir)
    assert done.returncode == 1, done.stderr
    (run,) = RunDir.list(runs_dir)
    assert run.state().members == {"bad": "failed", "next": "cancelled"}
    traced = json.loads(fleet("trace", str(run.path), "--json").stdout)
    statuses = {m["member"]: (m["status"], m["reason"]) for m in traced["members"]}
    assert statuses["next"] == ("cancelled", "cancelled: fail_fast after bad failed")


def _view_finds(*args: str, **env: str) -> str:
    """The first line ``fleet view ARGS --port 0`` prints (then it is stopped)."""
    view = popen(
        [FLEET, "view", *args, "--port", "0"],
        env=os.environ | env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert view.stderr is not None
        return view.stderr.readline()
    finally:
        view.terminate()
        view.wait(timeout=30)


def test_every_command_that_takes_a_run_finds_it_the_same_way(tmp_path, images, runs_dir):
    job = tmp_path / "job.toml"
    job.write_text('name = "found"\n[model]\nname = "offline"\n' + _coder("c", "look around"))
    env = {"FLEET_RUNS_DIR": str(runs_dir)}
    assert fleet("run", str(job), "--plain", **env).returncode == 0  # goes to $FLEET_RUNS_DIR
    (run,) = RunDir.list(runs_dir)
    (runs_dir / "memory" / "greeter").mkdir(parents=True)  # memory profiles live beside runs
    prefix = run.id[: len("found-")]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # The same id prefix through $FLEET_RUNS_DIR and through --output-dir, from anywhere.
    for how, extra in ((env, []), ({}, ["--output-dir", str(runs_dir)])):
        listed = json.loads(fleet("runs", "--json", *extra, cwd=elsewhere, **how).stdout)
        assert [r["id"] for r in listed] == [run.id]
        traced = fleet("trace", prefix, "--json", *extra, cwd=elsewhere, **how)
        assert json.loads(traced.stdout)["run"] == run.id, traced.stderr
        resumed = fleet("resume", prefix, *extra, cwd=elsewhere, **how)
        assert resumed.returncode == 0 and "nothing left to run" in resumed.stderr
        assert f"serving run {run.id}" in _view_finds(prefix, *extra, **how)
    assert f"serving run {run.id}" in _view_finds(str(run.path))
    # A name that matches nothing lists the runs there - and not memory/, which is none.
    missing = fleet("trace", "nothing-like-it", cwd=elsewhere, **env)
    assert missing.returncode == 2
    assert run.id in missing.stderr and "memory" not in missing.stderr
    assert "--output-dir DIR or FLEET_RUNS_DIR=DIR" in missing.stderr


def test_a_search_url_the_allowlist_refuses_is_refused_before_the_run(tmp_path):
    url = "http://docs.example/search?q={query}"
    done = fleet("research", "What is a task?", "--search-url", url, "--output-dir", str(tmp_path))
    assert done.returncode == 2 and not list(tmp_path.iterdir())
    assert "--search-url (egress.search_url): its host docs.example:80 is not" in done.stderr
    assert "--allow-domain docs.example:80" in done.stderr


def _only_blocked_pages(body: dict[str, Any]) -> Any:
    if not _tool_results(body):
        return tool_use("navigate", {"url": "http://blocked.example/docs"})
    return tool_use(
        "submit_result",
        {"summary": "nothing found", "claims": [], "open_questions": [], "confidence": "low"},
    )


@pytest.mark.chromium
def test_a_member_whose_every_tool_call_was_refused_is_not_ok(tmp_path, images, runs_dir):
    job = tmp_path / "job.toml"
    job.write_text(
        'name = "walled"\n[model]\nname = "claude-sonnet-5"\n'
        '[[members]]\nid = "walled"\nkind = "browser"\ntask = "Read the docs."\n'
    )
    done, _ = run_against(_only_blocked_pages, job, runs_dir)
    assert done.returncode == 1, done.stderr
    (run,) = RunDir.list(runs_dir)
    outcome = run.outcome("walled")
    assert outcome.status == "failed"
    assert outcome.reason.startswith(
        "every tool call was refused by policy (1 of 1), e.g. blocked:"
    )
    assert run.state().members == {"walled": "failed"}


def test_max_turns_reads_as_the_number_written_in_every_view(tmp_path, images, runs_dir):
    """One turn allowed; the closing call after it is a model call, not a second turn."""
    job = tmp_path / "job.toml"
    job.write_text(
        'name = "one-turn"\n[model]\nname = "claude-sonnet-5"\n'
        '[[members]]\nid = "brief"\nkind = "coding"\ntask = "count"\n'
        "limits = { max_turns = 1 }\n"
    )
    done, api = run_against(_shell_then_sleep_then_submit, job, runs_dir)
    assert done.returncode == 1 and len(api.requests) == 2, done.stderr
    (run,) = RunDir.list(runs_dir)
    assert run.outcome("brief").turns == 1 and run.outcome("brief").status == "incomplete"
    row = next(line for line in done.stderr.splitlines() if line.startswith("brief "))
    assert row.split()[1:3] == ["incomplete", "1"], row  # status, turn
    traced = json.loads(fleet("trace", str(run.path), "--json").stdout)
    assert traced["members"][0]["turns"] == 1
    detail = fleet("trace", str(run.path), "brief").stdout
    assert "turn 1 " in detail and "closing call (after a limit)" in detail


def test_a_run_where_no_member_ends_ok_still_writes_its_report(tmp_path, images, runs_dir):
    job = tmp_path / "job.toml"
    task = "Replace `Hello, {name}!` with `Hi, {name}!` in `greet.py`."
    job.write_text('name = "none-ok"\n[model]\nname = "offline"\n' + _coder("curt", task))
    done = fleet("run", str(job), "--output-dir", str(runs_dir), "--plain")
    assert done.returncode == 1, done.stderr
    (run,) = RunDir.list(runs_dir)
    assert f"report: {run.path / 'report.md'}" in done.stderr
    report = json.loads((run.path / "report.json").read_text())
    assert report["summary"].startswith("No member returned a result: all 1 ended without one")
    (line,) = report["failed"]
    assert (line["member"], line["task"], line["status"]) == ("curt", task, "failed")
    assert line["reason"].startswith("test failed after edit:")
    md = (run.path / "report.md").read_text()
    row = next(r for r in md.splitlines() if r.startswith("| curt |"))
    assert "Hi, {name}!" in row and "test failed after edit" in row  # what was tried, and why


def _readme_block(first_line: str) -> str:
    """The models page's indented code block that starts with ``first_line``, dedented."""
    lines = (ROOT / "docs" / "models.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == first_line)
    indent = len(lines[start]) - len(lines[start].lstrip())
    block = []
    for line in lines[start:]:
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            break
        block.append(line[indent:])
    return "\n".join(block).strip() + "\n"


@pytest.mark.chromium
def test_the_readme_fake_api_example_runs_to_a_report_by_the_model_analyst(
    tmp_path, images, runs_dir
):
    (tmp_path / "own-job.toml").write_text(_readme_block('name = "own-job"'))
    script = _readme_block(
        '[{"content": [{"type": "tool_use", "id": "t1", "name": "submit_result",'
    )
    (tmp_path / "replies.json").write_text(script)
    server = popen(
        [sys.executable, "-m", "subagents.fake_api", "--port", "0", "--script", "replies.json"],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stderr is not None
        url = re.search(r"(http://127\.0\.0\.1:\d+)", server.stderr.readline())
        assert url, "the fake server printed no URL"
        keys = {"ANTHROPIC_BASE_URL": url.group(1), "ANTHROPIC_API_KEY": "test"}
        done = fleet("run", "own-job.toml", "--output-dir", str(runs_dir), cwd=tmp_path, **keys)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert done.returncode == 0, done.stderr
    (run,) = RunDir.list(runs_dir)
    report = json.loads((run.path / "report.json").read_text())
    assert report["analyst"] == "claude-sonnet-5" and "failed" not in report["summary"]
    assert not [e for e in run.journal.read() if e.event == "analyst_failed"]

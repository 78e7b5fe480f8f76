"""On a cluster a member goes on from its last completed turn, a run killed with its
coordinator resumes with what had finished kept and no box left on any node, and the
run keeps one budget: through the real CLI (``fleet run --cluster``, ``fleet resume --cluster``)
on the Ray test cluster (``ray_cluster``: head + 2 nodes sharing this machine's
Docker engine), real boxes, the offline coding model on the nodes.

The node's scratch directory goes with its actor; what a resumed member goes on from
is what reached the coordinator through the attempt's stream.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
from test_cluster import _boxes, _cluster_run, _fleet, _wait_for

from coordinator.rundir.runs import RunDir
from subagents.trace import read_trace

pytestmark = [pytest.mark.docker, pytest.mark.slow]
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
EDIT = 'task = "Replace `Hello, {name}!` with `Hello there, {name}!` in `greet.py`."'
SLOW_SECOND = (
    "n=$(cat /tmp/runs 2>/dev/null || echo 0); echo $((n+1)) > /tmp/runs; "
    "[ \"$n\" = 0 ] && grep -q 'Hello, {' greet.py && touch /tmp/unedited; "
    '[ "$n" = 1 ] && [ -e /tmp/unedited ] && sleep 12; python3 test_greet.py'
)
"""The check command: slow the second time it runs in a box whose first run saw the
file before the edit (the offline coder runs it before and after its edit), while the
test stops the run. In a box where a member goes on after its edit every run is quick,
the one that checks the submitted result too."""


def _events(run: RunDir, member: str) -> list[Any]:
    path = run.path / "members" / member / "trace.jsonl"
    return list(read_trace(path)) if path.exists() else []


def _shell_calls(run: RunDir, member: str) -> int:
    return sum(1 for e in _events(run, member) if e.type == "tool_call" and e.tool == "shell")


def _coder_job(tmp_path: Path, fanout: str = "", check: str = SLOW_SECOND) -> Path:
    shutil.copytree(EXAMPLES / "sample-repo", tmp_path / "sample-repo")
    text = f'name = "resumed"\n[model]\nname = "offline"\n[fanout]\n{fanout}\n'
    text += '[[members]]\nid = "c"\nkind = "coding"\nrepo = "sample-repo"\n'
    text += f"{EDIT}\ntest = {json.dumps(check)}\n"
    job = tmp_path / "job.toml"
    job.write_text(text)
    return job


def _in_the_check_after_the_edit(run: RunDir) -> None:
    """Waits until the member runs its check after the edit (its third turn, slow):
    the edit's turn is saved by then."""
    _wait_for(lambda: _shell_calls(run, "c") >= 2, 180, "the check after the edit")


def _went_on_from_the_edit(run: RunDir) -> None:
    """The member went on from its second turn with the workspace of that turn."""
    result = run.outcome("c")
    assert result.status == "ok", result.reason
    events = _events(run, "c")
    (mark,) = [e for e in events if e.type == "resumed"]
    # It went on from the edit's turn, its workspace put back as of that turn ...
    assert mark.turn == 2 and "workspace restored" in mark.restored, mark
    after = events[events.index(mark) :]
    # ... so only the check and the submission were asked for again, not every turn,
    assert [e.type for e in after].count("model_call") == 2
    # the edit that had completed did not run again (it would fail: already applied),
    assert [e.tool for e in after if e.type == "tool_call"] == ["shell", "submit_result"]
    assert not any("refused" in n for n in result.result.notes), result.result
    # and the workspace was the turn's: the patch holds the edit once, the check passed.
    patch = result.result.patch
    assert patch.count('+    return f"Hello there, {name}!"') == 1, patch
    assert result.result.tests_passed is True
    assert result.resumed_from == 2
    # A final outcome leaves no transcript or checkpoint behind.
    mdir = run.path / "members" / "c"
    assert not (mdir / "conversation.json").exists() and not list(mdir.glob("checkpoint-*"))


def test_a_sigkilled_run_resumes_each_member_from_its_last_turn_and_leaves_no_box(
    tmp_path, ray_cluster, node_client, cleanup
):
    # Two at a time: "c" is killed in its check after its edit, "c0" has finished by
    # then, the other members wait or run.
    cleanup.append(tmp_path / "runs")
    job = _coder_job(
        tmp_path, "max_parallel = 2", check=SLOW_SECOND.replace("sleep 12", "sleep 120")
    )
    quick = 'kind = "coding"\nrepo = "sample-repo"\ntest = "python3 test_greet.py"\n'
    job.write_text(
        job.read_text() + "".join(f'[[members]]\nid = "c{i}"\n{quick}{EDIT}\n' for i in range(3))
    )
    with _cluster_run(tmp_path, job, ray_cluster.address) as (proc, run):

        def c_checks_and_one_is_done() -> bool:
            states = run.state().members
            return (
                _shell_calls(run, "c") >= 2
                and states.get("c") == "running"
                and ("ok" in states.values())
            )

        _wait_for(c_checks_and_one_is_done, 240, "c in its check after the edit, c0 done")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert run.state().status == "dead"
    done_before = {m for m, s in run.state().members.items() if s == "ok"}
    calls_before = sum(1 for e in _events(run, "c") if e.type == "model_call")
    assert calls_before == 3, calls_before

    resumed = _fleet("resume", str(run.path), "--plain", "--cluster", ray_cluster.address)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = run.state()
    assert after.status == "succeeded" and set(after.members.values()) == {"ok"}
    assert all(after.starts[m] == 1 for m in done_before)  # what had finished kept
    assert any(e.event == "reaped" for e in run.journal.read())  # the dead run's boxes
    assert _boxes(node_client, run.id) == []
    _went_on_from_the_edit(run)
    report = (run.path / "report.md").read_text()
    assert "resumed from turn 2" in report
    shown = _fleet("trace", str(run.path), "c")
    assert "resumed from turn 2" in shown.stdout, shown.stdout[-2000:]
    # Resumed again with nothing left: said so, and nothing runs or is recorded.
    events = len(run.journal.read())
    again = _fleet("resume", str(run.path), "--plain", "--cluster", ray_cluster.address)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"run {run.id} has nothing left to run (succeeded)" in again.stderr
    assert len(run.journal.read()) == events and _boxes(node_client, run.id) == []


def test_a_member_whose_node_is_lost_goes_on_from_its_last_turn_on_another_node(
    tmp_path, ray_cluster, docker_client, cleanup
):
    # One member at a time: the run's one slot is on the node with the most of them.
    doomed = ray_cluster.add_node(slots=8)
    name = ray_cluster.name(doomed)
    cleanup.append(tmp_path / "runs")
    retry = 'retry = { attempts = 2, backoff_s = 0, on = ["crashed"] }\nmax_parallel = 1'
    with _cluster_run(tmp_path, _coder_job(tmp_path, retry), ray_cluster.address) as (proc, run):
        _in_the_check_after_the_edit(run)
        ray_cluster.remove_node(doomed)
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    journal = list(run.journal.read())
    started = [e.node for e in journal if e.event == "member_started"]
    assert started[0] == name and len(started) == 2 and started[1] != name, started
    (retry_entry,) = [e for e in journal if e.event == "member_retry"]
    assert retry_entry.reason.startswith(f"node {name} lost: ")
    _went_on_from_the_edit(run)


def _budget_job(tmp_path: Path, members: int, tokens: int) -> Path:
    text = 'name = "budget"\n[model]\nname = "offline"\nmax_tokens = 256\n'
    text += f"[fanout]\nmax_parallel = {members}\n[budget]\ntokens = {tokens}\n"
    for i in range(members):
        text += f'[[members]]\nid = "m{i}"\nkind = "coding"\ntask = "List the files."\n'
    job = tmp_path / "job.toml"
    job.write_text(text)
    return job


def test_a_fan_out_across_nodes_keeps_the_runs_one_budget(tmp_path, ray_cluster, cleanup):
    # 4 offline members of 2 calls each spend about 3,400 tokens each (13,500 in all);
    # the line is 15,000 with each member's closing room held: one goes first (its first
    # call teaches the run), two at once once it finished (on both nodes: the node with
    # the most free slots takes each), then what is left carries one more, not a fourth.
    members, hard = 4, 15000
    cleanup.append(tmp_path / "runs")
    job = _budget_job(tmp_path, members, hard)
    out = str(tmp_path / "runs")
    done = _fleet("run", str(job), "--output-dir", out, "--plain", "--cluster", ray_cluster.address)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    (run,) = RunDir.list(tmp_path / "runs")
    journal = list(run.journal.read())
    nodes = {e.node for e in journal if e.event == "member_started"}
    assert len(nodes) == 2, nodes  # members on both nodes reserved from the one line
    calls = [e.tokens for e in journal if e.event == "budget_spent"]
    assert calls and sum(calls) <= hard, (sum(calls), calls)
    assert [e.event for e in journal].count("budget_hard") <= 1
    results = {f"m{i}": run.outcome(f"m{i}") for i in range(members)}
    stopped = {m: r for m, r in results.items() if r.status != "ok"}
    assert stopped and len(stopped) < members, {m: r.reason for m, r in results.items()}
    for member, r in stopped.items():
        assert r.limit == "budget", (member, r.reason)
        if r.status == "skipped":  # never started: no box, no call
            assert r.reason.startswith("skipped: the run's budget cannot carry it"), r.reason
            assert r.turns == 0
        else:  # stopped at the line, with what it did
            assert r.status == "incomplete" and r.reason.startswith("run budget reached")
            if r.turns:
                assert r.partial_result and r.progress.last_actions, r
    report = (run.path / "report.md").read_text()
    assert "never started (skipped" in report or "reached the hard line" in report

    # More tokens: the members the budget stopped run again, on the nodes, and finish.
    more = _fleet(
        "resume", str(run.path), "--plain", "--budget-tokens", "100000",
        "--cluster", ray_cluster.address,
    )  # fmt: skip
    assert more.returncode == 0, more.stderr[-3000:]
    assert all(run.outcome(m).status == "ok" for m in results)
    journal = list(run.journal.read())
    assert [e.tokens for e in journal if e.event == "budget"] == [hard, 100000]
    spent = [e for e in journal if e.event == "budget_spent"][-1].spent_tokens
    assert spent > sum(calls)  # went on from what the first life spent

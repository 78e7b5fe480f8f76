"""``fleet run / code / resume / runs`` end to end: real boxes, the real harness, the real
``anthropic`` client against the fake Messages API on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fleet_policies import coding_policy

from coordinator.cli import main
from coordinator.rundir.runs import RunDir
from subagents.trace import read_trace

pytestmark = pytest.mark.docker
FLEET = [str(Path(sys.executable).with_name("fleet"))]


def _boxes(docker_client: Any, run_id: str) -> list[dict[str, Any]]:
    """The run's containers as the engine lists them (no per-box inspect, which races
    with a box being removed at that moment)."""
    return docker_client.api.containers(all=True, filters={"label": f"fleet.run={run_id}"})


def _member(mid: str, task: str, **extra: Any) -> str:
    lines = ["[[members]]", f'id = "{mid}"', 'kind = "coding"', f"task = {json.dumps(task)}"]
    lines += [f"{k} = {v}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def _job(tmp_path: Path, members: str, *, fanout: str = "") -> Path:
    text = f'name = "t"\noutput_dir = "{tmp_path / "runs"}"\n[model]\nname = "claude-sonnet-5"\n'
    text += f"[fanout]\n{fanout}\n" + members
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def _kill_box_when_up(docker_client: Any, trace: Path, stop: threading.Event) -> None:
    """Kill the member's box (named in its trace) a moment after it is handed over."""
    while not stop.is_set():
        names = (
            [e.box for e in read_trace(trace) if e.type == "sandbox" and e.action == "create"]
            if trace.exists()
            else []
        )
        if names:
            time.sleep(0.5)
            docker_client.containers.get(names[0]).kill()
            return
        time.sleep(0.1)


def _glob_one(pattern: Path, stop: threading.Event) -> Path:
    """The one path matching ``pattern`` once it exists (a run directory is made later)."""
    while not stop.is_set():
        found = list(Path("/").glob(str(pattern).lstrip("/")))
        if found:
            return found[0]
        time.sleep(0.1)
    return pattern


def test_five_members_three_failures_two_results_and_a_report(
    tmp_path, images, docker_client, fake_api, cleanup, capsys
):
    fake_api(coding_policy(turns=3, latency_s=0.4))
    cleanup.append(tmp_path / "runs")
    members = (
        _member("good-1", "List the files.")
        + _member("good-2", "Print the date.")
        + _member("rejected", "[bad-request] anything")
        + _member("stuck", "[hang] anything", limits="{ deadline_s = 8 }")
        + _member("victim", "[slow] Count the lines.")
    )
    job = _job(
        tmp_path, members, fanout="max_parallel = 5\nmin_success = 2\nretry = { attempts = 1 }"
    )
    stop = threading.Event()
    victim_trace = tmp_path / "runs" / "*" / "members" / "victim" / "trace.jsonl"
    killer = threading.Thread(
        target=lambda: _kill_box_when_up(docker_client, _glob_one(victim_trace, stop), stop)
    )
    killer.start()
    try:
        code = main(["run", str(job), "--plain"])
    finally:
        stop.set()
        killer.join()
    assert code == 0  # quorum of 2 met; the failures are listed, not fatal
    (run,) = RunDir.list(tmp_path / "runs")
    status = {m: run.outcome(m).status for m in ("good-1", "good-2", "rejected", "stuck", "victim")}
    assert status == {
        "good-1": "ok",
        "good-2": "ok",
        "rejected": "failed",
        "stuck": "timed_out",
        "victim": "crashed",
    }
    report = json.loads((run.path / "report.json").read_text())
    assert {c["member"] for c in report["code"]} == {"good-1", "good-2"}
    failed = {f["member"]: f["reason"] for f in report["failed"]}
    assert set(failed) == {"rejected", "stuck", "victim"}
    assert "model error" in failed["rejected"] and "prompt is too long" in failed["rejected"]
    assert "deadline" in failed["stuck"]  # the harness's soft one (7.2 s) or the hard 8 s
    assert "sandbox crashed" in failed["victim"]
    md = (run.path / "report.md").read_text()
    assert "3 member(s) failed" in md and "victim (crashed" in md
    out = capsys.readouterr()
    assert "succeeded: 2 of 5 members ok" in out.err
    assert _boxes(docker_client, run.id) == []


def test_oom_killed_box_is_its_members_crash_and_a_killed_box_is_retried(
    tmp_path, images, docker_client, fake_api, cleanup, capsys
):
    """Real harness, real boxes: one member's box is OOM-killed on every attempt, another's
    only on its first; the sibling and the retried member finish, the run meets its quorum."""
    fake_api(coding_policy(turns=2))
    cleanup.append(tmp_path / "runs")
    small = '{ memory = "64m" }'  # small enough that init, not the hog, is picked
    members = (
        _member("steady", "List the files.")
        + _member("hog", "[oom] Load the whole data set.", sandbox=small)
        + _member("flaky", "[oom-once] Count the lines.", sandbox=small)
    )
    job = _job(
        tmp_path,
        members,
        fanout="max_parallel = 3\nmin_success = 2\nretry = { attempts = 2, backoff_s = 0.2 }",
    )
    code = main(["run", str(job), "--plain"])
    assert code == 0, capsys.readouterr().err
    (run,) = RunDir.list(tmp_path / "runs")
    hog = run.outcome("hog")
    assert hog.status == "crashed"
    assert hog.reason == "sandbox crashed: oom-killed", hog.reason
    assert run.outcome("steady").status == "ok"
    assert run.outcome("flaky").status == "ok"
    state = run.state()
    assert state.starts == {"steady": 1, "hog": 2, "flaky": 2}
    retries = {e.member: e for e in run.journal.read() if e.event == "member_retry"}
    assert set(retries) == {"hog", "flaky"}
    assert retries["flaky"].reason == "sandbox crashed: oom-killed"
    # The retried member's trace shows both attempts: two boxes, the first one dead.
    trace = list(read_trace(run.path / "members" / "flaky" / "trace.jsonl"))
    boxes = [e.box for e in trace if e.type == "sandbox" and e.action == "create"]
    assert len(boxes) == 2 and boxes[0] != boxes[1]
    assert [e.type for e in trace].count("member_start") == 2
    report = json.loads((run.path / "report.json").read_text())
    assert {f["member"]: f["reason"] for f in report["failed"]} == {
        "hog": "sandbox crashed: oom-killed"
    }
    assert "succeeded: 2 of 3 members ok" in capsys.readouterr().err
    assert _boxes(docker_client, run.id) == []


def test_exit_code_of_the_real_fleet_process_is_0_on_quorum_and_1_below_it(
    tmp_path, images, docker_client, fake_api, cleanup
):
    fake_api(coding_policy(turns=1))
    cleanup.append(tmp_path / "runs")
    members = _member("fine", "List the files.") + _member("rejected", "[bad-request] x")
    for quorum, want in ((1, 0), (2, 1)):
        job = _job(tmp_path, members, fanout=f"min_success = {quorum}")
        proc = subprocess.run(
            [*FLEET, "run", str(job), "--plain"], capture_output=True, text=True, timeout=180
        )
        assert proc.returncode == want, proc.stderr
        assert "Traceback" not in proc.stderr
        # Failed members are listed either way, with their reason.
        row = next(ln for ln in proc.stderr.splitlines() if ln.startswith("rejected "))
        assert "failed" in row and "model error" in row
        verdict = "succeeded" if want == 0 else "failed"
        assert f"{verdict}: 1 of 2 members ok (quorum {quorum})" in proc.stderr


def test_a_box_the_job_asks_to_keep_outlives_the_run_and_only_that_one(
    tmp_path, images, docker_client, cleanup, monkeypatch, capsys
):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)  # the offline model will do
    cleanup.append(tmp_path / "runs")
    members = _member("kept", "List the files.", sandbox="{ keep = true }") + _member(
        "plain", "List the files."
    )
    job = _job(tmp_path, members)
    job.write_text(job.read_text().replace('"claude-sonnet-5"', '"offline"'))
    assert main(["run", str(job), "--plain"]) == 0
    (run,) = RunDir.list(tmp_path / "runs")
    left = _boxes(docker_client, run.id)
    assert [c["Labels"]["fleet.member"] for c in left] == ["kept"]
    assert left[0]["State"] == "running"  # ready to be inspected with docker exec
    name = left[0]["Names"][0].lstrip("/")
    kept = [e for e in run.journal.read() if e.event == "boxes_kept"]
    assert kept and kept[0].boxes == [name]
    err = capsys.readouterr().err
    assert f"kept for debugging: {name}" in err
    # The progress table's last action says which box was kept, not that it was removed.
    rows = {ln.split()[0]: ln for ln in err.splitlines() if ln.startswith(("kept ", "plain "))}
    assert rows["kept"].endswith(f"box kept: {name}"), rows
    assert rows["plain"].endswith("box removed"), rows
    trace = list(read_trace(run.path / "members" / "kept" / "trace.jsonl"))
    assert [(e.action, e.box) for e in trace if e.type == "sandbox"][-1] == ("keep", name)
    # The line names the command that removes this box, and only it (not gc --all,
    # which would take every kept box on a shared engine).
    assert f"remove with 'fleet sandbox rm {name}'" in err
    assert main(["sandbox", "rm", name]) == 0
    assert _boxes(docker_client, run.id) == []
    assert f"removed {name} (run {run.id}, member kept)" in capsys.readouterr().out
    assert main(["sandbox", "rm", name]) == 2  # gone: named, with where to look
    assert "no Fleet box named" in capsys.readouterr().err


def _wait_for(pred, timeout: float, what: str, describe=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}: {describe()}")


def test_sigkill_then_resume_reruns_only_unfinished_members(
    tmp_path, images, docker_client, fake_api, cleanup
):
    api = fake_api(coding_policy(turns=3, latency_s=0.6))
    cleanup.append(tmp_path / "runs")
    members = "".join(_member(f"m{i}", f"Task number {i}.") for i in range(1, 6))
    job = _job(tmp_path, members, fanout="max_parallel = 2\nmin_success = 5")
    env = {**os.environ, "ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url}
    proc = subprocess.Popen(
        [*FLEET, "run", str(job), "--plain"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(
            lambda: RunDir.list(tmp_path / "runs"),
            60,
            "the run directory",
            lambda: proc.stderr.read()[-3000:] if proc.poll() is not None else "running",
        )
        (run,) = RunDir.list(tmp_path / "runs")

        def two_done_one_running() -> bool:
            # "running" is journaled before the member's box is up (a box not taken
            # from the warm ones starts beside its first model call): wait for the box.
            st = run.state()
            done = [m for m, s in st.members.items() if s == "ok"]
            running = {m for m, s in st.members.items() if s == "running"}
            boxed = {b["Labels"].get("fleet.member") for b in _boxes(docker_client, run.id)}
            return len(done) >= 2 and bool(running & boxed)

        def describe() -> str:
            if proc.poll() is not None:
                return f"fleet exited {proc.returncode}: {proc.stderr.read()[-3000:]}"
            return "\n".join(e.to_json() for e in run.journal.read())[-3000:]

        _wait_for(
            two_done_one_running, 120, "two members finished and one running in its box", describe
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    before = run.state()
    finished_before = {m for m, s in before.members.items() if s == "ok"}
    assert before.status == "dead"
    assert _boxes(docker_client, run.id), "a killed coordinator leaves its boxes behind"
    # gc knows the run is over (its owner pid is dead) and removes them.
    gc = subprocess.run([*FLEET, "sandbox", "gc"], env=env, capture_output=True, text=True)
    assert gc.returncode == 0, gc.stderr
    assert _boxes(docker_client, run.id) == []

    resumed = subprocess.run(
        [*FLEET, "resume", str(run.path), "--plain"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    after = run.state()
    assert set(after.members.values()) == {"ok"} and len(after.members) == 5
    assert after.status == "succeeded"
    for m in finished_before:  # not run again: one start in the journal, one in the trace
        assert after.starts[m] == 1
        starts = [
            e
            for e in read_trace(run.path / "members" / m / "trace.jsonl")
            if e.type == "member_start"
        ]
        assert len(starts) == 1
    for m in finished_before:  # the table shows its recorded figures, not 0 turns in 0.0s
        row = next(ln for ln in resumed.stderr.splitlines() if ln.startswith(f"{m} ")).split()
        assert row[1] == "ok" and row[2] == str(run.outcome(m).turns) != "0", row
        assert row[5] != "0.0s", row
    rerun = set(after.members) - finished_before
    assert rerun and all(after.starts[m] >= 1 for m in rerun)
    assert any(e.event == "reaped" for e in run.journal.read())
    assert (run.path / "report.md").exists()
    assert _boxes(docker_client, run.id) == []
    listing = subprocess.run(
        [*FLEET, "runs", "--output-dir", str(tmp_path / "runs")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.id in listing.stdout and "succeeded" in listing.stdout and "5/5" in listing.stdout


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


def test_fleet_code_returns_a_patch_that_applies_to_the_untouched_repo(
    tmp_path, images, docker_client, fake_api, cleanup, capsys
):
    repo = tmp_path / "proj"
    repo.mkdir()
    (repo / "hello.py").write_text('print("hello world")\n')
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    fake_api(coding_policy())
    out_dir = tmp_path / "runs"
    cleanup.append(out_dir)
    task = "Greet the fleet [edit:/workspace/hello.py:world:fleet]"
    code = main(
        [
            "code",
            str(repo),
            task,
            "--test",
            "python3 hello.py",
            "--model",
            "claude-sonnet-5",
            "--output-dir",
            str(out_dir),
            "--plain",
        ]
    )
    assert code == 0
    assert (repo / "hello.py").read_text() == 'print("hello world")\n'
    assert _git(repo, "status", "--porcelain") == ""
    (run,) = RunDir.list(out_dir)
    patch = run.path / "members" / "coder" / "patch.diff"
    result = run.outcome("coder").result
    assert result.files_changed == ["hello.py"]
    assert result.verified.passed is True
    printed = capsys.readouterr().out
    assert "hello.py" in printed and str(patch) in printed
    subprocess.run(["git", "apply", "--check", str(patch)], cwd=repo, check=True)
    subprocess.run(["git", "apply", str(patch)], cwd=repo, check=True)
    assert (repo / "hello.py").read_text() == 'print("hello fleet")\n'
    # --apply does the same in one step.
    _git(repo, "checkout", "--", "hello.py")
    code = main(
        [
            "code",
            str(repo),
            task,
            "--apply",
            "--model",
            "claude-sonnet-5",
            "--output-dir",
            str(out_dir),
            "--plain",
        ]
    )
    assert code == 0
    assert (repo / "hello.py").read_text() == 'print("hello fleet")\n'


def test_fleet_code_never_applies_a_patch_that_fails_the_test(
    tmp_path, images, docker_client, fake_api, cleanup, capsys
):
    repo = tmp_path / "proj"
    repo.mkdir()
    (repo / "hello.py").write_text('print("hello world")\n')
    fake_api(coding_policy())
    out_dir = tmp_path / "runs"
    cleanup.append(out_dir)
    code = main(
        [
            "code",
            str(repo),
            "Greet the fleet [edit:/workspace/hello.py:world:fleet]",
            "--test",
            "grep -q world hello.py",
            "--apply",
            "--model",
            "claude-sonnet-5",
            "--output-dir",
            str(out_dir),
            "--plain",
        ]
    )
    assert code == 1
    assert (repo / "hello.py").read_text() == 'print("hello world")\n'
    printed = capsys.readouterr().out
    assert "-> exit 1 (FAILED" in printed and "untouched (not applied)" in printed
    (run,) = RunDir.list(out_dir)
    assert '+print("hello fleet")' in (run.path / "members" / "coder" / "patch.diff").read_text()
    # The member and the run failed, and every record says so.
    assert run.state().status == "failed" and run.state().members["coder"] == "failed"
    assert run.outcome("coder").reason.startswith("test failed after edit:")

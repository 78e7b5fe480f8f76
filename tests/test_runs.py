"""Run directories: the journal survives kills, state is folded from it, resume picks
the right members, and Ctrl-C leaves a resumable run with no boxes behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import pytest
from conftest import remove_run
from fleet_policies import coding_policy
from process_support import popen

from coordinator.job.jobfile import parse_job
from coordinator.rundir.runs import RunDir, RunNotFound
from sandbox.docker import reaper
from subagents.fake_api import FakeMessagesAPI, tool_use

FLEET = str(Path(sys.executable).with_name("fleet"))
JOB = (
    'name = "Journal test"\n[[members]]\nid = "a"\nkind = "coding"\ntask = "t"\n'
    '[[members]]\nid = "b"\nkind = "coding"\ntask = "u"\n'
    '[[members]]\nid = "c"\nkind = "coding"\ntask = "v"\n'
)


def _fleet(args: list[str], api_url: str | None = None) -> subprocess.Popen[str]:
    """Start the real `fleet` process: against the fake Messages API at ``api_url``, or
    offline (no API key in its environment) when none is given."""
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    if api_url:
        env |= {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": api_url}
    return popen([FLEET, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run(tmp_path: Path) -> RunDir:
    job = parse_job(JOB)
    return RunDir.create(job, JOB, root=tmp_path)


def test_run_directory_holds_the_job_as_given_and_validated(tmp_path):
    run = _run(tmp_path)
    assert run.id.startswith("journal-test-")
    assert (run.path / "job.toml").read_text() == JOB
    assert run.job().members[1].id == "b"
    assert run.journal.read()[0].event == "run_created"
    assert RunDir.open(run.id, root=tmp_path).path == run.path
    assert RunDir.open(run.id[:-2], root=tmp_path).path == run.path  # unique prefix
    with pytest.raises(RunNotFound, match="fleet runs"):
        RunDir.open("nothing-like-it", root=tmp_path)


def test_a_torn_last_journal_line_is_skipped(tmp_path):
    run = _run(tmp_path)
    run.journal.note("member_started", member="a", attempt=1)
    with run.journal.path.open("a") as fh:
        fh.write('{"ts": 1, "event": "member_fini')  # killed mid-write
    events = [e.event for e in run.journal.read()]
    assert events == ["run_created", "member_started"]


def test_resume_runs_members_without_a_final_outcome(tmp_path):
    run = _run(tmp_path)
    members = run.job().members
    run.journal.note("run_started", pid=999_999_999)
    for m, status in (("a", "ok"), ("b", "failed"), ("c", "cancelled")):
        run.journal.note("member_started", member=m, attempt=1)
        run.journal.note("member_finished", member=m, status=status)
    assert [m.id for m in run.pending_members(members)] == ["c"]
    assert [m.id for m in run.pending_members(members, retry_failed=True)] == ["b", "c"]
    run.journal.note("member_started", member="c", attempt=1)  # then SIGKILL
    st = run.state()
    assert st.members["c"] == "running" and st.starts["c"] == 2
    assert st.status == "dead"  # running per the journal, but no live owner


def test_live_owner_is_reported_until_cleared(tmp_path):
    run = _run(tmp_path)
    run.journal.note("run_started", pid=os.getpid())
    run.mark_live()
    assert run.owner_pid() == os.getpid() and run.state().status == "running"
    run.clear_live()
    assert run.owner_pid() is None and run.state().status == "dead"


@pytest.mark.docker
def test_ctrl_c_interrupts_removes_boxes_and_the_run_resumes(tmp_path, images, docker_client):
    job = tmp_path / "job.toml"
    job.write_text(
        f'name = "ctrlc"\noutput_dir = "{tmp_path / "runs"}"\n[model]\nname = "claude-sonnet-5"\n'
        + "".join(
            f'[[members]]\nid = "m{i}"\nkind = "coding"\ntask = "Task {i}."\n' for i in range(3)
        )
    )
    with FakeMessagesAPI(coding_policy(turns=4, latency_s=0.5)) as api:
        proc = _fleet(["run", str(job), "--plain"], api_url=api.url)
        run = None
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                runs = RunDir.list(tmp_path / "runs")
                if runs and "running" in runs[0].state().members.values():
                    run = runs[0]
                    break
                time.sleep(0.1)
            assert run is not None, "no member started"
            time.sleep(1.0)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 130, err
            assert "Traceback" not in err and f"fleet resume {run.id}" in err
            events = [e.event for e in run.journal.read()]
            assert "run_interrupted" in events
            st = run.state()
            assert st.status == "interrupted"
            assert "cancelled" in st.members.values()
            assert (
                docker_client.containers.list(all=True, filters={"label": f"fleet.run={run.id}"})
                == []
            )
            resumed = _fleet(
                ["resume", run.id, "--output-dir", str(tmp_path / "runs"), "--plain"],
                api_url=api.url,
            )
            _, resumed_err = resumed.communicate(timeout=300)
            assert resumed.returncode == 0, resumed_err
            assert set(run.state().members.values()) == {"ok"}
            assert json.loads((run.path / "report.json").read_text())["failed"] == []
        finally:
            if proc.poll() is None:
                proc.kill()
            if run is not None:
                remove_run(docker_client, run.id)


def test_resume_refuses_a_run_that_is_still_running_and_unknown_runs(tmp_path, capsys):
    from coordinator.cli import main

    run = _run(tmp_path)
    run.journal.note("run_started", pid=os.getpid())
    run.mark_live()
    assert main(["resume", str(run.path)]) == 2
    assert "still running" in capsys.readouterr().err
    assert main(["resume", "no-such-run", "--output-dir", str(tmp_path)]) == 2
    assert "fleet runs" in capsys.readouterr().err
    run.clear_live()


@pytest.mark.docker
def test_ctrl_c_while_the_planner_thinks_leaves_an_interrupted_run(tmp_path, images, docker_client):
    job = tmp_path / "job.toml"
    job.write_text(
        f'name = "plan-ctrlc"\noutput_dir = "{tmp_path / "runs"}"\n'
        '[model]\nname = "claude-sonnet-5"\n[research]\nquestion = "How do tasks end?"\n'
    )
    asked = threading.Event()

    def slow_planner(body: dict) -> object:
        asked.set()
        return tool_use("submit_plan", {"sub_questions": ["x" * 12]}, latency_s=3600)

    with FakeMessagesAPI(slow_planner) as api:
        proc = _fleet(["run", str(job), "--plain"], api_url=api.url)
        run = None
        try:
            assert asked.wait(60), "the planner was never asked"
            (run,) = RunDir.list(tmp_path / "runs")
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 130, err
            assert "Traceback" not in err and f"fleet resume {run.id}" in err
            st = run.state()
            assert st.status == "interrupted"
            assert run.planned_members() is None  # resume plans afresh
            assert run.owner_pid() is None
            assert (
                docker_client.containers.list(all=True, filters={"label": f"fleet.run={run.id}"})
                == []
            )
        finally:
            if proc.poll() is None:
                proc.kill()
            if run is not None:
                remove_run(docker_client, run.id)


def test_an_engine_gone_after_the_preflight_is_one_paragraph_and_exit_1(
    tmp_path, monkeypatch, capsys
):
    """The engine's error surfaces from the run's task group wrapped in an exception
    group; the user sees its message and the run directory, never a traceback."""
    from coordinator.api import Ready
    from coordinator.cli.commands import _go
    from coordinator.runner.driver import RunOptions

    text = (
        'name = "gone"\n[model]\nname = "offline"\n[research]\n'
        'question = "How does asyncio cancel tasks?"\nmembers = 1\n'
        '[egress]\nallow = ["corpus:8080"]\n'
    )
    job = parse_job(text)
    run = RunDir.create(job, text, root=tmp_path)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    monkeypatch.setenv("FLEET_HOME", str(tmp_path / "fleet-home"))
    with pytest.raises(SystemExit) as ended:
        _go(lambda: anyio.run(Ready(job, RunOptions(tty=False, out=sys.stderr), run=run).go))
    assert ended.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "ExceptionGroup" not in err
    assert f"fleet: run {run.id} failed: the Docker engine is not reachable" in err
    assert f"run directory: {run.path}" in err
    assert f"'fleet resume {run.id} --output-dir {tmp_path}'" in err  # not the default place
    assert run.state().status == "failed" and run.owner_pid() is None
    assert run.id not in reaper.live_runs(), "a run that ended must not stay marked live"


def _corpus_box_created(docker_client, root: Path) -> bool:
    runs = RunDir.list(root)
    if not runs:
        return False
    found = docker_client.api.containers(
        all=True, filters={"label": [f"fleet.run={runs[0].id}", "fleet.member=corpus"]}
    )
    return bool(found)


def _run_started(docker_client, root: Path) -> bool:
    runs = RunDir.list(root)
    return bool(runs) and any(e.event == "run_started" for e in runs[0].journal.read())


@pytest.mark.docker
@pytest.mark.parametrize(
    ("when", "gap"),
    [(_run_started, 0.05), (_run_started, 0.5), (_corpus_box_created, 0.05)],
    ids=["before-members", "before-members-then-at-exit", "during-corpus-start"],
)
def test_two_quick_ctrl_c_end_the_run_interrupted_with_no_boxes_left(
    tmp_path, images, docker_client, when, gap
):
    """The second Ctrl-C arrives while the first one's cleanup runs (or as the process
    exits): still exit 130 after an orderly end (final table, run directory), the run
    interrupted and resumable, no box left, within a bounded time."""
    root = tmp_path / "runs"
    args = ["research", "How do asyncio tasks get cancelled?", "--members", "2", "--plain"]
    proc = _fleet([*args, "--output-dir", str(root)])
    run = None
    try:
        deadline = time.monotonic() + 60
        while not when(docker_client, root):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.02)
        (run,) = RunDir.list(root)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        time.sleep(gap)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=90)
        assert time.monotonic() - sent < 60
        assert proc.returncode == 130, err
        assert "Traceback" not in err and "KeyboardInterrupt" not in err
        assert f"interrupted: resume with '{run.resume_command()}'" in err
        assert f"run directory: {run.path}" in err  # the orderly end, not a cut-short one
        assert run.state().status == "interrupted" and run.owner_pid() is None
        left = docker_client.api.containers(all=True, filters={"label": f"fleet.run={run.id}"})
        assert left == []
    finally:
        if proc.poll() is None:
            proc.kill()
        if run is not None:
            remove_run(docker_client, run.id)


def _fleet_closed_stdout(args: list[str]) -> tuple[int, str]:
    """``fleet ARGS | head -0``: the reader has gone before Fleet writes a byte."""
    proc = subprocess.Popen([FLEET, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # Fleet takes a third of a second to start: long gone by then
    err = proc.stderr.read().decode()
    return proc.wait(timeout=60), err


def test_a_reader_that_closes_the_pipe_ends_runs_and_trace_quietly(tmp_path):
    run = _run(tmp_path)
    for args in (["runs", "--json"], ["runs"], ["trace", run.id]):
        code, err = _fleet_closed_stdout([*args, "--output-dir", str(tmp_path)])
        assert (code, err) == (141, ""), args  # as `git log | head`: no traceback, no noise


def test_a_run_whose_coordinator_died_before_it_started_is_dead(tmp_path):
    """Killed between making the run directory and starting the run, a coordinator
    left a run that said ``created 0/0`` forever; its pid is in the journal."""
    made = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from coordinator.job.jobfile import parse_job; "
            "from coordinator.rundir.runs import RunDir; "
            "RunDir.create(parse_job(sys.argv[1]), sys.argv[1], root=sys.argv[2])",
            JOB,
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    (run,) = RunDir.list(tmp_path)
    assert run.state().status == "dead"
    listed = subprocess.run(
        [FLEET, "runs", "--json", "--output-dir", str(tmp_path)], capture_output=True, text=True
    )
    assert [r["status"] for r in json.loads(listed.stdout)] == ["dead"]
    assert _run(tmp_path).state().status == "created"  # its maker is alive: not dead


def test_the_resume_hint_names_the_runs_directory_unless_it_is_the_default(tmp_path, monkeypatch):
    run = _run(tmp_path / "elsewhere")
    monkeypatch.delenv("FLEET_RUNS_DIR", raising=False)
    assert run.resume_command() == f"fleet resume {run.id} --output-dir {tmp_path / 'elsewhere'}"
    monkeypatch.setenv("FLEET_RUNS_DIR", str(tmp_path / "elsewhere"))
    assert run.resume_command() == f"fleet resume {run.id}"
    monkeypatch.delenv("FLEET_RUNS_DIR")
    monkeypatch.chdir(tmp_path)  # ./runs is where fleet resume looks by default
    default = _run(tmp_path / "runs")
    assert default.resume_command() == f"fleet resume {default.id}"
    spaced = _run(tmp_path / "my runs")
    assert spaced.resume_command().endswith(f"--output-dir '{tmp_path / 'my runs'}'")


@pytest.mark.docker
def test_fail_fasts_final_table_shows_the_member_it_stopped_as_cancelled(
    tmp_path, images, docker_client
):
    """The member that never started is journalled ``cancelled`` at the run's end; the
    final table says so too (it said ``queued``)."""
    job = tmp_path / "job.toml"
    job.write_text(
        f'name = "ff"\noutput_dir = "{tmp_path / "runs"}"\n[model]\nname = "claude-sonnet-5"\n'
        "[fanout]\nmax_parallel = 1\nfail_fast = true\n"
        '[[members]]\nid = "breaks"\nkind = "coding"\ntask = "[bad-request] t"\n'
        '[[members]]\nid = "waits"\nkind = "coding"\ntask = "u"\n'
    )
    with FakeMessagesAPI(coding_policy()) as api:
        proc = _fleet(["run", str(job), "--plain"], api_url=api.url)
        try:
            _, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
            for run in RunDir.list(tmp_path / "runs"):
                remove_run(docker_client, run.id)
    assert proc.returncode == 1, err
    final = err[err.rindex("member ") :].splitlines()  # the last table printed
    (row,) = [line for line in final if line.startswith("waits ")]
    assert row.split()[1] == "cancelled", final

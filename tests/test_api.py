"""Fleet's Python API (``import coordinator as fleet``): a job as a dict, TOML text or a
file in, a finished run out, progress through callbacks, typed errors, nothing printed.

The run itself uses only the public names; fixtures only clean up the engine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import types
from pathlib import Path
from typing import Any

import anyio
import pytest
from fleet_policies import coding_policy
from process_support import ignoring, popen

import coordinator as fleet
from coordinator.journal.entries import KINDS
from subagents.fake_api import FakeMessagesAPI

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TASK = "Greet warmly: replace `Hello, {name}!` with `Hello and welcome, {name}!` in `greet.py`."


def _coding_job(tmp_path: Path, **member: Any) -> dict[str, Any]:
    repo = tmp_path / "repo"
    if not repo.exists():
        shutil.copytree(EXAMPLES / "sample-repo", repo)
    return {
        "name": "api-job",
        "output_dir": str(tmp_path / "runs"),
        "model": {"name": "offline"},
        "members": [
            {
                "id": "coder",
                "kind": "coding",
                "task": TASK,
                "repo": str(repo),
                "test": "python3 test_greet.py",
                **member,
            }
        ],
    }


@pytest.mark.docker
def test_a_dict_job_runs_to_a_result_with_callbacks_and_prints_nothing(
    tmp_path, images, docker_client, cleanup, monkeypatch, capfd
):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    cleanup.append(tmp_path / "runs")
    journal: list[fleet.JournalEntryModel] = []
    events: list[Any] = []

    result = fleet.run(_coding_job(tmp_path), on_journal=journal.append, on_event=events.append)

    assert (result.status, result.exit_code) == ("succeeded", 0)
    outcome = result.outcomes["coder"]
    assert outcome.status == "ok" and isinstance(outcome.result, fleet.CodingMemberResult)
    assert outcome.result.verified is not None and outcome.result.verified.passed is True
    assert result.run.path.parent == tmp_path / "runs"
    assert result.report_path is not None and result.report_path.exists()
    kinds = [e.event for e in journal]
    assert kinds.index("member_queued") < kinds.index("member_started")
    assert "member_finished" in kinds
    # Every entry the run wrote, and nothing else, reached on_journal as its kind's model.
    assert all(type(e) is KINDS[e.event] for e in journal)
    written = (result.run.path / "journal.jsonl").read_text().splitlines()
    assert [json.loads(e.to_json()) for e in journal] == [json.loads(line) for line in written]
    (finished,) = [e for e in journal if isinstance(e, fleet.MemberFinishedEntry)]
    assert (finished.member, finished.status, finished.attempts) == ("coder", "ok", 1)
    assert any(getattr(e, "type", "") == "model_call" for e in events)
    assert {getattr(e, "member", None) for e in events} == {"coder"}
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    # The run keeps its job as TOML that reads back to the same job.
    kept = fleet.load(result.run.path / "job.toml")
    assert kept == fleet.load(_coding_job(tmp_path))


def test_a_bad_job_is_a_job_error_naming_the_field_and_no_run_exists(tmp_path):
    job = _coding_job(tmp_path, limits={"max_turns": 0})
    with pytest.raises(fleet.JobError, match=r"members\[0\]\.limits\.max_turns"):
        fleet.run(job)
    with pytest.raises(fleet.JobError, match="not valid TOML"):
        fleet.load('name = "x\n[model]\n')
    assert not (tmp_path / "runs").exists()


def test_a_job_that_cannot_start_here_is_run_not_started_and_no_run_exists(
    tmp_path, monkeypatch, capfd
):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    job = _coding_job(tmp_path)
    job["model"] = {"name": "claude-sonnet-5"}
    with pytest.raises(fleet.RunNotStarted, match="ANTHROPIC_API_KEY"):
        fleet.run(job)
    assert not (tmp_path / "runs").exists()
    assert capfd.readouterr().err == ""


def test_an_output_directory_that_cannot_be_made_is_run_not_started(tmp_path, capfd):
    (tmp_path / "afile").write_text("x")
    job = _coding_job(tmp_path)
    with pytest.raises(fleet.RunNotStarted, match="afile exists and is not a directory"):
        fleet.run(job, output_dir=tmp_path / "afile" / "runs")
    assert capfd.readouterr().err == ""


def test_job_sources_agree_file_text_dict_and_job(tmp_path, monkeypatch):
    path = EXAMPLES / "mixed.toml"
    from_file = fleet.load(path)
    monkeypatch.chdir(EXAMPLES)  # paths in TOML text are relative to where it is loaded
    from_text = fleet.load(path.read_text())
    assert from_text == from_file
    from_dict = fleet.load(from_file.model_dump(mode="json"))
    assert fleet.load(from_dict) == from_dict == from_file


@pytest.mark.docker
def test_a_jobs_own_result_fields_reach_the_member_and_come_back_filled(
    tmp_path, images, docker_client, cleanup, monkeypatch
):
    """The model is told the job's extra result fields (submit_result carries them),
    so the member returns them; a constraint on the kind's own field is still checked."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    cleanup.append(tmp_path / "runs")
    schema = {
        "type": "object",
        "properties": {
            "risk": {"type": "string", "enum": ["low", "high"]},
            "files_changed": {"type": "array", "minItems": 1},
        },
        "required": ["risk", "files_changed"],
    }
    result = fleet.run(_coding_job(tmp_path, result_schema=schema))
    outcome = result.outcomes["coder"]
    assert outcome.status == "ok", outcome.reason
    assert outcome.result.job_fields == {"risk": "low"}
    assert outcome.result.files_changed == ["greet.py"]


def test_a_job_field_the_model_could_not_submit_is_refused_when_the_job_is_read(tmp_path):
    schema = {"type": "object", "properties": {"extra": {"type": "object"}}}
    with pytest.raises(fleet.JobError, match=r"members\[0\]\.result_schema"):
        fleet.load(_coding_job(tmp_path, result_schema=schema))


def test_a_dict_jobs_missing_repository_is_refused_as_a_job_files_is(tmp_path, monkeypatch):
    """A job from a dict (or TOML text, or a Job) is checked like a job file: a repo
    that is not a directory is a JobError before anything exists, not a run that
    "succeeds" on an empty workspace. Relative paths are relative to the current
    directory."""
    job = _coding_job(tmp_path, repo="no-such-repo")
    as_job = fleet.load(_coding_job(tmp_path))
    as_job.members[0].repo = "no-such-repo"
    as_text = 'name = "t"\n[[members]]\nkind = "coding"\ntask = "t"\nrepo = "no-such-repo"\n'
    monkeypatch.chdir(tmp_path)
    for source in (job, as_job, as_text):
        with pytest.raises(fleet.JobError, match=r"members\[0\]\.repo: 'no-such-repo'"):
            fleet.load(source)
    with pytest.raises(fleet.JobError, match=r"members\[0\]\.repo"):
        fleet.run(job)
    assert not (tmp_path / "runs").exists()
    # A relative repo that does exist is made absolute, so the run finds it from anywhere.
    assert fleet.load(_coding_job(tmp_path, repo="repo")).members[0].repo == str(tmp_path / "repo")


def test_resume_refuses_a_run_another_live_process_runs_and_touches_nothing(tmp_path):
    """The API refuses as ``fleet resume`` does (the same error type, exported): a
    resume would first reap the run's boxes - those of the live run."""
    job = fleet.load(_coding_job(tmp_path))
    from coordinator.rundir.runs import RunDir

    run = RunDir.create(job, "", root=tmp_path / "runs")
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        run.journal.note("run_started", pid=owner.pid, resume=False)
        (run.path / "live.json").write_text(json.dumps({"pid": owner.pid, "since": 0}))
        before = run.journal.path.read_bytes()
        with pytest.raises(fleet.RunInProgress, match=f"run {run.id} is still running") as got:
            fleet.resume(run.id, output_dir=tmp_path / "runs")
        assert got.value.pid == owner.pid and isinstance(got.value, fleet.RunNotStarted)
        with pytest.raises(fleet.RunInProgress):
            anyio.run(lambda: fleet.resume_async(run.path))
        assert run.journal.path.read_bytes() == before  # nothing reaped, nothing recorded
    finally:
        owner.kill()
        owner.wait()
    with pytest.raises(fleet.RunNotFound, match="fleet runs"):
        fleet.resume("no-such-run", output_dir=tmp_path / "runs")


@pytest.mark.docker
def test_a_cancelled_run_async_is_interrupted_and_resumes_at_once(
    tmp_path, images, docker_client, cleanup, monkeypatch
):
    """Cancelling the caller's scope ends the run ``interrupted`` (journalled, its live
    mark gone, its boxes removed) - not ``running`` until the process exits - and
    every journal entry, of every kind, reached ``on_journal``."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    cleanup.append(tmp_path / "runs")
    heard: list[Any] = []

    async def cancelled_once_started() -> None:
        with anyio.CancelScope() as scope:

            def listen(entry: Any) -> None:
                heard.append(entry)
                if entry.event == "member_started":
                    scope.cancel()

            await fleet.run_async(_coding_job(tmp_path), on_journal=listen)
        assert scope.cancelled_caught

    anyio.run(cancelled_once_started)
    (path,) = (tmp_path / "runs").iterdir()
    journal = [json.loads(line) for line in (path / "journal.jsonl").read_text().splitlines()]
    assert journal[-1]["event"] == "run_interrupted"
    assert [
        json.loads(e.to_json()) for e in heard
    ] == journal  # run_created, run_started, ... run_interrupted: all of them
    assert not (path / "live.json").exists()
    assert (
        docker_client.containers.list(all=True, filters={"label": f"fleet.run={path.name}"}) == []
    )

    result = fleet.resume(path.name, output_dir=tmp_path / "runs")  # not refused as running
    assert (result.status, result.outcomes["coder"].status) == ("succeeded", "ok")


def _member_started(root: Path) -> bool:
    journals = list(root.glob("*/journal.jsonl"))
    return bool(journals) and '"member_started"' in journals[0].read_text()


HANGING_SCRIPT = """
import json, sys
import coordinator as fleet
fleet.run(json.loads(sys.argv[1]))
"""


@pytest.mark.docker
def test_ctrl_c_in_a_scripts_run_ends_it_interrupted_not_dead(
    tmp_path, images, docker_client, cleanup
):
    """A plain script's Ctrl-C: ``fleet.run`` raises KeyboardInterrupt, and the run is
    ``interrupted`` (resumable), its boxes removed - not ``dead``. The script's parent
    ignores SIGINT, as a shell's background job does: the script is started with it at
    its default (``process_support.popen``), as a terminal's foreground program is."""
    cleanup.append(tmp_path / "runs")
    job = _coding_job(tmp_path, task="[hang] " + TASK)
    job["model"] = {"name": "claude-sonnet-5"}
    with FakeMessagesAPI(coding_policy()) as api:
        env = {**os.environ, "ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": api.url}
        env["PYTHONPATH"] = os.pathsep.join(sys.path)
        with ignoring(signal.SIGINT, signal.SIGQUIT):
            script = popen(
                [sys.executable, "-c", HANGING_SCRIPT, json.dumps(job)],
                env=env,
                stderr=subprocess.PIPE,
                text=True,
            )
        try:
            deadline = time.monotonic() + 120
            while not _member_started(tmp_path / "runs") and time.monotonic() < deadline:
                assert script.poll() is None, script.communicate()[1]
                time.sleep(0.1)  # its model call hangs: the run cannot end by itself
            script.send_signal(signal.SIGINT)
            _, err = script.communicate(timeout=120)
        finally:
            if script.poll() is None:
                script.kill()
    assert "KeyboardInterrupt" in err
    (path,) = (tmp_path / "runs").iterdir()
    from coordinator.rundir.runs import RunDir

    run = RunDir(path)
    assert run.state().status == "interrupted", err
    assert docker_client.containers.list(all=True, filters={"label": f"fleet.run={run.id}"}) == []


def test_every_error_a_caller_can_meet_is_exported_and_listed(tmp_path):
    errors = {
        "JobError",
        "RunNotStarted",
        "RunInProgress",
        "RunNotFound",
        "RunFailed",
        "ModelError",
        "SandboxError",
    }
    assert errors <= set(fleet.__all__) <= set(dir(fleet))
    assert all(issubclass(getattr(fleet, name), Exception) for name in errors)
    for _ in range(2):  # a second look must not find a submodule of the same name
        assert not any(isinstance(getattr(fleet, n), types.ModuleType) for n in fleet.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        fleet.nothing  # noqa: B018
    # The packages say they are typed, and the wheel carries the marker.
    root = Path(__file__).resolve().parent.parent
    for package in ("coordinator", "subagents", "sandbox"):
        assert (root / package / "py.typed").is_file()
    data = tomllib.loads((root / "pyproject.toml").read_text())
    assert "py.typed" in data["tool"]["setuptools"]["package-data"]["*"]


def test_a_job_part_built_directly_with_a_bad_field_is_a_job_error():
    with pytest.raises(fleet.JobError) as got:
        fleet.MemberJob(kind="coder", task="t")
    message = str(got.value)
    # The kinds a job may name: the built-in ones, and any this process registered.
    assert re.search(
        r"kind: 'coder' is not allowed; input should be 'browser'(, | or )'coding'", message
    )
    assert "pydantic" not in message and "validation error" not in message
    with pytest.raises(fleet.JobError, match="name"):
        fleet.Job(members=[{"kind": "coding", "task": "t"}])


@pytest.mark.docker
def test_a_stream_goes_from_run_created_to_run_ended_with_typed_events(
    tmp_path, images, docker_client, cleanup, monkeypatch
):
    """Only the public API: the run's id and path come first, every journal entry
    and trace event follows as a typed model, the outcome last; a started run
    cancelled at once ends interrupted."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    cleanup.append(tmp_path / "runs")

    async def everything() -> list[Any]:
        return [event async for event in fleet.stream(_coding_job(tmp_path))]

    events = anyio.run(everything)
    first, last = events[0], events[-1]
    assert isinstance(first, fleet.RunCreated) and first.path.is_dir()
    assert first.path.name == first.run_id
    assert isinstance(last, fleet.RunEnded) and last.status == "succeeded"
    assert last.outcomes["coder"].status == "ok"
    entries = [e for e in events if isinstance(e, fleet.JournalEntry)]
    written = (first.path / "journal.jsonl").read_text().splitlines()
    assert [e.event for e in entries] == [json.loads(line)["event"] for line in written]
    assert any(e.type == "model_call" and e.member == "coder" for e in events)

    async def cancelled() -> fleet.RunSummary:
        async with fleet.start(_coding_job(tmp_path)) as run:
            run.cancel()
            return await run.wait()

    stopped = anyio.run(cancelled)
    assert stopped.status == "interrupted" and stopped.run.state().status == "interrupted"


@pytest.mark.docker
def test_cancelling_a_running_member_ends_it_alone_and_removes_its_box(
    tmp_path, images, docker_client, cleanup, fake_api
):
    """A member whose model call hangs is cancelled through the handle: it ends
    ``cancelled`` at once (its box removed), the run ends on its own, and a resume
    would run that member again."""
    cleanup.append(tmp_path / "runs")
    fake_api(coding_policy())
    job = _coding_job(tmp_path, task="[hang] " + TASK)
    job["model"] = {"name": "claude-sonnet-5"}
    job["fanout"] = {"min_success": 0}

    handles: list[fleet.RunHandle] = []

    def listen(entry: dict[str, Any]) -> None:
        if entry.event == "member_started":
            assert handles[0].cancel_member("coder")

    async def cancel_it_once_it_runs() -> fleet.RunSummary:
        async with fleet.start(job, on_journal=listen) as run:
            handles.append(run)  # before the run's task gets to run
            with anyio.fail_after(120):
                return await run.wait()

    summary = anyio.run(cancel_it_once_it_runs)
    assert summary.status == "succeeded"  # min_success 0: the run itself went fine
    assert summary.outcomes["coder"].status == "cancelled"
    assert "the caller cancelled" in summary.outcomes["coder"].reason
    assert summary.run.state().members["coder"] == "cancelled"
    assert [m.id for m in summary.run.pending_members(summary.run.job().members)] == ["coder"]
    assert (
        docker_client.containers.list(all=True, filters={"label": f"fleet.run={summary.run.id}"})
        == []
    )

"""Fleet's Python API (``import coordinator as fleet``): a job as a dict, TOML text or a
file in, a finished run out, progress through callbacks, typed errors, nothing printed.

The run itself uses only the public names; fixtures only clean up the engine.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import coordinator as fleet

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
    journal: list[dict[str, Any]] = []
    events: list[Any] = []

    result = fleet.run(_coding_job(tmp_path), on_journal=journal.append, on_event=events.append)

    assert (result.status, result.exit_code) == ("succeeded", 0)
    outcome = result.outcomes["coder"]
    assert outcome.status == "ok" and outcome.result["verified"]["passed"] is True
    assert result.run.path.parent == tmp_path / "runs"
    assert result.report_path is not None and result.report_path.exists()
    kinds = [e["event"] for e in journal]
    assert kinds.index("member_queued") < kinds.index("member_started")
    assert "member_finished" in kinds
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


def test_job_sources_agree_file_text_dict_and_job(tmp_path):
    path = EXAMPLES / "mixed.toml"
    from_file = fleet.load(path)
    from_text = fleet.load(path.read_text())
    assert from_text.model_dump(exclude={"members"}) == from_file.model_dump(exclude={"members"})
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
    assert outcome.result["risk"] == "low"
    assert outcome.result["files_changed"] == ["greet.py"]


def test_a_job_field_the_model_could_not_submit_is_refused_when_the_job_is_read(tmp_path):
    schema = {"type": "object", "properties": {"extra": {"type": "object"}}}
    with pytest.raises(fleet.JobError, match=r"members\[0\]\.result_schema"):
        fleet.load(_coding_job(tmp_path, result_schema=schema))

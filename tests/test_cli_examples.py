"""The shipped examples are valid job files, and the mixed one runs end to end offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import remove_run

from coordinator.cli import main
from coordinator.job.jobfile import load_job
from coordinator.rundir.runs import RunDir

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize(
    "name", ["research.toml", "code.toml", "mixed.toml", "tools.toml", "mcp.toml"]
)
def test_example_job_files_are_valid(name):
    job, _ = load_job(EXAMPLES / name)
    assert job.member_count >= 1


@pytest.mark.docker
@pytest.mark.slow
def test_mixed_example_runs_offline_with_research_browser_and_coding_members(
    tmp_path, images, docker_client, monkeypatch, capsys
):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    original = (EXAMPLES / "sample-repo" / "greet.py").read_text()
    try:
        code = main(["run", str(EXAMPLES / "mixed.toml"), "--output-dir", str(tmp_path), "--plain"])
    finally:
        for run in RunDir.list(tmp_path):
            remove_run(docker_client, run.id)
    assert code == 0, capsys.readouterr().err
    (run,) = RunDir.list(tmp_path)
    report = json.loads((run.path / "report.json").read_text())
    assert report["offline"] is True and report["analyst"] == "offline"
    ok = {m["member"] for m in report["members"] if m["status"] == "ok"}
    assert {"decimal-docs", "coder"} <= ok and len(ok) >= 3
    urls = {c["url"] for claim in report["claims"] for c in claim["citations"]}
    assert urls and all(u.startswith("http://corpus:8080/") for u in urls)
    assert report["code"][0]["files_changed"] == ["greet.py"]
    patch = (run.path / "members" / "coder" / "patch.diff").read_text()
    assert '+    return f"Hello and welcome, {name}!"' in patch
    # Fleet re-ran the example's own test on the member's work, and it passes.
    verified = run.outcome("coder").result.verified
    assert verified.command == "python3 test_greet.py" and verified.passed is True
    assert (EXAMPLES / "sample-repo" / "greet.py").read_text() == original


@pytest.mark.docker
@pytest.mark.slow
def test_fleet_research_front_door_runs_offline_and_writes_a_cited_report(
    tmp_path, images, docker_client, monkeypatch, capsys
):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    question = "How does asyncio.shield protect a task from cancellation?"
    try:
        code = main(
            ["research", question, "--members", "2", "--output-dir", str(tmp_path), "--plain"]
        )
    finally:
        for run in RunDir.list(tmp_path):
            remove_run(docker_client, run.id)
    err = capsys.readouterr().err
    assert code == 0, err
    (run,) = RunDir.list(tmp_path)
    assert f"run directory: {run.path}" in err and "succeeded: 2 of 2 members ok" in err
    assert "[research]" in (run.path / "job.toml").read_text()  # the job it stood for
    plan = next(e for e in run.journal.read() if e.event == "plan")
    assert plan.planner == "offline" and len(plan.sub_questions) == 2
    report = json.loads((run.path / "report.json").read_text())
    assert report["question"] == question and report["claims"]
    for claim in report["claims"]:
        assert claim["citations"] and claim["citations"][0]["url"].startswith("http://corpus:8080/")
    md = (run.path / "report.md").read_text()
    assert "## Findings" in md and "### Sources" in md and "offline analyst" in md

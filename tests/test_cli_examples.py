"""The shipped examples are valid job files, and the mixed one runs end to end offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import remove_run

from coordinator.cli import main
from coordinator.jobfile import load_job
from coordinator.runs import RunDir

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("name", ["research.toml", "code.toml", "mixed.toml"])
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
    assert '+    return f"Hello, {name}, welcome!"' in patch
    assert (EXAMPLES / "sample-repo" / "greet.py").read_text() == original

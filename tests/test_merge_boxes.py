"""``[merge]`` through the real ``fleet`` process: three coding members on one
repository (real boxes, the real ``anthropic`` client against a fake Messages API), two
on different files and a third that conflicts with the first - merged in a fresh box,
the conflicting patch left out whole and named, the merged tree tested, and
``fleet apply`` applying the merged patch only when that test passed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fleet_policies import coding_policy

from coordinator.rundir.runs import RunDir
from subagents.fake_api import FakeMessagesAPI

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parent.parent
FLEET = str(Path(sys.executable).with_name("fleet"))
SAMPLE = ROOT / "examples" / "sample-repo"
TEST = "python3 test_greet.py"
EDITS = {
    "warm": "[edit:greet.py:Hello, {name}!:Hello there, {name}!]",
    "tests": "[edit:test_greet.py:from greet import greeting:from greet import greeting  # under test]",
    "other": "[edit:greet.py:Hello, {name}!:Hello again, {name}!]",
}


def _job(tmp_path: Path, repo: Path, merge: str, order: tuple[str, ...] = tuple(EDITS)) -> Path:
    lines = [
        f'name = "merged"\noutput_dir = "{tmp_path / "runs"}"\n[model]\nname = "claude-sonnet-5"'
    ]
    lines.append("[synthesis]\nenabled = true")
    lines.append(merge)
    for mid in order:
        lines.append(
            f'[[members]]\nid = "{mid}"\nkind = "coding"\ntask = {json.dumps("Change it. " + EDITS[mid])}\n'
            f'repo = "{repo}"\ntest = "{TEST}"'
        )
    path = tmp_path / "job.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(job: Path, *args: str) -> subprocess.CompletedProcess[str]:
    api = FakeMessagesAPI(coding_policy()).start()
    try:
        env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
        env |= {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": api.url}
        return subprocess.run(
            [FLEET, *args, str(job), "--plain"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        api.stop()


def _fleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FLEET, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(SAMPLE, copy)
    return copy


def test_two_members_merge_and_the_one_that_conflicts_is_left_out_whole(
    tmp_path, images, repo, runs_dir
):
    job = _job(tmp_path, repo, "[merge]")
    done = _run(job, "run")
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = RunDir.list(tmp_path / "runs")
    assert {m: run.outcome(m).status for m in EDITS} == {"warm": "ok", "tests": "ok", "other": "ok"}
    record = json.loads((run.path / "merge" / "merge.json").read_text())
    assert record["members"] == ["warm", "tests", "other"]
    assert record["applied"] == ["warm", "tests"]
    (conflict,) = record["conflicts"]
    assert conflict["member"] == "other" and conflict["files"] == ["greet.py"]
    assert record["test"]["command"] == TEST and record["test"]["passed"] is True
    assert record["verdict"] == "passed"
    merged = (run.path / "merge" / "merged.diff").read_text()
    assert "Hello there" in merged and "# under test" in merged
    assert "Hello again" not in merged  # never half applied
    assert "<<<<<<<" not in merged
    # Shown: the run's last lines, the journal, the report, fleet runs.
    assert (
        "merge: passed" in done.stderr and "other left out, it conflicts on greet.py" in done.stderr
    )
    (entry,) = [e for e in run.journal.read() if e.event == "merge"]
    assert (entry.verdict, entry.applied, entry.conflicts) == (
        "passed",
        ["warm", "tests"],
        ["other"],
    )
    report = (run.path / "report.md").read_text()
    assert "## Merge" in report and "**other** left out whole: it conflicts on greet.py" in report
    listed = json.loads(_fleet("runs", "--output-dir", str(tmp_path / "runs"), "--json").stdout)
    assert [r["merge"] for r in listed] == ["passed"]
    # fleet apply: the merged patch, onto the repository, because its test passed.
    applied = _fleet("apply", str(run.path))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "Hello there" in (repo / "greet.py").read_text()
    assert "# under test" in (repo / "test_greet.py").read_text()


def test_a_merge_whose_test_fails_is_never_applied(tmp_path, images, repo, runs_dir):
    job = _job(
        tmp_path,
        repo,
        '[merge]\ntest = "grep -q again greet.py"\norder = ["other", "warm"]',
        order=("warm", "other"),
    )
    done = _run(job, "run")
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = RunDir.list(tmp_path / "runs")
    record = json.loads((run.path / "merge" / "merge.json").read_text())
    assert record["applied"] == ["other"] and [c["member"] for c in record["conflicts"]] == ["warm"]
    assert record["verdict"] == "passed"  # "again" is the applied one's word
    job2 = _job(tmp_path, repo, '[merge]\ntest = "grep -q there greet.py"', order=("other", "warm"))
    shutil.rmtree(tmp_path / "runs")
    done = _run(job2, "run")
    (run,) = RunDir.list(tmp_path / "runs")
    record = json.loads((run.path / "merge" / "merge.json").read_text())
    assert record["verdict"] == "failed" and record["test"]["exit_code"] == 1
    assert "merge: failed" in done.stderr
    before = (repo / "greet.py").read_text()
    refused = _fleet("apply", str(run.path))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "failed" in refused.stderr and (repo / "greet.py").read_text() == before

"""``[merge]`` against hostile patches: a member's patch is the member's to write, so
the merge must contain it - a path out of the tree, through a link, into a ``.git`` -
and leave such a patch out whole while the honest ones merge; a patch file that is a
link on the host is never followed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import anyio
import pytest

from coordinator.job.jobfile import parse_job
from coordinator.job.spec import Job
from coordinator.merge.merge import MergeRecord, read_merge, run_merge
from coordinator.rundir.runs import RunDir
from sandbox.docker import reaper
from sandbox.registry import get_backend
from subagents.results.outcome import MemberOutcome

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples" / "sample-repo"

HONEST = "\n".join(
    [
        "diff --git a/greet.py b/greet.py",
        "--- a/greet.py",
        "+++ b/greet.py",
        "@@ -5,6 +5,6 @@ import sys",
        " ",
        " def greeting(name: str) -> str:",
        '-    return f"Hello, {name}!"',
        '+    return f"Hello there, {name}!"',
        " ",
        " ",
        ' if __name__ == "__main__":',
        "",
    ]
)
OUT_OF_TREE = """diff --git a/../escape.txt b/../escape.txt
new file mode 100644
--- /dev/null
+++ b/../escape.txt
@@ -0,0 +1 @@
+out
"""
THROUGH_LINK = """diff --git a/outside/planted.txt b/outside/planted.txt
new file mode 100644
--- /dev/null
+++ b/outside/planted.txt
@@ -0,0 +1 @@
+planted
"""
INTO_GIT = """diff --git a/.git/hooks/post-commit b/.git/hooks/post-commit
new file mode 100755
--- /dev/null
+++ b/.git/hooks/post-commit
@@ -0,0 +1,2 @@
+#!/bin/sh
+touch /tmp/fleet-hook-ran
"""


def _setup(tmp_path: Path, patches: dict[str, str]) -> tuple[RunDir, Job]:
    repo = tmp_path / "repo"
    shutil.copytree(SAMPLE, repo)
    os.symlink("/tmp", repo / "outside")  # goes into the box as a link
    members = "".join(
        f'[[members]]\nid = "{mid}"\nkind = "coding"\ntask = "t"\nrepo = "{repo}"\n'
        for mid in patches
    )
    job = parse_job(f'name = "h"\n[merge]\ntest = "python3 test_greet.py"\n{members}', source="t")
    run = RunDir(tmp_path / "runs" / "r-hostile")
    for mid, patch in patches.items():
        mdir = run.path / "members" / mid
        mdir.mkdir(parents=True)
        (mdir / "patch.diff").write_text(patch)
        outcome = MemberOutcome(member=mid, kind="coding", status="ok", result={"summary": "s"})
        (mdir / "result.json").write_text(outcome.model_dump_json())
    return run, job


def _merge(run: RunDir, job: Job) -> MergeRecord:
    """The merge, outside a run: what a run's end does after it (its boxes gone, the
    run no longer marked live on this host) is done here."""
    try:
        return anyio.run(run_merge, run, job, lambda: get_backend())
    finally:
        reaper.mark_done(run.id)


def test_hostile_patches_are_left_out_whole_and_the_honest_one_merges(tmp_path, images, cleanup):
    patches = {"honest": HONEST, "escape": OUT_OF_TREE, "link": THROUGH_LINK, "git": INTO_GIT}
    run, job = _setup(tmp_path, patches)
    cleanup.append(tmp_path / "runs")
    record = _merge(run, job)
    assert record.applied == ["honest"], record
    named = {c.member: c.files for c in record.conflicts}
    assert named == {
        "escape": ["../escape.txt"],
        "link": ["outside/planted.txt"],
        "git": [".git/hooks/post-commit"],
    }
    assert record.verdict == "passed"
    merged = (run.path / "merge" / "merged.diff").read_text()
    assert "Hello there" in merged
    for word in ("escape.txt", "planted", "post-commit"):
        assert word not in merged
    assert read_merge(run.path) == record


def test_a_patch_file_that_is_a_link_is_not_followed(tmp_path, images, cleanup):
    run, job = _setup(tmp_path, {"a": HONEST, "b": HONEST})
    cleanup.append(tmp_path / "runs")
    secret = tmp_path / "secret.diff"
    secret.write_text(HONEST.replace("Hello there", "Hello from the host"))
    link = run.path / "members" / "b" / "patch.diff"
    link.unlink()
    os.symlink(secret, link)
    record = _merge(run, job)
    assert record.applied == ["a"]
    assert [(s.member, s.reason) for s in record.skipped] == [("b", "it changed nothing")]
    assert "from the host" not in (run.path / "merge" / "merged.diff").read_text()

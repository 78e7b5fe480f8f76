"""Repositories given to ``fleet code`` as users have them: hostile, oddly named, linked
out, with attributes. Each goes through the real ``fleet`` process, a real coding box
and the offline coding model, and ``--apply`` back onto the repository.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.rundir.runs import RunDir

pytestmark = pytest.mark.docker
FLEET = str(Path(sys.executable).with_name("fleet"))
EDIT = "replace `world` with `fleet` in `greet.txt`"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


def _commit_all(repo: Path) -> None:
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "init")


def fleet_code(
    repo: Path, task: str, out: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """The real ``fleet code`` process with the offline model (``env``: added to ours)."""
    args = ["code", str(repo), task, "--model", "offline", "--output-dir", str(out)]
    return subprocess.run(
        [FLEET, *args, "--plain", *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def _hostile_config(repo: Path, marks: Path) -> None:
    """Every command git could be made to run from the repository's own files."""

    def mark(name: str) -> str:
        return f"touch {marks / name}; cat"

    hooks = repo / "hooks"
    hooks.mkdir()
    for hook in (
        "pre-commit",
        "post-checkout",
        "post-applypatch",
        "pre-auto-gc",
        "post-index-change",
    ):
        (hooks / hook).write_text(f"#!/bin/sh\ntouch {marks / hook}\n")
        (hooks / hook).chmod(0o755)
    (repo / ".gitattributes").write_text(
        "*.txt filter=evil diff=evil merge=evil\n*.py filter=in=cluded\n"
    )
    (repo / "included.cfg").write_text(
        f'[filter "in=cluded"]\n\tclean = {mark("included-clean")}\n'
        f"\tsmudge = {mark('included-smudge')}\n\trequired = true\n"
    )
    settings = {
        "core.fsmonitor": f"touch {marks / 'fsmonitor'}; false",
        "core.hooksPath": str(hooks),
        "core.sshCommand": mark("ssh"),
        "core.pager": mark("pager"),
        "core.editor": mark("editor"),
        "diff.external": mark("diff-external"),
        "filter.evil.clean": mark("clean"),
        "filter.evil.smudge": mark("smudge"),
        "filter.evil.process": mark("process"),
        "filter.evil.required": "true",
        "diff.evil.textconv": mark("textconv"),
        "diff.evil.command": mark("diff-command"),
        "merge.evil.driver": mark("merge"),
        "include.path": str(repo / "included.cfg"),
    }
    for key, value in settings.items():
        _git(repo, "config", key, value)


def test_a_hostile_repository_runs_no_command_on_the_host_through_fleet_code_apply(
    tmp_path, images, cleanup
):
    repo, marks, out = tmp_path / "proj", tmp_path / "marks", tmp_path / "runs"
    repo.mkdir()
    marks.mkdir()
    cleanup.append(out)
    (repo / "greet.txt").write_text("hello world\n")
    (repo / "app.py").write_text("print(1)\n")
    _commit_all(repo)
    _hostile_config(repo, marks)
    # The same config runs its commands under a plain git (the test's own premise).
    probe = subprocess.run(["git", "-C", str(repo), "ls-files"], capture_output=True)
    assert probe.returncode == 0 and (marks / "fsmonitor").exists()
    (marks / "fsmonitor").unlink()

    done = fleet_code(repo, EDIT, out, "--apply")
    assert sorted(p.name for p in marks.iterdir()) == []
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"applied to {repo}" in done.stdout
    assert (repo / "greet.txt").read_text() == "hello fleet\n"
    (run,) = RunDir.list(out)
    assert run.outcome("coder").result.files_changed == ["greet.txt"]


def test_links_pointing_out_of_the_repository_are_copied_as_links_not_a_crash(
    tmp_path, images, cleanup
):
    repo, out = tmp_path / "proj", tmp_path / "runs"
    repo.mkdir()
    cleanup.append(out)
    (repo / "greet.txt").write_text("hello world\n")
    links = {"passwd": "/etc/passwd", "etc": "/etc", "up": "../../elsewhere", "in": "greet.txt"}
    for name, target in links.items():
        (repo / name).symlink_to(target)
    # Fleet re-runs this in the box: every link is there, as the link it was.
    test = " && ".join(f'test "$(readlink {n})" = {t}' for n, t in links.items())
    done = fleet_code(repo, EDIT, out, "--apply", "--test", test)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(passed" in done.stdout and "attempt 2" not in done.stdout
    assert (repo / "greet.txt").read_text() == "hello fleet\n"
    assert {n: str((repo / n).readlink()) for n in links} == links


def test_gitattributes_cannot_hide_or_convert_a_change_and_apply_writes_the_bytes(
    tmp_path, images, cleanup
):
    repo, out = tmp_path / "proj", tmp_path / "runs"
    repo.mkdir()
    cleanup.append(out)
    before = {
        "greet.md": b"hello world\n",
        "crlf.txt": b"one\r\ntwo world\r\n",
        "data.bin": b"\x00\x01 world \xff\xfe",
        "latin.py": b"# caf\xe9 world\n",
    }
    for name, data in before.items():
        (repo / name).write_bytes(data)
    (repo / ".gitattributes").write_text("*.md binary\n*.txt text eol=crlf\n*.py diff=nope\n")
    _commit_all(repo)
    task = ", ".join(f"replace `world` with `fleet` in `{name}`" for name in before)
    done = fleet_code(repo, task, out, "--apply")
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = RunDir.list(out)
    patch = (run.path / "members" / "coder" / "patch.diff").read_bytes()
    assert b"-hello world\n+hello fleet\n" in patch  # text, whatever .gitattributes says
    assert b"GIT binary patch" in patch and b"Binary files" not in patch
    for name, data in before.items():
        assert (repo / name).read_bytes() == data.replace(b"world", b"fleet"), name


def test_a_repository_of_200_mb_goes_into_the_box_whole(tmp_path, images, cleanup):
    repo, out = tmp_path / "proj", tmp_path / "runs"
    repo.mkdir()
    cleanup.append(out)
    (repo / "greet.txt").write_text("hello world\n")
    marker = os.urandom(1 << 20)
    (repo / "marker.bin").write_bytes(marker)
    block = bytes(10 << 20)
    for i in range(20):  # 200 MB past the marker: over what one agent message carries
        (repo / f"data-{i:02d}.bin").write_bytes(block)
    digest = hashlib.sha256(marker).hexdigest()
    size = 20 * len(block)
    test = f"sha256sum marker.bin | grep -q {digest} && test $(cat data-*.bin | wc -c) = {size}"
    done = fleet_code(repo, EDIT, out, "--apply", "--test", test)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(passed" in done.stdout and "attempt 2" not in done.stdout
    assert (repo / "greet.txt").read_text() == "hello fleet\n"


def test_a_repository_larger_than_the_members_box_is_refused_before_the_run(tmp_path, images):
    repo, out = tmp_path / "proj", tmp_path / "runs"
    repo.mkdir()
    (repo / "data.bin").write_bytes(bytes(20 << 20))
    job = tmp_path / "job.toml"
    job.write_text(
        f'name = "small-box"\noutput_dir = "{out}"\n[model]\nname = "offline"\n'
        f'[[members]]\nid = "coder"\nkind = "coding"\ntask = "look"\nrepo = "{repo}"\n'
        'sandbox = { workspace_size = "16m" }\n'
    )
    done = subprocess.run(
        [FLEET, "run", str(job), "--plain"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "members[0].repo" in done.stderr and "Traceback" not in done.stderr
    assert "workspace_size" in done.stderr and "tmpfs_size" in done.stderr
    assert not out.exists()

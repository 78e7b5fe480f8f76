"""A repository cannot make its staging read anything outside it, and what a user
expects in the box is there or refused: hostile layouts (a directory replaced by a
link out, ``/proc/self``, a gitfile or ``core.worktree`` naming elsewhere), bare
repositories and submodules. The staging is tried directly, and through the real
``fleet code`` process with the offline model and real boxes.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

import pytest
from test_code_repos import EDIT, _commit_all, _git, fleet_code

import coordinator as fleet
from coordinator.nodes.repo_copy import RepoRefused, select_files, staged_copy
from coordinator.rundir.runs import RunDir


def _linked_out(repo: Path, target: str, leaf: str, *, ignore: str | None, name: str = "p") -> None:
    """A repository that tracks ``NAME/<leaf>`` and whose work tree then has ``NAME``
    replaced by a link to ``target``; ``ignore``: the file naming the link as ignored."""
    (repo / name).mkdir(parents=True)
    (repo / "greet.txt").write_text("hello world\n")
    (repo / name / leaf).write_text("tracked\n")
    _commit_all(repo)
    (repo / name / leaf).unlink()
    (repo / name).rmdir()
    (repo / name).symlink_to(target)
    if ignore:
        with (repo / ignore).open("a") as f:
            f.write(f"{name}\n")


def _bare(tmp_path: Path) -> Path:
    """A bare clone of a one-commit repository."""
    work, bare = tmp_path / "work", tmp_path / "bare.git"
    work.mkdir()
    (work / "greet.txt").write_text("hello world\n")
    _commit_all(work)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    return bare


def _all_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.mark.parametrize("ignore", [".gitignore", ".git/info/exclude", None])
def test_a_directory_linked_out_of_the_repository_is_not_read_through(tmp_path, ignore):
    outside, repo = tmp_path / "outside", tmp_path / "proj"
    outside.mkdir()
    secret = secrets.token_hex(16)
    (outside / "secret.txt").write_text(secret)
    _linked_out(repo, str(outside), "secret.txt", ignore=ignore)
    staged = staged_copy(repo)
    try:
        root = Path(staged.name)
        assert secret.encode() not in _all_bytes(root)
        assert (root / "greet.txt").read_text() == "hello world\n"
        assert not (root / "p").exists() or (root / "p").is_symlink()
        (why,) = staged.not_copied
        assert why.startswith(f"p/secret.txt: p is a symbolic link (to {outside})")
    finally:
        staged.cleanup()


def test_proc_self_environ_of_this_process_never_reaches_the_copy(tmp_path, monkeypatch):
    marker = secrets.token_hex(16)
    monkeypatch.setenv("FLEET_TEST_MARKER", marker)
    repo = tmp_path / "proj"
    _linked_out(repo, "/proc/self", "environ", ignore=".git/info/exclude")
    staged = staged_copy(repo)
    try:
        assert marker.encode() not in _all_bytes(Path(staged.name))
        assert staged.not_copied[0].startswith("p/environ: p is a symbolic link (to /proc/self)")
    finally:
        staged.cleanup()


def test_names_from_the_repository_are_shown_with_control_characters_escaped(tmp_path):
    repo = tmp_path / "proj"
    _linked_out(repo, "/tmp/\x1b]0;owned\x07", "x", ignore=None, name="p\x1b[2J")
    staged = staged_copy(repo)
    staged.cleanup()
    (why,) = staged.not_copied
    assert "\x1b" not in why and "\x07" not in why
    assert why.startswith("p\\x1b[2J/x: p\\x1b[2J is a symbolic link (to /tmp/\\x1b]0;owned\\x07)")


def test_a_named_pipe_is_named_as_left_out_and_never_opened(tmp_path):
    repo = tmp_path / "proj"
    repo.mkdir()
    (repo / "greet.txt").write_text("hello world\n")
    os.mkfifo(repo / "pipe")  # opened for reading, it would wait for a writer forever
    _commit_all(repo)
    staged = staged_copy(repo)
    staged.cleanup()
    assert staged.not_copied == ["pipe: a named pipe, not a file"]


def test_a_gitfile_naming_another_repository_is_not_followed(tmp_path):
    """The other repository's index and excludes would decide the selection."""
    other, repo = tmp_path / "other", tmp_path / "proj"
    other.mkdir()
    _git(other, "init", "-q")
    (other / ".git" / "info" / "exclude").write_text("greet.txt\n")
    repo.mkdir()
    (repo / "greet.txt").write_text("hello world\n")
    (repo / "build.log").write_text("noise\n")
    (repo / ".gitignore").write_text("*.log\n")
    (repo / ".git").write_text(f"gitdir: {other / '.git'}\n")
    assert sorted(select_files(repo)) == [".gitignore", "greet.txt"]


def test_core_worktree_naming_another_directory_changes_nothing(tmp_path):
    other, repo = tmp_path / "other", tmp_path / "proj"
    other.mkdir()
    (other / "elsewhere.txt").write_text("not the repository's\n")
    repo.mkdir()
    (repo / "greet.txt").write_text("hello world\n")
    _commit_all(repo)
    (repo / "new.py").write_text("untracked\n")
    _git(repo, "config", "core.worktree", str(other))
    assert sorted(select_files(repo)) == ["greet.txt", "new.py"]


def test_a_directory_inside_a_work_tree_keeps_its_own_gitignore(tmp_path):
    """Its enclosing repository is not read; the .gitignore files inside it still count."""
    top = tmp_path / "mono"
    (top / "sub" / "build").mkdir(parents=True)
    (top / "sub" / "app.py").write_text("x\n")
    (top / "sub" / "build" / "out.bin").write_text("generated\n")
    (top / "sub" / ".gitignore").write_text("build/\n")
    _commit_all(top)
    assert sorted(select_files(top / "sub")) == [".gitignore", "app.py"]


def test_a_bare_repository_is_refused_by_the_staging(tmp_path):
    with pytest.raises(RepoRefused, match="bare git repository"):
        staged_copy(_bare(tmp_path))
    _git(tmp_path, "init", "-q")  # inside a work tree (a home directory under git) too
    with pytest.raises(RepoRefused, match="bare git repository"):
        staged_copy(tmp_path / "bare.git")


# ------------------------------------------------------------ through fleet code


@pytest.mark.docker
def test_fleet_code_on_a_repo_linking_proc_self_leaks_no_environment(tmp_path, images, cleanup):
    repo, out = tmp_path / "proj", tmp_path / "runs"
    cleanup.append(out)
    _linked_out(repo, "/proc/self", "environ", ignore=".gitignore")
    marker = secrets.token_hex(16)
    # The check runs in the box after the edit; its output is kept in the result.
    done = fleet_code(
        repo, EDIT, out, "--test", "cat p/environ; true", env={"FLEET_TEST_MARKER": marker}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert marker not in done.stdout + done.stderr
    assert marker.encode() not in _all_bytes(out)
    (run,) = RunDir.list(out)
    result = run.outcome("coder")
    assert result.result.files_changed == ["greet.txt"]
    (why,) = result.not_copied
    assert why.startswith("p/environ: p is a symbolic link (to /proc/self)")
    assert f"not copied into the box (as the member's result.json says):\n  {why}" in done.stdout


@pytest.mark.docker
def test_fleet_code_refuses_a_bare_repository_before_any_box(tmp_path, images):
    out = tmp_path / "runs"
    done = fleet_code(_bare(tmp_path), EDIT, out)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "is a bare git repository" in done.stderr and "git clone" in done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists()  # refused before a run directory, so before any box


def test_the_python_api_refuses_a_bare_repository_before_a_run(tmp_path):
    bare = _bare(tmp_path)
    job = {
        "name": "bare",
        "output_dir": str(tmp_path / "runs"),
        "model": {"name": "offline"},
        "members": [{"id": "coder", "kind": "coding", "task": EDIT, "repo": str(bare)}],
    }
    with pytest.raises(fleet.RunNotStarted, match="bare git repository"):
        fleet.run(job)
    assert not (tmp_path / "runs").exists()


@pytest.mark.docker
def test_fleet_code_edits_and_applies_a_file_of_a_submodule(tmp_path, images, cleanup):
    lib, repo, out = tmp_path / "lib", tmp_path / "proj", tmp_path / "runs"
    cleanup.append(out)
    lib.mkdir()
    (lib / "greet.txt").write_text("hello world\n")
    _commit_all(lib)
    repo.mkdir()
    (repo / "app.py").write_text("print(1)\n")
    _commit_all(repo)
    _git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "lib")
    _git(repo, "commit", "-qm", "lib")
    assert (repo / "lib" / ".git").is_file()  # a gitfile into the superproject's .git

    task = "replace `world` with `fleet` in `lib/greet.txt`"
    done = fleet_code(repo, task, out, "--apply")
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = RunDir.list(out)
    assert run.outcome("coder").result.files_changed == ["lib/greet.txt"]
    assert (repo / "lib" / "greet.txt").read_text() == "hello fleet\n"

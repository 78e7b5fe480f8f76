"""What of a coding member's repo goes into its box: the project, not its environment."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from coordinator.cli import main
from coordinator.nodes import repo_copy
from coordinator.nodes.repo_copy import RepoTooLarge, select_files, staged_copy


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_git_repo_copies_tracked_edited_and_untracked_files_but_not_ignored_or_envs(tmp_path):
    repo = tmp_path / "proj"
    repo.mkdir()
    _write(repo, {"app.py": "v1\n", "gone.py": "x\n", ".gitignore": "build/\n"})
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "init")
    _write(
        repo,
        {
            "app.py": "v2 uncommitted\n",
            "new.py": "untracked\n",
            "build/out.bin": "ignored\n",
            ".venv/lib/site.py": "environment\n",
            "pkg/node_modules/a.js": "environment\n",
        },
    )
    (repo / "gone.py").unlink()
    assert sorted(select_files(repo)) == [".gitignore", "app.py", "new.py"]
    staged = staged_copy(repo)
    try:
        root = Path(staged.name)
        assert (root / "app.py").read_text() == "v2 uncommitted\n"
        assert not (root / ".git").exists() and not (root / ".venv").exists()
    finally:
        staged.cleanup()
    assert (repo / "app.py").read_text() == "v2 uncommitted\n"  # the original is intact
    assert (repo / ".venv/lib/site.py").exists()


def test_plain_directory_skips_environments_and_caches(tmp_path):
    _write(
        tmp_path,
        {
            "main.py": "x\n",
            "sub/util.py": "y\n",
            "venv/bin/python": "env\n",
            "sub/__pycache__/util.pyc": "cache\n",
            "node_modules/a.js": "env\n",
        },
    )
    assert sorted(select_files(tmp_path)) == ["main.py", "sub/util.py"]


def test_a_repo_too_large_to_copy_is_bad_input_before_a_run(tmp_path, monkeypatch, capsys):
    _write(tmp_path / "proj", {"a.py": "x" * 2000, "b.py": "y" * 2000})
    monkeypatch.setattr(repo_copy, "MAX_COPY_BYTES", 3000)
    with pytest.raises(RepoTooLarge):
        staged_copy(tmp_path / "proj")
    out = tmp_path / "runs"
    code = main(["code", str(tmp_path / "proj"), "do it", "--output-dir", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert "files to copy into the box (largest: " in err and "Traceback" not in err
    assert not out.exists()
    # Not a git work tree: a .gitignore would change nothing, and the hint says so.
    assert "it is not a git work tree" in err and "a .gitignore has no effect" in err
    subprocess.run(["git", "init", "-q", str(tmp_path / "proj")], check=True)
    assert main(["code", str(tmp_path / "proj"), "do it", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "list bulky generated files in .gitignore" in err and "not a git" not in err

"""A setup's key reads each file's bytes once per process, and still sees every change."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox.prepared import key


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = key.file_sha256

    def counted(path: str | Path) -> str:
        seen.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(key, "file_sha256", counted)
    key._content_digest.cache_clear()
    return seen


def _wheelhouse(root: Path) -> Path:
    wheels = root / "wheels"
    wheels.mkdir()
    for i in range(3):
        (wheels / f"pkg{i}-1.0-py3-none-any.whl").write_bytes(bytes([i]) * 50_000)
    return wheels


def test_a_wheelhouse_keyed_twice_in_a_run_is_read_once(tmp_path: Path, reads: list[str]) -> None:
    """The early-box thread and the run's preparer both key the setup: the second digest
    costs a look at each file's status, not its bytes."""
    wheels = _wheelhouse(tmp_path)
    first = key.wheelhouse_digest(str(wheels))
    assert sorted(reads) == sorted(p.name for p in wheels.iterdir())
    reads.clear()
    assert key.wheelhouse_digest(str(wheels)) == first
    assert reads == []


def test_an_edit_that_keeps_size_and_mtime_changes_the_digest(
    tmp_path: Path, reads: list[str]
) -> None:
    """Same length, the old modification time put back: the change time still moves,
    so the file is read again and the key is new."""
    wheels = _wheelhouse(tmp_path)
    first = key.wheelhouse_digest(str(wheels))
    target = wheels / "pkg1-1.0-py3-none-any.whl"
    before = target.stat()
    target.write_bytes(b"\x09" * 50_000)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert target.stat().st_size == before.st_size
    assert target.stat().st_mtime_ns == before.st_mtime_ns
    reads.clear()
    assert key.wheelhouse_digest(str(wheels)) != first
    assert reads == [target.name]


def test_a_replaced_file_and_a_new_file_change_the_key(tmp_path: Path, reads: list[str]) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "requirements.txt").write_text("tinydep==1.0\n")
    first = key.key_files(repo)
    replacement = repo / "requirements.new"
    replacement.write_text("tinydep==2.0\n")
    replacement.replace(repo / "requirements.txt")  # another inode under the same name
    second = key.key_files(repo)
    assert second != first
    (repo / "requirements-dev.txt").write_text("pytest\n")
    assert set(key.key_files(repo)) == {"requirements.txt", "requirements-dev.txt"}

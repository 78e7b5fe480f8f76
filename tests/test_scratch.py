"""Host-side scratch directories: a killed owner's is swept by the next maker, a live
owner's never is, and a sweep touches nothing through a link or of another user."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from coordinator.nodes.repo_copy import staged_copy
from sandbox.host import scratch
from sandbox.host.scratch import LOCK_SUFFIX, Scratch, sweep

MAKER = """
import sys
from sandbox.host.scratch import Scratch
s = Scratch("fleet-repo-", root=sys.argv[1])
open(s.name + "/code.py", "w").write("SECRET = 1\\n")
print(s.name, flush=True)
sys.stdin.read()
"""
"""Makes a scratch directory with a file in it, says its name, and waits to be killed."""


def _owner(folder: Path) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", MAKER, str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_killed_owners_directory_goes_with_the_next_maker_and_a_live_ones_stays(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(scratch, "_swept", set())
    dead, dead_dir = _owner(tmp_path)
    live, live_dir = _owner(tmp_path)
    try:
        _kill(dead)
        # The kill ran no cleanup: the copy of the code is still there.
        assert (dead_dir / "code.py").read_text() == "SECRET = 1\n"
        mine = Scratch("fleet-repo-", root=str(tmp_path))
        assert not dead_dir.exists()
        assert not Path(str(dead_dir) + LOCK_SUFFIX).exists()
        assert (live_dir / "code.py").exists()  # its owner holds its lock
        assert mine.path.is_dir() and oct(mine.path.stat().st_mode & 0o777) == "0o700"
        # Once per folder and process: the next one does not sweep again.
        _kill(live)
        Scratch("fleet-repo-", root=str(tmp_path)).cleanup()
        assert live_dir.exists()
        assert sweep(str(tmp_path)) == 1 and not live_dir.exists()
        mine.cleanup()
        mine.cleanup()  # again: nothing
        assert _left(tmp_path) == []
    finally:
        for proc in (dead, live):
            if proc.poll() is None:
                _kill(proc)


def test_a_staged_repository_copy_is_a_scratch_directory(tmp_path, monkeypatch):
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "a.py").write_text("x = 1\n")
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(scratch.tempfile, "tempdir", str(tmp_path / "tmp"))
    staged = staged_copy(tmp_path / "repo")
    assert Path(staged.name).parent == tmp_path / "tmp"
    assert Path(staged.name + LOCK_SUFFIX).is_file()
    assert sweep(str(tmp_path / "tmp")) == 0  # this process holds it
    staged.cleanup()
    assert _left(tmp_path / "tmp") == []


def test_a_sweep_follows_no_link_and_leaves_what_is_not_this_users(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    folder = tmp_path / "tmp"
    folder.mkdir()
    # A dead scratch directory whose name is a link to a directory outside.
    (folder / "fleet-repo-aaa").symlink_to(outside)
    (folder / "fleet-repo-aaa.fleet-lock").write_text("")
    # A dead one holding a link out.
    (folder / "fleet-repo-bbb").mkdir()
    (folder / "fleet-repo-bbb" / "out").symlink_to(outside)
    (folder / "fleet-repo-bbb.fleet-lock").write_text("")
    # A lock that is a link to a file outside, beside a directory.
    (folder / "fleet-repo-ccc").mkdir()
    (folder / "fleet-repo-ccc.fleet-lock").symlink_to(outside / "keep.txt")
    # Another user's: a lock and a directory it owns.
    (folder / "fleet-repo-ddd").mkdir()
    (folder / "fleet-repo-ddd.fleet-lock").write_text("")
    if os.getuid() == 0:
        os.chown(folder / "fleet-repo-ddd.fleet-lock", 65534, 65534)
    else:
        os.chmod(folder / "fleet-repo-ddd.fleet-lock", 0)
    assert sweep(str(folder)) == 2
    assert (outside / "keep.txt").read_text() == "mine"
    assert _left(folder) == [
        "fleet-repo-ccc",
        "fleet-repo-ccc.fleet-lock",
        "fleet-repo-ddd",
        "fleet-repo-ddd.fleet-lock",
    ]


def test_two_sweepers_at_once_remove_each_dead_directory_once(tmp_path):
    counts: list[int] = []

    def sweeper() -> None:
        counts.append(sweep(str(tmp_path)))

    for _ in range(20):
        for i in range(5):
            (tmp_path / f"fleet-repo-{i}").mkdir()
            (tmp_path / f"fleet-repo-{i}.fleet-lock").write_text("")
        counts.clear()
        sweepers = [threading.Thread(target=sweeper) for _ in range(3)]
        for t in sweepers:
            t.start()
        for t in sweepers:
            t.join()
        assert sum(counts) == 5 and _left(tmp_path) == []


def test_what_will_not_go_is_passed_over_and_the_rest_is_swept(tmp_path, monkeypatch):
    # Another user's link where a dead directory was, in a sticky folder: unlinking it
    # is refused (root may, so the refusal is made here); the sweep goes on, and the
    # maker's own directory is still made.
    for name in ("fleet-repo-aaa", "fleet-repo-bbb"):
        (tmp_path / f"{name}.fleet-lock").write_text("")
    (tmp_path / "fleet-repo-aaa").symlink_to(tmp_path)
    (tmp_path / "fleet-repo-bbb").mkdir()
    real_unlink = os.unlink

    def refusing(path: Any, *args: Any, **kwargs: Any) -> None:
        if str(path).endswith("fleet-repo-aaa"):
            raise PermissionError(1, "Operation not permitted", str(path))
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(scratch.os, "unlink", refusing)
    monkeypatch.setattr(scratch, "_swept", set())
    made = Scratch("fleet-repo-", root=str(tmp_path))
    assert not (tmp_path / "fleet-repo-bbb").exists()
    assert (tmp_path / "fleet-repo-aaa").is_symlink()
    made.cleanup()

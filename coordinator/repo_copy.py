"""What of a coding member's ``repo`` goes into its box, and how.

A user points ``fleet code`` at a project directory, which usually holds far more than
the code: a virtualenv, ``node_modules``, build output, caches - hundreds of MB that
the box cannot use (they are built for the host) and that would take the copy down.
So, like ``git`` itself, Fleet copies what the project consists of:

* in a git work tree, the files git would see - tracked ones plus untracked ones not
  ignored (``git ls-files --cached --others --exclude-standard``) and not inside an
  environment or cache directory - uncommitted edits included, so the patch applies
  to the tree exactly as the user has it;
* elsewhere, everything except well-known environment and cache directories.

Symbolic links are copied as links and never followed: one that points outside the
project (to a file elsewhere on this machine) is the same link in the box, dangling
there, so the box sees the tree as it is and nothing outside it is copied.

The selection is staged into a temporary directory (hard links where possible, so it
costs no copy on the same file system) and that is uploaded; the original is never
written to. A selection over :data:`MAX_COPY_BYTES`, or one that would not fit in the
member's box (its ``/workspace``, and its ``/tmp``, where the coding member keeps the
snapshot its patch is computed against), is refused with a message that says
how to narrow it, instead of a box falling over halfway through the upload. Below
that, any size goes: the box's upload streams a large tree as a tar stream, with no
message limit of its own.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from sandbox.spec import SandboxSpec, parse_size

from . import host_git

SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".venv",
        "venv",
        "node_modules",
        "__pycache__",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".tox",
        ".nox",
    }
)
"""Directories whose untracked contents are never copied (environments, caches)."""
MAX_COPY_BYTES = 256 * 1024 * 1024
"""Largest selection copied into a box (the copy streams, so this is the project's
limit, not the transport's: past it a directory is rarely just a project)."""
PAGE = 4096


def copy_room(spec: SandboxSpec) -> int:
    """Bytes a coding box of ``spec`` holds for a copy: it lands in ``/workspace``, and
    the snapshot the patch is computed against takes as much again in ``/tmp``."""
    return min(parse_size(spec.workspace_size), parse_size(spec.tmpfs_size))


class RepoTooLarge(ValueError):
    """The files to copy exceed :data:`MAX_COPY_BYTES`."""


def _ls_files(repo: Path, *which: str) -> list[str] | None:
    try:
        proc = host_git.git(repo, "ls-files", "-z", *which)
    except OSError:
        return None  # no git on the host
    if proc.returncode != 0:
        return None
    return [p for p in proc.stdout.decode("utf-8", "surrogateescape").split("\0") if p]


def _git_files(repo: Path) -> list[str] | None:
    """Paths git would see in ``repo`` (relative), or None when it is not a work tree.

    Untracked files inside environment or cache directories stay out even when no
    .gitignore names them (a fresh repo next to its .venv); tracked files always go in.
    """
    tracked = _ls_files(repo, "--cached")
    if tracked is None:
        return None
    others = _ls_files(repo, "--others", "--exclude-standard") or []
    return tracked + [p for p in others if not SKIP_DIRS.intersection(Path(p).parts)]


def _walk_files(repo: Path) -> list[str]:
    out = []
    for root, dirs, files in os.walk(repo):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        rel = Path(root).relative_to(repo)
        # A link to a directory is listed with the directories (and not followed): it
        # is copied as the link it is, like a link to a file.
        out += [str(rel / d) for d in dirs if os.path.islink(os.path.join(root, d))]
        out += [str(rel / f) for f in files]
    return out


def select_files(repo: Path) -> list[str]:
    """The relative paths of ``repo`` that go into the box (see the module docstring)."""
    found = _git_files(repo)
    names = found if found is not None else _walk_files(repo)
    # A tracked file deleted in the work tree is not there to copy; a link is a link.
    return [n for n in names if (repo / n).is_file() or (repo / n).is_symlink()]


def check_size(repo: Path, names: list[str] | None = None, *, room: int | None = None) -> int:
    """Bytes of the selection; raises :class:`RepoTooLarge` past :data:`MAX_COPY_BYTES`,
    or when it would not fit in ``room`` bytes of the box (its tmpfs mounts, where every
    file takes whole pages)."""
    total = footprint = 0
    tops: dict[str, int] = {}
    for name in select_files(repo) if names is None else names:
        path = repo / name
        size = 0 if path.is_symlink() else path.stat().st_size
        total += size
        footprint += -(-size // PAGE) * PAGE
        top = Path(name).parts[0]
        tops[top] = tops.get(top, 0) + size
        if total > MAX_COPY_BYTES:
            raise RepoTooLarge(
                f"{repo} holds more than {MAX_COPY_BYTES // 2**20} MB of files to copy into "
                f"the box{_biggest(tops)}; point REPO at the project itself, or "
                + _how_to_leave_out(repo)
            )
        if room is not None and footprint > room:
            raise RepoTooLarge(
                f"{repo}: the files to copy take more than the box holds ({room // 2**20} MB "
                "in /workspace, and again in /tmp for the snapshot the patch is computed "
                "against); raise the member's sandbox.workspace_size and sandbox.tmpfs_size "
                '(e.g. sandbox = { workspace_size = "2g", tmpfs_size = "1g" }), or '
                + _how_to_leave_out(repo)
            )
    return total


def _biggest(tops: dict[str, int]) -> str:
    """The largest top-level entries seen so far, where a user looks first."""
    big = sorted(tops.items(), key=lambda kv: -kv[1])[:3]
    return " (largest: " + ", ".join(f"{n} {s / 2**20:.0f} MB" for n, s in big) + ")"


def _how_to_leave_out(repo: Path) -> str:
    """How bulky files stay out of the copy - which depends on what ``repo`` is: only
    in a git work tree does .gitignore decide."""
    if _ls_files(repo, "--cached") is not None:
        return "list bulky generated files in .gitignore (ignored files are not copied)"
    return (
        "move bulky files out of it: it is not a git work tree, so everything in it is "
        "copied but virtualenvs, node_modules and caches, and a .gitignore has no effect "
        "(it would in a git work tree: git init, then list them in .gitignore)"
    )


def stage(repo: Path, dest: Path, *, room: int | None = None) -> int:
    """Link or copy the selected files of ``repo`` under ``dest``; returns their bytes."""
    names = select_files(repo)
    total = check_size(repo, names, room=room)
    for name in names:
        src, dst = repo / name, dest / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(os.readlink(src))
            continue
        try:
            os.link(src, dst)
        except OSError:  # another file system, or links not allowed
            shutil.copy2(src, dst)
    return total


def staged_copy(repo: Path, *, room: int | None = None) -> tempfile.TemporaryDirectory[str]:
    """A temporary directory holding the selection of ``repo`` (remove it when done);
    ``room``: the bytes the box holds for it (see :func:`check_size`)."""
    tmp = tempfile.TemporaryDirectory(prefix="fleet-repo-")
    try:
        stage(repo, Path(tmp.name), room=room)
    except BaseException:
        tmp.cleanup()
        raise
    return tmp

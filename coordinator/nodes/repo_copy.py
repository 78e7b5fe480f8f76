"""What of a coding member's ``repo`` goes into its box, and how.

A user points ``fleet code`` at a project directory, which usually holds far more than
the code: a virtualenv, ``node_modules``, build output, caches - hundreds of MB that
the box cannot use (they are built for the host) and that would take the copy down.
So, like ``git`` itself, Fleet copies what the project consists of:

* in a git work tree, the files git would see - tracked ones plus untracked ones not
  ignored and not inside an environment or cache directory - uncommitted edits
  included, so the patch applies to the tree exactly as the user has it, and the
  checked-out files of its submodules;
* elsewhere, everything except well-known environment and cache directories.

:mod:`coordinator.nodes.repo_list` says how those names are found with host git reading
nothing outside the repository, and :mod:`coordinator.nodes.repo_tree` how each is read
without leaving it. A symbolic link is copied as a link and never followed: one that
points outside the project is the same link in the box, dangling there. A path that
goes *through* a link (a tracked ``p/environ`` where the work tree has
``p -> /proc/self``), a named pipe, a socket or a device is not copied: each is named,
with why, in the member's result (``not_copied``). A bare repository is refused: it
has no work tree to copy.

The selection is staged into a temporary directory (hard links of the files opened
where possible, so it costs no copy on the same file system) and that is uploaded; the
original is never written to. A run killed before it removes that copy leaves it to the
next run's sweep (:mod:`sandbox.host.scratch`). A selection over
:data:`MAX_COPY_BYTES`, or one that would not fit in the member's box (its
``/workspace``, and its ``/tmp``, where the coding member keeps the snapshot its patch
is computed against), is refused with a message that says how to narrow it, instead of a box falling over halfway through the upload. Below
that, any size goes: the box's upload streams a large tree as a tar stream, with no
message limit of its own.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.host.scratch import Scratch
from sandbox.spec import SandboxSpec, parse_size

from .repo_list import SKIP_DIRS, RepoRefused, list_names
from .repo_tree import Gone, Skip, Walker, copy_leaf, kind_of, lstat_in, parts_of, printable

__all__ = [
    "SKIP_DIRS",
    "RepoRefused",
    "RepoTooLarge",
    "Selection",
    "StagedRepo",
    "check_size",
    "copy_room",
    "select",
    "select_files",
    "stage",
    "staged_copy",
]

MAX_COPY_BYTES = 256 * 1024 * 1024
"""Largest selection copied into a box (the copy streams, so this is the project's
limit, not the transport's: past it a directory is rarely just a project)."""
PAGE = 4096
NOT_COPIED_SHOWN = 20
"""Paths not copied that a member's result names one by one (a repository can hold
any number; the rest are counted)."""


def copy_room(spec: SandboxSpec) -> int:
    """Bytes a coding box of ``spec`` holds for a copy: it lands in ``/workspace``, and
    the snapshot the patch is computed against takes as much again in ``/tmp``."""
    return min(parse_size(spec.workspace_size), parse_size(spec.tmpfs_size))


class RepoTooLarge(ValueError):
    """The files to copy exceed :data:`MAX_COPY_BYTES`."""


@dataclass
class Selection:
    """What of a repository goes into the box, and what does not."""

    files: list[tuple[str, os.stat_result]]
    """Relative name and status of each regular file and link to copy, in tree order."""
    not_copied: list[str] = field(default_factory=list)
    """``name: why`` for each path left out that the user would expect in the box."""
    git: bool = False
    """Whether ``.gitignore`` decided the selection (a git work tree)."""

    def shown(self) -> list[str]:
        """:attr:`not_copied` as a member's result names it (bounded)."""
        more = len(self.not_copied) - NOT_COPIED_SHOWN
        tail = [f"... and {more} more path(s) not copied"] if more > 0 else []
        return self.not_copied[:NOT_COPIED_SHOWN] + tail


def _open_dir(path: Path) -> int:
    # The repository's own path is the job author's: followed, as they named it.
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def select(repo: Path) -> Selection:
    """The files of ``repo`` that go into the box (see the module docstring)."""
    root = _open_dir(repo)
    walker = Walker(root)
    try:
        names, git = list_names(repo, root)
        chosen = Selection([], git=git)
        for name in sorted(set(names), key=lambda n: n.split("/")):
            try:
                parts = parts_of(name)
                st = lstat_in(walker.dir(parts[:-1]), parts[-1])
            except Gone:
                continue  # a tracked file deleted in the work tree is not there to copy
            except Skip as why:
                chosen.not_copied.append(f"{printable(name)}: {why}")
                continue
            if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                chosen.files.append((name, st))
            elif not stat.S_ISDIR(st.st_mode):  # a submodule's entry: its files are listed
                chosen.not_copied.append(f"{printable(name)}: {kind_of(st.st_mode)}, not a file")
        return chosen
    finally:
        walker.close()
        os.close(root)


def select_files(repo: Path) -> list[str]:
    """The relative paths of ``repo`` that go into the box."""
    return [name for name, _ in select(repo).files]


def check_size(repo: Path, selection: Selection | None = None, *, room: int | None = None) -> int:
    """Bytes of the selection; raises :class:`RepoTooLarge` past :data:`MAX_COPY_BYTES`,
    or when it would not fit in ``room`` bytes of the box (its tmpfs mounts, where every
    file takes whole pages)."""
    chosen = select(repo) if selection is None else selection
    total = footprint = 0
    tops: dict[str, int] = {}
    for name, st in chosen.files:
        size = 0 if stat.S_ISLNK(st.st_mode) else st.st_size
        total += size
        footprint += -(-size // PAGE) * PAGE
        top = Path(name).parts[0]
        tops[top] = tops.get(top, 0) + size
        if total > MAX_COPY_BYTES:
            raise RepoTooLarge(
                f"{repo} holds more than {MAX_COPY_BYTES // 2**20} MB of files to copy into "
                f"the box{_biggest(tops)}; point REPO at the project itself, or "
                + _how_to_leave_out(chosen.git)
            )
        if room is not None and footprint > room:
            raise RepoTooLarge(
                f"{repo}: the files to copy take more than the box holds ({room // 2**20} MB "
                "in /workspace, and again in /tmp for the snapshot the patch is computed "
                "against); raise the member's sandbox.workspace_size and sandbox.tmpfs_size "
                '(e.g. sandbox = { workspace_size = "2g", tmpfs_size = "1g" }), or '
                + _how_to_leave_out(chosen.git)
            )
    return total


def _biggest(tops: dict[str, int]) -> str:
    """The largest top-level entries seen so far, where a user looks first."""
    big = sorted(tops.items(), key=lambda kv: -kv[1])[:3]
    return " (largest: " + ", ".join(f"{n} {s / 2**20:.0f} MB" for n, s in big) + ")"


def _how_to_leave_out(git: bool) -> str:
    """How bulky files stay out of the copy - which depends on what the repository is:
    only in a git work tree does .gitignore decide."""
    if git:
        return "list bulky generated files in .gitignore (ignored files are not copied)"
    return (
        "move bulky files out of it: it is not a git work tree, so everything in it is "
        "copied but virtualenvs, node_modules and caches, and a .gitignore has no effect "
        "(it would in a git work tree: git init, then list them in .gitignore)"
    )


def stage(repo: Path, dest: Path, *, room: int | None = None) -> Selection:
    """Link or copy the selected files of ``repo`` under ``dest`` (no link followed on
    either side); returns the selection, with what was not copied."""
    chosen = select(repo)
    check_size(repo, chosen, room=room)
    root, out = _open_dir(repo), _open_dir(dest)
    src, dst = Walker(root), Walker(out, create=True)
    try:
        for name, st in chosen.files:
            parts = name.split("/")
            try:
                copy_leaf(src.dir(parts[:-1]), parts[-1], st, dst.dir(parts[:-1]))
            except (Skip, Gone) as why:
                said = str(why) if isinstance(why, Skip) else "it changed while being copied"
                chosen.not_copied.append(f"{printable(name)}: {said}")
    finally:
        src.close()
        dst.close()
        os.close(root)
        os.close(out)
    return chosen


class StagedRepo:
    """A temporary directory holding a repository's selection (:meth:`cleanup` it)."""

    def __init__(self) -> None:
        self._tmp = Scratch("fleet-repo-")
        self.name = self._tmp.name
        self.not_copied: list[str] = []
        """The paths left out, as the member's result names them."""

    def cleanup(self) -> None:
        self._tmp.cleanup()


def staged_copy(repo: Path, *, room: int | None = None) -> StagedRepo:
    """A temporary directory holding the selection of ``repo`` (remove it when done);
    ``room``: the bytes the box holds for it (see :func:`check_size`)."""
    staged = StagedRepo()
    try:
        staged.not_copied = stage(repo, Path(staged.name), room=room).shown()
    except BaseException:
        staged.cleanup()
        raise
    return staged

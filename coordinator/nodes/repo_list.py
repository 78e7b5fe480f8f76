"""Which names of a coding member's ``repo`` are candidates for its box, found without
host git reading anything outside the repository.

``git ls-files`` run in a repository reads what its ``.git`` says: a gitfile
(``gitdir: /elsewhere``) or a linked ``.git`` sends it to another repository's index,
``core.worktree`` to another work tree, ``include.path`` and ``core.excludesFile`` to
any file, and listing untracked files probes each nested directory's ``.git`` (opening
the ``HEAD`` it names, wherever that is). So git never runs on the repository's own
git directory here. It runs on an empty one of Fleet's own
(:func:`coordinator.nodes.host_git.isolated`) into which the two files that matter are
copied without following links (:mod:`coordinator.nodes.repo_tree`): the index (tracked
files) and ``info/exclude``. The work tree is walked here, with no link followed, and
``git check-ignore --no-index`` decides, one level of the tree at a time, which of
what the walk found the ``.gitignore`` files ignore (git opens those with
``O_NOFOLLOW`` and probes no nested repository for it). A directory it ignores is not
entered.

What that gives, by what ``REPO/.git`` is:

* a directory: tracked files plus untracked ones not ignored, as ``git ls-files
  --cached --others --exclude-standard`` would list them - and, unlike it, the files
  of checked-out submodules and nested repositories too (their work trees are part of
  what the user sees; their own ``.git`` is never copied);
* a gitfile or a link (a linked work tree, a submodule's checkout): its git directory
  lies elsewhere and is not read, so the files the ``.gitignore`` files do not ignore
  (a tracked file that a ``.gitignore`` pattern matches is then left out);
* absent, in a directory below a work tree's top (``fleet code ./subproject``): the
  files not ignored by the ``.gitignore`` files inside it - the git directory above
  is not read, nor the ``.gitignore`` files above;
* absent elsewhere: everything, as in any other directory (a ``.gitignore`` has no
  effect) - unless the directory is a bare repository, which has no work tree to copy
  and is refused (:class:`RepoRefused`).

Untracked files inside environment and cache directories (:data:`SKIP_DIRS`) are
never listed, even when no ``.gitignore`` names them.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from . import host_git
from .repo_tree import DIR_FLAGS, Gone, Skip, Walker, copy_leaf, lstat_in

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


class RepoRefused(ValueError):
    """The repository cannot be copied as it is (a bare repository: no work tree)."""


def _entry(root: int, name: str) -> os.stat_result | None:
    try:
        return lstat_in(root, name)
    except Gone:
        return None


def is_bare(root: int) -> bool:
    """Whether the directory of ``root`` is a bare git repository (its own git dir)."""
    head, objects, refs = (_entry(root, n) for n in ("HEAD", "objects", "refs"))
    return (
        head is not None
        and stat.S_ISREG(head.st_mode)
        and objects is not None
        and stat.S_ISDIR(objects.st_mode)
        and refs is not None
        and stat.S_ISDIR(refs.st_mode)
    )


def list_names(repo: Path, root: int) -> tuple[list[str], bool]:
    """The candidate names of ``repo`` (open as ``root``), and whether ``.gitignore``
    decided them (a git work tree); :class:`RepoRefused` for a bare repository."""
    dot_git = _entry(root, ".git")
    if dot_git is None and is_bare(root):
        raise RepoRefused(
            f"{repo} is a bare git repository: it holds history but no work tree, so "
            "there are no files to copy into the box, and no tree a patch could be "
            f"applied to; check it out first (git clone {repo} DIR, or git -C {repo} "
            "worktree add DIR) and point REPO at that directory"
        )
    if dot_git is None and not _in_work_tree(repo):
        return walk(root, None), False
    with tempfile.TemporaryDirectory(prefix="fleet-ls-") as tmp:
        gitdir = Path(tmp) / "git"
        try:
            made = host_git.own_gitdir(gitdir)
        except OSError:
            made = None  # no git on this host
        if made is None or made.returncode != 0:
            return walk(root, None), False
        tracked: list[str] = []
        if dot_git is not None and stat.S_ISDIR(dot_git.st_mode):
            tracked = _tracked(repo, root, gitdir)

        def ignored(names: list[str]) -> set[str]:
            return _ignored(repo, gitdir, names)

        return tracked + walk(root, ignored), True


def _in_work_tree(repo: Path) -> bool:
    """Whether ``repo`` lies below a git work tree's top (a directory above it has a
    ``.git``): only looked at, never read."""
    return any(os.path.lexists(parent / ".git") for parent in repo.resolve().parents)


def _copy_in(root: int, parts: tuple[str, ...], dest: Path) -> bool:
    """Copy the regular file ``parts`` of the repository into directory ``dest``
    (no link followed); whether it was there to copy."""
    walker = Walker(root)
    out = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        src = walker.dir(parts[:-1])
        seen = lstat_in(src, parts[-1])
        if not stat.S_ISREG(seen.st_mode):
            return False
        copy_leaf(src, parts[-1], seen, out)
        return True
    except (Gone, Skip):
        return False
    finally:
        os.close(out)
        walker.close()


def _tracked(repo: Path, root: int, gitdir: Path) -> list[str]:
    """The index's names, read from a copy of it (and of a split index's shared part)."""
    _copy_in(root, (".git", "info", "exclude"), gitdir / "info")
    if not _copy_in(root, (".git", "index"), gitdir):
        return []
    try:
        fd = os.open(".git", DIR_FLAGS, dir_fd=root)
    except OSError:
        return []
    try:
        shared = [n for n in os.listdir(fd) if n.startswith("sharedindex.")]
    finally:
        os.close(fd)
    for name in shared:
        _copy_in(root, (".git", name), gitdir)
    listed = host_git.isolated(repo, gitdir, "ls-files", "--cached", "-z")
    if listed.returncode != 0:
        return []
    return [p for p in listed.stdout.decode("utf-8", "surrogateescape").split("\0") if p]


def _ignored(repo: Path, gitdir: Path, names: list[str]) -> set[str]:
    """Which of ``names`` the repository's ``.gitignore`` files (and the copied
    ``info/exclude``, and the user's own global excludes) ignore."""
    # A leading ":" would be read as pathspec magic; "./" keeps the name a path.
    asked = {("./" + n if n.startswith(":") else n): n for n in names}
    stdin = b"".join(a.encode("utf-8", "surrogateescape") + b"\0" for a in asked)
    done = host_git.isolated(
        repo, gitdir, "check-ignore", "--no-index", "-z", "--stdin", stdin=stdin
    )
    if done.returncode not in (0, 1):  # 1: none ignored
        raise RepoRefused(
            f"{repo}: git could not tell which files its .gitignore files ignore: "
            + done.stderr.decode("utf-8", "replace").strip()[:300]
        )
    out = done.stdout.decode("utf-8", "surrogateescape").split("\0")
    return {asked.get(p, p) for p in out if p}


def walk(root: int, ignored: Callable[[list[str]], set[str]] | None) -> list[str]:
    """Every file and link under ``root``, no link followed, one level at a time (so
    ``ignored`` is asked once a level, and an ignored directory is not entered)."""
    out: list[str] = []
    level: list[tuple[str, ...]] = [()]
    walker = Walker(root)
    try:
        while level:
            found: list[tuple[tuple[str, ...], bool]] = []
            for parts in level:
                try:
                    fd = walker.dir(parts)
                except (Gone, Skip):
                    continue  # changed since it was listed
                with os.scandir(fd) as entries:
                    found += [
                        ((*parts, e.name), e.is_dir(follow_symlinks=False))
                        for e in entries
                        if e.name not in SKIP_DIRS
                    ]
            found.sort()
            names = ["/".join(p) for p, _ in found]
            drop = ignored(names) if ignored is not None and names else set()
            kept = [(p, is_dir, n) for (p, is_dir), n in zip(found, names, strict=True)]
            level = [p for p, is_dir, n in kept if is_dir and n not in drop]
            out += [n for _, is_dir, n in kept if not is_dir and n not in drop]
    finally:
        walker.close()
    return out

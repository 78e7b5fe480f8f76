"""Reading a repository's tree without ever leaving it, and writing its copy likewise.

The names come from the repository - its index, its directory listings - and any
component of one may be a symbolic link that a call taking a path (``open``,
``stat``, ``os.link``, ``shutil.copy2``) follows: a tracked ``p/environ`` with the
work tree's ``p -> /proc/self`` reads this process's environment, API key included.
So nothing here takes a path from the repository whole:

* a path is walked one component at a time from a directory descriptor, each opened
  with ``O_NOFOLLOW | O_DIRECTORY`` (``openat``): a component that is a link is never
  gone through, whether the link leads out of the repository or not - a path through
  one is not copied (:class:`Skip` says why);
* the leaf is ``lstat``-ed where it lies: a link is copied as the link it is (its
  text, never its target), a regular file is opened with ``O_NOFOLLOW | O_NONBLOCK``
  (a FIFO cannot block us; a device is never opened) and ``fstat``-ed, and it is that
  open file that is copied - hard-linked by its descriptor (``/proc/self/fd/N`` with
  ``AT_SYMLINK_FOLLOW``, the documented way to link an open file) or read from it -
  never a name that may have changed in between;
* the copy is written the same way (``mkdirat``, ``O_CREAT | O_EXCL | O_NOFOLLOW``,
  ``symlinkat``), so a link placed in the copy cannot lead a later write out of it.

Descriptors along the current path are kept on a stack, so a sorted list of names
costs one ``openat`` per directory, and never more open descriptors than the tree
is deep.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Sequence

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_GONE = {errno.ENOENT, errno.ENOTDIR}
_KINDS = {
    stat.S_IFIFO: "a named pipe",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


class Skip(Exception):
    """A path that is not copied; its message says why (for the member's result)."""


class Gone(Exception):
    """A listed path that is not there (a tracked file deleted in the work tree)."""


def parts_of(name: str) -> tuple[str, ...]:
    """The components of a relative name, or :class:`Skip` for one that is not plain."""
    parts = tuple(name.split("/"))
    if any(p in ("", ".", "..") for p in parts) or "\0" in name:
        raise Skip("not a plain relative path")
    return parts


def printable(text: str) -> str:
    """``text`` with what is not printable escaped: names and link targets are the
    repository's, and end up in front of a person (a terminal, a report)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def kind_of(mode: int) -> str:
    """What a file that is neither a regular file nor a link is, in words."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


class Walker:
    """Descriptors of the directories along one path under ``root_fd`` (not owned).

    With ``create``, missing directories are made (the copy's side).
    """

    def __init__(self, root_fd: int, *, create: bool = False) -> None:
        self._root = root_fd
        self._names: list[str] = []
        self._fds: list[int] = []
        self._create = create

    def dir(self, parts: Sequence[str]) -> int:
        """The descriptor of directory ``parts``; :class:`Skip` when a component is a
        link or otherwise not a directory of its own, :class:`Gone` when absent."""
        keep = 0
        while keep < min(len(parts), len(self._names)) and self._names[keep] == parts[keep]:
            keep += 1
        self._drop(keep)
        for part in parts[keep:]:
            self._fds.append(self._open(part))
            self._names.append(part)
        return self._fds[-1] if self._fds else self._root

    def _open(self, part: str) -> int:
        parent = self._fds[-1] if self._fds else self._root
        if self._create:
            try:
                os.mkdir(part, 0o755, dir_fd=parent)
            except FileExistsError:
                pass
        try:
            return os.open(part, DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            where = printable("/".join([*self._names, part]))
            try:
                st = os.stat(part, dir_fd=parent, follow_symlinks=False)
            except OSError:
                st = None
            if st is not None and stat.S_ISLNK(st.st_mode):
                target = printable(os.readlink(part, dir_fd=parent)[:200])
                raise Skip(
                    f"{where} is a symbolic link (to {target}) in the work tree; nothing is "
                    "read through a link, which may lead out of the repository"
                ) from None
            if exc.errno in _GONE or exc.errno == errno.ELOOP:
                raise Gone(where) from None
            raise

    def _drop(self, keep: int) -> None:
        while len(self._names) > keep:
            self._names.pop()
            os.close(self._fds.pop())

    def close(self) -> None:
        self._drop(0)


def lstat_in(dir_fd: int, leaf: str) -> os.stat_result:
    """The leaf's own status (a link is not followed); :class:`Gone` when absent."""
    try:
        return os.stat(leaf, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in _GONE:
            raise Gone(leaf) from None
        raise


def copy_leaf(src_dir: int, leaf: str, seen: os.stat_result, dst_dir: int) -> None:
    """Copy ``leaf`` (a regular file or a link, as ``seen`` found it) from ``src_dir``
    into ``dst_dir``; :class:`Skip` when it changed since or is already there."""
    try:
        if stat.S_ISLNK(seen.st_mode):
            os.symlink(os.readlink(leaf, dir_fd=src_dir), leaf, dir_fd=dst_dir)
            return
        fd = os.open(leaf, FILE_FLAGS, dir_fd=src_dir)
    except FileExistsError:
        raise Skip("listed twice") from None
    except OSError as exc:
        if exc.errno in _GONE or exc.errno == errno.ELOOP:
            raise Skip("changed while the repository was being copied") from None
        raise
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (
            seen.st_dev,
            seen.st_ino,
        ):
            raise Skip("changed while the repository was being copied")
        _link_or_copy(fd, now, leaf, dst_dir)
    finally:
        os.close(fd)


def _link_or_copy(fd: int, st: os.stat_result, leaf: str, dst_dir: int) -> None:
    try:
        # The open file itself, not a name: no copy on the same file system.
        os.link(f"/proc/self/fd/{fd}", leaf, dst_dir_fd=dst_dir, follow_symlinks=True)
        return
    except FileExistsError:
        raise Skip("listed twice") from None
    except OSError:
        pass  # another file system, links not allowed, or no /proc: a copy
    try:
        out = os.open(
            leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dst_dir
        )
    except FileExistsError:
        raise Skip("listed twice") from None
    try:
        with open(fd, "rb", closefd=False) as src, open(out, "wb", closefd=False) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.fchmod(out, stat.S_IMODE(st.st_mode) & 0o777)
        os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        os.close(out)

"""Host-side temporary directories that a killed process does not leave behind for good.

A coding member's staged copy of the user's repository (:mod:`coordinator.nodes.repo_copy`),
a merge's, a cluster node's scratch space (member directories, repository copies,
memory) and an image build's context live in the system's temporary directory while
the process that made them runs; a base image's rootfs is built in Fleet's cache
directory. Their owner removes them when its work ends, fails or is cancelled. A
process that is SIGKILLed, OOM-killed or lost with its node runs no cleanup at all:
before this module its copy of the user's code stayed in ``/tmp`` until the machine
rebooted, one more for every ``kill -9`` of ``fleet run`` and every lost Ray worker,
and a killed ``fleet setup`` left a rootfs of hundreds of MB in the cache for good.

So every such directory ``NAME`` has a lock file ``NAME.fleet-lock`` beside it, made
*before* the directory, on which its maker holds an exclusive ``flock`` for as long as
it lives. The kernel drops that lock when the process dies, however it dies. The next
Fleet process to make a scratch directory sweeps the folder once: a lock it can take
belongs to a dead process, and that directory goes.

Why a lock and not the pid that the live markers of
:mod:`sandbox.docker.reaper` hold: a pid can be reused, and it means nothing across
pid namespaces (a Ray worker or a container sharing ``/tmp``), while a held ``flock``
is the owner being alive, by definition, for any process on the same kernel. pytest's
numbered temporary directories solve the same problem with a lock file that holds a pid,
and their sweep goes by that file's age (three days): a guess. A held lock answers exactly.

A sweep touches only what this user owns: a regular lock file, and a real directory
beside it. A link is unlinked, never followed. The tree is removed with
:func:`shutil.rmtree`, which walks by file descriptor here (``avoids_symlink_attacks``),
so a link planted inside cannot lead it out. Two sweepers never both remove one
directory: the second finds the lock file gone or replaced and leaves it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
import weakref
from pathlib import Path

__all__ = ["LOCK_SUFFIX", "Scratch", "sweep"]

LOCK_SUFFIX = ".fleet-lock"
"""The lock file beside each scratch directory: ``NAME`` and ``NAME.fleet-lock``."""

_swept: set[str] = set()
"""Folders this process has swept (once each)."""


class Scratch:
    """A new private (0700) directory in ``root`` (the system's temporary directory by
    default) whose name starts with ``prefix``; removed by :meth:`cleanup`, when this
    object is collected, or by the next process's :func:`sweep` if this one is killed."""

    def __init__(self, prefix: str, root: str | None = None) -> None:
        folder = root or tempfile.gettempdir()
        if folder not in _swept:
            _swept.add(folder)
            sweep(folder)
        for _ in range(100):
            fd, lock = tempfile.mkstemp(prefix=prefix, suffix=LOCK_SUFFIX, dir=folder)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                pass  # a file system without locks: the directory is then never swept
            name = lock[: -len(LOCK_SUFFIX)]
            try:
                os.mkdir(name, 0o700)
                break
            except FileExistsError:  # something else holds that name: draw again
                os.unlink(lock)
                os.close(fd)
        else:
            raise FileExistsError(f"no free scratch name under {folder}")
        self.name = name
        self.path = Path(name)
        self._finalizer = weakref.finalize(self, _remove, name, lock, fd)

    def cleanup(self) -> None:
        """Remove the directory and its lock (again: nothing)."""
        self._finalizer()


def _remove(name: str, lock: str, fd: int) -> None:
    shutil.rmtree(name, ignore_errors=True)
    try:
        os.unlink(lock)
    except FileNotFoundError:
        pass
    os.close(fd)


def sweep(folder: str | None = None) -> int:
    """Remove from ``folder`` the scratch directories whose makers are gone; returns how
    many. Any scratch kind goes: each is told by its lock file alone."""
    folder = folder or tempfile.gettempdir()
    removed = 0
    try:
        entries = [e.name for e in os.scandir(folder) if e.name.endswith(LOCK_SUFFIX)]
    except OSError:
        return 0
    for lock_name in entries:
        try:
            removed += _take(folder, lock_name)
        except OSError:
            continue  # one that will not go (another user's link in a sticky folder): the next
    return removed


def _take(folder: str, lock_name: str) -> bool:
    """Remove one dead owner's directory and lock; False when it lives or is not ours."""
    lock = os.path.join(folder, lock_name)
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False  # gone, a link, or not ours to read
    try:
        held = os.fstat(fd)
        if not stat.S_ISREG(held.st_mode) or held.st_uid != os.getuid():
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # its owner lives (or locks do not work here: leave it)
        try:
            now = os.lstat(lock)
        except FileNotFoundError:
            return False  # another sweeper removed it first
        if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            return False
        _remove_dir(os.path.join(folder, lock_name[: -len(LOCK_SUFFIX)]))
        os.unlink(lock)
        return True
    finally:
        os.close(fd)


def _remove_dir(path: str) -> None:
    """Remove ``path`` if it is this user's directory; a link there is unlinked."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        os.unlink(path)
    elif stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
        shutil.rmtree(path, ignore_errors=True)

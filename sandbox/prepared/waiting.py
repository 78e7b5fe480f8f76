"""Boxes that start while their setup runs, and get its tree when it is made.

Members that need a setup no snapshot exists for wait for it (:mod:`.prepare`), and
only then could their boxes start from the snapshot: every member's box started at
once, after the setup, in series with the rest of the run. A box's start is the
engine's work (about 0.2 CPU-seconds a box, whatever the box asks for:
``bench/box_start.py``), and a setup mostly waits - on a package index, or on its own
single-threaded install - so those starts are better made while it runs. Measured by
``bench/setup.py`` (8 members, a 20 s setup, two cores): after the setup the machine
was at 100% for a second while eight boxes started and eight harnesses made their first
calls, and the members' first tool call came 1.1-1.5 s after the setup, against 0.5 s
(one model call) for a box started early.

So a member whose setup is still to run in this run has a box of its plain image
started at once, with one extra mount: the directory where this run keeps the key's
tree (:func:`key_dir`), read-only at :data:`MOUNT`. When the setup's snapshot is made,
its clean archive - the same bytes the snapshot's layer holds, checked by
:mod:`.capture` - is put there (:func:`sandbox.docker.prepared.save`, written in a
private directory and renamed in whole), and the box lays it into its ``/workspace`` by
its own ``tar`` (:meth:`sandbox.docker.backend.DockerBackend.lay_tree`), with what the
snapshot adds to its boxes' environment (the virtualenv first on ``PATH``) set on every
command it runs. Such a box is then what a box of the snapshot is: the tree in
``/workspace``, the same environment, no network, the same limits.

What this costs and bounds:

* a copy of the tree's archive on the host, kept only for keys some box waited for,
  and only until the last of those boxes has laid it (or will not:
  :meth:`~sandbox.prepared.prepare.Preparer.done_waiting`); whatever is left goes with
  the run's boxes (:func:`drop_trees`), or with ``gc`` after a run that died;
* each waiting box sees its own key's directory only, read-only: never another key's,
  never the setup's raw archive, never a half-written file;
* a setup that fails removes the waiting boxes with the members (they end ``failed``
  with the setup's reason, as before); a tree the box cannot lay removes the box, and the
  member starts from the snapshot as a member that arrived later does.

Peers: Codex and E2B start an agent from a finished environment; nothing of theirs
starts before it. Docker cannot give a running container a new image, so this is the
way to overlap the two on a user's own engine without a privileged mount.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

MOUNT = "/opt/fleet/tree"
"""Where a waiting box sees its key's directory (read-only)."""
_SAFE = re.compile(r"^[A-Za-z0-9_.@-]{1,128}$")
"""A run's owner key (``run`` or ``run@node``: two nodes of one run may share a host)
never a path of more than one name."""
_KEY = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def trees_dir() -> Path:
    from ..images.catalog import cache_dir

    return cache_dir() / "prepared-trees"


def key_dir(run: str, key: str) -> Path:
    """The directory (made now, 0755) where ``run`` (its owner key) keeps ``key``'s tree
    for its waiting boxes."""
    if not _SAFE.match(run) or run in (".", "..") or not _KEY.match(key[:64]):
        raise ValueError(f"not a run id and key Fleet makes: {run!r}, {key[:64]!r}")
    path = trees_dir() / run / key[:64]
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o755)
    path.parent.chmod(0o755)
    return path


def drop_trees(run: str) -> None:
    """Remove what ``run`` (its owner key) kept for its waiting boxes."""
    if _SAFE.match(run) and run not in (".", ".."):
        shutil.rmtree(trees_dir() / run, ignore_errors=True)


def drop_stale(live: Callable[[], set[str]]) -> int:
    """Remove what runs no longer live kept (a run that died before its cleanup); how many.
    ``live`` (the owners that live) is asked after the kept trees are listed: a run is
    live before it keeps one, so a run that starts meanwhile is never taken for dead."""
    try:
        kept = [p for p in trees_dir().iterdir() if p.is_symlink() or p.is_dir()]
    except FileNotFoundError:
        return 0
    owners = live()
    runs = [p for p in kept if p.name not in owners]
    for path in runs:
        if path.is_symlink():  # never Fleet's: the link goes, never what it points to
            path.unlink(missing_ok=True)
        else:
            shutil.rmtree(path, ignore_errors=True)
    return len(runs)

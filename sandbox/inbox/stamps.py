"""The workspace's stamps print: one hash of every entry under ``/workspace`` with its stamp.

Runs in the box, in two places that must agree byte for byte: the box agent
(:mod:`sandbox.inbox.boxagent`) puts it in an ``exec`` reply when the host asks
(``stamps`` in the request), after the command and everything it left running have
ended; and Fleet's in-box git program (:mod:`subagents.kinds.workspace_git`) returns it
with a snapshot or a checkpoint. A coding member's checkpoint compares the print after
a turn's commands with the one of its newest checkpoint: equal means nothing under
``/workspace`` was written, created, removed, renamed or re-moded since, and the turn
needs no collection at all (a change time cannot be set back).

What the print is worth: the box computes it, so it is only ever the box's word about
its own workspace - a box that lies spoils its own member's resume, nothing else. The
host takes a 64-digit hex string or nothing.

Standard library only, no ``from __future__`` (the git program is sent as this file's
source followed by its own, and a future import must open a file). Bounded: a walk past
:data:`MAX_ENTRIES` entries gives no print (the checkpoint then collects as it would
without one), so a workspace of millions of files costs each command at most that walk.
"""

import os
import stat
import time

try:
    from _sha256 import sha256 as _sha256  # type: ignore[import-not-found]  # no OpenSSL
except ImportError:  # pragma: no cover - a Python built without it
    from hashlib import sha256 as _sha256

WORKSPACE = b"/workspace"
MAX_ENTRIES = 200_000
"""Entries walked at most; past it there is no print."""
SETTLE_NS = 2_000_000_000
"""An entry changed this recently gives no print: a file's times have the clock's
coarse granularity, so a second write in the same tick would not move them."""


def stamps_print() -> str | None:
    """One hash of every entry under /workspace with its stamp (inode, size, mode,
    modification and change times), links not followed; None when an entry changed in
    the last :data:`SETTLE_NS` or the walk passed :data:`MAX_ENTRIES` (as for the
    snapshot's stamps)."""
    settled = time.time_ns() - SETTLE_NS
    digest = _sha256()
    pending = [WORKSPACE]
    seen = 0
    while pending:
        here = pending.pop()
        try:
            entries = sorted(os.scandir(here), key=lambda e: e.name)
        except OSError as exc:
            digest.update(b"?%s %d\n" % (here, exc.errno or 0))
            continue
        seen += len(entries)
        if seen > MAX_ENTRIES:
            return None
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:  # removed under the walk: not settled
                return None
            if max(st.st_ctime_ns, st.st_mtime_ns) >= settled:
                return None
            digest.update(
                b"%s\0%d %d %o %d %d\n"
                % (entry.path, st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns, st.st_ctime_ns)
            )
            if stat.S_ISDIR(st.st_mode):
                pending.append(entry.path)
    return str(digest.hexdigest())


def is_print(value: object) -> bool:
    """Whether a value from the box looks like a print (a SHA-256 in lower-case hex)."""
    return isinstance(value, str) and len(value) == 64 and not value.strip("0123456789abcdef")

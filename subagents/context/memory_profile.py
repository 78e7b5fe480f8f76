"""A memory profile on the host: loading it and applying a member's changes to it.

A profile is a directory several members - of one run or of runs at the same time -
load at their start and save into at their end. A save must not lose what others
saved in between (the member's working copy is older than the profile by then), so
it does not copy files over: per changed file it merges three versions - the one the
member loaded (base), the member's edit (ours) and the file as it is now (theirs) -
with :func:`~subagents.context.merge3.merge3` for text. What cannot be merged is a
conflict that keeps both sides and is reported, never a silent drop:

=============================== ===================================================
the member ...                  while the profile meanwhile ...
=============================== ===================================================
edited or created a file        did not change it: the member's version is written
edited a file                   changed it too: three-way merge; lines both changed
                                differently are kept twice between markers
deleted a file                  did not change it: deleted
deleted a file                  changed it: conflict, the changed file is kept
edited a file                   deleted it: conflict, the member's version is kept
renamed a -> b                  changed a: the change is carried into b, a goes
a non-text file both changed    conflict: the profile's stays, the member's is kept
                                beside it as ``NAME.<member>-conflict``
=============================== ===================================================

Bookkeeping lives in ``<profile>/.fleet/`` (never loaded, never writable through the
memory tool):

- ``lock``: every load and save holds an exclusive ``flock`` on it, so saves of one
  profile are serialized across threads *and processes* on this host (two runs may
  share a profile), and a load never sees half of a save.
- ``saves.jsonl``: the ledger, one line per applied save with its key (run, member,
  a token per attempt) and what it did to each file. A save whose key is already
  there is not applied again; a load remembers the ledger's length, so a save can
  say who changed a file since its member loaded it.
- ``pending.json``: a save is first written there whole (final contents of every
  file it touches, fsync'd, by rename), then applied, then entered in the ledger,
  then removed. A process killed in the middle leaves the file behind and the next
  load or save of the profile finishes the job, so a save is all or nothing.

Retries and resume: each attempt of a member loads the profile anew (so it starts
from the profile as it is then, earlier attempts' saves included) and its save
carries only the difference between what it loaded and what it left - never what an
earlier attempt wrote. A re-run after a crash therefore re-applies nothing its first
attempt saved; what it writes itself is its own change.

Past one machine (the cluster executor): a member on another node loads the profile
from what the coordinator ships with it and returns its changes - each changed
file's base and final version, the attempt's key and the ledger length it loaded -
with the member's other files; the coordinator, the profile's only writer, applies
them with :func:`save_profile` exactly as here. The key makes a changeset delivered
twice (a retried transfer, a coordinator restart) apply once.

The lock is ``flock`` on a local file: it serializes processes of one host, not
hosts sharing a network filesystem (the coordinator being the single writer is what
covers hosts).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..trace import MemoryFileSave
from .merge3 import merge3

META = ".fleet"
"""The profile's bookkeeping directory (lock, ledger, pending save)."""
LOCK_TIMEOUT_S = 30.0


class ProfileBusy(Exception):
    """The profile's lock was not free within the timeout (another save hangs)."""


@dataclass
class FileChange:
    """One file a member changed: what it loaded and what it left (None: absent)."""

    path: str
    base: bytes | None
    ours: bytes | None
    origin: str | None = None
    """The path the member renamed this file from (``base`` is that file's)."""
    renamed_to: str | None = None
    """The member renamed this file away (``ours`` is None)."""


@dataclass
class Loaded:
    base: dict[str, bytes]
    """Every file loaded, by path relative to the profile."""
    seq: int
    """Saves in the profile's ledger at load time."""


@contextlib.contextmanager
def locked(profile: Path, timeout_s: float | None = None) -> Iterator[None]:
    """Hold the profile's lock (across processes), waiting at most ``timeout_s``
    (default :data:`LOCK_TIMEOUT_S`)."""
    timeout_s = LOCK_TIMEOUT_S if timeout_s is None else timeout_s
    meta = profile / META
    meta.mkdir(parents=True, exist_ok=True)
    fd = os.open(meta / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ProfileBusy(
                        f"memory profile {profile} stayed locked for {timeout_s:g}s by another "
                        f"save (lock file {meta / 'lock'})"
                    ) from None
                time.sleep(0.02)
        _roll_forward(profile)
        yield
    finally:
        os.close(fd)  # releases the lock


def load_profile(profile: Path, dest: Path) -> Loaded:
    """Copy the profile into ``dest`` (replacing it); returns what was loaded.

    Symlinks are skipped, not followed: memory must never pull in host files from
    outside its directory. The bookkeeping directory stays out.
    """

    def skip(directory: str, names: list[str]) -> set[str]:
        out = {n for n in names if os.path.islink(os.path.join(directory, n))}
        if Path(directory) == profile:
            out.add(META)
        return out

    profile.mkdir(parents=True, exist_ok=True)
    with locked(profile):
        seq = len(_ledger(profile))
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(profile, dest, ignore=skip)
    base = {
        str(p.relative_to(dest)): p.read_bytes()
        for p in sorted(dest.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }
    return Loaded(base=base, seq=seq)


def save_profile(
    profile: Path,
    changes: list[FileChange],
    *,
    key: str,
    run: str,
    member: str,
    loaded_seq: int,
    timeout_s: float | None = None,
) -> tuple[list[MemoryFileSave], bool]:
    """Apply ``changes`` to the profile as it is now; returns (per file what was done,
    whether the key was already in the ledger - then nothing is applied)."""
    profile.mkdir(parents=True, exist_ok=True)
    with locked(profile, timeout_s):
        ledger = _ledger(profile)
        for entry in ledger:
            if entry.get("key") == key:
                done = entry.get("files") or {}
                return [MemoryFileSave(path=p, action=a) for p, a in done.items()], True
        since = ledger[loaded_seq:] if loaded_seq <= len(ledger) else []
        writes: dict[str, bytes | None] = {}
        me = f"{member} (run {run})"
        files = [_one(profile, ch, writes, since, me) for ch in changes]
        entry = {
            "seq": len(ledger),
            "ts": round(time.time(), 3),
            "key": key,
            "run": run,
            "member": member,
            "files": {f.path: f.action for f in files},
        }
        _commit(profile, entry, writes)
    return files, False


# -- deciding -------------------------------------------------------------------------


def _read(profile: Path, rel: str) -> bytes | None:
    path = profile / rel
    if path.is_symlink() or not path.is_file():
        return None
    return path.read_bytes()


def _inside(profile: Path, rel: str) -> bool:
    """The path's directory is inside the profile (no symlinked directory leads out)."""
    root = profile.resolve()
    parent = (profile / rel).parent.resolve()
    return parent == root or root in parent.parents


def _one(
    profile: Path,
    ch: FileChange,
    writes: dict[str, bytes | None],
    since: list[dict[str, Any]],
    me: str,
) -> MemoryFileSave:
    others = [
        f"{e.get('member')} (run {e.get('run')})"
        for e in since
        if ch.path in (e.get("files") or {}) or (ch.origin and ch.origin in (e.get("files") or {}))
    ]
    result = MemoryFileSave(path=ch.path, action="unchanged", merged_with=others)
    if not _inside(profile, ch.path) or (profile / ch.path).is_dir():
        result.action, result.detail = "refused", "a symlink or a directory is at this path now"
        return result
    theirs = current = _read(profile, ch.path)
    if ch.renamed_to is not None:
        # Its content moved to ``renamed_to``, whose own entry carries concurrent edits.
        if theirs is not None:
            writes[ch.path] = None
        result.action, result.detail = "renamed", f"renamed to {ch.renamed_to}"
        return result
    ours, base = ch.ours, ch.base
    if ch.origin is not None:
        moved = _read(profile, ch.origin)
        if theirs is None:
            theirs = moved  # edits saved to the old name meanwhile follow the file
        elif moved is not None and ours is not None:
            # Someone else created the new name meanwhile: carry the old name's edits
            # into ours, then merge with theirs as two files that share no base.
            first = MemoryFileSave(path=ch.path, action="unchanged")
            ours, extra = _resolve(base, ours, moved, ch.path, me, first)
            writes.update(extra)
            base = None
            if first.action == "conflict":
                result.detail = first.detail + "; "
    content, extra = _resolve(base, ours, theirs, ch.path, me, result)
    if content != current:
        writes[ch.path] = content
    if ch.origin is not None:
        if result.action == "unchanged" and content != current:
            # Only the old name's file had changed meanwhile: it now has the new name.
            result.action, result.detail = "merged", ""
        result.detail = f"renamed from {ch.origin}" + (
            f"; {result.detail}" if result.detail else ""
        )
    writes.update(extra)
    return result


def _resolve(
    base: bytes | None,
    ours: bytes | None,
    theirs: bytes | None,
    path: str,
    me: str,
    result: MemoryFileSave,
) -> tuple[bytes | None, dict[str, bytes]]:
    """(what the file holds after the save - None: absent -, other files to write);
    sets ``result``'s action and adds to its detail."""
    if ours == theirs:
        return _say(result, "unchanged", "the profile already holds this version", theirs)
    if theirs == base:
        return _say(result, "deleted" if ours is None else "written", "", ours)
    if ours == base:
        return _say(result, "unchanged", "the profile's newer version is kept", theirs)
    if ours is None:
        why = (
            "deleted by this member but changed in the profile since it was loaded; "
            "the changed file is kept"
        )
        return _say(result, "conflict", why, theirs)
    if theirs is None:
        why = (
            "changed by this member but deleted from the profile since it was loaded; "
            "this member's version is kept"
        )
        return _say(result, "conflict", why, ours)
    try:
        texts = [(b or b"").decode("utf-8") for b in (base, ours, theirs)]
    except UnicodeDecodeError:
        side = _side_name(path, me)
        why = (
            "not text, and changed both by this member and in the profile; the "
            f"profile's version stays, this member's is kept as {side}"
        )
        return _say(result, "conflict", why, theirs)[0], {side: ours}
    who = ", ".join(result.merged_with) or "other members"
    merged = merge3(*texts, ours_label=me, theirs_label=f"the profile as saved since by {who}")
    if not merged.conflicts:
        return _say(result, "merged", "", merged.text.encode("utf-8"))
    why = (
        f"{merged.conflicts} place(s) changed differently by this member and in the profile; "
        "both versions are kept between <<<<<<< and >>>>>>> markers"
    )
    return _say(result, "conflict", why, merged.text.encode("utf-8"))


def _say(
    result: MemoryFileSave, action: str, why: str, content: bytes | None
) -> tuple[bytes | None, dict[str, bytes]]:
    result.action = action  # type: ignore[assignment]
    result.detail += why
    return content, {}


def _side_name(path: str, me: str) -> str:
    member = me.split(" ")[0]
    p = Path(path)
    return str(p.with_name(f"{p.name}.{member}-conflict"))


# -- applying -------------------------------------------------------------------------


def _ledger(profile: Path) -> list[dict[str, Any]]:
    try:
        text = (profile / META / "saves.jsonl").read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


def _fsync_replace(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.fleet-tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _commit(profile: Path, entry: dict[str, Any], writes: dict[str, bytes | None]) -> None:
    """Write the save whole to ``pending.json``, apply it, enter it in the ledger."""
    encoded = {p: None if d is None else base64.b64encode(d).decode() for p, d in writes.items()}
    pending = {"entry": entry, "writes": encoded}
    _fsync_replace(profile / META / "pending.json", json.dumps(pending).encode())
    _finish(profile, pending)


def _finish(profile: Path, pending: dict[str, Any]) -> None:
    for rel, data in pending["writes"].items():
        target = profile / rel
        if data is not None:
            _fsync_replace(target, base64.b64decode(data))
            continue
        if target.is_symlink() or target.is_file():
            target.unlink()
        # A deleted file's emptied directories go too (not the profile itself).
        parent = target.parent
        while parent != profile and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    entry = pending["entry"]
    if not any(e.get("key") == entry["key"] for e in _ledger(profile)):
        line = (json.dumps(entry) + "\n").encode("utf-8")
        fd = os.open(profile / META / "saves.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
    (profile / META / "pending.json").unlink()


def _roll_forward(profile: Path) -> None:
    """Finish a save whose process died between writing it and entering it."""
    path = profile / META / "pending.json"
    try:
        pending = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return
    except (OSError, ValueError):
        path.unlink(missing_ok=True)  # unreadable: it was never applied (written by rename)
        return
    _finish(profile, pending)

"""What makes two setups the same one: the key of a prepared snapshot.

A snapshot is reused when, and only when, everything that could change what the setup
leaves behind is the same: the image (by id, not by name: a rebuilt ``python:3.12``
is another image), the runtime, the setup's command, hosts, wheelhouse (its content,
not its path) and secrets' names, Fleet's snapshot format - and the content of the
repository's files the setup reads: its dependency manifests and lock files
(:data:`~sandbox.prepared.spec.DEFAULT_KEY_FILES`) and whatever ``key_files`` adds. The
rest of the tree is not in the key, so a source edit reuses the snapshot; the member's
box gets the repository as it is now laid over it, then the optional ``refresh``.

The time limit and the refresh are not in the key: neither changes what a successful
setup made. A secret's value is not either: a new token is the same setup.

Everything read here is read without following a link: a manifest that is a symbolic
link is keyed by where it points (as text), never by what it points at on the host.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from fnmatch import fnmatchcase
from functools import lru_cache
from pathlib import Path

from .spec import DEFAULT_KEY_FILES, SetupSpec

FORMAT = 1
"""Fleet's prepared-snapshot format: where the tree sits in the image and how it is
laid into ``/workspace``. A change to either makes every older snapshot a miss."""
_CHUNK = 1024 * 1024


@lru_cache(maxsize=256)
def _pattern(glob: str) -> re.Pattern[str]:
    """A relative glob as a whole-path expression: ``*`` and ``?`` stay within one
    directory, ``**/`` spans any number of them."""
    out, i = [], 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a regular file's bytes, opened without following a link."""
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _file_digest(path: str, st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "link:" + hashlib.sha256(os.fsencode(os.readlink(path))).hexdigest()
    return _content_digest(path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@lru_cache(maxsize=16384)
def _content_digest(path: str, dev: int, ino: int, size: int, mtime_ns: int, ctime_ns: int) -> str:
    """:func:`file_sha256`, once per process for a file whose status is unchanged. A run
    keys each setup twice - its early boxes (:mod:`coordinator.nodes.prewarm`) and its
    preparer read the same wheelhouse and manifests - and a wheelhouse can be hundreds
    of megabytes. The change time is in the key: writing a file changes it, and unlike
    the modification time no one but the kernel sets it (``touch -d`` cannot put it back),
    so an edit that keeps the size and the old mtime is still seen."""
    return file_sha256(path)


def _could_hold(rel_dir: str, globs: tuple[str, ...]) -> bool:
    """Whether a file under the directory ``rel_dir`` could match one of ``globs``: the
    walk enters no other (a project's ``.git`` or ``node_modules`` is never read)."""
    here = rel_dir.split("/")
    for glob in globs:
        parts = glob.split("/")
        if "**" in parts or any("**" in p for p in parts):
            return True
        dirs = parts[:-1]
        if len(here) <= len(dirs) and all(
            fnmatchcase(h, g) for h, g in zip(here, dirs, strict=False)
        ):
            return True
    return False


def _walk(root: Path, globs: tuple[str, ...] | None = None):  # type: ignore[no-untyped-def]
    """(relative posix name, full path, lstat) of every file and link under ``root``,
    without following a link; with ``globs``, only in directories that could hold a
    match."""
    for top, dirs, files in os.walk(root, followlinks=False):
        rel_top = os.path.relpath(top, root)
        if globs is not None:
            prefix = "" if rel_top == "." else rel_top.replace(os.sep, "/") + "/"
            dirs[:] = [d for d in dirs if _could_hold(prefix + d, globs)]
        dirs.sort()
        for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            full = os.path.join(top, name)
            rel = name if rel_top == "." else f"{rel_top}/{name}"
            yield rel.replace(os.sep, "/"), full, os.lstat(full)


def key_files(repo: Path | None, extra: tuple[str, ...] = ()) -> dict[str, str]:
    """``{relative name: sha256}`` of the repository files the key depends on."""
    if repo is None or not repo.is_dir():
        return {}
    globs = (*DEFAULT_KEY_FILES, *extra)
    patterns = [_pattern(p) for p in globs]
    found: dict[str, str] = {}
    for rel, full, st in _walk(repo, globs):
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            continue
        if any(p.match(rel) for p in patterns):
            found[rel] = _file_digest(full, st)
    return found


def wheelhouse_digest(path: str | None) -> str | None:
    """One SHA-256 over the wheelhouse's names and contents (None: no wheelhouse)."""
    if path is None:
        return None
    digest = hashlib.sha256()
    for rel, full, st in _walk(Path(path)):
        if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
            digest.update(f"{rel}\0{_file_digest(full, st)}\n".encode())
    return digest.hexdigest()


def key_inputs(
    setup: SetupSpec,
    *,
    image_id: str,
    runtime: str,
    repo: Path | None,
    wheels: str | None = None,
) -> dict[str, object]:
    """Everything the key is made of, as data (kept on the snapshot as its label, so a
    person can see why two snapshots differ). ``wheels``: the wheelhouse's digest when
    the caller has it already (a run hashes a wheelhouse once, not once per member)."""
    return {
        "format": FORMAT,
        "image": image_id,
        "runtime": runtime,
        "run": setup.command,
        "allow": sorted(setup.allow),
        "wheels": wheels if wheels is not None else wheelhouse_digest(setup.wheels),
        "secrets": sorted(setup.secrets),
        "files": key_files(repo, setup.key_files),
    }


def setup_key(inputs: dict[str, object]) -> str:
    """The key: SHA-256 of :func:`key_inputs` as canonical JSON."""
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()

"""Fleet's own git work inside a coding box: the baseline snapshot, and the patch.

This file runs in the box, not on the host: :mod:`subagents.kinds.coding` sends its
source as ``python3 -I -S -c SOURCE snapshot OUT`` / ``... collect OUT OBJECTS COMMIT``
(standard library only; it travels as one ``-c``, after the source of
:mod:`sandbox.inbox.stamps`, which the box agent shares and which is imported as
``stamps``). ``-I -S`` and the
working directory ``/`` mean no file the member can write is imported: not a
``glob.py`` in ``/workspace``, not a ``.pth`` file, no ``PYTHON*`` variable.

Everything in ``/workspace`` and ``/tmp`` is the member's: its uid can write, replace or
delete any file there, Fleet's included. So nothing here trusts a file it did not make
in the same call, and nothing of the member's runs beside it (both calls come when the
member's commands have ended, and the box agent kills what a command leaves running):

* **No git directory is used twice.** ``snapshot`` commits ``/workspace`` in a fresh
  git directory under ``/tmp`` and returns the commit's id, which the host keeps, out
  of the member's reach. ``collect`` makes another fresh git directory and copies into
  it, from the snapshot's ``objects``, only the objects it needs - the commit, its
  trees, the old content of changed files - each checked to hash to the id its parent
  names, from the kept commit down (the loose-object format is read here, in bounded
  steps). An object the member changed is refused; the snapshot's ``config``, hooks
  and index are never read again, so a ``core.fsmonitor`` written there runs nothing.
  The snapshot also stores each file's stamp (inode, size, mode, modification and
  change times, as git's index does) as one more object, so only files whose stamp
  moved are read again; the member can set a modification time back, not a change
  time.
* **git reads only what Fleet wrote.** Its configuration is the fresh directory's own
  plus :data:`GIT_CONFIG` given on the command line (no system or global file, no
  hooks, fsmonitor, pager, external diff or textconv); the environment is built from
  nothing. ``.gitattributes`` files in the workspace are still read by git, but the git
  directory's ``info/attributes`` beats them and turns off filters, ``ident``,
  end-of-line and encoding conversion and diff drivers - and no filter or driver is
  configured anywhere git looks, so an attribute naming one names nothing.
* **What is in the patch is decided here, not by git's walk.** Files are listed by a
  walk of ``/workspace`` that skips only entries named ``.git`` (which no patch can
  carry) and what the ignore rules *as they were at the snapshot* ignore: the
  baseline's own ``.gitignore`` files, checked out into an empty shadow tree, plus
  Fleet's :data:`EXCLUDES`. A ``.gitignore`` the member wrote is a change in the patch
  like any other, but it hides nothing from it; a directory the member made into a
  repository (``sub/.git``) still has its files listed one by one. Which files changed
  is decided by comparing each file's blob id with the baseline's; git stages
  exactly those, and a path git will not take (``.Git/config``) is a failed collection
  that names it, never a silently shorter patch.

A failed collection keeps the member's edits: the changed files (or, without a usable
baseline, every file the walk lists) go into ``edits.tar`` beside the result, up to
:data:`ARCHIVE_BYTES`, with deleted and left-out paths listed in the result.

Output goes to files in ``OUT``, a directory the host named and this program creates
(it refuses one that exists): ``result.json``, ``patch.diff``, ``edits.tar``. A
``collect OUT OBJECTS COMMIT SAME_AS PRINT`` (a checkpoint: ``SAME_AS`` is the
SHA-256 of the host's last one, ``PRINT`` the box's :func:`stamps_print` then, or
``-``; a snapshot returns the print too) whose patch hashes to ``SAME_AS`` removes
``OUT`` and prints ``{"ok": true, "same": true, "stamps_print": ...}`` instead: the host has nothing to read back or
clean up. When the workspace's stamps print is still ``PRINT``, nothing was written
since: it answers so before importing anything a collection needs (:func:`quick`),
which is most of the cost of a turn that changed nothing. A box that lies about
either only spoils its own member's resume, as a forged patch would. Paths in
``result.json`` are ``os.fsdecode`` strings (surrogate escapes for bytes that are not
UTF-8, which JSON carries).
"""

from __future__ import annotations

import os
import sys

if "stamps" in sys.modules:  # in the box: its source ran first, as a module of that name
    from stamps import WORKSPACE, stamps_print  # type: ignore[import-not-found]
else:  # on the host, which imports this file for its constants
    from sandbox.inbox.stamps import WORKSPACE, stamps_print


def quick(argv: list[str]) -> bool:
    """``collect OUT OBJECTS COMMIT SAME_AS PRINT`` whose workspace still has ``PRINT``:
    say ``same`` and stop, before the imports a collection needs (most of its cost)."""
    if len(argv) != 6 or argv[0] != "collect" or argv[5] == "-" or stamps_print() != argv[5]:
        return False
    sys.stdin.buffer.read()
    sys.stdout.write(f'{{"ok": true, "same": true, "stamps_print": "{argv[5]}"}}\n')
    return True


if __name__ == "__main__" and quick(sys.argv[1:]):
    sys.exit(0)

import functools  # noqa: E402 - after the quick answer, which needs none of these
import hashlib  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import stat  # noqa: E402
import subprocess  # noqa: E402
import tarfile  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import zlib  # noqa: E402
from typing import Any, BinaryIO  # noqa: E402

GIT = "/usr/bin/git"
ARCHIVE_BYTES = 64 * 1024 * 1024
"""Most bytes of file content put into ``edits.tar`` (the rest is listed as left out)."""
EXCLUDES = (
    ".git\n__pycache__/\n*.pyc\n.pytest_cache/\n.mypy_cache/\n.ruff_cache/\n"
    ".tox/\n.nox/\n.venv/\nnode_modules/\n"
)
"""Never in a patch, whatever the repository's rules: caches and environments a run makes."""
RAW_ATTRIBUTES = "* -text -filter -ident !eol !working-tree-encoding !diff\n"
"""Attributes under which git reads each file's bytes as they are and runs no driver."""
SAFE_CONFIG: dict[str, str] = {
    "core.fsmonitor": "false",
    "core.hooksPath": "/dev/null",
    "core.sshCommand": "",
    "core.askPass": "",
    "core.pager": "cat",
    "core.editor": ":",
    "sequence.editor": ":",
    "credential.helper": "",
    "diff.external": "",
    "gpg.program": "",
    "core.alternateRefsCommand": "",
    "protocol.allow": "never",
    "gc.auto": "0",
    "maintenance.auto": "false",
}
"""Settings that would run a command, switched off on every git call Fleet makes - here
and on the host (:mod:`coordinator.nodes.host_git` takes this list)."""
GIT_CONFIG: dict[str, str] = {
    **SAFE_CONFIG,
    "core.attributesFile": "/dev/null",
    "core.excludesFile": "/dev/null",
    "core.autocrlf": "false",
    "core.safecrlf": "false",
    "core.untrackedCache": "false",
    "core.fileMode": "true",
    "core.symlinks": "true",
    "core.ignoreCase": "false",
    "core.quotePath": "false",
    "color.ui": "never",
    "diff.noprefix": "false",
    "diff.mnemonicPrefix": "false",
    "core.bigFileThreshold": "64g",
    "user.name": "fleet",
    "user.email": "fleet@localhost",
}
"""Every setting the in-box calls would otherwise look up somewhere, fixed on git's
command line (no file of the user's or the member's is read for them)."""
_FIXED_DATE = "1700000000 +0000"
OBJECT_BYTES = 64 * 1024 * 1024
"""Largest object whose content is read back from the baseline (trees, a commit,
``.gitignore`` files); a blob only copied may declare up to 64 GiB, more than a box
holds."""


NO_SNAPSHOT = "-"
"""``OBJECTS`` of a collection whose baseline is the empty workspace and was taken by no
snapshot: the host knew ``/workspace`` was empty (a fresh box of Fleet's image that
nothing was written into, :meth:`sandbox.base.Sandbox.untouched_workspace`), so the
baseline is the commit an empty snapshot makes (:func:`empty_baseline`), and the
collection writes its two objects itself - there is nothing in the box to read them
from, and nothing the member made is read for them."""


def empty_baseline() -> tuple[str, dict[str, bytes]]:
    """The commit a snapshot of an empty ``/workspace`` makes (the dates and names are
    Fleet's fixed ones): its id, and its objects as ``{id: header and content}``."""
    tree = b"tree 0\0"
    tree_id = hashlib.sha1(tree, usedforsecurity=False).hexdigest()
    who = f"fleet <fleet@localhost> {_FIXED_DATE}"
    body = f"tree {tree_id}\nauthor {who}\ncommitter {who}\n\nbaseline\n".encode()
    commit = b"commit %d\0" % len(body) + body
    commit_id = hashlib.sha1(commit, usedforsecurity=False).hexdigest()
    return commit_id, {tree_id: tree, commit_id: commit}


def write_empty_baseline(dst: str, commit: str) -> None:
    """Write the empty baseline's objects into the objects directory ``dst``."""
    expected, objects = empty_baseline()
    if commit != expected:
        raise Failed(f"a baseline taken by no snapshot is the empty one, not {commit!r}")
    for oid, raw in objects.items():
        os.makedirs(os.path.join(dst, oid[:2]), exist_ok=True)
        with open(os.path.join(dst, oid[:2], oid[2:]), "wb") as f:
            f.write(zlib.compress(raw))


class Failed(Exception):
    """A step that stops the collection; the message says which and why."""


def git_env(gitdir: str, worktree: str) -> dict[str, str]:
    """git's whole environment: nothing inherited, nothing read but Fleet's own."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/nonexistent",
        "LC_ALL": "C",
        "GIT_DIR": gitdir,
        "GIT_WORK_TREE": worktree,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_NO_REPLACE_OBJECTS": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_AUTHOR_DATE": _FIXED_DATE,
        "GIT_COMMITTER_DATE": _FIXED_DATE,
        "GIT_CONFIG_COUNT": str(len(GIT_CONFIG)),
    }
    for i, (key, value) in enumerate(GIT_CONFIG.items()):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


class Repo:
    """A git directory this program made, with ``/workspace`` as its work tree."""

    def __init__(self, gitdir: str) -> None:
        self.gitdir = gitdir
        self.env = git_env(gitdir, os.fsdecode(WORKSPACE))
        self.run("init", "-q", "--template=")
        info = os.path.join(gitdir, "info")
        os.makedirs(info, exist_ok=True)
        with open(os.path.join(info, "attributes"), "w") as f:
            f.write(RAW_ATTRIBUTES)
        with open(os.path.join(info, "exclude"), "w") as f:
            f.write(EXCLUDES)

    def run(
        self, *args: str, stdin: bytes = b"", cwd: bytes = WORKSPACE, into: BinaryIO | None = None
    ) -> bytes:
        """git's output (or, with ``into``, written there); :class:`Failed` on an error."""
        done = subprocess.run(
            [GIT, *args],
            input=stdin,
            stdout=into or subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
            cwd=cwd,
            check=False,
        )
        if done.returncode != 0:
            err = done.stderr.decode("utf-8", "replace").strip()[-400:]
            raise Failed(f"git {args[0]} failed (exit {done.returncode}): {err}")
        return done.stdout or b""

    def ignored(self, paths: list[bytes], worktree: bytes) -> set[bytes]:
        """Which of ``paths`` the ignore rules in ``worktree`` (and info/exclude) ignore."""
        if not paths:
            return set()
        # "./" first: a name starting ":(" or ":!" is then a name, not pathspec magic
        # (check-ignore refuses GIT_LITERAL_PATHSPECS). --no-index: tracked files are
        # listed anyway, and with the index read each path costs a pass over it.
        done = subprocess.run(
            [GIT, "check-ignore", "--no-index", "-z", "--stdin"],
            input=b"".join(b"./" + p + b"\0" for p in paths),
            capture_output=True,
            env={**self.env, "GIT_WORK_TREE": os.fsdecode(worktree)},
            cwd=worktree,
            check=False,
        )
        if done.returncode not in (0, 1):
            err = done.stderr.decode("utf-8", "replace").strip()[-400:]
            raise Failed(f"git check-ignore failed: {err}")
        return {p.removeprefix(b"./") for p in done.stdout.split(b"\0") if p}


def walk(repo: Repo, rules: bytes) -> list[bytes]:
    """Files and symbolic links under /workspace (relative), level by level, minus
    entries named ``.git`` and what the ignore rules in the tree ``rules`` ignore.
    Directories are mirrored into ``rules`` when it is a shadow, so a rule for
    directories only (``build/``) sees them as directories there."""
    files: list[bytes] = []
    level = [b""]
    while level:
        entries: list[tuple[bytes, bool]] = []
        for parent in level:
            try:
                with os.scandir(os.path.join(WORKSPACE, parent)) as it:
                    for e in it:
                        if e.name == b".git":
                            continue
                        rel = os.path.join(parent, e.name)
                        if e.is_dir(follow_symlinks=False):
                            entries.append((rel, True))
                        elif e.is_symlink() or e.is_file(follow_symlinks=False):
                            entries.append((rel, False))
            except OSError as exc:
                raise Failed(f"cannot list {os.fsdecode(parent) or '.'}: {exc.strerror}") from None
        if rules != WORKSPACE:
            for rel, is_dir in entries:
                if is_dir:
                    os.makedirs(os.path.join(rules, rel), exist_ok=True)
        # A .gitignore is always listed, even one that ignores itself ("*"): so the
        # snapshot keeps its rules, and the member cannot hide one it wrote.
        rule_files = {
            rel for rel, is_dir in entries if not is_dir and os.path.basename(rel) == b".gitignore"
        }
        drop = repo.ignored([rel for rel, _ in entries], rules) - rule_files
        level = [rel for rel, is_dir in entries if is_dir and rel not in drop]
        files += [rel for rel, is_dir in entries if not is_dir and rel not in drop]
    return sorted(files)


@functools.cache
def _real_dir(rel: bytes) -> bool:
    """Whether ``rel`` is a directory of the workspace reached through directories
    only: a path under a link (``src`` made a link to ``/etc``) is not in the
    workspace, and is never read."""
    if not rel:
        return True
    try:
        st = os.lstat(os.path.join(WORKSPACE, rel))
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and _real_dir(os.path.dirname(rel))


def lstat(rel: bytes) -> os.stat_result | None:
    """The workspace path's own status; None when it is not there (or under a link)."""
    if not _real_dir(os.path.dirname(rel)):
        return None
    try:
        return os.lstat(os.path.join(WORKSPACE, rel))
    except (FileNotFoundError, NotADirectoryError):
        return None


def blob(rel: bytes) -> tuple[str, str] | None:
    """``(mode, blob id)`` of a workspace path as git would stage it; None when it is
    not there, or is neither a file nor a link."""
    full = os.path.join(WORKSPACE, rel)
    st = lstat(rel)
    if st is None:
        return None
    h = hashlib.sha1(usedforsecurity=False)
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(full)
        h.update(b"blob %d\0" % len(target) + target)
        return "120000", h.hexdigest()
    if not stat.S_ISREG(st.st_mode):
        return None
    h.update(b"blob %d\0" % st.st_size)
    size = 0
    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(1 << 20):
            size += len(chunk)
            h.update(chunk)
    if size != st.st_size:
        raise Failed(f"{os.fsdecode(rel)} changed while it was read")
    return ("100755" if st.st_mode & stat.S_IXUSR else "100644"), h.hexdigest()


def _file_or_link(st: os.stat_result | None) -> bool:
    return st is not None and (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode))


def stage(repo: Repo, paths: list[bytes]) -> None:
    """Put ``paths`` in the index as they are now: gone ones (or made directories) out
    first, without git looking at the work tree (it refuses a path under a link), then
    the rest."""
    gone = {p for p in paths if not _file_or_link(lstat(p))}
    here = [p for p in paths if p not in gone]
    for flags, listed in ((["--force-remove"], sorted(gone)), (["--add", "--replace"], here)):
        if listed:
            names = b"".join(p + b"\0" for p in listed)
            repo.run("update-index", *flags, "-z", "--stdin", stdin=names)


def staged(repo: Repo) -> set[bytes]:
    return {p for p in repo.run("ls-files", "-z", "--cached").split(b"\0") if p}


def snapshot(out: str) -> dict[str, object]:
    """Commit /workspace as the baseline: its id, where its objects are, and the paths
    git would not take (kept with their blob ids, so only a change to one fails later)."""
    # A file changed this close to the snapshot could be changed again within the
    # same clock tick and keep its stamp; it gets none and is always read again.
    settled = time.time_ns() - 2_000_000_000
    gitdir = tempfile.mkdtemp(prefix="fleet-baseline-", dir="/tmp")
    repo = Repo(gitdir)
    files = walk(repo, WORKSPACE)
    stage(repo, files)
    refused = sorted(set(files) - staged(repo))
    tree = repo.run("write-tree").strip().decode()
    commit = repo.run("commit-tree", tree, "-m", "baseline").strip().decode()
    listed = b"".join(p + b"\0" + (stamp(p, settled) or b"") + b"\0" for p in files)
    stamps = repo.run("hash-object", "-w", "--stdin", stdin=listed).strip().decode()
    return {
        "ok": True,
        "commit": commit,
        "stamps": stamps,
        "objects": os.path.join(gitdir, "objects"),
        "files": len(files),
        "refused": {os.fsdecode(p): blob(p) for p in refused},
    }


def stamp(rel: bytes, settled: int | None = None) -> bytes | None:
    """What changes whenever a file's content or mode does (git's own test): inode,
    size, mode, modification and change times. The member can set a modification time
    back, never a change time. None: no such file, or one changed after ``settled``."""
    st = lstat(rel)
    if st is None:
        return None
    if settled is not None and max(st.st_ctime_ns, st.st_mtime_ns) >= settled:
        return None
    return b"%d %d %d %d %d" % (st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns, st.st_ctime_ns)


def read_stamps(objects: str, mine: str, oid: str) -> dict[bytes, bytes]:
    parts = copy_object(objects, mine, oid, b"blob").split(b"\0")
    return dict(zip(parts[0:-1:2], parts[1::2], strict=True))


def copy_object(src: str, dst: str, oid: str, kind: bytes, *, keep: bool = True) -> bytes:
    """Copy the loose object ``oid`` from the objects directory ``src`` into ``dst``
    once its bytes are shown to hash to ``oid`` and to be a ``kind``; its content
    (b"" unless ``keep``). Inflated in bounded steps: a small file cannot make it
    inflate without end."""
    if len(oid) != 40 or oid.strip("0123456789abcdef"):
        raise Failed(f"Fleet's baseline snapshot names a bad object id {oid!r}")
    name = os.path.join(oid[:2], oid[2:])
    os.makedirs(os.path.join(dst, oid[:2]), exist_ok=True)
    unzip, h = zlib.decompressobj(), hashlib.sha1(usedforsecurity=False)
    raw, total, bound = bytearray(), 0, None  # bound: header plus declared length
    try:
        with open(os.path.join(src, name), "rb") as f, open(os.path.join(dst, name), "wb") as out:
            while chunk := f.read(1 << 20):
                out.write(chunk)
                while chunk:
                    data, chunk = unzip.decompress(chunk, 1 << 20), unzip.unconsumed_tail
                    h.update(data)
                    total += len(data)
                    if keep or len(raw) < 64:
                        raw += data
                    if bound is None and b"\0" in raw[:64]:
                        bound = raw.index(b"\0") + 1 + _length(raw, kind, keep)
                    if total > (OBJECT_BYTES if bound is None else bound):
                        raise Failed("Fleet's baseline snapshot was changed in the box")
    except OSError as exc:
        raise Failed(f"Fleet's baseline snapshot is unreadable ({exc.strerror}: {name})") from None
    body = bytes(raw).partition(b"\0")[2]
    if total != bound or not unzip.eof or unzip.unused_data or h.hexdigest() != oid:
        raise Failed("Fleet's baseline snapshot was changed in the box")
    return body if keep else b""


def _length(raw: bytearray, kind: bytes, keep: bool) -> int:
    """The content length an object's header (``kind LENGTH\\0``) declares."""
    what, _, length = bytes(raw[: raw.index(b"\0")]).partition(b" ")
    if what != kind or not length.isdigit() or int(length) > (OBJECT_BYTES if keep else 1 << 36):
        raise Failed("Fleet's baseline snapshot was changed in the box")
    return int(length)


def baseline_entries(src: str, dst: str, commit: str) -> dict[bytes, tuple[str, str]]:
    """Every file of the baseline ``commit`` as ``{path: (mode, blob id)}``, read from
    objects each checked against its id, from the commit the host kept down."""
    first = copy_object(src, dst, commit, b"commit").split(b"\n", 1)[0]
    if not first.startswith(b"tree "):
        raise Failed("Fleet's baseline snapshot was changed in the box")
    entries: dict[bytes, tuple[str, str]] = {}
    trees = [(b"", first[5:].decode())]
    while trees:
        prefix, oid = trees.pop()
        data, i = copy_object(src, dst, oid, b"tree"), 0
        while i < len(data):
            space = data.index(b" ", i)
            nul = data.index(b"\0", space)
            mode, name, sha = (
                data[i:space].decode(),
                data[space + 1 : nul],
                data[nul + 1 : nul + 21],
            )
            i = nul + 21
            if mode == "40000":
                trees.append((prefix + name + b"/", sha.hex()))
            else:
                entries[prefix + name] = (mode, sha.hex())
    return entries


def shadow_rules(src: str, dst: str, base: dict[bytes, tuple[str, str]], shadow: bytes) -> None:
    """The baseline's ``.gitignore`` files, written into the empty tree ``shadow``."""
    for path, (mode, oid) in base.items():
        if os.path.basename(path) == b".gitignore" and mode != "120000":
            target = os.path.join(shadow, path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(copy_object(src, dst, oid, b"blob"))


def collect(out: str, objects: str, commit: str, request: dict[str, Any]) -> dict[str, object]:
    """The patch of /workspace against the baseline ``commit``, whose objects are in
    ``objects``. ``request``: ``stamps`` (the id of the snapshot's file stamps),
    ``refused`` (its paths git would not take, with blob ids) and ``patch_bytes``."""
    gitdir = tempfile.mkdtemp(prefix="fleet-collect-", dir="/tmp")
    shadow = os.fsencode(tempfile.mkdtemp(prefix="fleet-rules-", dir="/tmp"))
    changed: list[bytes] = []
    try:
        repo = Repo(gitdir)
        mine = os.path.join(gitdir, "objects")
        stamps: dict[bytes, bytes] = {}
        if objects == NO_SNAPSHOT:
            write_empty_baseline(mine, commit)
            base: dict[bytes, tuple[str, str]] = {}
        else:
            base = baseline_entries(objects, mine, commit)
            shadow_rules(objects, mine, base, shadow)
            stamps = read_stamps(objects, mine, str(request.get("stamps")))
        repo.run("read-tree", commit)
        known = dict(base)
        refused = request.get("refused") or {}
        known.update({os.fsencode(p): (m, o) for p, (m, o) in refused.items()})
        candidates = set(walk(repo, shadow)) | set(base)
        for path in sorted(candidates):
            if path in known and stamp(path) == stamps.get(path):
                continue  # untouched since the snapshot: no need to read it again
            if blob(path) != known.get(path):
                changed.append(path)
                if path in base:  # the diff reads its old content
                    copy_object(objects, mine, base[path][1], b"blob", keep=False)
        stage(repo, changed)
        diff = ["diff", "--cached", "--no-renames", commit]
        took = {p for p in repo.run(*diff, "--name-only", "-z").split(b"\0") if p}
        left = sorted(set(changed) - took)
        if left:
            names = ", ".join(os.fsdecode(p) for p in left[:10])
            raise Failed(f"git will not hold {len(left)} changed path(s) in a patch: {names}")
        with open(os.path.join(out, "patch.diff"), "wb") as f:
            repo.run(*diff, "--binary", "--no-color", "--no-ext-diff", "--no-textconv", into=f)
            size = os.fstat(f.fileno()).st_size
        patch_bytes = int(request.get("patch_bytes", 1 << 26))
        if size > patch_bytes:
            raise Failed(f"the patch is {size} bytes, over the {patch_bytes}-byte limit")
        return {"ok": True, "changed": [os.fsdecode(p) for p in changed]}
    except (Failed, OSError) as exc:
        kept = changed or walk_all()
        return {"ok": False, "error": str(exc), "changed": [os.fsdecode(p) for p in changed]} | (
            archive(out, kept)
        )
    finally:
        shutil.rmtree(gitdir, ignore_errors=True)
        shutil.rmtree(shadow, ignore_errors=True)


def walk_all() -> list[bytes]:
    """Every file the walk lists under Fleet's excludes alone (no baseline to compare)."""
    gitdir = tempfile.mkdtemp(prefix="fleet-collect-", dir="/tmp")
    shadow = os.fsencode(tempfile.mkdtemp(prefix="fleet-rules-", dir="/tmp"))
    try:
        return walk(Repo(gitdir), shadow)
    except (Failed, OSError):
        return []
    finally:
        shutil.rmtree(gitdir, ignore_errors=True)
        shutil.rmtree(shadow, ignore_errors=True)


def archive(out: str, paths: list[bytes]) -> dict[str, object]:
    """``edits.tar`` of the files among ``paths`` (links as links), up to ARCHIVE_BYTES."""
    stored, deleted, left_out = [], [], []
    total = 0
    with tarfile.open(os.path.join(out, "edits.tar"), "w", format=tarfile.PAX_FORMAT) as tar:
        for path in paths:
            full = os.path.join(WORKSPACE, path)
            st = lstat(path)
            if st is None:
                deleted.append(os.fsdecode(path))
                continue
            size = st.st_size if stat.S_ISREG(st.st_mode) else 0
            if stat.S_ISDIR(st.st_mode) or total + size > ARCHIVE_BYTES:
                left_out.append(os.fsdecode(path))
                continue
            try:
                tar.add(os.fsdecode(full), arcname=os.fsdecode(path), recursive=False)
            except OSError:
                left_out.append(os.fsdecode(path))
                continue
            total += size
            stored.append(os.fsdecode(path))
    return {"archived": stored, "deleted": deleted, "left_out": left_out}


def main(argv: list[str]) -> int:
    action, out, *rest = argv
    os.mkdir(out, 0o700)  # refuses a directory that is already there
    request = json.loads(sys.stdin.read() or "{}")
    same = rest[2] if action == "collect" and len(rest) == 4 else None
    seen = stamps_print() if action == "snapshot" or same is not None else None
    try:
        if action == "snapshot":
            result = snapshot(out)
        else:
            result = collect(out, rest[0], rest[1], request)
    except (Failed, OSError) as exc:
        result = {"ok": False, "error": str(exc)}
    if seen is not None:
        result["stamps_print"] = seen
    if (
        result.get("ok")
        and same is not None
        and file_sha256(os.path.join(out, "patch.diff")) == same
    ):
        # A checkpoint equal to the host's last: nothing to read back, nothing to keep.
        shutil.rmtree(out, ignore_errors=True)
        print(json.dumps({"ok": True, "same": True, "stamps_print": seen}))
        return 0
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f)
    return 0


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(functools.partial(f.read, 1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

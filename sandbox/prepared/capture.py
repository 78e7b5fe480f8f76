"""What of a finished setup's ``/workspace`` becomes the prepared snapshot.

The box's archive of ``/workspace`` is hostile input: the setup ran whatever the
repository and the package index gave it. It is read here once, as a stream (never
decompressed, never extracted on the host), and written again as a clean archive for
the engine to store, entry by entry:

* only directories, regular files, symbolic links (kept as links, never followed) and
  hard links to a file already kept; names are relative, without ``..``; anything else
  (a device, a pipe, an absolute name) refuses the whole capture;
* every entry is owned by the box's user (uid 1000) and loses set-uid, set-gid and
  sticky bits: the snapshot cannot give a member more than the setup had;
* a file the setup did not change - the same bytes as the repository's copy - is left
  out: each member gets the repository as it is *now*, laid over the snapshot, so a
  file deleted or edited since the setup is not brought back by it;
* the content, names and link targets are searched for the value of every secret the
  setup was given; one found refuses the capture (naming the variable and the file,
  never the value) - a setup that wrote its token into ``pip.conf`` is not cached;
* the kept bytes are bounded (:data:`MAX_BYTES` by default).
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .key import file_sha256

BOX_UID = 1000
MAX_BYTES = 4 * 1024**3
"""Most bytes of file content a snapshot may keep."""
PREFIX = "opt/fleet/prepared"
"""Where the tree sits in the snapshot's image (``/workspace`` is a fresh tmpfs in every
box, so the tree is copied there when a member's box starts)."""
MIN_SECRET_CHARS = 4
"""Secret values shorter than this are not searched for (they would match anywhere)."""
_CHUNK = 1024 * 1024
VENV_PYTHON = ".venv/bin/python"


class CaptureRefused(Exception):
    """The setup's tree cannot become a snapshot; the message says why."""


@dataclass
class Captured:
    files: int = 0
    bytes: int = 0
    unchanged: int = 0
    """Files left out because the repository has the same bytes."""
    venv: bool = False
    """The tree has ``.venv/bin/python``: members get it first on their ``PATH``."""


class _SecretScan:
    """Finds any of ``values`` in a stream of chunks (matches across chunk ends too)."""

    def __init__(self, secrets: dict[str, str]) -> None:
        self.values = {
            name: value.encode()
            for name, value in secrets.items()
            if len(value) >= MIN_SECRET_CHARS
        }
        self.keep = max((len(v) for v in self.values.values()), default=1) - 1
        self.tail = b""

    def reset(self) -> None:
        self.tail = b""

    def feed(self, chunk: bytes) -> str | None:
        data = self.tail + chunk
        for name, value in self.values.items():
            if value in data:
                return name
        self.tail = data[-self.keep :] if self.keep else b""
        return None

    def whole(self, data: bytes) -> str | None:
        return next((n for n, v in self.values.items() if v in data), None)


def redact(text: str, secrets: dict[str, str]) -> str:
    """``text`` with every secret's value replaced by ``***``."""
    for value in secrets.values():
        if value:
            text = text.replace(value, "***")
    return text


def _repo_digest(repo: Path | None, name: str, size: int) -> str | None:
    """SHA-256 of the repository's regular file ``name`` when its size is ``size``."""
    if repo is None:
        return None
    path = repo / name
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return None
        # Each parent must be a directory of the copy, not a link out of it.
        for parent in Path(name).parents:
            if parent != Path(".") and not stat.S_ISDIR(os.lstat(repo / parent).st_mode):
                return None
        return file_sha256(path)
    except OSError:
        return None


def _clean_name(raw: str) -> str:
    name = raw
    while name.startswith("./"):
        name = name[2:]
    name = name.rstrip("/")
    parts = name.split("/")
    if raw.startswith("/") or ".." in parts or ("" in parts and name):
        raise CaptureRefused(f"the setup's tree holds an entry named {raw!r}")
    return name


def capture(
    archive: BinaryIO,
    out: BinaryIO,
    *,
    repo: Path | None,
    secrets: dict[str, str],
    limit: int = MAX_BYTES,
) -> Captured:
    """Read the box's archive of ``/workspace`` from ``archive`` and write the clean
    one (names under :data:`PREFIX`) to ``out``; raises :class:`CaptureRefused`."""
    scan = _SecretScan(secrets)
    got = Captured()
    kept: set[str] = set()
    try:
        source = tarfile.open(fileobj=archive, mode="r|")
    except tarfile.ReadError as exc:
        raise CaptureRefused(f"the setup's tree did not come as a tar archive ({exc})") from None
    with source, tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as sink:
        sink.addfile(_dir_entry(PREFIX))
        try:
            for member in source:
                _one(member, source, sink, repo, scan, got, kept, limit)
        except tarfile.TarError as exc:
            raise CaptureRefused(f"the setup's tree is not a readable archive ({exc})") from None
    return got


def _dir_entry(name: str, mtime: float = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    info.uid = info.gid = BOX_UID
    info.mtime = int(mtime)
    return info


def _one(
    member: tarfile.TarInfo,
    source: tarfile.TarFile,
    sink: tarfile.TarFile,
    repo: Path | None,
    scan: _SecretScan,
    got: Captured,
    kept: set[str],
    limit: int,
) -> None:
    name = _clean_name(member.name)
    if not name:
        return  # the archive's own root, "."
    found = scan.whole(name.encode("utf-8", "surrogateescape"))
    if found:
        raise CaptureRefused(f"a file name in the setup's tree holds the value of secret {found}")
    info = tarfile.TarInfo(f"{PREFIX}/{name}")
    info.mtime = member.mtime
    info.uid = info.gid = BOX_UID
    info.mode = member.mode & 0o777
    if member.isdir():
        info.type = tarfile.DIRTYPE
        sink.addfile(info)
        return
    if member.issym():
        found = scan.whole(member.linkname.encode("utf-8", "surrogateescape"))
        if found:
            raise CaptureRefused(f"the link {name!r} holds the value of secret {found}")
        info.type = tarfile.SYMTYPE
        info.linkname = member.linkname
        sink.addfile(info)
        kept.add(name)
        got.venv = got.venv or name == VENV_PYTHON
        return
    if member.islnk():
        target = _clean_name(member.linkname)
        if target not in kept:
            raise CaptureRefused(
                f"the setup's tree holds a hard link {name!r} to {member.linkname!r}, "
                "which is not a file it kept"
            )
        info.type = tarfile.LNKTYPE
        info.linkname = f"{PREFIX}/{target}"
        sink.addfile(info)
        kept.add(name)
        return
    if not member.isreg():
        raise CaptureRefused(
            f"the setup's tree holds {name!r}, which is not a file, link or directory"
        )
    if got.bytes + member.size > limit:
        raise CaptureRefused(f"the setup's tree holds more than {limit:,} bytes of files")
    data = source.extractfile(member)
    assert data is not None
    same_as = _repo_digest(repo, name, member.size)
    digest = hashlib.sha256()
    scan.reset()
    with tempfile.SpooledTemporaryFile(max_size=8 * _CHUNK) as spool:
        while chunk := data.read(_CHUNK):
            found = scan.feed(chunk)
            if found:
                raise CaptureRefused(f"the file {name!r} holds the value of secret {found}")
            digest.update(chunk)
            spool.write(chunk)
        if same_as is not None and digest.hexdigest() == same_as:
            got.unchanged += 1
            return
        info.size = spool.tell()
        spool.seek(0)
        sink.addfile(info, spool)
    kept.add(name)
    got.files += 1
    got.bytes += info.size
    got.venv = got.venv or name == VENV_PYTHON


def capture_bytes(data: bytes, **kwargs: object) -> tuple[bytes, Captured]:
    """:func:`capture` of an archive in memory (tests, small trees)."""
    out = io.BytesIO()
    got = capture(io.BytesIO(data), out, **kwargs)  # type: ignore[arg-type]
    return out.getvalue(), got

"""Fleet's images as data, tagged by a hash of their build inputs.

Every image is an :class:`ImageDef` in :data:`IMAGES` (name, context directory,
parent, repository files copied into the context). Adding an image - the offline
documentation corpus, say - is one more entry there plus its directory under
``images/``; the build order follows the ``parent`` links.

Tags. An image's tag is the first 12 hex digits of a SHA-256 over everything that
goes into it: every file of its context directory (path, mode, bytes), the helper
files copied in, its parent's tag, the extra CA bundle (base only; children inherit
it through the parent's tag), and :data:`BUILDER_VERSION`. Equal inputs give the
same tag on any machine, so "is it built?" is one ``docker image inspect`` and an
unchanged image is never rebuilt; a changed input gives a new tag, so a stale image
can never be mistaken for a current one. Old tags are left alone (another process
may still run boxes on them) until ``fleet images prune``.

The root image (``rootfs``) is ``debootstrap --variant=minbase`` imported with
``docker import``: no registry is needed anywhere. Its tag hashes its debootstrap
config and overlay only, not the date: it is a pinned snapshot until ``--force``.

Extra CA bundle. An explicit setting, never picked up implicitly from
``SSL_CERT_FILE``: that variable usually names the whole public bundle, and letting
the environment of one shell change every tag would make ``image_ref`` in another
shell call the images missing. ``fleet images build --extra-ca FILE`` stores the
bundle in :func:`config_dir` (``--no-extra-ca`` forgets it); from then on it is a
build input like any other, installed into the trust store of ``fleet-base`` (so of
every image) and named by ``PIP_CERT``, ``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE``.

:func:`image_ref` is synchronous (it blocks on the Docker API); async callers run it
through ``anyio.to_thread.run_sync``. Building what is missing is
:func:`sandbox.images.build.ensure_images`: this module only says what the images are
and which tags their inputs give, so it imports nothing of the builder.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

import docker
import docker.errors
from pydantic import BaseModel, ConfigDict, Field

from ..errors import SandboxUnavailable

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILDER_VERSION = "1"
"""Bump when the build procedure itself changes what an image contains."""
LABEL_IMAGE = "fleet.image"
LABEL_INPUTS = "fleet.inputs"


class ImageBuildFailed(SandboxUnavailable):
    """A build ran and failed (a Dockerfile step, debootstrap, the import); the message
    ends with the last lines of its output. Unlike plain :class:`SandboxUnavailable`
    (no engine, no root) this is never an environment to skip over in tests."""


class ImageDef(BaseModel):
    """One Fleet image, declared as data."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9-]*$")
    """Short name; the repository is ``fleet-<name>``."""
    directory: str
    """Context directory relative to the repository root (holds the Dockerfile, or
    ``debootstrap.json`` for a ``debootstrap`` image)."""
    parent: str | None = None
    """Image this one is built ``FROM``; passed to the Dockerfile as build arg ``BASE``."""
    files: tuple[str, ...] = ()
    """Repository files copied into the context under ``fleet/`` (flat, by base name);
    files that do not exist yet are skipped, and the list of copied ones is part of
    the hash."""
    builder: Literal["dockerfile", "debootstrap"] = "dockerfile"
    """``debootstrap`` builds a root file system offline and ``docker import``s it."""
    extra_ca: bool = False
    """Whether the extra CA bundle goes into this image's context (as ``fleet-ca/``)."""

    @property
    def repository(self) -> str:
        return f"fleet-{self.name}"

    @property
    def path(self) -> Path:
        return REPO_ROOT / self.directory


BOX_HELPERS = (
    "sandbox/inbox/boxagent.py",
    "sandbox/inbox/boxagent_main.py",
    "sandbox/inbox/egress_proxy.py",
    "sandbox/inbox/egress_rules.py",
    "sandbox/inbox/memguard.py",
    "sandbox/inbox/stamps.py",
    "sandbox/inbox/wire.py",
)
"""The stdlib-only programs that run inside boxes (:mod:`sandbox.inbox`), baked into
every image that runs a box at ``/opt/fleet/``."""

IMAGES: tuple[ImageDef, ...] = (
    ImageDef(name="rootfs", directory="images/base/rootfs", builder="debootstrap"),
    ImageDef(name="base", directory="images/base", parent="rootfs", extra_ca=True),
    ImageDef(name="coding", directory="images/coding", parent="base", files=BOX_HELPERS),
    ImageDef(name="browser", directory="images/browser", parent="base", files=BOX_HELPERS),
    # The corpus server is part of its image's context (images/corpus/corpus_server.py).
    ImageDef(name="corpus", directory="images/corpus", parent="base", files=BOX_HELPERS),
)
"""Every image, parents before children."""


def image_defs() -> dict[str, ImageDef]:
    """The declared images by name, parents before children."""
    return {d.name: d for d in IMAGES}


def build_order(names: Iterable[str] | None = None) -> list[ImageDef]:
    """The named images and all their ancestors, parents first."""
    defs = image_defs()
    wanted = list(defs) if names is None else list(names)
    unknown = [n for n in wanted if n not in defs]
    if unknown:
        raise SandboxUnavailable(
            f"unknown image {', '.join(map(repr, unknown))}; Fleet's images are {', '.join(defs)}"
        )
    needed: set[str] = set()
    for name in wanted:
        cur: str | None = name
        while cur is not None and cur not in needed:
            needed.add(cur)
            cur = defs[cur].parent
    return [d for d in defs.values() if d.name in needed]


# ---------------------------------------------------------------- extra CA bundle

_PEM_RE = re.compile(rb"-----BEGIN CERTIFICATE-----\s+[A-Za-z0-9+/=\s]+?-----END CERTIFICATE-----")


def config_dir() -> Path:
    """Where Fleet keeps settings: ``$FLEET_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/fleet``."""
    if os.environ.get("FLEET_CONFIG_DIR"):
        return Path(os.environ["FLEET_CONFIG_DIR"])
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "fleet"


def cache_dir() -> Path:
    """Where build caches live: ``$FLEET_CACHE_DIR``, else ``$XDG_CACHE_HOME/fleet``."""
    if os.environ.get("FLEET_CACHE_DIR"):
        return Path(os.environ["FLEET_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "fleet"


def split_pem(data: bytes, source: str = "bundle") -> list[bytes]:
    """The certificates of a PEM bundle, one normalized block each."""
    certs = [m.group(0).replace(b"\r\n", b"\n") + b"\n" for m in _PEM_RE.finditer(data)]
    if data.strip() and not certs:
        raise SandboxUnavailable(
            f"{source} holds no PEM certificate ('-----BEGIN CERTIFICATE-----' blocks); "
            f"give --extra-ca a PEM bundle such as /etc/ssl/certs/ca-certificates.crt"
        )
    return certs


def saved_extra_ca() -> bytes:
    """The stored extra CA bundle, or ``b""`` when none is configured."""
    path = config_dir() / "extra-ca.pem"
    return path.read_bytes() if path.is_file() else b""


def save_extra_ca(source: Path | None) -> bytes:
    """Store (``source``) or forget (``None``) the extra CA bundle; returns what is in force."""
    path = config_dir() / "extra-ca.pem"
    if source is None:
        path.unlink(missing_ok=True)
        return b""
    try:
        data = source.read_bytes()
    except OSError as exc:
        raise SandboxUnavailable(f"cannot read the CA bundle {source}: {exc.strerror}") from None
    bundle = b"".join(split_pem(data, str(source)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bundle)
    return bundle


# ---------------------------------------------------------------- hashing


def context_files(defn: ImageDef) -> Iterator[tuple[str, Path]]:
    """(path in context, file) for every file that goes into ``defn``'s context."""
    root = defn.path
    if not root.is_dir():
        raise SandboxUnavailable(f"image {defn.name!r}: its directory {root} does not exist")
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and not any(p in {"__pycache__", ".git"} for p in rel.parts):
            yield rel.as_posix(), path
    for name in defn.files:
        src = REPO_ROOT / name
        if src.is_file():
            yield f"fleet/{src.name}", src


def input_hash(defn: ImageDef, parent_tag: str | None, extra_ca: bytes) -> str:
    """The tag of ``defn``: a hash of all its build inputs (see the module docstring)."""
    h = hashlib.sha256()
    h.update(f"fleet-image\0{BUILDER_VERSION}\0{defn.name}\0{defn.builder}\0".encode())
    h.update(f"parent\0{parent_tag or ''}\0".encode())
    for rel, path in context_files(defn):
        data = path.read_bytes()
        executable = os.stat(path).st_mode & 0o111 != 0
        h.update(f"file\0{rel}\0{int(executable)}\0{len(data)}\0".encode())
        h.update(data)
    if defn.extra_ca:
        h.update(b"extra-ca\0" + b"".join(split_pem(extra_ca)))
    return h.hexdigest()[:12]


def current_refs(
    names: Iterable[str] | None = None, *, extra_ca: bytes | None = None
) -> dict[str, str]:
    """Image name -> the reference its current inputs give (``fleet-coding:<tag>``)."""
    ca = saved_extra_ca() if extra_ca is None else extra_ca
    refs: dict[str, str] = {}
    for defn in build_order(names):
        parent_tag = refs[defn.parent].split(":", 1)[1] if defn.parent else None
        refs[defn.name] = f"{defn.repository}:{input_hash(defn, parent_tag, ca)}"
    return refs


# ---------------------------------------------------------------- lookup


def image_exists(client: docker.DockerClient, ref: str) -> bool:
    try:
        client.images.get(ref)
    except docker.errors.ImageNotFound:
        return False
    return True


def image_ref(name: str, *, client: docker.DockerClient | None = None) -> str:
    """The current reference of image ``name``; :class:`SandboxUnavailable` if not built.

    Blocking (one Docker API call): async code runs it in a worker thread.
    """
    ref = current_refs([name])[name]
    owned = client is None
    if client is None:
        from ..docker.engine import connect

        client = connect()
    try:
        if not image_exists(client, ref):
            raise SandboxUnavailable(
                f"image {ref} is not built (or is out of date with the files under "
                f"images/); run 'fleet images build' (or 'fleet setup') and try again"
            )
    finally:
        if owned:
            client.close()
    return ref


class ImageStatus(BaseModel):
    """One image as ``fleet images ls`` shows it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """Short name (``coding``)."""
    ref: str
    """Reference the current inputs give."""
    built: bool
    """Whether that reference exists in the engine (the image is up to date)."""
    size: int | None = None
    """Size in bytes when built."""
    stale_tags: tuple[str, ...] = ()
    """Older tags of the same repository still present (``fleet images prune``)."""


def status(client: docker.DockerClient) -> list[ImageStatus]:
    """Every declared image: current reference, whether built, size, stale tags."""
    refs = current_refs()
    present: dict[str, tuple[int, list[str]]] = {}
    for image in client.images.list(filters={"label": LABEL_IMAGE}):
        for tag in image.tags:
            present[tag] = (int(image.attrs.get("Size") or 0), image.tags)
    out = []
    for name, ref in refs.items():
        repo = ref.split(":", 1)[0]
        stale = tuple(sorted(t for t in present if t.split(":", 1)[0] == repo and t != ref))
        built = ref in present
        out.append(
            ImageStatus(
                name=name,
                ref=ref,
                built=built,
                size=present[ref][0] if built else None,
                stale_tags=stale,
            )
        )
    return out


def prune_superseded(
    client: docker.DockerClient, names: Iterable[str] | None = None
) -> tuple[list[str], list[str]]:
    """Remove ``fleet-*`` tags that current inputs no longer give; (removed, kept in use).

    Only tags Fleet built (labelled ``fleet.image``) of the declared repositories
    (``names``, default all) are touched, never with force: a tag a container still
    uses is kept.
    """
    wanted = None if names is None else set(names)
    current = set(current_refs().values())
    repos = {d.repository for d in build_order(wanted) if wanted is None or d.name in wanted}
    removed: list[str] = []
    kept: list[str] = []
    # Children first, so a parent's layers are no longer referenced when it goes.
    order = {d.repository: i for i, d in enumerate(IMAGES)}
    stale = [
        tag
        for image in client.images.list(filters={"label": LABEL_IMAGE})
        for tag in image.tags
        if tag.split(":", 1)[0] in repos and tag not in current
    ]
    for tag in sorted(stale, key=lambda t: -order[t.split(":", 1)[0]]):
        try:
            client.images.remove(tag, noprune=False)
        except docker.errors.APIError as exc:
            if exc.status_code == 409:
                kept.append(tag)
                continue
            if not isinstance(exc, docker.errors.ImageNotFound):
                raise SandboxUnavailable(f"removing {tag} failed: {exc.explanation}") from None
        else:
            removed.append(tag)
    return removed, kept

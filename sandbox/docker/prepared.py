"""Prepared snapshots on a Docker engine: images made from a finished setup's tree.

A snapshot is an image: the member's image with one more layer holding the setup's
tree at ``/opt/fleet/prepared`` (:data:`~sandbox.prepared.capture.PREFIX`), owned by
the box's user, plus labels that say its key and what made it. An image because that
is what an engine keeps, lists, ships (``fleet images push``) and starts from with no
copy of its own; the layer holds only what the setup made (a virtualenv, build
output), not the repository, which each member's box gets as it is now. Modal's
file-system snapshots are image diffs in the same way; E2B and Codex keep whole
machines or containers, which on a user's engine would hold a stopped container per
key and its tmpfs would be lost anyway.

Making one. ``/workspace`` is a tmpfs, which neither ``docker commit`` nor ``docker
cp`` sees, so the setup box's own ``tar`` streams it out over a plain ``docker exec``
(capped as it arrives). :func:`sandbox.prepared.capture.capture` rewrites that stream
into a clean archive on the host; an unstarted container of the member's image takes
it (``put_archive``, extracted by the engine inside the container's root, never on
the host) and is committed with the labels and, when the tree holds ``.venv``, the
virtualenv first on ``PATH``. A failed capture leaves no image.

Using one. A box whose spec names the snapshot (``SandboxSpec.prepared``) starts from
that image and copies the tree into its fresh ``/workspace`` before it is handed out
(:meth:`sandbox.docker.backend.DockerBackend.create`). The copy is the box's first act,
made by its own start command while the engine finishes the start and the host connects
to the box's agent; the first request waits only for what is left of it. In series
after the start (an ``exec`` of ``cp -a``) a 25 MB virtualenv made such a box 1.25x a
plain one's time to its first answer; beside it, 1.05x (``bench/setup.py --boxes-only``).
A lower layer mounted in place (an overlay of the image's tree under ``/workspace``)
would copy nothing, but needs a mount the unprivileged box cannot make, and a tmpfs
``/workspace`` is what bounds the box's disk.

A member that needs a setup still to run does not wait for the snapshot to start its
box: its box starts from the member's image at once, and takes the clean archive
:func:`save` keeps for it (``keep``) when the snapshot is made
(:mod:`sandbox.prepared.waiting` says why and what it bounds).

Last use is a file per key under the cache directory, touched each time a run takes
the snapshot: an image's labels cannot change, and an engine records no use of an
image. ``fleet sandbox prepared`` lists and removes snapshots; ``gc`` removes those
unused past a TTL, then the least recently used past a disk cap.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from pathlib import Path

import docker
import docker.errors
import requests

from ..errors import SandboxUnavailable
from ..prepared.capture import CaptureRefused, capture, redact
from ..prepared.spec import PreparedInfo
from .engine import REMOVE_PATIENCE_S, answers, on_engine

REPOSITORY = "fleet-prepared"
KEY_LABEL = "fleet.prepared.key"
ARCHIVE_LIMIT = 8 * 1024**3
"""Most bytes of the setup box's archive read (its ``/workspace`` is smaller still)."""
TTL_S = 14 * 24 * 3600.0
"""Default: a snapshot unused this long is removed by ``gc``."""
MAX_TOTAL_BYTES = 20 * 1024**3
"""Default: past this many bytes of snapshots, ``gc`` removes the least recently used."""
_INPUTS_LABEL_CHARS = 16_000


def _uses_dir() -> Path:
    from ..images.catalog import cache_dir

    return cache_dir() / "prepared-uses"


_KEY = re.compile(r"[0-9a-f]{64}")
"""A key Fleet makes (:func:`sandbox.prepared.key.setup_key`: SHA-256 in hex)."""


def _uses_file(key: str) -> Path | None:
    """Where a use of ``key`` is recorded; None for a key Fleet never makes. The key of
    a listed snapshot is its image's label, the image's word: ``../../x`` must name no
    file outside the folder for gc to read or unlink."""
    return _uses_dir() / key if _KEY.fullmatch(key) else None


def touch(key: str) -> None:
    """Record a use of the snapshot ``key`` now."""
    path = _uses_file(key)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def last_used(key: str, created: float) -> float:
    path = _uses_file(key)
    try:
        return max(path.stat().st_mtime, created) if path is not None else created
    except OSError:
        return created


@on_engine
def find(client: docker.DockerClient, key: str) -> str | None:
    """The image reference of the snapshot ``key`` on this engine, or None."""
    images = client.api.images(filters={"label": f"{KEY_LABEL}={key}"})
    if not images:
        return None
    return str(images[0]["Id"])


def find_for_use(client: docker.DockerClient, key: str) -> str | None:
    """:func:`find`, recording a use of the snapshot when there is one (a box is about to
    start from it: ``fleet sandbox prepared gc`` goes by last use)."""
    ref = find(client, key)
    if ref is not None:
        touch(key)
    return ref


@on_engine
def image_id(client: docker.DockerClient, ref: str) -> str:
    try:
        return str(client.api.inspect_image(ref)["Id"])
    except docker.errors.ImageNotFound:
        raise SandboxUnavailable(
            f"image {ref!r} is not on this engine; build Fleet's images with 'fleet images "
            "build' (or name an existing image)"
        ) from None


@on_engine
def archive_workspace(
    client: docker.DockerClient, box_id: str, prefix: list[str], dest: Path, limit: int
) -> None:
    """The box's ``/workspace`` as a tar stream into ``dest``, by the box's own ``tar``
    over a plain exec (the agent's archive is one message; a tree can be far larger)."""
    api = client.api
    argv = [*prefix, "tar", "-C", "/workspace", "--numeric-owner", "-cf", "-", "."]
    exec_id = api.exec_create(box_id, argv, user="1000:1000", workdir="/")["Id"]
    written, err = 0, b""
    with open(dest, "wb") as out:
        for chunk_out, chunk_err in api.exec_start(exec_id, stream=True, demux=True):
            if chunk_out:
                written += len(chunk_out)
                if written > limit:
                    raise CaptureRefused(f"the setup's tree is more than {limit:,} bytes")
                out.write(chunk_out)
            if chunk_err and len(err) < 4096:
                err += chunk_err
    code = api.exec_inspect(exec_id)["ExitCode"]
    if code != 0:
        tail = err.decode("utf-8", "replace").strip()[-500:]
        raise CaptureRefused(f"'tar' in the setup box ended with exit {code}: {tail}")


@on_engine
def commit(
    client: docker.DockerClient,
    base: str,
    clean: Path,
    *,
    key: str,
    labels: dict[str, str],
    venv: bool,
) -> str:
    """An image of ``base`` with the clean archive ``clean`` added at its root; its id."""
    api = client.api
    created = api.create_container(base, network_disabled=True, labels={"fleet.kind": "prepare"})
    cid = created["Id"]
    try:
        with open(clean, "rb") as data:
            if not api.put_archive(cid, "/", data):
                raise SandboxUnavailable("the engine did not take the prepared tree")
        conf: dict[str, object] = {"Labels": {**labels, KEY_LABEL: key, "fleet.kind": "prepared"}}
        if venv:
            env = api.inspect_image(base)["Config"].get("Env") or []
            path = next((e.split("=", 1)[1] for e in env if e.startswith("PATH=")), "/usr/bin:/bin")
            conf["Env"] = ["VIRTUAL_ENV=/workspace/.venv", f"PATH=/workspace/.venv/bin:{path}"]
        image = api.commit(cid, repository=REPOSITORY, tag=key[:24], conf=conf)
        return str(image["Id"])
    finally:
        api.remove_container(cid, force=True)


def save(
    client: docker.DockerClient,
    box_id: str,
    prefix: list[str],
    base: str,
    *,
    key: str,
    inputs: dict[str, object],
    setup: str,
    repo: Path | None,
    secrets: dict[str, str],
    keep: Path | None = None,
) -> str:
    """Blocking: the finished setup box's tree as the snapshot ``key``; its image id.
    ``keep``: a directory that also gets the clean archive, as :data:`TREE_FILE`, once
    the snapshot is made (for the boxes that waited for it, read-only in each). Both
    archives are written in a private directory beside it, never in it: the raw one is
    the setup's tree as it was (a secret's value may be in it), and a clean one is whole
    and free of secrets only once the capture has ended without refusing it."""
    private = keep.parent if keep is not None else None
    with tempfile.TemporaryDirectory(prefix="fleet-prepare-", dir=private) as tmp:
        raw, clean = Path(tmp) / "raw.tar", Path(tmp) / "clean.tar"
        archive_workspace(client, box_id, prefix, raw, ARCHIVE_LIMIT)
        with open(raw, "rb") as source, open(clean, "wb") as out:
            got = capture(source, out, repo=repo, secrets=secrets)
        raw.unlink()
        described = json.dumps(inputs, sort_keys=True)
        if len(described) > _INPUTS_LABEL_CHARS:
            files = inputs.get("files")
            count = len(files) if isinstance(files, dict) else 0
            described = json.dumps({**inputs, "files": f"{count} files"}, sort_keys=True)
        labels = {
            "fleet.prepared.created": str(int(time.time())),
            "fleet.prepared.setup": redact(setup[:500], secrets),
            "fleet.prepared.base": base,
            "fleet.prepared.inputs": redact(described, secrets),
            "fleet.prepared.files": str(got.files),
        }
        ref = commit(client, base, clean, key=key, labels=labels, venv=got.venv)
        if keep is not None:  # one file system: a rename, never a half-written file
            clean.chmod(0o644)
            clean.rename(keep / TREE_FILE)
    touch(key)
    return ref


TREE_FILE = "tree.tar"
"""The clean archive of a snapshot's tree, as :func:`save` keeps it when asked."""


@on_engine
def added_env(client: docker.DockerClient, ref: str, base: str) -> dict[str, str]:
    """What the snapshot ``ref`` sets in its boxes' environment beyond its ``base``
    image (the virtualenv first on ``PATH``, :func:`commit`)."""

    def env(image: str) -> dict[str, str]:
        pairs = client.api.inspect_image(image)["Config"].get("Env") or []
        return dict(e.split("=", 1) for e in pairs if "=" in e)

    mine, theirs = env(ref), env(base)
    return {k: v for k, v in mine.items() if theirs.get(k) != v}


HELPER_AGE_S = 3600.0
"""A commit's helper container older than this was left by a process that died mid-commit."""


@on_engine
def remove_helpers(
    client: docker.DockerClient,
    *,
    now: float | None = None,
    age_s: float = HELPER_AGE_S,
    only: set[str] | None = None,
) -> int:
    """Remove commit helpers (never started) that a killed process left; how many
    (``only``: of these container ids alone)."""
    now = time.time() if now is None else now
    gone = 0
    for c in client.api.containers(all=True, filters={"label": "fleet.kind=prepare"}):
        if only is not None and c["Id"] not in only:
            continue
        if now - float(c.get("Created") or 0) >= age_s:
            client.api.remove_container(c["Id"], force=True)
            gone += 1
    return gone


@on_engine
def list_all(client: docker.DockerClient) -> list[PreparedInfo]:
    out = []
    bases: dict[str, int] = {}
    for image in client.api.images(filters={"label": KEY_LABEL}):
        labels = image.get("Labels") or {}
        key = labels.get(KEY_LABEL, "")
        base = labels.get("fleet.prepared.base", "")
        if base not in bases:  # a snapshot's own cost is its layer, not its base's
            try:
                bases[base] = int(client.api.inspect_image(base).get("Size") or 0) if base else 0
            except (docker.errors.DockerException, ValueError, TypeError):
                bases[base] = 0
        try:  # labels are the image's word, not Fleet's: a foreign one may say anything
            created = float(labels.get("fleet.prepared.created") or image.get("Created") or 0)
        except (ValueError, TypeError):
            created = float(image.get("Created") or 0)
        out.append(
            PreparedInfo(
                key=key,
                ref=str(image["Id"]),
                size=max(int(image.get("Size") or 0) - bases[base], 0),
                created=created,
                last_used=last_used(key, created),
                setup=labels.get("fleet.prepared.setup", ""),
                base=base,
            )
        )
    return sorted(out, key=lambda p: p.last_used, reverse=True)


@on_engine
def remove(client: docker.DockerClient, info: PreparedInfo) -> bool:
    """Remove one snapshot; False when a box still uses it (it stays). Like a box's
    removal, a call that times out on an engine that still answers is asked again,
    bounded: deleting an image's layers waits on whatever else the engine is doing."""
    deadline = time.monotonic() + REMOVE_PATIENCE_S
    while True:
        try:
            client.api.remove_image(info.ref, force=False)
            break
        except docker.errors.ImageNotFound:
            break
        except docker.errors.APIError:
            return False
        except requests.exceptions.Timeout:
            if time.monotonic() > deadline or not answers(client):
                raise
            time.sleep(1.0)
    path = _uses_file(info.key)
    try:
        if path is not None:
            os.unlink(path)
    except OSError:
        pass
    return True


def gc(
    client: docker.DockerClient,
    *,
    ttl_s: float = TTL_S,
    max_bytes: int = MAX_TOTAL_BYTES,
    now: float | None = None,
    dry_run: bool = False,
) -> list[PreparedInfo]:
    """Remove snapshots unused for ``ttl_s``, then the least recently used until the rest
    hold at most ``max_bytes``; the ones removed (or, ``dry_run``, that would be)."""
    now = time.time() if now is None else now
    if not dry_run:
        remove_helpers(client, now=now)
    kept, removed = [], []

    def drop(info: PreparedInfo) -> bool:
        if dry_run:
            return True
        # Used since it was listed (a run found it meanwhile and is about to start a
        # box from it): it stays. A run that finds it after this look can still lose
        # it; its box then fails as SnapshotGone and its retry sets the setup up again.
        if last_used(info.key, info.created) > info.last_used:
            return False
        return remove(client, info)

    for info in list_all(client):
        if now - info.last_used > ttl_s and drop(info):
            removed.append(info)
            continue
        kept.append(info)
    total = sum(i.size for i in kept)
    for info in sorted(kept, key=lambda p: p.last_used):
        if total <= max_bytes:
            break
        if drop(info):
            removed.append(info)
            total -= info.size
    return removed

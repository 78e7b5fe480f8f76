"""How Fleet's images are built: the offline root file system and Dockerfile builds.

:func:`ensure_images` is the entry point: it builds whichever of the images declared
in :mod:`sandbox.images.catalog` (and their parents) are missing or out of date with their
inputs. That module says what the images are and which tags their inputs give; this
one makes them exist, so the import runs one way, from here to there.

The root image comes from ``debootstrap --variant=minbase`` into a temporary
directory (Debian's mirror over plain HTTP; no registry), trimmed (no apt lists,
docs, man pages or locales; a dpkg config keeps later installs trimmed too), packed
once into a tarball cached under ``cache_dir()/rootfs/<tag>.tar`` and imported with
``docker import``. The tarball cache makes a rebuild after the engine lost its images
take seconds instead of a fresh debootstrap; only the newest tarball is kept.

Dockerfile images are built with the Docker SDK's classic builder (the engine here
has no BuildKit) from a temporary context: the image directory, the declared helper
files under ``fleet/`` and, for the base, the extra CA certificates under
``fleet-ca/``. Output stays quiet except one progress line per build step; a failed
build raises :class:`ImageBuildFailed` with the last lines of its log.

Images whose parents are ready build concurrently (the coding and browser images
spend most of their time waiting on the mirror), in threads, at most three at once.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

import docker
import docker.errors

from ..docker.engine import Say, connect, ensure_build_tools, is_root
from ..errors import SandboxUnavailable
from ..host.scratch import Scratch
from .catalog import (
    LABEL_IMAGE,
    LABEL_INPUTS,
    ImageBuildFailed,
    ImageDef,
    build_order,
    cache_dir,
    context_files,
    current_refs,
    image_exists,
    saved_extra_ca,
    split_pem,
)

MAX_PARALLEL_BUILDS = 3
LOG_TAIL_LINES = 15


def ensure_images(
    names: Iterable[str] | None = None,
    *,
    client: docker.DockerClient | None = None,
    force: bool = False,
    extra_ca: bytes | None = None,
    say: Say | None = None,
) -> dict[str, str]:
    """Build whatever of ``names`` (default: all) and their parents is missing or stale.

    ``force`` rebuilds the named images (not their parents) from scratch: a fresh
    debootstrap for the root, no layer cache for the others - how Debian's updates get
    in, since a tag depends on the inputs, not the date. Returns name -> reference for
    the requested images and their parents. Blocking; a no-op (hashing plus one
    inspect per image) when everything is up to date. Concurrent callers on one
    machine serialize on a lock file, so two test sessions never build the same image
    twice.
    """
    owned = client is None
    if client is None:
        client = connect()
    order = build_order(names)
    forced = frozenset(d.name for d in order) if names is None else frozenset(names)
    try:
        return build_images(
            order,
            client=client,
            forced=forced if force else frozenset(),
            extra_ca=saved_extra_ca() if extra_ca is None else extra_ca,
            say=say or (lambda _line: None),
        )
    finally:
        if owned:
            client.close()


def build_images(
    order: list[ImageDef],
    *,
    client: docker.DockerClient,
    forced: frozenset[str] = frozenset(),
    extra_ca: bytes,
    say: Say,
) -> dict[str, str]:
    """Build the missing images of ``order``, and those in ``forced`` afresh; name -> ref."""
    refs = current_refs([d.name for d in order], extra_ca=extra_ca)
    todo = [d for d in order if d.name in forced or not image_exists(client, refs[d.name])]
    if not todo:
        return refs
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same images
        # Another process may have built some while we waited for the lock.
        todo = [d for d in todo if d.name in forced or not image_exists(client, refs[d.name])]
        _build_in_dependency_order(
            todo, refs, client=client, extra_ca=extra_ca, forced=forced, say=say
        )
    return refs


def _build_in_dependency_order(
    todo: list[ImageDef],
    refs: dict[str, str],
    *,
    client: docker.DockerClient,
    extra_ca: bytes,
    forced: frozenset[str],
    say: Say,
) -> None:
    pending = {d.name: d for d in todo}
    running: dict[Future[None], str] = {}
    with ThreadPoolExecutor(max_workers=MAX_PARALLEL_BUILDS) as pool:
        while pending or running:
            busy = set(pending) | set(running.values())
            for name, defn in list(pending.items()):
                if defn.parent not in busy:
                    del pending[name]
                    fresh = name in forced
                    fut = pool.submit(_build_one, defn, refs, client, extra_ca, fresh, say)
                    running[fut] = name
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                del running[fut]
                fut.result()  # a failed build stops the rest: its children cannot build


def _build_one(
    defn: ImageDef,
    refs: dict[str, str],
    client: docker.DockerClient,
    extra_ca: bytes,
    fresh: bool,
    say: Say,
) -> None:
    """Build one image; ``fresh`` bypasses the rootfs tarball and docker's layer cache."""
    ref = refs[defn.name]
    started = time.monotonic()
    replaced = _image_id(client, ref) if fresh else None
    say(f"building {ref}")
    if defn.builder == "debootstrap":
        build_rootfs_image(defn, ref, client=client, fresh=fresh, say=say)
    else:
        parent = refs[defn.parent] if defn.parent else None
        build_dockerfile_image(
            defn, ref, parent, client=client, extra_ca=extra_ca, fresh=fresh, say=say
        )
    say(f"built {ref} in {time.monotonic() - started:.0f} s")
    if replaced and replaced != _image_id(client, ref):
        # The forced rebuild took the tag; drop the old image unless a box still uses it.
        try:
            client.images.remove(replaced)
        except docker.errors.APIError:
            pass


def _image_id(client: docker.DockerClient, ref: str) -> str | None:
    try:
        return str(client.images.get(ref).id)
    except docker.errors.ImageNotFound:
        return None


# ---------------------------------------------------------------- rootfs


def build_rootfs_image(
    defn: ImageDef, ref: str, *, client: docker.DockerClient, fresh: bool = False, say: Say
) -> None:
    """Import the cached rootfs tarball for ``ref``, debootstrapping it first if needed
    (or always, when ``fresh``: that is how ``--force`` picks up Debian's updates)."""
    tag = ref.split(":", 1)[1]
    store = cache_dir() / "rootfs"
    tarball = store / f"{tag}.tar"
    if fresh or not tarball.is_file():
        store.mkdir(parents=True, exist_ok=True)
        _debootstrap_tarball(defn, tarball, say)
        for old in store.glob("*.tar"):
            if old != tarball:
                old.unlink(missing_ok=True)
    say(f"  {defn.name}: importing {tarball.stat().st_size / 2**20:.0f} MiB root file system")
    repo, _, tag = ref.partition(":")
    changes = [
        f"LABEL {LABEL_IMAGE}={defn.name} {LABEL_INPUTS}={tag}",
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        'CMD ["/bin/bash"]',
    ]
    try:
        client.api.import_image(src=str(tarball), repository=repo, tag=tag, changes=changes)
    except docker.errors.APIError as exc:
        raise ImageBuildFailed(f"docker import of {tarball} failed: {exc.explanation}") from None


def _debootstrap_tarball(defn: ImageDef, tarball: Path, say: Say) -> None:
    if not is_root():
        raise SandboxUnavailable(
            "building the base image runs debootstrap, which needs root; run "
            "'sudo fleet images build' (or 'sudo fleet setup') once"
        )
    ensure_build_tools(say)
    config = json.loads((defn.path / "debootstrap.json").read_text())
    # A build killed outright leaves its rootfs (hundreds of MB, in the cache dir, which
    # a reboot keeps): the next build's scratch sweeps it (sandbox/host/scratch.py).
    scratch = Scratch("fleet-rootfs-", root=str(tarball.parent))
    workdir = scratch.path
    root = workdir / "root"
    try:
        # Seed Fleet's dpkg/apt config first: dpkg inside debootstrap then already
        # skips fsync (force-unsafe-io) and docs.
        _copy_overlay(defn, root)
        say(f"  {defn.name}: debootstrap {config['variant']} {config['suite']} (about 30 s)")
        cmd = [
            "debootstrap",
            f"--variant={config['variant']}",
            f"--include={','.join(config['include'])}" if config["include"] else "",
            f"--cache-dir={_deb_cache()}",
            config["suite"],
            str(root),
            config["mirror"],
        ]
        _run([c for c in cmd if c], "debootstrap")
        _finish_rootfs(defn, root, config)
        partial = workdir / "rootfs.tar"
        _run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(partial), "."], "tar")
        partial.rename(tarball)
    finally:
        scratch.cleanup()


def _deb_cache() -> Path:
    # Downloaded .debs survive between debootstraps, so a rebuild does not download again.
    path = cache_dir() / "debs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _finish_rootfs(defn: ImageDef, root: Path, config: dict) -> None:
    """Overlay Fleet's apt/dpkg config, write sources.list, drop what boxes never read."""
    _copy_overlay(defn, root)
    suite, mirror, security = config["suite"], config["mirror"], config["security_mirror"]
    (root / "etc/apt/sources.list").write_text(
        f"deb {mirror} {suite} main\n"
        f"deb {mirror} {suite}-updates main\n"
        f"deb {security} {suite}-security main\n"
    )
    for rel in config["trim"]:
        target = root / rel
        if target.is_dir():
            # Empty the directory but keep it: apt and dpkg expect it to exist.
            for child in target.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        elif target.exists():
            target.unlink()


def _copy_overlay(defn: ImageDef, root: Path) -> None:
    overlay = defn.path / "overlay"
    if overlay.is_dir():
        shutil.copytree(overlay, root, dirs_exist_ok=True)


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-LOG_TAIL_LINES:])
        raise ImageBuildFailed(
            f"{what} failed (exit {proc.returncode}); check that Debian's mirror answers "
            f"over HTTP and try again. Last output:\n{tail}"
        )


# ---------------------------------------------------------------- Dockerfile images


def build_dockerfile_image(
    defn: ImageDef,
    ref: str,
    parent: str | None,
    *,
    client: docker.DockerClient,
    extra_ca: bytes,
    fresh: bool = False,
    say: Say,
) -> None:
    """Build ``ref`` from ``defn``'s directory with ``BASE=parent`` (no layer cache if ``fresh``)."""
    scratch = Scratch(f"fleet-ctx-{defn.name}-")
    try:
        ctx = scratch.path
        _assemble_context(defn, ctx, extra_ca)
        tag = ref.split(":", 1)[1]
        buildargs = {**_proxy_args(), **({"BASE": parent} if parent else {})}
        stream = client.api.build(
            path=str(ctx),
            tag=ref,
            buildargs=buildargs or None,
            labels={LABEL_IMAGE: defn.name, LABEL_INPUTS: tag},
            rm=True,
            forcerm=True,
            pull=False,
            nocache=fresh,
            decode=True,
        )
        _follow_build(defn.name, ref, stream, say)
    finally:
        scratch.cleanup()


def _proxy_args() -> dict[str, str]:
    # Docker's predefined proxy build args: used by apt in RUN steps, kept out of the
    # image and its history, and not part of the tag (where packages come through
    # does not change what the image is).
    names = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "FTP_PROXY")
    return {n: os.environ[n] for name in names for n in (name, name.lower()) if os.environ.get(n)}


def _assemble_context(defn: ImageDef, ctx: Path, extra_ca: bytes) -> None:
    (ctx / "fleet").mkdir()
    for rel, src in context_files(defn):
        dest = ctx / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        # Modes as the hash sees them (only the executable bit), readable by the box user.
        dest.chmod(0o755 if src.stat().st_mode & 0o111 else 0o644)
    if defn.extra_ca:
        ca_dir = ctx / "fleet-ca"
        ca_dir.mkdir()
        # COPY of a directory needs something in it; only *.crt files are trusted.
        (ca_dir / "README").write_text("Extra CA certificates from 'fleet images build'.\n")
        for i, cert in enumerate(split_pem(extra_ca)):
            (ca_dir / f"extra-{i:03d}.crt").write_bytes(cert)
    # Keep an empty helpers directory copyable, and say in the image what it holds.
    helpers = sorted(p.name for p in (ctx / "fleet").iterdir())
    (ctx / "fleet" / "HELPERS").write_text("".join(f"{h}\n" for h in helpers))


def _follow_build(name: str, ref: str, stream, say: Say) -> None:
    tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
    try:
        for chunk in stream:
            if "error" in chunk:
                tail.append(str(chunk["error"]).strip())
                raise ImageBuildFailed(_build_failed(ref, tail))
            text = str(chunk.get("stream", ""))
            for line in text.splitlines():
                line = line.rstrip()
                if not line:
                    continue
                tail.append(line)
                if line.startswith("Step "):
                    say(f"  {name}: {line[:110]}")
    except docker.errors.APIError as exc:
        tail.append(str(exc.explanation))
        raise ImageBuildFailed(_build_failed(ref, tail)) from None


def _build_failed(ref: str, tail: deque[str]) -> str:
    lines = "\n".join(tail)
    return (
        f"building {ref} failed; if apt could not reach Debian's mirror, check the network "
        f"(and --extra-ca for a TLS-intercepting proxy), then run 'fleet images build' "
        f"again. Last output:\n{lines}"
    )

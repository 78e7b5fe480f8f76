"""``fleet images push --cluster ADDRESS``: Fleet's images onto every node's engine.

A node's engine needs Fleet's images under the references the node's own Fleet
computes from its build inputs (:func:`sandbox.images.catalog.current_refs`). This command asks
each Fleet node which of them its engine lacks, and streams those images from this
host's engine to the node through Ray: ``docker save`` output here, cut into chunks of
:data:`CHUNK` bytes, each one call of a small actor pinned to the node
(:class:`Loader`), which feeds them to its engine's ``docker load`` as they come. At
most :data:`IN_FLIGHT` chunks are on their way to a node at once and :data:`QUEUED`
wait on the node, so neither side holds more than a bounded part of an image of
hundreds of MB. Through Ray a push costs more than a local ``docker save | docker
load`` (the coding image, 468 MB: about 40 s against 14 s on a busy 2-core machine):
each chunk is copied into Ray's object store and out again.

Why copy and not build on each node: the build needs ``debootstrap``, root and
Debian's mirror on every host, and minutes per host; a tag is a hash of the build's
inputs, not of its result, so a build elsewhere (a day later, Debian updated) may put
different bytes under the same reference. A copy is the image the coordinator's host
runs, byte for byte, and needs nothing on the node but its engine and Ray. Why through
Ray and not a registry: Fleet never pulls (no registry may be reachable), and Ray's
connection to each node is already there, authenticated by the cluster's token.

Nodes that share an engine (the engine's ID says so) get each image once. A node
whose Fleet is another version wants references this host does not have: it is named,
with what it wants, and nothing is sent to it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import SandboxUnavailable

CHUNK = 8 * 2**20
"""Bytes of ``docker save`` output per call to a node."""
IN_FLIGHT = 16
"""Chunks on their way to one node at once (128 MiB), so that Ray's transfers overlap
the engine's load (the coding image, once each on a busy machine: 53 s with 4, 41 s
with 16)."""
QUEUED = 4
"""Chunks the node holds for its engine's load, beyond the one being read."""
LOAD_S = 600.0
"""How long a node's engine may take to load what it was sent."""

Say = Callable[[str], None]


def engine_needs(names: list[str] | None) -> dict[str, Any]:
    """Run on a node: its engine's ID, the references its Fleet wants (name -> ref), and
    which of those its engine lacks."""
    from ..docker.engine import connect
    from .catalog import current_refs, image_exists

    client = connect()
    try:
        refs = current_refs(names)
        missing = [ref for ref in refs.values() if not image_exists(client, ref)]
        return {"engine": client.info()["ID"], "refs": refs, "missing": missing}
    finally:
        client.close()


class Loader:
    """The node's end of a push: chunks in, its engine's ``docker load`` fed with them
    (in a thread, as they come); :meth:`finish` returns what the engine loaded."""

    def __init__(self) -> None:
        from ..docker.engine import connect

        self._chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=QUEUED)
        self._loaded: list[str] = []
        self._error: BaseException | None = None
        self._client = connect(timeout=LOAD_S)
        self._thread = threading.Thread(target=self._load, daemon=True)
        self._thread.start()

    def _stream(self) -> Iterator[bytes]:
        while (chunk := self._chunks.get()) is not None:
            yield chunk

    def _load(self) -> None:
        try:
            for line in self._client.api.load_image(self._stream()):
                text = str(line.get("stream", "")).strip()
                if text.startswith("Loaded image: "):
                    self._loaded.append(text.removeprefix("Loaded image: "))
                if line.get("error"):
                    raise SandboxUnavailable(str(line["error"]))
        except BaseException as exc:
            self._error = exc
            while self._chunks.get() is not None:  # the sender is not left blocked
                pass

    def write(self, chunk: bytes) -> None:
        if self._error is not None:
            raise SandboxUnavailable(f"the node's engine refused the images: {self._error}")
        self._chunks.put(chunk)

    def finish(self) -> list[str]:
        self._chunks.put(None)
        self._thread.join(LOAD_S)
        self._client.close()
        if self._error is not None:
            raise SandboxUnavailable(f"the node's engine refused the images: {self._error}")
        if self._thread.is_alive():
            raise SandboxUnavailable(f"the node's engine did not load them within {LOAD_S:g}s")
        return self._loaded


@dataclass
class Plan:
    """What goes where: per engine, one node to send through and the refs it lacks."""

    sends: dict[str, tuple[dict[str, Any], list[str]]] = field(default_factory=dict)
    ready: list[str] = field(default_factory=list)
    """Nodes whose engine has every image already."""
    problems: list[str] = field(default_factory=list)
    """Nodes nothing can be sent to, and why."""


def plan(
    found: list[tuple[dict[str, Any], dict[str, Any] | Exception]],
    have: set[str],
    repositories: set[str],
) -> Plan:
    """Decide the sends from each node's answer (``found``: node info and what
    :func:`engine_needs` said, or why it could not say), the refs this host has, and
    the repositories of the images asked for: a node is sent nothing else, whatever
    it says it lacks (what this host's engine holds besides Fleet's images is not
    the cluster's to take)."""
    from ..cluster.nodes import node_name

    out = Plan()
    for info, needs in found:
        name = node_name(info)
        if isinstance(needs, Exception):
            out.problems.append(f"node {name} could not say what it lacks ({needs})")
            continue
        strange = [r for r in needs["missing"] if r.partition(":")[0] not in repositories]
        if strange:
            out.problems.append(
                f"node {name} asked for {', '.join(strange)[:300]}, not one of the images "
                "pushed; it was sent nothing"
            )
            continue
        foreign = [ref for ref in needs["missing"] if ref not in have]
        if foreign:
            out.problems.append(
                f"node {name} wants {', '.join(foreign)}, which this host's engine does not "
                "have: its Fleet is another version than this one (or its extra CA bundle "
                "differs); install the same Fleet there, or build with 'fleet setup' on it"
            )
            continue
        if not needs["missing"]:
            out.ready.append(name)
        elif needs["engine"] not in out.sends:
            out.sends[needs["engine"]] = (info, list(needs["missing"]))
    return out


def push(address: str, names: list[str] | None, say: Say, *, insecure: bool = False) -> int:
    """Load the images each Fleet node of the cluster lacks into its engine; returns
    how many engines got images. SandboxUnavailable when a node could not be served."""
    import ray

    from ..cluster.nodes import connect, fleet_nodes, node_name, pinned
    from ..docker.engine import connect as engine
    from .catalog import build_order, image_exists

    connect(address, insecure=insecure)
    infos = fleet_nodes(address)
    ask = ray.remote(num_cpus=0, max_retries=0)(engine_needs)
    refs = [ask.options(scheduling_strategy=pinned(n)).remote(names) for n in infos]
    found: list[tuple[dict[str, Any], dict[str, Any] | Exception]] = []
    for info, ref in zip(infos, refs, strict=True):
        try:
            found.append((info, ray.get(ref, timeout=120)))
        except (ray.exceptions.RayError, TimeoutError) as exc:
            found.append((info, Exception(str(exc).strip().splitlines()[0][:200])))
    client = engine()
    try:
        wanted = {r for _, n in found if isinstance(n, dict) for r in n["missing"]}
        have = {r for r in wanted if image_exists(client, r)}
        todo = plan(found, have, {d.repository for d in build_order(names)})
        for name in todo.ready:
            say(f"node {name}: every image already there")
        for info, missing in todo.sends.values():
            say(f"node {node_name(info)}: loading {', '.join(missing)}")
            loaded = _send(client, info, missing)
            say(f"node {node_name(info)}: loaded {', '.join(loaded) or 'nothing'}")
    finally:
        client.close()
    if todo.problems:
        raise SandboxUnavailable("; ".join(todo.problems))
    return len(todo.sends)


def _save(client: Any, refs: list[str]) -> Iterator[bytes]:
    """``docker save REFS`` as a stream of parts of at most :data:`CHUNK` bytes: one
    archive, each shared layer in it once (the SDK's own ``get_image`` takes one image)."""
    api = client.api
    res = api._get(api._url("/images/get"), params={"names": refs}, stream=True)
    api._raise_for_status(res)
    yield from res.iter_content(CHUNK)


def _send(client: Any, info: dict[str, Any], refs: list[str]) -> list[str]:
    """Stream ``docker save REFS`` to a Loader on the node; what its engine loaded."""
    import ray

    from ..cluster.nodes import pinned

    actor: Any = (
        ray.remote(Loader)
        .options(num_cpus=0, scheduling_strategy=pinned(info), max_restarts=0)
        .remote()
    )
    try:
        pending: list[Any] = []
        for part in _save(client, refs):
            pending.append(actor.write.remote(part))
            if len(pending) >= IN_FLIGHT:
                ray.get(pending.pop(0))
        ray.get(pending)
        return list(ray.get(actor.finish.remote(), timeout=LOAD_S + 30))
    except ray.exceptions.RayTaskError as exc:
        raise SandboxUnavailable(str(exc.cause)) from None
    finally:
        ray.kill(actor)

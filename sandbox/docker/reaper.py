"""Box lifecycle on the host: labels, the live-run registry, listing and garbage collection.

Every container and network Fleet makes carries ``fleet.run``, ``fleet.member``,
``fleet.kind``, ``fleet.created`` (epoch seconds), ``fleet.ttl`` (seconds) and
``fleet.keep`` labels, so the engine itself is the inventory: nothing to fall out of
sync.

A run is *live* while its marker file ``~/.fleet/live/<run>`` (``$FLEET_HOME/live``)
exists and names a process that is still alive. The backend writes the marker when a
run's first box is created and removes it in ``remove_run``; a coordinator killed
with SIGKILL leaves a marker whose pid is dead, which counts as over. ``gc`` then
removes: boxes whose run is over (unless kept for debugging), boxes whose TTL has
passed (kept or not), run networks with no live run and no containers, and gVisor
processes on the host with no container behind them (a box whose start failed can
leave them; :func:`sandbox.docker.gvisor.end_orphans`). Boxes of
a live run are otherwise never touched - not even by ``--all`` - unless the caller
says ``include_live``: on a shared engine, a live run is someone's work in progress.

On a cluster, a run's boxes on a node are made by that node's actor for the run, not
by the coordinator on another host: they carry a ``fleet.node`` label, and the actor
writes the marker ``<run>@<node>`` on its node. A marker is on one host's disk,
though, and hosts with different disks may share an engine, so a gc run inside the
cluster also asks Ray whether that actor lives (:func:`sandbox.cluster.nodes.live_owners`);
when the coordinator or the node dies, Ray ends the actor, and the next node actor
to start on the engine, or ``gc --cluster``, removes the boxes.

The public engine functions run under :func:`sandbox.docker.engine.on_engine`: an engine that
stopped answering is :class:`~sandbox.errors.SandboxUnavailable`, for the backend and
the ``fleet sandbox`` commands alike.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors

from ..base import BoxInfo, owner_key
from ..spec import SandboxSpec
from . import gvisor
from .engine import on_engine, remove_box

LABEL = "fleet.run"
NODE_LABEL = "fleet.node"


def fleet_home() -> Path:
    return Path(os.environ.get("FLEET_HOME") or Path.home() / ".fleet")


def _marker(run: str) -> Path:
    return fleet_home() / "live" / run


def mark_live(run: str, pid: int | None = None) -> None:
    """Record that ``run`` is owned by process ``pid`` (default: this one).

    The marker is written beside its place and renamed into it: a gc reading the folder
    meanwhile (another process's, at any moment) sees no marker or a whole one, never
    an empty file, which names no process and would be pruned as a dead run's. The side
    file is made new (a link left in its place is removed, never followed); no fsync: a
    marker stands for a living process, which a power loss ends too."""
    path = _marker(run)
    if path.exists() and pid_alive(_read_pid(path)):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    part.unlink(missing_ok=True)
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, f"{pid or os.getpid()}\n".encode())
    finally:
        os.close(fd)
    os.replace(part, path)


def mark_done(run: str) -> None:
    _marker(run).unlink(missing_ok=True)


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def pid_alive(pid: int | None) -> bool:
    """Whether process ``pid`` runs. A zombie - killed, not yet reaped by its parent, as
    a cluster node's actor is when the node's processes are killed - does not."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def live_runs() -> set[str]:
    """Runs whose marker names a living process."""
    folder = fleet_home() / "live"
    if not folder.is_dir():
        return set()
    return {p.name for p in folder.iterdir() if not _partial(p) and pid_alive(_read_pid(p))}


def _partial(path: Path) -> bool:
    """A marker still being written (:func:`mark_live`), not a run's."""
    return path.name.startswith(".") and path.name.endswith(".part")


def _age_s(path: Path) -> float:
    """Seconds since ``path`` was written (0: it is gone)."""
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


def prune_stale_markers() -> int:
    """Delete markers whose owner process is gone; returns how many."""
    folder = fleet_home() / "live"
    if not folder.is_dir():
        return 0
    stale = [
        p
        for p in folder.iterdir()
        if (_partial(p) and _age_s(p) > 60) or (not _partial(p) and not pid_alive(_read_pid(p)))
    ]
    for path in stale:
        path.unlink(missing_ok=True)
    return len(stale)


def _node_label(node: str) -> dict[str, str]:
    return {NODE_LABEL: node} if node else {}


def box_labels(spec: SandboxSpec, run: str, member: str, node: str = "") -> dict[str, str]:
    return {
        **spec.labels,
        "fleet.run": run,
        "fleet.member": member,
        "fleet.kind": spec.kind,
        "fleet.created": f"{time.time():.3f}",
        "fleet.ttl": f"{spec.ttl_s:g}",
        "fleet.keep": "1" if spec.keep else "0",
        **_node_label(node),
    }


def proxy_labels(run: str, node: str = "") -> dict[str, str]:
    return {
        "fleet.run": run,
        "fleet.created": f"{time.time():.3f}",
        "fleet.ttl": "86400",
        "fleet.keep": "0",
        **_node_label(node),
    }


def network_labels(run: str, node: str = "") -> dict[str, str]:
    return {
        "fleet.run": run,
        "fleet.kind": "network",
        "fleet.created": f"{time.time():.3f}",
        **_node_label(node),
    }


def _selector(run: str | None, node: str | None = None) -> dict[str, list[str]]:
    """A label filter: Fleet's objects, of one run, of one node."""
    labels = [f"{LABEL}={run}" if run else LABEL]
    if node:
        labels.append(f"{NODE_LABEL}={node}")
    return {"label": labels}


def _info(c: dict) -> BoxInfo:
    labels = c.get("Labels") or {}
    return BoxInfo(
        id=c["Id"][:12],
        name=(c.get("Names") or ["?"])[0].lstrip("/"),
        kind=labels.get("fleet.kind", "?"),
        run=labels.get(LABEL, "?"),
        member=labels.get("fleet.member", "?"),
        status=c.get("State") or c.get("Status", "?"),
        created=float(labels.get("fleet.created") or c.get("Created") or 0),
        ttl_s=float(labels.get("fleet.ttl") or 3600),
        keep=labels.get("fleet.keep") == "1",
        node=labels.get(NODE_LABEL, ""),
    )


@on_engine
def list_boxes(
    client: docker.DockerClient, run: str | None = None, node: str | None = None
) -> list[BoxInfo]:
    """Fleet's containers (boxes and proxies), oldest first; of one run, of one node."""
    found = client.api.containers(all=True, filters=_selector(run, node))
    return sorted((_info(c) for c in found), key=lambda b: b.created)


def _remove(client: docker.DockerClient, ident: str) -> bool:
    return remove_box(client, ident)


def _networks(
    client: docker.DockerClient, run: str | None = None, node: str | None = None
) -> list[dict]:
    return client.api.networks(filters=_selector(run, node))


def _remove_network(client: docker.DockerClient, net: dict) -> bool:
    try:
        client.api.remove_network(net["Id"])
        return True
    except docker.errors.NotFound:
        return False
    except docker.errors.APIError:
        return False  # still has endpoints: a later gc removes it


@on_engine
def remove_run(client: docker.DockerClient, run: str, node: str | None = None) -> int:
    """Remove every box of ``run`` (kept ones too), then its networks; returns box count.
    With ``node``, only what that cluster node made (nodes may share an engine)."""
    count = 0
    for c in _containers(client, run, node):
        is_box = (c.get("Labels") or {}).get("fleet.kind") != "proxy"
        if _remove(client, c["Id"]) and is_box:
            count += 1
    for net in _networks(client, run, node):
        _remove_network(client, net)
    return count


def _containers(client: docker.DockerClient, run: str, node: str | None = None) -> list[dict]:
    return client.api.containers(all=True, filters=_selector(run, node))


def doomed(
    boxes: list[BoxInfo],
    live: set[str],
    now: float,
    everything: bool,
    *,
    include_live: bool = False,
) -> list[BoxInfo]:
    """Which boxes gc removes (pure, so the rule is testable on its own).

    ``everything`` also takes kept boxes whose TTL has not passed, but a live run's
    boxes go only when their TTL has passed or ``include_live`` is given: on a shared
    engine another process may be using them right now.
    """
    out = []
    for box in boxes:
        expired = now > box.created + box.ttl_s
        is_live = box.owner in live
        over = not is_live and not box.keep
        if expired or over or (everything and (include_live or not is_live)):
            out.append(box)
    return out


@dataclass
class Collected:
    """What one gc removed (or, for a dry run, would remove)."""

    boxes: list[BoxInfo] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)
    """Names of the run networks left without a live run and without containers."""
    orphans: int = 0
    """gVisor processes ended that no container stood behind (:func:`gvisor.end_orphans`)."""
    listed: list[BoxInfo] = field(default_factory=list)
    """Every box the engine had when gc looked."""
    live: set[str] = field(default_factory=set)
    """The owners judged live, read after that look."""


Liveness = Callable[[list[BoxInfo]], set[str]]
"""Which owners live, asked with the boxes gc has just listed (:func:`collect`)."""


@on_engine
def collect(
    client: docker.DockerClient,
    live: Liveness,
    *,
    now: float,
    everything: bool = False,
    include_live: bool = False,
    dry_run: bool = False,
) -> Collected:
    """Remove what :func:`doomed` picks, then networks left without a live run or boxes;
    a dry run removes nothing and says which networks would go with those boxes.

    Which runs live is asked (``live``) only after the engine's boxes and networks are
    listed. A run marks itself live before it makes its network or any box
    (:meth:`~sandbox.docker.backend.DockerBackend.create`), so whatever the listings hold
    of a live run is judged live. Asked first, the answer missed a run that started
    while gc worked - on a shared engine, or beside a test suite, it does - and gc
    removed that run's box as it started, and its network under it."""
    boxes = list_boxes(client)
    networks = _networks(client)
    owners = live(boxes)
    victims = doomed(boxes, owners, now, everything, include_live=include_live)
    out = Collected(boxes=victims, listed=boxes, live=owners)
    going = {b.id for b in victims}
    for box in victims if not dry_run else []:
        _remove(client, box.id)
    for net in networks:
        labels = net.get("Labels") or {}
        run, node = labels.get(LABEL, ""), labels.get(NODE_LABEL, "")
        # A live run's network may be empty for a moment, between its creation and
        # its first box: removing it then would fail that run's create.
        if not include_live and owner_key(run, node) in owners:
            continue
        left = [
            c for c in _containers(client, run, node or None) if not dry_run or c["Id"] not in going
        ]
        if left:
            continue
        if dry_run or _remove_network(client, net):
            out.networks.append(str(net.get("Name") or net["Id"][:12]))
    if not dry_run:
        prune_stale_markers()
        out.orphans = gvisor.end_orphans(client)
    return out


@on_engine
def remove_boxes(client: docker.DockerClient, boxes: list[BoxInfo]) -> Collected:
    """Remove these boxes (a kept one, say) and, for each run left with no box but its
    egress proxy, that proxy and the run's networks: one box's leftovers, no one else's."""
    out = Collected()
    for box in boxes:
        if _remove(client, box.id):
            out.boxes.append(box)
    for run, node in sorted({(b.run, b.node) for b in boxes}):
        rest = _containers(client, run, node or None)
        if any((c.get("Labels") or {}).get("fleet.kind") != "proxy" for c in rest):
            continue
        for c in rest:
            _remove(client, c["Id"])
        for net in _networks(client, run, node or None):
            if _remove_network(client, net):
                out.networks.append(str(net.get("Name") or net["Id"][:12]))
    return out


def gc(client: docker.DockerClient, live: Liveness, *, now: float) -> list[BoxInfo]:
    """:func:`collect` for the backend: the boxes removed."""
    return collect(client, live, now=now).boxes

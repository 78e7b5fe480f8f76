"""Fleet's Docker hosts as the nodes of a Ray cluster: finding them and reaching each.

A Docker host joins with ``ray start --address HEAD:PORT --resources
'{"fleet_slots": N}'``: the custom resource ``fleet_slots`` says it is a Fleet node
and how many members it runs at once. This module connects to such a cluster, lists
its Fleet nodes and runs a function on each (``fleet sandbox gc --cluster``; the
coordinator's preflight and resume). The coordinator's placement of members is in
``coordinator/nodes/cluster.py``. Importing this module imports Ray (the ``cluster``
extra), so nothing imports it unless a cluster is named.

Ray runs code for anyone who reaches its port, so :func:`connect` first asks the
cluster from a process without the token (:mod:`sandbox.cluster.auth`) and refuses one
that lets such a process in - or that it cannot tell about - unless the caller passes
``insecure`` (``--insecure-cluster-without-auth``). With token authentication on
(``RAY_AUTH_MODE=token``), this process needs the token too (``RAY_AUTH_TOKEN``,
``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import ray
import ray.exceptions
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..base import BoxInfo
from ..errors import SandboxUnavailable
from .auth import Probe, own_token_refused, probe, refusal, warning

if TYPE_CHECKING:
    from ..docker.reaper import Collected

SLOTS = "fleet_slots"
"""The custom resource a node offers Fleet: how many members it runs at once."""
CALL_S = 120.0
"""How long a function run on every node may take."""

T = TypeVar("T")


class ClusterUnavailable(SandboxUnavailable):
    """The cluster cannot serve: unreachable, no node with ``fleet_slots``, nodes not
    set up, or open to anyone who reaches it. The message names what to do."""


def node_name(info: dict[str, Any]) -> str:
    """A node's name in labels, journals and tables: its address and a short id."""
    return f"{info['NodeManagerAddress']}-{info['NodeID'][:6]}"


def connect(address: str, *, insecure: bool = False, probed: Probe | None = None) -> None:
    """Connect this process to the cluster at ``address`` (once), after making sure it
    refuses a process without its token (``probed``: already asked); ``insecure``: also
    to a cluster that does not, or that cannot be told about (a warning on stderr says
    so)."""
    if ray.is_initialized():
        return
    found = probed or probe(address)
    refused = refusal(address, found, insecure=insecure)
    if refused is not None:
        raise ClusterUnavailable(refused)
    mine = own_token_refused(address, found)
    if mine is not None:
        raise ClusterUnavailable(_token_refused(address, mine))
    warned = warning(address, found)
    if warned is not None:
        print(f"fleet: {warned}", file=sys.stderr, flush=True)
    sigterm = signal.getsignal(signal.SIGTERM)
    breakpoints = os.environ.get("PYTHONBREAKPOINT")
    try:
        ray.init(
            address=address,
            namespace="fleet",
            log_to_driver=False,
            logging_level=logging.ERROR,
        )
    except ray.exceptions.AuthenticationError as exc:
        raise ClusterUnavailable(_token_refused(address, str(exc).splitlines()[0][:200])) from None
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterUnavailable(
            f"cannot connect to the Ray cluster at {address}: {str(exc).splitlines()[0]}. "
            "Start its head with 'ray start --head' and each Docker host with "
            f"'ray start --address HEAD:PORT --resources '{{\"{SLOTS}\": 16}}''; with "
            "token authentication on, this process needs the cluster's token "
            "(RAY_AUTH_TOKEN or ~/.ray/auth_token)"
        ) from None
    finally:
        # ray.init makes SIGTERM end the process by sys.exit, for good, and points
        # breakpoint() - this process's and every child's - at Ray's debugger. The
        # process is its caller's: its handlers and environment are put back (a run that
        # handles signals watches SIGTERM itself; Fleet's drivers take no worker logs).
        if sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, sigterm)
        if breakpoints is None:
            os.environ.pop("PYTHONBREAKPOINT", None)
        else:
            os.environ["PYTHONBREAKPOINT"] = breakpoints


def _token_refused(address: str, why: str) -> str:
    return (
        f"the Ray cluster at {address} refused this process: its token is missing or not "
        f"the cluster's ({why}); give it the cluster's token (RAY_AUTH_TOKEN, "
        "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)"
    )


def fleet_nodes(address: str) -> list[dict[str, Any]]:
    """The cluster's live nodes that offer ``fleet_slots``, most slots first."""
    connect(address)
    found = [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get(SLOTS, 0) >= 1]
    if not found:
        raise ClusterUnavailable(
            f"no node of the Ray cluster at {address} offers {SLOTS}; on each Docker host "
            f"run 'fleet setup', then 'ray start --address {address} --resources "
            f"'{{\"{SLOTS}\": 16}}''"
        )
    return sorted(found, key=lambda n: -n["Resources"][SLOTS])


def pinned(info: dict[str, Any]) -> NodeAffinitySchedulingStrategy:
    """Schedule on exactly this node (never elsewhere: a box is where its node is)."""
    return NodeAffinitySchedulingStrategy(info["NodeID"], soft=False)


def on_each_node(
    address: str, fn: Callable[..., T], *args: Any, only: set[str] | None = None
) -> list[tuple[str, T | NodeUnreachable]]:
    """Run ``fn(*args)`` once on every Fleet node; (node name, result) per node, or
    :class:`NodeUnreachable` for a node that did not answer within :data:`CALL_S`. A
    node that just left the cluster is still listed as alive for a while; Ray's
    scheduler already knows better, and such a node is left out. Ray's retries are off."""
    nodes = [n for n in fleet_nodes(address) if only is None or node_name(n) in only]
    task = ray.remote(num_cpus=0, max_retries=0)(fn)
    refs = [task.options(scheduling_strategy=pinned(n)).remote(*args) for n in nodes]
    ray.wait(refs, num_returns=len(refs), timeout=CALL_S)
    out: list[tuple[str, T | NodeUnreachable]] = []
    for info, ref in zip(nodes, refs, strict=True):
        try:
            out.append((node_name(info), ray.get(ref, timeout=0)))
        except ray.exceptions.TaskUnschedulableError:
            continue  # the node left the cluster after it was listed (Ray says so late)
        except (ray.exceptions.RayError, TimeoutError) as exc:
            ray.cancel(ref, force=True)
            out.append((node_name(info), NodeUnreachable(_first_line(exc))))
    if not out:
        raise ClusterUnavailable(f"every Fleet node of the Ray cluster at {address} left it")
    return out


def on_each_engine(
    address: str, fn: Callable[..., T], *args: Any
) -> list[tuple[str, T | NodeUnreachable]]:
    """:func:`on_each_node`, but once per Docker engine: nodes that share one (the
    engine's ID says so) run ``fn`` on one of them only - two gcs on one engine at once
    race each other's removals, and each leaves the run network the other still empties."""
    found = on_each_node(address, engine_id)
    first: dict[str, str] = {}
    for name, engine in found:
        if isinstance(engine, str):
            first.setdefault(engine, name)
    chosen = set(first.values())
    unreachable: list[tuple[str, T | NodeUnreachable]] = [
        (n, e) for n, e in found if isinstance(e, NodeUnreachable)
    ]
    if not chosen:
        return unreachable
    return unreachable + on_each_node(address, fn, *args, only=chosen)


def engine_id() -> str:
    """This node's Docker engine's ID (run on a node)."""
    from ..docker.engine import connect

    client = connect()
    try:
        return str(client.info()["ID"])
    finally:
        client.close()


def actor_name(run: str, node: str) -> str:
    """The Ray actor that serves ``run`` on ``node`` goes by this name (namespace
    ``fleet``) while it lives: the one sign of life of that node's boxes for the run
    that every host reaches, whatever disk it has."""
    return f"fleet-node:{run}@{node}"


def live_owners(boxes: list[BoxInfo]) -> set[str]:
    """Owners (``run@node``) of these cluster boxes whose node's actor for the run is
    alive (run inside the cluster). A box of a node this cluster never had (another
    cluster's, on a shared engine) counts as live: it is not this cluster's to judge."""
    known = {node_name(n): bool(n.get("Alive")) for n in ray.nodes()}
    live = set()
    for owner, run, node in {(b.owner, b.run, b.node) for b in boxes if b.node}:
        if node not in known or (known[node] and _actor_alive(actor_name(run, node))):
            live.add(owner)
    return live


def _actor_alive(name: str) -> bool:
    try:
        ray.get_actor(name, namespace="fleet")
    except ValueError:  # no such actor: it died (or never was), its name is free
        return False
    return True


def remove_dead() -> int:
    """Remove this engine's cluster boxes, and their networks, whose actor is dead
    (:func:`live_owners`); returns how many boxes. Boxes of runs on one machine (no
    node label) are left to that machine's gc. Each node's actor runs it as it starts:
    a node that died leaves its boxes behind, and nothing else would ever look."""
    from ..docker import reaper
    from ..docker.engine import connect

    client = connect()
    try:
        boxes = [b for b in reaper.list_boxes(client) if b.node]
        live = live_owners(boxes)
        dead = sorted({(b.run, b.node) for b in boxes if b.owner not in live})
        return sum(reaper.remove_run(client, run, node) for run, node in dead)
    finally:
        client.close()


def gc_node(everything: bool, include_live: bool, dry_run: bool) -> Collected:
    """``fleet sandbox gc`` on this node's engine: this host's rule for boxes of runs on
    one machine (live markers), Ray's for the cluster's (their node's actor lives)."""
    from ..docker import reaper
    from ..docker.engine import connect

    client = connect()
    try:
        removed = reaper.collect(
            client,
            lambda boxes: reaper.live_runs() | live_owners(boxes),
            now=time.time(),
            everything=everything,
            include_live=include_live,
            dry_run=dry_run,
        )
    finally:
        client.close()
    return removed


class NodeUnreachable(Exception):
    """A node did not answer a call (it died, or is leaving the cluster)."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"

"""What a cluster's nodes are asked outside a run's actor: whether they can run it
(:func:`check_node`, before the run starts) and removing a dead run's boxes
(:func:`reap_node`, before a resume).

Each runs as a plain Ray task on every node (:func:`sandbox.cluster.nodes.on_each_node`), in
a worker process that imports this module by name. So it imports only what these two
need - the Docker client and the image references - and none of what runs a member
(the agent loop, the model client, the harnesses): that import is several seconds of
CPU per node and per command, paid again by the run's node actors, which do need it.
"""

from __future__ import annotations

import anyio

from sandbox.docker import firewall
from sandbox.errors import SandboxUnavailable

MISSING = " is missing"
"""How :func:`check_node` ends what it says of a missing image of Fleet's."""


def check_node(images: list[str], own: dict[str, str], firewall_needed: bool) -> list[str]:
    """What keeps this node from running the run's boxes, in words (empty: nothing):
    Fleet's ``images`` missing, members' ``own`` images (reference -> the job field
    naming it) not on its engine, the host firewall rules absent.

    Blocking; run as a task on the node before the run starts."""
    from sandbox.docker.engine import connect
    from sandbox.images.catalog import current_refs, image_exists

    problems: list[str] = []
    try:
        client = connect()
    except SandboxUnavailable as exc:
        return [str(exc)]
    try:
        refs = current_refs(images)
        problems += [
            f"image {refs[n]}{MISSING}" for n in images if not image_exists(client, refs[n])
        ]
        problems += [
            f"image {ref!r} ({where}) is not on its engine (Fleet never pulls)"
            for ref, where in own.items()
            if not image_exists(client, ref)
        ]
    finally:
        client.close()
    if firewall_needed:
        try:
            firewall.ensure_host_rules()
        except SandboxUnavailable as exc:
            problems.append(str(exc))
    return problems


def reap_node(run_id: str) -> int:
    """Remove every box of ``run_id`` on this node's engine, whichever node made it."""
    from sandbox.registry import get_backend

    return anyio.run(get_backend().remove_run, run_id)

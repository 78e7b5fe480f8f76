"""A Ray cluster on this machine for the cluster tests: head + 2 Fleet nodes.

The nodes are processes of ``ray.cluster_utils.Cluster`` that share this machine's
Docker engine (which is why Fleet's node-side names and labels are per node). Token
authentication is on, as the README asks of a real cluster: ``RAY_AUTH_MODE=token``
with a fresh ``RAY_AUTH_TOKEN`` in the environment of every process of the cluster
and of every Fleet process a test starts (they inherit it). Everything listens on
127.0.0.1 (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, set by ``conftest.py`` before Ray
is imported, makes Ray use the loopback address), so no test traffic leaves the
machine.

Only the processes this helper started are stopped (``Cluster.shutdown``); ``ray
stop`` would end every Ray process of the machine, other people's included.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

ENV = {
    "RAY_AUTH_MODE": "token",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    # A removed node is declared dead after 3 failed health checks a second apart
    # instead of Ray's 5 at 3 s: what the tests check is Fleet's side of a lost node
    # (its members retried, gc on the nodes left), not how long Ray takes to see it.
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "2000",
    "RAY_health_check_failure_threshold": "3",
}
SLOTS = 4
LOOPBACK = "127.0.0.1"


def ship_by_value(module: Any) -> None:
    """Let a test module's helpers (harnesses, node setups) travel to the nodes: the
    nodes cannot import test modules by name."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(module)


class RayCluster:
    """A running cluster: its address, and nodes to add or remove."""

    def __init__(self, cluster: Any, address: str) -> None:
        self.cluster = cluster
        self.address = address
        self.nodes: list[Any] = []

    def add_node(self, slots: int = SLOTS) -> Any:
        node = self.cluster.add_node(
            num_cpus=1, resources={"fleet_slots": slots}, node_ip_address=LOOPBACK
        )
        self.nodes.append(node)
        return node

    def remove_node(self, node: Any) -> None:
        self.cluster.remove_node(node, allow_graceful=False)
        self.nodes.remove(node)

    @staticmethod
    def name(node: Any) -> str:
        """The node's name as Fleet records it (``coordinator.cluster.node_name``)."""
        return f"{node.node_ip_address}-{node.node_id[:6]}"


@contextmanager
def ray_cluster(nodes: int = 2) -> Iterator[RayCluster]:
    """Head (no slots) + ``nodes`` Fleet nodes, token authentication on."""
    from ray._private.authentication_test_utils import reset_auth_token_state
    from ray.cluster_utils import Cluster

    saved = {k: os.environ.get(k) for k in (*ENV, "RAY_AUTH_TOKEN")}
    os.environ.update(ENV)
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(16)
    reset_auth_token_state()  # Ray read its auth settings when it was imported
    cluster = Cluster(initialize_head=False)
    try:
        cluster.add_node(num_cpus=0, include_dashboard=False, node_ip_address=LOOPBACK)
        handle = RayCluster(cluster, cluster.address)
        for _ in range(nodes):
            handle.add_node()
        yield handle
    finally:
        import ray

        ray.shutdown()
        cluster.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        reset_auth_token_state()

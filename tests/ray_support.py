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

:func:`ray_head` starts a one-node cluster the way the README's recipe does - ``ray
start --head --block`` bound to 127.0.0.1, with a temp dir of its own - with token
authentication on or off (the only way to test that Fleet refuses an open cluster),
and stops it the recipe's way: by ending that one process, which ends its node.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from process_support import popen

if TYPE_CHECKING:
    from node_engine import NodeEngine

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
    # Ray lowers its workers' priority (nice 15). On a dedicated node nothing competes;
    # here the suite's other worker does, and the node actors - which run the members -
    # starved behind it made the Ray tests the suite's longest stretch.
    "RAY_worker_niceness": "0",
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

    def __init__(
        self, cluster: Any, address: str, env: dict[str, str], engine: NodeEngine | None = None
    ) -> None:
        self.cluster = cluster
        self.address = address
        self.env = env
        """What a process of the cluster, or a client of it, has in its environment
        (``RAY_AUTH_TOKEN`` among it): set while the cluster's own processes start, and
        by whoever uses the cluster (``conftest.py``'s ``ray_cluster``, per test)."""
        self.engine = engine
        """The Docker engine of its Fleet nodes (None: this machine's own)."""
        self.nodes: list[Any] = []
        self._added = 0
        self._client: Any = None

    def add_node(self, slots: int = SLOTS, env: dict[str, str] | None = None) -> Any:
        """A Fleet node on the cluster's node engine, with a home and temp directory of
        its own; ``env``: more of its environment (its processes inherit the lot)."""
        self._added += 1
        extra = self.engine.node_env(self._added) if self.engine is not None else {}
        with environment(self.env | extra | (env or {})), handlers_kept():
            node = self.cluster.add_node(
                num_cpus=1, resources={"fleet_slots": slots}, node_ip_address=LOOPBACK
            )
        node.fleet_env = extra | (env or {})
        self.nodes.append(node)
        return node

    def engine_client(self) -> Any:
        """A client of the nodes' Docker engine (made once)."""
        if self._client is None:
            import docker

            engine = self.engine
            self._client = (
                docker.DockerClient(base_url=engine.host) if engine else docker.from_env()
            )
        return self._client

    def remove_node(self, node: Any) -> None:
        self.cluster.remove_node(node, allow_graceful=False)
        self.nodes.remove(node)

    @staticmethod
    def name(node: Any) -> str:
        """The node's name as Fleet records it (``coordinator.nodes.cluster.node_name``)."""
        return f"{node.node_ip_address}-{node.node_id[:6]}"


@contextmanager
def handlers_kept() -> Iterator[None]:
    """This process's SIGINT and SIGTERM handlers as they were after the block: a node
    started in this process (``Cluster.add_node``) makes SIGTERM end the process, for
    good, after ending Ray's processes; the tests' worker keeps its own handlers."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            if handler is not None:
                signal.signal(s, handler)


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """This process's environment with ``values`` set (a Ray node started meanwhile
    keeps them: its processes inherit them), restored after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def ray_cluster(nodes: int = 2, engine: NodeEngine | None = None) -> Iterator[RayCluster]:
    """Head (no slots) + ``nodes`` Fleet nodes on ``engine`` (default: this machine's),
    token authentication on. This process's environment is left as it was: the
    cluster's (:attr:`RayCluster.env`) is set only while Ray starts or stops its
    processes; a caller that uses the cluster sets it for as long as it does."""
    from ray._private.authentication_test_utils import reset_auth_token_state
    from ray.cluster_utils import Cluster

    env = ENV | {"RAY_AUTH_TOKEN": secrets.token_hex(16)}
    with environment(env):
        reset_auth_token_state()  # Ray read its auth settings when it was imported
        cluster = Cluster(initialize_head=False)
    try:
        with environment(env), handlers_kept():
            # No log monitor: it globs the session's log directory ten times a second
            # to forward workers' output to drivers, and Fleet's drivers take none
            # (``log_to_driver=False``); on this machine it was 40 s of the suite's CPU.
            cluster.add_node(
                num_cpus=0,
                include_dashboard=False,
                include_log_monitor=False,
                node_ip_address=LOOPBACK,
            )
        handle = RayCluster(cluster, cluster.address, env, engine)
        for _ in range(nodes):
            handle.add_node()
        yield handle
    finally:
        import ray

        with environment(env):
            ray.shutdown()
            cluster.shutdown()
        reset_auth_token_state()


AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
RAY = str(Path(sys.executable).with_name("ray"))


def without_token(env: dict[str, str] | None = None) -> dict[str, str]:
    """An environment (this process's by default) with no Ray token or auth mode in it."""
    return {k: v for k, v in (env or os.environ).items() if k not in AUTH_VARS}


@dataclass
class RayHead:
    address: str
    token: str
    """The token its processes require ("" when authentication is off)."""
    temp_dir: Path
    pid: int
    """The ``ray start --block`` process: ending it ends the node."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def end(proc: subprocess.Popen[bytes]) -> None:
    """Ask a process this helper started to end (SIGTERM), kill it after a minute."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def own_processes(temp_dir: Path) -> list[int]:
    """The pids whose command line names ``temp_dir`` (a head's GCS, raylet, monitors)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(temp_dir) in (proc / "cmdline").read_text():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


@contextmanager
def ray_head(*, auth: bool, slots: int = 2) -> Iterator[RayHead]:
    """A one-node Fleet cluster on 127.0.0.1 (``fleet_slots``), token authentication
    ``auth``; stopped by ending its ``ray start --block`` process, nothing else."""
    temp_dir = Path(tempfile.mkdtemp(prefix="fray-"))  # short: Ray's socket paths
    token = secrets.token_hex(32) if auth else ""
    # An explicit mode: "disabled" wins over a ~/.ray/auth_token, RAY_AUTH_TOKEN over it.
    env = without_token() | ENV
    env |= (
        {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
        if auth
        else {"RAY_AUTH_MODE": "disabled"}
    )
    address = f"{LOOPBACK}:{_free_port()}"
    log = temp_dir / "start.log"
    args = [RAY, "start", "--head", "--block", "--node-ip-address", LOOPBACK]
    args += ["--port", address.rpartition(":")[2], "--temp-dir", str(temp_dir / "ray")]
    args += ["--num-cpus", "1", "--resources", f'{{"fleet_slots": {slots}}}']
    args += ["--include-dashboard=false", "--disable-usage-stats"]
    with open(log, "wb") as out:
        proc = popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while b"will now block" not in log.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start failed: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield RayHead(address, token, temp_dir, proc.pid)
    finally:
        end(proc)
        for pid in own_processes(temp_dir):  # whatever outlived it, still only its own
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)

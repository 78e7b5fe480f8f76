"""A second Docker engine on this machine, for the test cluster's nodes.

A real cluster's nodes each have their own engine and disk; the test cluster's nodes
run on this machine, and would otherwise share the coordinator's engine, which hides
every bug of the kind "removed through the wrong engine" or "a path only the
coordinator has". :func:`node_engine` starts one more ``dockerd`` - its own socket,
data root, exec root, pid file and containerd - that the test cluster's Fleet nodes
use (``DOCKER_HOST``), and stops it and removes its data root at the end. Only the
processes it started are stopped; the machine's engine is never touched except to
read the images it copies.

Its networks. Its default bridge is an interface of its own, ``fleet-nbX``, made by
the fixture before the engine starts (``docker0`` is the main engine's interface, and
two engines must not share a bridge device; and ``--bridge=none`` is no way out: an
engine started so deletes ``docker0`` from the host, taking the main engine's default
network with it, so the fixture checks that ``docker0`` outlives the start). Its
address pool (a ``10.X.0.0/16`` in /24s that no route of the machine uses yet, chosen
under a lock file: other sessions may run node engines too) is one the main engine
never hands out, so no two engines' networks overlap. Run networks' bridges are named from the network's name,
which holds the node's name, so they do not clash with the main engine's either. The
egress network is the exception: its bridge has one fixed name (``flt-egress``) per
engine, and a second engine creating it on this machine would take over the main
engine's interface. So the fixture creates the node engine's ``fleet-egress`` network
itself, on a bridge named ``fleet-neX`` (X of its pool): under the host rules of
:mod:`sandbox.docker.firewall` (a ``fleet*`` bridge) nothing leaves it, which the tests never
need (their models are offline, their pages are served inside the run network).
``--iptables=false``: the main engine owns this machine's Docker chains (two engines
rewriting the same chains would break each other), and with them the ``FORWARD``
policy ``DROP``, which would drop the frames between two boxes of one node network (a
browser box and its run's proxy) that the engine no longer accepts itself. The fixture
adds the one rule the node engine would have: frames bridged within one of its
networks (:func:`_same_bridge`; its address pool, ``physdev --physdev-is-bridged``, so
traffic routed between two of its networks is still dropped), and removes it at the
end. The host rules of :mod:`sandbox.docker.firewall` apply as on any engine.

Fleet's images are copied from the main engine (``docker save | docker load``, only
the current ones, once per session): the nodes then hold the same references the
coordinator's checks expect. The copy runs in a thread of its own while the caller
starts the cluster on the engine (:meth:`NodeEngine.loaded` waits for it), and an
image only some tests need (the browser and corpus images: 0.85 GB of the 1.3) is copied
when the first of them asks (:meth:`NodeEngine.ensure`): two session clusters each
copying every image at the suite's start held both workers for 40-75 s.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray_support import end

POOLS = range(200, 255)
"""Second octets of the ``10.X.0.0/16`` address pools a node engine may take."""
LOCK = Path("/run/fleet-test-node-engine.lock")
START_S = 60.0
_started = itertools.count(1)


def _same_bridge(pool: str) -> list[str]:
    """The ``FORWARD`` rule that lets frames through within one of the engine's networks."""
    bridged = ["-m", "physdev", "--physdev-is-bridged", "-j", "ACCEPT"]
    return ["FORWARD", "-s", pool, "-d", pool, *bridged]


def _owner(octet: int) -> Path:
    """Where the pid of the node engine holding ``10.octet.0.0/16`` is written."""
    return Path(f"/run/fleet-test-node-engine-{octet}.pid")


def _alive_engine(octet: int) -> bool:
    try:
        pid = int(_owner(octet).read_text().strip())
        return Path(f"/proc/{pid}/comm").read_text().strip() == "dockerd"
    except (OSError, ValueError):
        return False


def _free_pool() -> int:
    """A ``10.X.0.0/16`` for a node engine, under :data:`LOCK`: not routed by anything
    else on this machine, and not held by a node engine that still runs (its pid in
    :func:`_owner`). The bridges of a node engine that is gone (a killed session's)
    still hold their routes: they are removed and their pool taken again."""
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    used: set[int] = set()
    for line in routes.splitlines():
        words = line.split()
        dev = words[words.index("dev") + 1] if "dev" in words else ""
        if words and words[0].startswith("10.") and not dev.startswith(("fleet-ne", "fleet-nb")):
            octet = words[0].split(".")[1]
            used |= {int(octet)} if octet.isdigit() else set()
    for octet in POOLS:
        if octet in used or _alive_engine(octet):
            continue
        _drop_link(f"fleet-ne{octet}")
        _drop_link(f"fleet-nb{octet}")
        rule = _same_bridge(f"10.{octet}.0.0/16")  # a killed session's, as often as it is there
        while subprocess.run(["iptables", "-D", *rule], capture_output=True).returncode == 0:
            pass
        return octet
    raise RuntimeError("no free 10.X.0.0/16 for a node engine (ip -4 route)")


@dataclass
class NodeEngine:
    """A running node engine: where it answers and what it holds."""

    host: str
    """``DOCKER_HOST`` for it (``unix:///run/fleet-test-dockerN.sock``)."""
    root: Path
    """Its data root, exec root and the nodes' own directories live under here."""
    pid: int
    images: list[str] = field(default_factory=list)
    """What has been copied in (or is being copied by the first copy)."""
    _first: threading.Thread | None = None
    _error: BaseException | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def copy_in_background(self, refs: list[str]) -> None:
        """Start copying ``refs`` in; :meth:`loaded` waits for it."""

        def copy() -> None:
            try:
                copy_images(self.host, refs)
            except BaseException as exc:
                self._error = exc

        self.images = list(refs)
        self._first = threading.Thread(target=copy, name="node-engine-copy", daemon=True)
        self._first.start()

    def loaded(self) -> None:
        """Wait for the first copy; raises what stopped it."""
        if self._first is not None:
            self._first.join()
        if self._error is not None:
            raise RuntimeError(f"copying images into the node engine failed: {self._error}")

    def ensure(self, refs: list[str]) -> None:
        """Copy in those of ``refs`` not copied yet (after the first copy)."""
        self.loaded()
        with self._lock:
            missing = [r for r in refs if r not in self.images]
            copy_images(self.host, missing)
            self.images += missing

    def client(self) -> Any:
        import docker

        return docker.DockerClient(base_url=self.host, timeout=120)

    def node_env(self, index: int) -> dict[str, str]:
        """A node's environment: this engine, and a home and temp dir of its own (the
        node never sees the coordinator's ``~/.fleet`` or scratch files)."""
        home = self.root / "nodes" / str(index)
        (home / "tmp").mkdir(parents=True, exist_ok=True)
        return {
            "DOCKER_HOST": self.host,
            "FLEET_HOME": str(home / "fleet"),
            "TMPDIR": str(home / "tmp"),
        }


def _wait_up(host: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    import docker

    deadline = time.monotonic() + START_S
    while True:
        try:
            docker.DockerClient(base_url=host, timeout=5).ping()
            return
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                why = log.read_text()[-2000:]
                raise RuntimeError(f"the node engine did not start: {why}") from None
            time.sleep(0.2)


def copy_images(host: str, refs: list[str]) -> None:
    """``docker save REFS | DOCKER_HOST=host docker load`` (layers shared once)."""
    if not refs:
        return
    save = subprocess.Popen(["docker", "save", *refs], stdout=subprocess.PIPE)
    env = dict(os.environ, DOCKER_HOST=host)
    load = subprocess.run(
        ["docker", "load", "-q"], stdin=save.stdout, env=env, capture_output=True, check=False
    )
    assert save.stdout is not None
    save.stdout.close()
    if save.wait() != 0 or load.returncode != 0:
        raise RuntimeError(f"copying images failed: {load.stderr.decode()[-2000:]}")


def _egress_network(host: str, bridge: str) -> None:
    import docker

    client = docker.DockerClient(base_url=host, timeout=30)
    try:
        client.api.create_network(
            "fleet-egress",
            driver="bridge",
            labels={"fleet.kind": "egress"},
            options={
                "com.docker.network.bridge.name": bridge,
                "com.docker.network.bridge.enable_icc": "false",
            },
        )
    finally:
        client.close()


@contextmanager
def node_engine(images: list[str]) -> Iterator[NodeEngine]:
    """Start the node engine and begin copying ``images`` in (:meth:`NodeEngine.loaded`
    waits for them); stop it and remove its files at the end."""
    root = Path(tempfile.mkdtemp(prefix="fleet-node-engine-"))
    sock = Path(f"/run/fleet-test-docker{os.getpid()}-{next(_started)}.sock")
    host = f"unix://{sock}"
    log = root / "dockerd.log"
    exec_root = Path(tempfile.mkdtemp(prefix="fne-", dir="/run"))  # short: socket paths
    args = ["dockerd", "--host", host, "--data-root", str(root / "data")]
    args += ["--exec-root", str(exec_root), "--pidfile", str(root / "dockerd.pid")]
    args += ["--iptables=false", "--ip6tables=false"]
    forward: list[str] = []
    had_docker0 = _has_link("docker0")
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        octet = _free_pool()
        pool = f"10.{octet}.0.0/16"
        bridge = f"fleet-nb{octet}"
        _make_bridge(bridge, f"10.{octet}.255.1/24")
        args += ["--bridge", bridge, "--default-address-pool", f"base={pool},size=24"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        _owner(octet).write_text(str(proc.pid))
        try:
            _wait_up(host, proc, log)
            if had_docker0 and not _has_link("docker0"):
                raise RuntimeError("starting the node engine removed the main engine's docker0")
            forward = _same_bridge(pool)
            subprocess.run(["iptables", "-I", *forward], check=True, capture_output=True)
            _egress_network(host, f"fleet-ne{octet}")
        except BaseException:
            _teardown(proc, host, forward, root, exec_root, sock)
            _release(octet)
            raise
    engine = NodeEngine(host, root, proc.pid)
    try:
        engine.copy_in_background(list(images))
        yield engine
    finally:
        with contextlib.suppress(Exception):  # a copy still running ends with its engine
            engine.loaded()
        _teardown(proc, host, forward, root, exec_root, sock)
        _release(octet)


def _release(octet: int) -> None:
    """The pool's bridges (the egress one too, if the engine left it) and its owner."""
    _drop_link(f"fleet-nb{octet}")
    _drop_link(f"fleet-ne{octet}")
    _owner(octet).unlink(missing_ok=True)


def _has_link(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


def _make_bridge(name: str, address: str) -> None:
    """A bridge interface for the engine's default network (left over from a killed
    session: made anew)."""
    _drop_link(name)
    for cmd in (
        ["ip", "link", "add", name, "type", "bridge"],
        ["ip", "addr", "add", address, "dev", name],
        ["ip", "link", "set", name, "up"],
    ):
        subprocess.run(cmd, check=True, capture_output=True)


def _drop_link(name: str) -> None:
    subprocess.run(["ip", "link", "del", name], check=False, capture_output=True)


def _teardown(
    proc: subprocess.Popen[bytes],
    host: str,
    forward: list[str],
    root: Path,
    exec_root: Path,
    sock: Path,
) -> None:
    """Stop the engine, take its rule out, remove its files."""
    _stop(proc, host)
    if forward:
        subprocess.run(["iptables", "-D", *forward], check=False, capture_output=True)
    _remove_tree(root / "data")
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(exec_root, ignore_errors=True)
    sock.unlink(missing_ok=True)


def _stop(proc: subprocess.Popen[bytes], host: str) -> None:
    """Remove what is left on the engine (its networks' bridges are host interfaces),
    then end the engine and wait for it."""
    import docker

    with contextlib.suppress(Exception):
        client = docker.DockerClient(base_url=host, timeout=30)
        for c in client.api.containers(all=True, quiet=True):
            client.api.remove_container(c["Id"], force=True, v=True)
        for net in client.api.networks():
            if net["Name"] not in ("none", "host"):
                client.api.remove_network(net["Id"])
        client.close()
    end(proc)


def _remove_tree(data: Path) -> None:
    """The data root, after unmounting whatever the engine left mounted under it."""
    mounts = [
        line.split()[1]
        for line in Path("/proc/self/mounts").read_text().splitlines()
        if line.split()[1].startswith(str(data))
    ]
    for point in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
    shutil.rmtree(data, ignore_errors=True)

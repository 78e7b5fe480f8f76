"""Per-run networks and egress proxies for boxes that may use the network.

Coding boxes get ``network_mode=none``: no interface but loopback. Browser and service
boxes sit on their run's own ``--internal`` bridge network, ``fleet-run-<run>``: the
host reaches them by IP (that is how CDP gets out), a box reaches the run's egress
proxy on its port and, through it, the run's service boxes (a service box answers
under its member name as a DNS alias, on :data:`~sandbox.docker.firewall.SERVICE_PORT`),
and nothing else - not a sibling member's box, not another port of a proxy or a
service box (the host rules of :mod:`sandbox.docker.firewall` drop that, by the MAC prefix
proxies and service boxes get and the port), and nothing off the bridge (an internal
network has no route off it).

The way out is the run's egress proxy (:mod:`sandbox.inbox.egress_proxy`): a small container
of the coding image on the internal network and on ``fleet-egress``, one per distinct
allowlist in a run (usually one per run). Boxes get its address in ``FLEET_PROXY``
(and the usual ``http_proxy`` variables); the browser image's start script hands it
to Chromium as ``--proxy-server``. The proxy refuses every address of the Docker host
it is told of (the gateways of the run network, of ``fleet-egress`` and of the
default bridge, read by :func:`sandbox.docker.host_addresses.bridge_gateways` even where the
engine's description omits them, and, with a local engine, every address of the
host's interfaces, IPv4 and IPv6), every address that is not globally routable
(loopback, private, link-local, carrier-grade NAT, multicast, ...) outside the run's
subnet, and every host not on the allowlist. Why a proxy for
egress: see the proxy's module docstring (filtering by name, per-run lifetime).

``fleet-egress`` is an ordinary (not internal) bridge that only proxies join, one per
engine, kept between runs like the host rules: its own bridge name
(``flt-egress``) is what lets the host firewall refuse the proxies any connection to
the host, whatever the address, which the engine's default bridge (shared with every
other container on the machine) could not be given. Containers on it cannot reach
each other (``enable_icc`` false).

The host. An ``--internal`` network still hands every box a default route via the
bridge's gateway address, which lives on the host, so a packet a box sends to any
host address is delivered to the host's own ``INPUT`` chain (Docker's isolation rules
only act on ``FORWARD``). Proxy settings bind only programs that honour them, so they
cannot be what keeps ``curl`` or a raw socket run by ``exec`` off the host. That is
the job of :mod:`sandbox.docker.firewall`: every run network's bridge is named
``fleet<hash>`` and one host rule set rejects any connection a ``fleet*`` bridge (or
``flt-egress``) opens to the host and forwards nothing off a ``fleet*`` bridge; the
host's own connections to boxes (CDP) and their replies still pass. The rules are installed before the
network is created; when they cannot be (no root), creating the network fails with
what to do, rather than quietly leaving the host open. Why not a design where a
browser box's only peer is the proxy (an "edge" network per box): the gateway
address is on every Docker bridge, edge or not, so the host stays reachable there
too and the same rule is needed anyway; it would add a network per box for nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import anyio
import docker
import docker.errors

from ..errors import SandboxUnavailable
from . import firewall, reaper
from .engine import engine_calls, engine_host, remove_box
from .host_addresses import bridge_gateways, engine_is_local, local_addresses

PROXY_PORT = firewall.PROXY_PORT
EGRESS_NETWORK = "fleet-egress"
"""The network every run's proxies leave by (one per engine, kept between runs)."""


def network_name(run: str, node: str = "") -> str:
    """A run's network on one engine; a cluster node's own (nodes may share an engine)."""
    return f"fleet-run-{run}" + (f"-{node}" if node else "")


def proxy_name(run: str, allow: Sequence[str], node: str = "") -> str:
    digest = hashlib.sha256(",".join(sorted(allow)).encode()).hexdigest()[:8]
    return f"fleet-proxy-{run}-{digest}" + (f"-{node}" if node else "")


class RunNetworks:
    """Creates a run's internal network and its egress proxies once, race-free in-process."""

    def __init__(self, client: docker.DockerClient, node: str = "") -> None:
        self._client = client
        self._node = node
        self._locks: dict[str, anyio.Lock] = {}
        self._guarded: set[str] = set()  # runs whose host rules this process has checked

    def _lock(self, key: str) -> anyio.Lock:
        return self._locks.setdefault(key, anyio.Lock())

    async def ensure_network(self, run: str) -> dict:
        """The run network's attributes (created when missing)."""
        async with self._lock(f"net:{run}"):
            if run not in self._guarded:
                # Before the network exists (or is reused): a bridge never lacks its rules.
                await anyio.to_thread.run_sync(firewall.ensure_host_rules)
                self._guarded.add(run)
            with engine_calls(self._client):
                return await anyio.to_thread.run_sync(self._ensure_network_sync, run)

    def _ensure_network_sync(self, run: str) -> dict:
        name = network_name(run, self._node)
        try:
            return self._client.api.inspect_network(name)
        except docker.errors.NotFound:
            pass
        labels = reaper.network_labels(run, self._node)
        try:
            self._client.api.create_network(
                name,
                driver="bridge",
                internal=True,
                labels=labels,
                check_duplicate=True,
                options={"com.docker.network.bridge.name": firewall.bridge_name(name)},
            )
        except docker.errors.APIError as e:
            raise SandboxUnavailable(
                f"cannot create the run network {name}: {e.explanation or e}. The engine may "
                f"have run out of address pools; remove old runs with 'fleet sandbox gc'."
            ) from None
        return self._client.api.inspect_network(name)

    async def ensure_proxy(
        self, run: str, allow: Sequence[str], image: str, labels: dict[str, str]
    ) -> str:
        """The IP address (on the run network) of the run's proxy for ``allow``."""
        net = await self.ensure_network(run)
        name = proxy_name(run, allow, self._node)
        async with self._lock(f"proxy:{name}"):
            with engine_calls(self._client):
                return await anyio.to_thread.run_sync(
                    self._ensure_proxy_sync, run, net, name, list(allow), image, labels
                )

    def _ensure_proxy_sync(
        self, run: str, net: dict, name: str, allow: list[str], image: str, labels: dict
    ) -> str:
        api = self._client.api
        try:
            info = api.inspect_container(name)
            if info["State"]["Running"]:
                return info["NetworkSettings"]["Networks"][net["Name"]]["IPAddress"]
            remove_box(self._client, name)
        except docker.errors.NotFound:
            pass
        config = net["IPAM"]["Config"][0]
        egress = self._ensure_egress_sync()
        env = {
            "FLEET_ALLOW": ",".join(allow),
            "FLEET_LOCAL_NET": config["Subnet"],
            "FLEET_DENY_IPS": ",".join(self._host_addresses_sync(net, egress)),
            "FLEET_PROXY_PORT": str(PROXY_PORT),
        }
        host_config = api.create_host_config(
            network_mode=net["Name"],
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            read_only=True,
            tmpfs={"/tmp": "rw,nosuid,nodev,size=16m,mode=1777"},
            pids_limit=128,
            mem_limit="128m",
            memswap_limit="128m",
            nano_cpus=500_000_000,
            init=True,
        )
        container = api.create_container(
            image,
            ["python3", "/opt/fleet/egress_proxy.py"],
            name=name,
            user="1000:1000",
            environment=env,
            labels={**labels, "fleet.kind": "proxy", "fleet.member": "proxy"},
            host_config=host_config,
            working_dir="/tmp",
            mac_address=firewall.infra_mac(),  # on the run network: boxes may reach it
        )
        api.connect_container_to_network(container["Id"], EGRESS_NETWORK)
        api.start(container["Id"])
        info = api.inspect_container(container["Id"])
        return info["NetworkSettings"]["Networks"][net["Name"]]["IPAddress"]

    def _host_addresses_sync(self, net: dict, egress: dict) -> list[str]:
        """Every address of the Docker host this process can know (see the module doc)."""
        found = bridge_gateways(net) + bridge_gateways(egress)
        try:
            found += bridge_gateways(self._client.api.inspect_network("bridge"))
        except docker.errors.NotFound:
            pass  # an engine started with --bridge=none has no default bridge
        if engine_is_local(engine_host()):
            found += local_addresses()
        return list(dict.fromkeys(found))

    def _ensure_egress_sync(self) -> dict:
        """The proxies' way-out network, created once per engine (see the module doc).

        Created under a lock file, because two Fleet processes may both find it
        missing, and the engine does not reliably refuse a second network of a name.
        """
        import fcntl

        from ..images.catalog import cache_dir

        api = self._client.api
        cache_dir().mkdir(parents=True, exist_ok=True)
        with open(cache_dir() / "egress-network.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                return api.inspect_network(EGRESS_NETWORK)
            except docker.errors.NotFound:
                pass
            firewall.ensure_host_rules()  # before the bridge exists, as for run networks
            try:
                api.create_network(
                    EGRESS_NETWORK,
                    driver="bridge",
                    labels={"fleet.kind": "egress"},
                    check_duplicate=True,
                    options={
                        "com.docker.network.bridge.name": firewall.EGRESS_BRIDGE,
                        # Proxies of different runs have nothing to say to each other.
                        "com.docker.network.bridge.enable_icc": "false",
                    },
                )
            except docker.errors.APIError as e:
                raise SandboxUnavailable(
                    f"cannot create the egress network {EGRESS_NETWORK}: "
                    f"{e.explanation or e}. The engine may have run out of address pools; "
                    f"remove old runs with 'fleet sandbox gc'."
                ) from None
            return api.inspect_network(EGRESS_NETWORK)


def proxy_env(ip: str) -> dict[str, str]:
    """Environment that points a box's programs at its proxy."""
    url = f"http://{ip}:{PROXY_PORT}"
    return {
        "FLEET_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "no_proxy": "localhost,127.0.0.1",
    }

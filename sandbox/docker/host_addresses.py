"""The Docker host's own addresses, which no box and no egress proxy may connect to.

Two sources, because neither alone is complete:

- A bridge network's gateway is the host's address on that bridge. The engine's
  ``IPAM.Config`` usually names it, but not always: Debian's docker.io 20.10, freshly
  started, shows the default bridge as ``{"Subnet": "172.17.0.0/16"}`` with no
  ``Gateway`` at all. :func:`bridge_gateways` then asks the bridge interface itself
  (``docker0``, or whatever ``com.docker.network.bridge.name`` says; ``br-<id>`` for
  other networks) and, when this process cannot see that interface (an engine on
  another machine), falls back to the subnet's first address, which is where
  Docker's allocator puts the gateway.
- Every address of every interface of this machine (:func:`local_addresses`): the
  LAN address, other bridges, IPv6 global, unique-local and link-local addresses.
  Read from ``/proc/net/fib_trie`` (each ``/32 host LOCAL`` entry is one local IPv4
  address, secondary ones included) and ``/proc/net/if_inet6``; no tool is needed.
  Only meaningful when the engine runs here, which :func:`engine_is_local` says.

The list is a snapshot taken when a proxy starts. The host firewall
(:mod:`sandbox.docker.firewall`) does not depend on it: it refuses any connection a box or a
proxy opens to the host, whatever the address, so an address added later is covered.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from collections.abc import Iterable
from pathlib import Path

_SIOCGIFADDR = 0x8915
DEFAULT_BRIDGE_OPTION = "com.docker.network.bridge.name"


def interface_ipv4(name: str) -> str | None:
    """The primary IPv4 address of interface ``name`` on this machine, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(
                sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15])
            )
        except OSError:  # no such interface here, or it has no IPv4 address
            return None
    return socket.inet_ntoa(packed[20:24])


def bridge_interface(net: dict) -> str:
    """The host interface of a bridge network, from ``docker network inspect``."""
    named = (net.get("Options") or {}).get(DEFAULT_BRIDGE_OPTION)
    return named or f"br-{net['Id'][:12]}"


def bridge_gateways(net: dict) -> list[str]:
    """The host's addresses on a bridge network, one per subnet (see the module docstring)."""
    out: list[str] = []
    for config in (net.get("IPAM") or {}).get("Config") or []:
        subnet = config.get("Subnet")
        gateway = config.get("Gateway")
        if not gateway and subnet:
            network = ipaddress.ip_network(subnet, strict=False)
            seen = interface_ipv4(bridge_interface(net)) if network.version == 4 else None
            if seen and ipaddress.ip_address(seen) in network:
                gateway = seen
            elif network.num_addresses > 2:
                gateway = str(network[1])
        if gateway:
            out.append(gateway.split("/")[0])
    return out


def _fib_trie_locals(text: str) -> Iterable[str]:
    last = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("|--"):
            last = stripped[3:].strip()
        elif stripped.startswith("/32 host LOCAL") and last:
            yield last


def _if_inet6(text: str) -> Iterable[str]:
    for line in text.splitlines():
        hexaddr = line.split()[0] if line.split() else ""
        if len(hexaddr) == 32:
            yield str(ipaddress.IPv6Address(bytes.fromhex(hexaddr)))


def local_addresses(proc: Path = Path("/proc/net")) -> list[str]:
    """Every IPv4 and IPv6 address configured on this machine's interfaces, sorted."""
    found: set[str] = set()
    for name, parse in (("fib_trie", _fib_trie_locals), ("if_inet6", _if_inet6)):
        try:
            found.update(parse((proc / name).read_text()))
        except OSError:  # no IPv6 in this kernel, or /proc not mounted
            continue
    return sorted(found, key=lambda a: (":" in a, a))


def engine_is_local(host: str) -> bool:
    """Whether an engine reached at ``host`` (a ``DOCKER_HOST`` value) runs on this machine."""
    return host.startswith("unix://")

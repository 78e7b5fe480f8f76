"""The Docker host's own addresses on its bridges, which the egress proxy refuses.

A bridge network's gateway is the host's address on that bridge. The engine's
``IPAM.Config`` usually names it, but not always: Debian's docker.io 20.10, freshly
started, shows the default bridge as ``{"Subnet": "172.17.0.0/16"}`` with no
``Gateway`` at all. :func:`bridge_gateways` then asks the bridge interface itself
(``docker0``, or whatever ``com.docker.network.bridge.name`` says; ``br-<id>`` for
other networks) and, when this process cannot see that interface (an engine on
another machine), falls back to the subnet's first address, which is where Docker's
allocator puts the gateway.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

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

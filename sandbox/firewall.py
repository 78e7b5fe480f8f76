"""Host firewall rules that keep boxes on Fleet's run networks off the Docker host.

Why this exists. An ``--internal`` network of Docker 20.10 still gives every
container a default route via the bridge's gateway address, and that address lives
on the host. A packet from a box to *any* of the host's addresses (the gateway, the
docker0 address, the host's LAN address) is then delivered locally: it crosses the
host's ``INPUT`` chain, never ``FORWARD``, so Docker's isolation rules for internal
networks (which are all in ``FORWARD``) do not see it. Chromium goes through the
egress proxy, but ``curl`` or a raw socket run by ``exec`` would reach every service
listening on the host. Measured here before this module: a box connected to
listeners on the gateway address and on the host's LAN address.

The rules. Every run network's bridge is named ``fleet<10 hex>`` (see
:func:`bridge_name`), so one chain covers all of them, with no per-run state:

    -A INPUT -i fleet+ -j FLEET-HOST                        (inserted first)
    -A FLEET-HOST -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
    -A FLEET-HOST -j REJECT --reject-with icmp-port-unreachable
    -A DOCKER-USER -i fleet+ ! -o fleet+ -j DROP            (inserted first)

The host can still open connections to boxes (CDP, the agent's ``docker exec`` does
not use the network at all); replies come back as ESTABLISHED. A box cannot open one
to the host on any address. REJECT rather than DROP so a refused program fails at
once instead of hanging in connect. The ``DOCKER-USER`` rule forwards nothing from a
Fleet bridge to any other interface, even if a network were created without
``--internal``; traffic between two Fleet bridges (two runs) is already dropped by
Docker's own isolation chains. Traffic between boxes on one bridge is bridged and
stays allowed (a browser box reaches its run's proxy and service boxes).

Lifetime. The rules are installed (idempotently, checked with ``iptables -C``) before
a run network is created, so a bridge never exists without them. They are not removed
with a run: they match nothing once no ``fleet*`` bridge exists, and removing shared
rules while another Fleet process creates a network would open a window. A reboot
clears them; the next network creation puts them back. To remove them by hand:
``iptables -D INPUT -i fleet+ -j FLEET-HOST; iptables -F FLEET-HOST;
iptables -X FLEET-HOST; iptables -D DOCKER-USER -i fleet+ ! -o fleet+ -j DROP``.

Without root (or without ``iptables``) the rules cannot be installed, and Fleet fails
closed: creating a browser or service box raises :class:`SandboxUnavailable` naming
what to do. ``FLEET_HOST_FIREWALL=external`` says an administrator installed the rules
above; ``FLEET_HOST_FIREWALL=off`` accepts that box processes may reach host services.
IPv6 needs no rule: Docker disables IPv6 on a container's interface on networks
created without ``--ipv6`` (checked: ``disable_ipv6`` is 1 in a box).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading

from .errors import SandboxUnavailable

BRIDGE_PREFIX = "fleet"
CHAIN = "FLEET-HOST"
_MATCH = f"{BRIDGE_PREFIX}+"
_JUMP = ["-i", _MATCH, "-j", CHAIN]
_CHAIN_RULES = [
    ["-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"],
    ["-j", "REJECT", "--reject-with", "icmp-port-unreachable"],
]
_NO_FORWARD = ["-i", _MATCH, "!", "-o", _MATCH, "-j", "DROP"]
_lock = threading.Lock()


def bridge_name(network: str) -> str:
    """The host interface name of a run network's bridge (at most 15 characters)."""
    return BRIDGE_PREFIX + hashlib.sha256(network.encode()).hexdigest()[:10]


def mode() -> str:
    """``auto`` (install the rules), ``external`` (installed by hand) or ``off``."""
    value = os.environ.get("FLEET_HOST_FIREWALL", "auto").strip().lower() or "auto"
    if value not in ("auto", "external", "off"):
        raise SandboxUnavailable(
            f"FLEET_HOST_FIREWALL={value!r} is not understood; use 'auto' (default: install "
            f"the host rules, needs root), 'external' (an administrator installed them) or "
            f"'off' (accept that box processes can reach services on the Docker host)"
        )
    return value


def _iptables(*args: str) -> subprocess.CompletedProcess:
    # -w: wait for the xtables lock; dockerd and other Fleet processes use it too.
    return subprocess.run(
        ["iptables", "-w", "5", *args], capture_output=True, text=True, timeout=30
    )


def _ensure_rule(chain: str, rule: list[str], *, first: bool) -> None:
    if _iptables("-C", chain, *rule).returncode == 0:
        return
    where = ["-I", chain, "1"] if first else ["-A", chain]
    done = _iptables(*where, *rule)
    if done.returncode != 0:
        raise SandboxUnavailable(
            f"could not install the host firewall rule '{chain} {' '.join(rule)}': "
            f"{done.stderr.strip()}. {_WHAT_TO_DO}"
        )


_WHAT_TO_DO = (
    "Without it, a process in a browser or service box could connect to services on the "
    "Docker host. Run Fleet as root (it installs the rules itself), have an administrator "
    "install the rules listed in sandbox/firewall.py and set FLEET_HOST_FIREWALL=external, "
    "or set FLEET_HOST_FIREWALL=off to accept that risk"
)


def ensure_host_rules() -> None:
    """Install the rules unless present (or configured away); raise when that cannot be."""
    if mode() != "auto":
        return
    if os.geteuid() != 0 or shutil.which("iptables") is None:
        why = "Fleet is not running as root" if os.geteuid() != 0 else "iptables is missing"
        raise SandboxUnavailable(
            f"cannot keep boxes off the Docker host: {why}, so the host firewall rules for "
            f"Fleet's run networks cannot be installed. {_WHAT_TO_DO}"
        )
    with _lock:
        if _iptables("-n", "-L", CHAIN).returncode != 0:
            _iptables("-N", CHAIN)  # a concurrent creator may win; the checks below decide
        for rule in _CHAIN_RULES:
            _ensure_rule(CHAIN, rule, first=False)
        _ensure_rule("INPUT", _JUMP, first=True)
        if _iptables("-n", "-L", "DOCKER-USER").returncode == 0:
            _ensure_rule("DOCKER-USER", _NO_FORWARD, first=True)

"""Host firewall rules that keep boxes and egress proxies off the Docker host.

Why this exists. An ``--internal`` network of Docker 20.10 still gives every
container a default route via the bridge's gateway address, and that address lives
on the host. A packet from a box to *any* of the host's addresses (the gateway, the
docker0 address, the host's LAN address, an IPv6 address) is then delivered locally:
it crosses the host's ``input`` hook, never ``forward``, so Docker's isolation rules
for internal networks (which all act on forwarded packets) do not see it. Chromium
goes through the egress proxy, but ``curl`` or a raw socket run by ``exec`` would
reach every service listening on the host. The egress proxy is in the same position
on its way-out network: its address checks (:mod:`sandbox.inbox.egress_rules`) refuse
the host's addresses it knows of, and this rule refuses the rest, whatever the address.

Members of one run must not reach each other's boxes either: a browser box's CDP
relay listens on all its addresses (the host drives Chromium through it), so any
process in a sibling's box could otherwise open ``http://SIBLING:9223/json/list`` and
take over that member's browser - and any port a sibling's command listens on. Nor
may a box reach more of the run's own infrastructure than it needs. What each kind
of box needs on its run network, and all it gets:

- a member's box (browser, or coding with an allowlist): a proxy, TCP
  :data:`PROXY_PORT` (3128). Its programs reach everything else, the corpus included,
  through the proxy (``--proxy-server``, ``http_proxy``), which applies the allowlist.
- an egress proxy: a service box, TCP :data:`SERVICE_PORT` (8080, the corpus's
  port); the world beyond leaves by ``flt-egress``, which this table does not limit.
- a service box: nothing; it only answers. (The rule cannot tell a service box
  from a proxy, so it could also open those two ports; nothing there serves it.)

The rules. Every run network's bridge is named ``fleetr<9 hex>`` (see
:func:`bridge_name`) and the proxies' way-out network's bridge is ``flt-egress``
(:data:`EGRESS_BRIDGE`, deliberately *not* ``fleet*``: a proxy must be forwarded off
it). A run's proxies and service boxes get a MAC address with Fleet's prefix
``02:f1:ee`` (:func:`infra_mac`, locally administered; members keep Docker's
``02:42:...``). One nftables table holds everything, with no per-run state, for IPv4
and IPv6 alike (:data:`RULESET`)::

    table inet fleet_v2
      chain input    (hook input):   from fleet* or flt-egress -> chain host
      chain host:                    replies (established, related) accepted, the rest
                                     rejected (port unreachable)
      chain forward  (hook forward): from fleet* to anything but fleet* -> drop;
                                     from fleetr* -> chain peers
      chain peers:                   replies accepted; a new connection accepted only
                                     to a Fleet MAC on TCP 3128 (a proxy's port), or
                                     from a Fleet MAC to one on TCP 8080 (a proxy to a
                                     service box); the rest dropped

Frames between two boxes of one bridge are bridged, not routed; they meet ``forward``
because the kernel's bridge netfilter hands bridged IP to it
(``net.bridge.bridge-nf-call-iptables`` and ``-ip6tables``, which Docker itself turns
on and :func:`ensure_host_rules` checks). Why this design for keeping members apart:
it is static - one rule for every run, nothing to add per box or to leak when a
process dies - and it fails closed: a box that does not carry the prefix is reachable
by nobody but the host. A box cannot take the prefix itself, as destination or as
source: changing its MAC or forging frames needs ``CAP_NET_ADMIN`` or ``CAP_NET_RAW``,
which no box has. Ports rather than a MAC prefix per kind: an earlier version's table
(below), which may stay installed beside this one, admits new connections only to
the one prefix, so a proxy given another would be cut off from its boxes. Rejected
alternatives: per-box allow rules (state to install and remove per box, leaked by a
killed Fleet), bridge port isolation per box (``brport/isolated``: per-box root work,
and nothing an administrator could install once for ``FLEET_HOST_FIREWALL=external``),
Docker's ``enable_icc=false`` (it also cuts members off from their proxy, and
internal networks cannot publish ports), a network per member (the engine's
address pools give about 30 networks in all), a token on the CDP relay (leaves every
other port of a sibling open). The ``peers`` rule matches ``fleetr*`` only, not
``fleet*``: bridges named by earlier versions have proxies without the prefix, and
isolating them would cut their boxes off from their proxy.

The host can still open connections to boxes (CDP; the agent's ``docker exec`` does
not use the network at all); replies come back as established. A box or a proxy
cannot open one to the host on any address, DNS included: a host whose resolver
listens on one of its own addresses must give Docker another (``dockerd --dns``).
REJECT rather than DROP so a refused program fails at once instead of hanging in
connect. Nothing is forwarded from a run network to any other interface, even if a
network were created without ``--internal``; traffic between two run networks is
also dropped by Docker's own isolation chains.

Lifetime. The table is replaced whole, in one atomic ``nft -f`` transaction, before a
run network or the egress network is created, so a bridge never exists without it and
two Fleet processes installing it at once cannot open a window. It is not removed
with a run: it matches nothing once no such bridge exists. A reboot clears it; the
next network creation puts it back. To remove it by hand: ``nft delete table inet
fleet_v2``. Why the version in the table's name: nftables runs every table's chains
on a packet and a drop in any of them is final, so two rule sets on one host (an
earlier Fleet's ``inet fleet``, which admits any port to the prefix, or one left by
an upgrade) hold together and the stricter wins; had both versions replaced one
shared table, whichever created a network last would decide for every run on the
host. An earlier table may stay and loosens nothing (``nft delete table inet
fleet`` removes it). (Versions before the nftables table installed the ``fleet+``
part of these rules with iptables, chain ``FLEET-HOST``; those rules agree with it.)

Without root (or without ``nft``, Debian's ``nftables``) the rules cannot be
installed, and Fleet fails closed: creating a browser or service box raises
:class:`SandboxUnavailable` naming what to do. ``fleet setup`` run as root installs
``nftables`` when it is missing and the table. ``FLEET_HOST_FIREWALL=external`` says
an administrator installed :data:`RULESET` (and turned on bridge netfilter);
``FLEET_HOST_FIREWALL=off`` accepts that box processes may reach host services and
each other's boxes. :func:`installed` says whether the rules are in force right now,
whatever the mode claims (``fleet doctor``).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import threading
from collections.abc import Callable
from typing import Any, Literal

from ..errors import SandboxUnavailable

BRIDGE_PREFIX = "fleet"
RUN_BRIDGE_PREFIX = "fleetr"
"""Run networks' bridges: ``fleet*`` for the host rules, ``fleetr*`` for ``peers``."""
INFRA_MAC_PREFIX = "02:f1:ee"
"""MAC prefix of a run's proxies and service boxes, the only peers a box may connect to."""
PROXY_PORT = 3128
"""The port a run's egress proxy listens on: the only one a box may open to it."""
SERVICE_PORT = 8080
"""The port a service box (the corpus) serves on: the only one a proxy may open to it."""
EGRESS_BRIDGE = "flt-egress"
"""Bridge of the network the egress proxies leave by (see :mod:`sandbox.docker.network`)."""
TABLE = "fleet_v2"
"""The rule set's name carries its version (see the module docstring)."""
_INFRA = f"& ff:ff:ff:00:00:00 == {INFRA_MAC_PREFIX}:00:00:00"
RULESET = f"""
table inet {TABLE} {{
    chain input {{
        type filter hook input priority filter; policy accept;
        iifname "{BRIDGE_PREFIX}*" jump host
        iifname "{EGRESS_BRIDGE}" jump host
    }}
    chain host {{
        ct state established,related accept
        reject with icmpx type port-unreachable
    }}
    chain forward {{
        type filter hook forward priority filter; policy accept;
        iifname "{BRIDGE_PREFIX}*" oifname != "{BRIDGE_PREFIX}*" drop
        iifname "{RUN_BRIDGE_PREFIX}*" jump peers
    }}
    chain peers {{
        ct state established,related accept
        ether daddr {_INFRA} tcp dport {PROXY_PORT} accept
        ether saddr {_INFRA} ether daddr {_INFRA} tcp dport {SERVICE_PORT} accept
        drop
    }}
}}
"""
"""The whole rule set, as ``nft -f`` reads it."""
_lock = threading.Lock()


def bridge_name(network: str) -> str:
    """The host interface name of a run network's bridge (at most 15 characters)."""
    return RUN_BRIDGE_PREFIX + hashlib.sha256(network.encode()).hexdigest()[:9]


def infra_mac() -> str:
    """A fresh MAC address for a run's proxy or service box (see the module docstring)."""
    tail = secrets.token_bytes(3)
    return INFRA_MAC_PREFIX + "".join(f":{b:02x}" for b in tail)


_BRIDGE_NF = (
    "/proc/sys/net/bridge/bridge-nf-call-iptables",
    "/proc/sys/net/bridge/bridge-nf-call-ip6tables",
)


def _bridged_traffic_filtered() -> None:
    """Make sure bridged IP meets the ``forward`` hook (root only; see the docstring)."""
    if not os.path.exists(_BRIDGE_NF[0]) and shutil.which("modprobe"):
        subprocess.run(["modprobe", "br_netfilter"], capture_output=True, timeout=30)
    for path in _BRIDGE_NF:
        try:
            with open(path) as f:
                if f.read().strip() == "1":
                    continue
            with open(path, "w") as f:
                f.write("1")
        except OSError as e:
            raise SandboxUnavailable(
                f"cannot keep a run's boxes apart: {path} cannot be set to 1 ({e.strerror}), "
                f"so traffic between boxes would bypass the host rules; load br_netfilter "
                f"('modprobe br_netfilter') and set it, or set FLEET_HOST_FIREWALL=off to "
                f"accept that members of a run can reach each other's boxes"
            ) from None


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


_WHAT_TO_DO = (
    "Without it, a process in a browser or service box could connect to services on the "
    "Docker host. Run Fleet as root (it installs the rules itself; 'fleet setup' also "
    "installs nftables), have an administrator install the rule set of "
    "sandbox/docker/firewall.py (RULESET) and set FLEET_HOST_FIREWALL=external, or set "
    "FLEET_HOST_FIREWALL=off to accept that risk"
)


def _replace_table() -> None:
    # 'add' first so the 'delete' never fails; the three run as one transaction.
    script = f"add table inet {TABLE}\ndelete table inet {TABLE}\n{RULESET}"
    done = subprocess.run(
        ["nft", "-f", "-"], input=script, capture_output=True, text=True, timeout=30
    )
    if done.returncode != 0:
        raise SandboxUnavailable(
            f"could not install the host firewall rules (nft: {done.stderr.strip()}). {_WHAT_TO_DO}"
        )


def ensure_host_rules() -> None:
    """Install the rules unless configured away; raise when that cannot be."""
    if mode() != "auto":
        return
    if os.geteuid() != 0 or shutil.which("nft") is None:
        why = "Fleet is not running as root" if os.geteuid() != 0 else "nft is missing"
        raise SandboxUnavailable(
            f"cannot keep boxes off the Docker host: {why}, so the host firewall rules for "
            f"Fleet's run networks cannot be installed. {_WHAT_TO_DO}"
        )
    with _lock:
        _bridged_traffic_filtered()
        _replace_table()


def setup(say: Callable[[str], None]) -> None:
    """``fleet setup``: as root, install ``nftables`` when missing, then the rules."""
    if mode() != "auto" or os.geteuid() != 0:
        return
    if shutil.which("nft") is None:
        from .engine import apt_install

        apt_install(["nftables"], say)
    ensure_host_rules()


Found = Literal["ok", "off", "missing", "differs", "unreadable"]


def installed() -> tuple[Found, str]:
    """Whether the rules are in force now, as the kernel holds them (``fleet doctor``):
    the table read back with ``nft`` and compared with :data:`RULESET` as ``nft`` itself
    prints it - loaded for that into a throwaway network namespace, so spelling
    differences between the two (``reject`` for ``reject with icmpx type
    port-unreachable``) do not count and any real one does - and bridge netfilter on.
    Reading the host's rules needs root. Returns the verdict and what was seen."""
    if mode() == "off":
        return "off", "switched off (FLEET_HOST_FIREWALL=off)"
    if shutil.which("nft") is None:
        return "unreadable", "nft (Debian's nftables) is not installed"
    if os.geteuid() != 0:
        return "unreadable", "reading the host's nftables rules needs root"
    listed = _nft_json(["nft", "-j", "list", "table", "inet", TABLE], "")
    if listed is None:
        return "missing", f"there is no table inet {TABLE}"
    script = f"nft -f /dev/stdin && nft -j list table inet {TABLE}"
    expected = _nft_json(["unshare", "--net", "sh", "-c", script], RULESET)
    if expected is None:
        return "differs", f"table inet {TABLE} is there but could not be compared (unshare)"
    if listed != expected:
        return "differs", f"table inet {TABLE} is not Fleet's rule set"
    off = [p for p in _BRIDGE_NF if not _reads_one(p)]
    if off:
        return "differs", f"bridged traffic bypasses the rules ({', '.join(off)} is not 1)"
    return "ok", f"table inet {TABLE} is Fleet's rule set; bridged traffic is filtered"


def _nft_json(cmd: list[str], stdin: str) -> list[Any] | None:
    """``nft -j``'s objects without the parts that differ between two loads (handles,
    nft's own version), or None when the command fails."""
    try:
        done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=30)
        items = json.loads(done.stdout)["nftables"] if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
        return None
    if items is None:
        return None

    def bare(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: bare(v) for k, v in x.items() if k != "handle"}
        if isinstance(x, list):
            return [bare(v) for v in x]
        return x

    return [bare(i) for i in items if "metainfo" not in i]


def _reads_one(path: str) -> bool:
    try:
        with open(path) as f:
            return f.read().strip() == "1"
    except OSError:
        return False

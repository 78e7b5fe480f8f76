"""How the egress proxy reads a host and which addresses it refuses: the rules the
host imports too, to judge a job's allowlist and URLs before any box starts.

Apart from the proxy's server (:mod:`.egress_proxy`) so that the job reader imports
rules, not a server; copied beside it into every image at ``/opt/fleet``. Standard
library only, like everything in :mod:`sandbox.inbox`.

Why refuse every IP literal that is not four decimal numbers rather than translate
it: programs read such forms differently (``inet_aton`` takes ``0177.0.0.1`` as
octal, Python's ``ipaddress`` refuses it, a URL parser may take ``1.2.3`` as three
parts or as a name), so a check that reads a host one way while the connecting
program reads it another is the classic way past an address filter. Refusing the
forms leaves one reading. Why ``is_global`` plus a list of its own: Python's table
follows IANA's special-purpose registry, but lets multicast, reserved and
site-local IPv6 addresses through as "global", and 3.11 patch releases differ in a
few ranges; the explicit list (carrier-grade NAT, 0.0.0.0/8, broadcast, Teredo,
6to4 relays, local-use NAT64) states the ones that matter whatever the version.
"""

from __future__ import annotations

import ipaddress
import re
from typing import NamedTuple
from urllib.parse import unquote

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})
"""Loopback's names in every container's ``/etc/hosts``; ``*.localhost`` is loopback by
RFC 6761 (or does not resolve at all): either way the proxy never gets anywhere."""


def address_refusal(
    ip: IPAddress,
    local_net: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None,
    deny_ips: frozenset[IPAddress] | set[IPAddress] = frozenset(),
) -> str | None:
    """None when the proxy may connect to ``ip``, else the reason it may not.

    Only globally routable addresses pass (``ipaddress``'s ``is_global``, and not
    multicast, reserved or site-local, which it lets through), apart from the run's
    own network ``local_net``, where the service boxes a job names live (its network
    and broadcast addresses excepted). ``deny_ips`` are the Docker host's addresses,
    refused wherever they are. Without ``local_net`` - before a run exists - no
    private address is in the run's network. An IPv6 address that carries an IPv4
    one (``::ffff:a.b.c.d``, NAT64's ``64:ff9b::/96``, 6to4's ``2002::/16``) is judged
    by that one too: ``::ffff:127.0.0.1`` is loopback, whatever Python says of it.
    """
    for inner in _embedded_ipv4(ip):
        why = address_refusal(inner, local_net, deny_ips)
        if why:
            return f"{why} ({inner} inside {ip})"
    if ip in deny_ips:
        return "an address of the Docker host"
    if local_net is not None and ip in local_net:
        if ip in (local_net.network_address, local_net.broadcast_address):
            return "the run network's own network or broadcast address"
        return None
    return _special_purpose(ip)


_NAMED_RANGES: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "'this network' (0.0.0.0/8), which reaches the proxy's own host"),
    (
        "100.64.0.0/10",
        "shared address space (100.64.0.0/10, carrier-grade NAT; "
        "100.100.100.200 is a cloud metadata service there)",
    ),
    ("255.255.255.255/32", "the broadcast address"),
    ("192.88.99.0/24", "a 6to4 relay anycast address (192.88.99.0/24)"),
    ("64:ff9b:1::/48", "a local-use NAT64 address (64:ff9b:1::/48)"),
    ("2001::/32", "a Teredo tunnel address (2001::/32)"),
)
_RANGES = [(ipaddress.ip_network(net), why) for net, why in _NAMED_RANGES]
_PRIVATE = [
    ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
]


def _special_purpose(ip: IPAddress) -> str | None:
    """What ``ip`` is when it is not a globally routable unicast address, else None."""
    for net, why in _RANGES:
        if ip.version == net.version and ip in net:
            return why
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address (169.254.169.254 is the cloud metadata service)"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_unspecified:
        return "the unspecified address"
    if ip.is_reserved or (ip.version == 6 and ip.is_site_local):
        return "a reserved address"
    if any(ip in net for net in _PRIVATE if net.version == ip.version):
        return "a private address, not globally routable"
    if ip.is_private or not ip.is_global:  # documentation, benchmarking, ...
        return "a special-purpose address, not globally routable"
    return None


_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _embedded_ipv4(ip: IPAddress) -> list[ipaddress.IPv4Address]:
    if ip.version == 4:
        return []
    assert isinstance(ip, ipaddress.IPv6Address)
    found = [a for a in (ip.ipv4_mapped, ip.sixtofour) if a is not None]
    if ip in _NAT64:
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return found


class HostForm(NamedTuple):
    """How a host as written is read by resolvers and URL parsers."""

    host: str
    """Its plain form: lower case, without user information, percent-escapes,
    brackets or trailing dots; an IP address in its one canonical spelling."""
    address: IPAddress | None
    """The IP address it denotes when any common parser reads it as one."""
    disguises: tuple[str, ...]
    """How the text differs from ``host``, in words; empty when it is plain."""


_IPV4_PART = re.compile(r"0x[0-9a-f]*|0[0-7]*|[1-9][0-9]*")
_ESCAPE = re.compile(r"%[0-9a-f]{2}")
_NUMERIC_LABEL = re.compile(r"0x[0-9a-f]*|[0-9]+")


def _ipv4_any_form(text: str) -> tuple[ipaddress.IPv4Address, str] | None:
    """The IPv4 address ``text`` is to ``inet_aton`` (glibc, curl, Python's socket)
    and to the WHATWG URL parser (Chromium): one to four parts, each decimal, octal
    (a leading 0) or hexadecimal (0x), the last one filling the remaining bytes;
    with how it is spelled when that is not the four decimal numbers."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 4 or not all(_IPV4_PART.fullmatch(p) for p in parts):
        return None
    if any(len(p) > 32 for p in parts):  # too long for any address; a name ending in a number
        return None
    values = [
        int(p[2:] or "0", 16) if p.startswith("0x") else int(p, 8 if p[0] == "0" else 10)
        for p in parts
    ]
    *head, last = values
    if any(v > 255 for v in head) or last >= 256 ** (5 - len(values)):
        return None
    number = sum(v << (8 * (3 - i)) for i, v in enumerate(head)) + last
    address = ipaddress.IPv4Address(number)
    if str(address) == text:
        return address, ""
    ways = []
    if any(p.startswith("0x") for p in parts):
        ways.append("hexadecimal")
    if any(len(p) > 1 and p[0] == "0" and not p.startswith("0x") for p in parts):
        ways.append("octal (a leading 0)")
    if len(parts) < 4:
        ways.append(f"{len(parts)} part{'s' if len(parts) > 1 else ''} instead of 4")
    return address, " and ".join(ways)


def read_host(text: str) -> HostForm:
    """Read a host name or address as resolvers and URL parsers would, naming each
    way the text hides what it is (``127.1``, ``0x7f000001``, ``2852039166``,
    ``0177.0.0.1``, ``a@host``, ``%31…``, ``[…]``, ``host.``). The one reading that
    the egress proxy (at each request) and the job reader (before a run) share."""
    host, disguises = text.strip().lower(), []
    if "@" in host:
        userinfo, _, host = host.rpartition("@")
        disguises.append(f"user information ({userinfo}@) in front of it")
    if _ESCAPE.search(host):  # not an IPv6 zone's bare '%' (fe80::1%eth0)
        host = unquote(host)
        disguises.append("percent-encoding")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        disguises.append("square brackets")
    if host.endswith(".") and host.strip("."):
        host = host.rstrip(".")
        disguises.append("a trailing dot")
    try:
        address: IPAddress | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None:  # ip_address takes IPv4 only as four decimal numbers
        return HostForm(str(address), address, tuple(disguises))
    v4 = _ipv4_any_form(host)
    if v4 is not None:
        if v4[1]:
            disguises.append(v4[1])
        return HostForm(str(v4[0]), v4[0], tuple(disguises))
    if _NUMERIC_LABEL.fullmatch(host.rpartition(".")[2]):
        disguises.append("a last label that is a number, which URL parsers read as an IPv4 address")
    return HostForm(host, None, tuple(disguises))


def split_entry(entry: str) -> tuple[str, str]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` as (host, port text)."""
    userinfo, at, rest = entry.strip().rpartition("@")  # kept: read_host names it
    if rest.startswith("["):
        inside, _, after = rest.partition("]")
        return userinfo + at + inside + "]", after[1:] if after.startswith(":") else after
    if rest.count(":") > 1:  # a bare IPv6 address: its colons are not a port
        return userinfo + at + rest, ""
    host, _, port = rest.partition(":")
    return userinfo + at + host, port


def disguise_refusal(form: HostForm) -> str:
    """What a host written in disguise really is, and why it is refused."""
    what = "the IP address" if form.address is not None else "the host"
    text = f"it is {what} {form.host} in disguise ({'; '.join(form.disguises)})"
    why = address_refusal(form.address) if form.address is not None else None
    if why:
        text += f", and {form.host} is {why}"
    return (
        f"{text}: resolvers and URL parsers read such forms differently, so only a plain "
        "name (or an IPv4 address as four decimal numbers) is accepted"
    )


def entry_refusal(entry: str) -> str | None:
    """Why the allowlist entry ``name``, ``name:port`` or ``*.domain`` can never be
    used through the proxy, or None. Judged without a run: a name that needs DNS is
    not looked up (what it resolves to is checked when a box asks for it)."""
    raw, port = split_entry(entry)
    if port and not (port.isdigit() and 1 <= int(port) <= 65535):
        return f"port {port!r} is not a TCP port (1-65535)"
    wildcard = raw.startswith("*.")
    form = read_host(raw.removeprefix("*."))
    bare = form.host
    if form.disguises:
        return disguise_refusal(form)
    if bare in LOOPBACK_NAMES or bare.endswith(".localhost"):
        return f"{bare} names the loopback address (RFC 6761), which the egress proxy refuses"
    if form.address is None:
        return None
    if wildcard:
        return f"'*.' cannot come before the address {bare}"
    why = address_refusal(form.address)
    return f"{bare} is {why}, which the egress proxy refuses" if why else None

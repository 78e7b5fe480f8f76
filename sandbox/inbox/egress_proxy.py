"""Fleet's egress proxy: the only way out of a run's internal network.

Baked into every Fleet image at ``/opt/fleet/egress_proxy.py``; the host runs it in
one small container per run that has browser boxes. The proxy sits on the run's
``--internal`` network (where the browser boxes are) and on a normal bridge network
(the way out). Chromium in a browser box is started with ``--proxy-server`` pointing
here. The internal network forwards nothing off its bridge, and the host firewall
rules of :mod:`sandbox.docker.firewall` refuse every connection a box opens to the host
itself, so the proxy is the only path off the box for any program in it.

It forwards plain HTTP (absolute-URI requests) and ``CONNECT`` tunnels, and only to
hosts on the allowlist. First the host is read as resolvers and URL parsers read it
(:func:`~.egress_rules.read_host`): an IP address in disguise - ``127.1``, ``0x7f000001``,
``2852039166``, ``0177.0.0.1``, user information (``a@host``), percent-escapes, a
trailing dot - is refused outright, since programs disagree on what such forms
mean. The allowlist is checked on the plain name; then a name is resolved once and
every address is checked, and an address literal is checked without any lookup.
Only globally routable addresses pass (``ipaddress``'s ``is_global``, and not
multicast, reserved or site-local): loopback, private, link-local (169.254.169.254),
carrier-grade NAT (100.64.0.0/10, where 100.100.100.200 is a cloud metadata
service), 0.0.0.0/8, broadcast, documentation and benchmarking ranges, Teredo and
every address of the Docker host Fleet knows of (its bridges' gateways and, with a
local engine, every address of its interfaces, IPv4 and IPv6) are refused, also when
an IPv6 address carries them (``::ffff:127.0.0.1``, NAT64, 6to4). The one exception
is the run's own subnet, and only for a one-label name (so an allowlisted service
box on the run's network is reached by its DNS alias, ``corpus``, while a public
name pointed at the run's boxes is not). The connection goes to the checked address, never to a
second lookup, so DNS rebinding gains nothing.

Why a proxy for the allowlist rather than per-run host firewall rules: it is per run
(its lifetime is the run's, nothing per run to leak on the host), it filters by host
name (what a user writes in an allowlist) rather than by IP, and its decisions are
logged one JSON line each on stderr (``docker logs``). Keeping boxes off the host
itself is a fixed rule set on the host, independent of any run.

The reading of a host is one function, :func:`~.egress_rules.read_host`, and the
address rule one, :func:`~.egress_rules.address_refusal` (both in
:mod:`.egress_rules`); :func:`~.egress_rules.entry_refusal` applies both to an allowlist entry
before any run starts (``egress.allow`` and ``NetworkPolicy.allow`` call it, and the
job reader calls it on every URL's host), so a host the proxy would always refuse -
``localhost``, ``169.254.169.254``, ``0x7f000001``, a private or loopback literal, a
port past 65535 - is an error in the job file, saying what it really is, rather than
a member that fails at its first fetch.

Configuration (environment): ``FLEET_ALLOW`` comma-separated ``host``, ``host:port``
or ``*.domain`` entries; ``FLEET_LOCAL_NET`` the run network's CIDR;
``FLEET_DENY_IPS`` comma-separated addresses of the Docker host to refuse;
``FLEET_PROXY_PORT`` (default 3128). Standard library only.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import socketserver
import sys
import threading
import time

_IDLE_S = 300.0
_HEAD_LIMIT = 64 * 1024

TYPE_CHECKING = False
if TYPE_CHECKING or __package__:  # imported on the host as sandbox.inbox.egress_proxy
    from .egress_rules import IPAddress, address_refusal, disguise_refusal, read_host
else:  # run as a script in the proxy's box, beside it in /opt/fleet (also under -I)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from egress_rules import IPAddress, address_refusal, disguise_refusal, read_host

    del sys.path[0]


class Denied(Exception):
    """The request goes nowhere; the message says why (it is sent to the client)."""


class Policy:
    """Allowlist by name, then refusal by address."""

    def __init__(self, allow: list[str], local_net: str | None, deny_ips: list[str]) -> None:
        self.allow = [a.strip().lower() for a in allow if a.strip()]
        self.local_net = ipaddress.ip_network(local_net, strict=False) if local_net else None
        self.deny_ips = {ipaddress.ip_address(ip.strip()) for ip in deny_ips if ip.strip()}

    def name_allowed(self, host: str, port: int) -> bool:
        """Whether ``host`` (in its plain form, see :func:`read_host`) is allowlisted."""
        host = host.lower()
        for entry in self.allow:
            name, _, want_port = entry.partition(":")
            if want_port and int(want_port) != port:
                continue
            if name.startswith("*."):
                if host.endswith(name[1:]):
                    return True
            elif host == name:
                return True
        return False

    def address_allowed(self, ip: IPAddress, name: str = "") -> str | None:
        """None when ``ip`` (what ``name`` resolved to) may be reached, else why not.

        The run's own network is open only to the name of a box on it: Docker's DNS
        answers a service box's alias, one label (``corpus``). A dotted name that
        resolves there is a public name pointed at the run's boxes (DNS rebinding),
        and an address literal names no box: neither gets the exception.
        """
        local = self.local_net if name and "." not in name else None
        return address_refusal(ip, local, self.deny_ips)

    def resolve(self, host: str, port: int) -> tuple[str, int]:
        """The address to connect to, or :class:`Denied`.

        Every address the name resolves to is checked, and the connection goes to
        one of those, never to a second lookup: DNS rebinding gains nothing. An
        address literal is never looked up at all, and one in disguise is refused.
        """
        form = read_host(host)
        if form.disguises:
            raise Denied(f"{host}: {disguise_refusal(form)}")
        if not self.name_allowed(form.host, port):
            raise Denied(f"{form.host}:{port} is not on this run's allowlist")
        if form.address is not None:
            why = self.address_allowed(form.address)
            if why:
                raise Denied(f"{form.host} is {why}")
            return form.host, port
        try:
            infos = socket.getaddrinfo(form.host, port, type=socket.SOCK_STREAM)
        except OSError as e:
            raise Denied(f"{form.host} does not resolve: {e}") from e
        for *_, sockaddr in infos:
            ip = ipaddress.ip_address(sockaddr[0])
            why = self.address_allowed(ip, form.host)
            if why:
                raise Denied(f"{form.host} resolves to {ip}, {why}")
        return str(infos[0][4][0]), port


def log(**fields: object) -> None:
    fields["t"] = round(time.time(), 3)
    sys.stderr.write(json.dumps(fields) + "\n")
    sys.stderr.flush()


def _split_hostport(text: str, default: int) -> tuple[str, int]:
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else default
    host, sep, port = text.rpartition(":")
    if sep and port.isdigit():
        return host, int(port)
    return text, default


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class ProxyHandler(socketserver.BaseRequestHandler):
    policy: Policy

    def handle(self) -> None:
        client: socket.socket = self.request
        client.settimeout(_IDLE_S)
        try:
            head, rest = self._read_head(client)
            method, target, version = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            if method == "CONNECT":
                host, port = _split_hostport(target, 443)
                upstream = self._open(host, port, method)
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                first = rest
            else:
                if not target.startswith("http://"):
                    raise Denied("only absolute http:// URLs and CONNECT are proxied")
                hostport, _, path = target[len("http://") :].partition("/")
                host, port = _split_hostport(hostport, 80)
                upstream = self._open(host, port, method)
                first = self._rewrite(head, method, "/" + path, version) + rest
        except Denied as e:
            log(decision="deny", client=self.client_address[0], reason=str(e))
            body = f"fleet egress proxy: {e}\n".encode()
            reply = b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\n"
            reply += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            client.sendall(reply + body)
            return
        except (OSError, ValueError):
            return
        with upstream:
            if first:
                upstream.sendall(first)
            back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
            back.start()
            _pipe(client, upstream)
            back.join()

    def _read_head(self, client: socket.socket) -> tuple[bytes, bytes]:
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = client.recv(65536)
            if not chunk:
                raise ValueError("client closed before sending a request")
            buf += chunk
            if len(buf) > _HEAD_LIMIT:
                raise Denied("request head too large")
        head, _, rest = buf.partition(b"\r\n\r\n")
        return head, rest

    def _rewrite(self, head: bytes, method: str, path: str, version: str) -> bytes:
        lines = head.split(b"\r\n")[1:]
        kept = [
            line
            for line in lines
            if not line.lower().startswith((b"proxy-", b"connection:", b"keep-alive:"))
        ]
        request = f"{method} {path} {version}".encode("latin-1")
        return b"\r\n".join([request, *kept, b"Connection: close"]) + b"\r\n\r\n"

    def _open(self, host: str, port: int, method: str) -> socket.socket:
        ip, port = self.policy.resolve(host, port)
        try:
            upstream = socket.create_connection((ip, port), timeout=10)
        except OSError as e:
            raise Denied(f"cannot connect to {host}:{port}: {e}") from e
        upstream.settimeout(_IDLE_S)
        log(
            decision="allow",
            client=self.client_address[0],
            host=host,
            ip=ip,
            port=port,
            method=method,
        )
        return upstream


class ThreadingServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def main() -> int:
    allow = os.environ.get("FLEET_ALLOW", "").split(",")
    policy = Policy(
        allow, os.environ.get("FLEET_LOCAL_NET"), os.environ.get("FLEET_DENY_IPS", "").split(",")
    )
    ProxyHandler.policy = policy
    port = int(os.environ.get("FLEET_PROXY_PORT", "3128"))
    with ThreadingServer(("0.0.0.0", port), ProxyHandler) as server:
        log(decision="start", port=port, allow=policy.allow, local_net=str(policy.local_net))
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Browser boxes: CDP from the host, and egress only to allowlisted hosts through the proxy.

All traffic stays on the run's own network: the allowlisted server is a service box,
the "Docker host" is a server bound to the run network's gateway address, and the
refused destinations are refused by the proxy before any packet leaves it.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
from collections.abc import Iterator

import pytest
from network_support import CONNECT

from sandbox.docker.backend import DockerBackend
from sandbox.docker.firewall import bridge_name
from sandbox.spec import NetworkPolicy, SandboxSpec

pytestmark = [pytest.mark.docker, pytest.mark.chromium, pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def backend(docker_client, images) -> DockerBackend:
    return DockerBackend(docker_client, images=images)


async def docs_service(backend: DockerBackend, run_id: str):
    """A service box that serves its /workspace on docs:8080 to the run's boxes."""
    return await backend.create(
        SandboxSpec(kind="service"),
        run=run_id,
        member="docs",
        command=["python3", "-m", "http.server", "8080", "--directory", "/workspace"],
    )


def interface_address(name: str) -> str:
    """The IPv4 address of a host interface as ``ip`` reports it: the engine's network
    description may omit the gateway (a fresh Debian docker.io 20.10 does for docker0)."""
    out = subprocess.run(
        ["ip", "-o", "-4", "addr", "show", "dev", name], capture_output=True, text=True, check=True
    ).stdout
    return out.split()[3].split("/")[0]


def docker0_address(docker_client) -> str:
    bridge = docker_client.api.inspect_network("bridge")
    return interface_address(bridge["Options"].get("com.docker.network.bridge.name", "docker0"))


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"host-secret-page"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def host_server_factory() -> Iterator:
    servers: list[http.server.HTTPServer] = []

    def start(address: str) -> int:
        server = http.server.HTTPServer((address, 0), _Hello)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server.server_address[1]

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


async def test_browser_reaches_only_allowlisted_hosts(
    backend: DockerBackend, run_id: str, docker_client, host_server_factory
) -> None:
    from playwright.async_api import async_playwright

    service = await docs_service(backend, run_id)
    await service.write_file("page.html", "<html><body><h1>allowed corpus page</h1></body></html>")
    net = docker_client.api.inspect_network(f"fleet-run-{run_id}")
    assert net["Internal"]
    gateway = interface_address(bridge_name(net["Name"]))
    host_port = host_server_factory(gateway)
    # The gateway and the metadata address are even listed, past the check that refuses
    # them in a job (model_construct skips it): the proxy's own address check must hold.
    policy = NetworkPolicy.model_construct(
        egress="allowlist", allow=("docs:8080", gateway, "169.254.169.254")
    )
    browser = await backend.create(
        SandboxSpec(kind="browser", network=policy), run=run_id, member="b"
    )
    try:
        endpoint = await browser.cdp_endpoint()
        assert endpoint == f"http://{browser.ip}:9223"
        async with async_playwright() as pw:
            chromium = await pw.chromium.connect_over_cdp(endpoint)
            page = await chromium.contexts[0].new_page()
            resp = await page.goto("http://docs:8080/page.html")
            assert resp is not None and resp.status == 200
            assert await page.inner_text("h1") == "allowed corpus page"
            for url in (
                f"http://{gateway}:{host_port}/",
                "http://169.254.169.254/latest/meta-data/",
                "http://example.com/",
            ):
                resp = await page.goto(url)
                assert resp is not None and resp.status == 403, url
                assert "fleet egress proxy" in await page.content()
            await chromium.close()
        # Nor straight to the host's listener, around the proxy. (An address, not a
        # name: a name's lookup could go out to the host's resolver.)
        host = f"{gateway}:{host_port}"
        direct = await browser.exec(["python3", "-c", CONNECT, host], timeout=30)
        assert json.loads(direct.stdout)[host] != "connected", direct
    finally:
        await browser.close()
        await service.close()


class _Listener:
    """A raw TCP listener on one of this machine's addresses that counts accepted peers."""

    def __init__(self, address: str) -> None:
        import socket

        self.sock = socket.create_server((address, 0))
        self.address = f"{address}:{self.sock.getsockname()[1]}"
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()


async def test_box_processes_cannot_reach_the_host_or_leave_the_run_network(
    backend: DockerBackend, run_id: str, docker_client
) -> None:
    """A raw socket from exec (no proxy involved) reaches the run's proxy, never the host
    (nor the service box: a member reaches that through the proxy)."""
    service = await docs_service(backend, run_id)
    policy = NetworkPolicy(egress="allowlist", allow=("docs:8080",))
    browser = await backend.create(
        SandboxSpec(kind="browser", network=policy), run=run_id, member="b"
    )
    net_name = f"fleet-run-{run_id}"
    gateway = interface_address(bridge_name(net_name))
    listeners = [_Listener(gateway), _Listener(docker0_address(docker_client))]
    (proxy,) = docker_client.api.containers(
        filters={"label": [f"fleet.run={run_id}", "fleet.kind=proxy"]}
    )
    proxy_nets = proxy["NetworkSettings"]["Networks"]
    proxy_inside = proxy_nets[net_name]["IPAddress"]
    proxy_outside = proxy_nets["fleet-egress"]["IPAddress"]
    try:
        peers = [f"{proxy_inside}:3128"]
        blocked = [*(lis.address for lis in listeners), f"{proxy_outside}:3128"]
        blocked.append(f"{service.ip}:8080")
        res = await browser.exec(["python3", "-c", CONNECT, *peers, *blocked], timeout=30)
        import json

        seen = json.loads(res.stdout)
        assert all(seen[p] == "connected" for p in peers), seen
        assert all(seen[b] != "connected" for b in blocked), seen
        assert [lis.accepted for lis in listeners] == [0, 0]
        # The host still opens connections to the box (that is how CDP gets out).
        assert (await browser.cdp_endpoint()).startswith(f"http://{browser.ip}:")
    finally:
        for lis in listeners:
            lis.sock.close()
        await browser.close()
        await service.close()


async def test_the_proxy_refuses_the_default_bridge_address_even_when_the_engine_omits_it(
    backend: DockerBackend, run_id: str, docker_client
) -> None:
    """On a fresh engine the default bridge's IPAM has no Gateway; docker0's address
    must still be on the proxy's deny list (and be refused when a name resolves to it)."""
    policy = NetworkPolicy(egress="allowlist", allow=("example.org",))
    browser = await backend.create(
        SandboxSpec(kind="browser", network=policy), run=run_id, member="b"
    )
    try:
        (proxy,) = docker_client.api.containers(
            filters={"label": [f"fleet.run={run_id}", "fleet.kind=proxy"]}
        )
        env = docker_client.api.inspect_container(proxy["Id"])["Config"]["Env"]
        deny = next(e for e in env if e.startswith("FLEET_DENY_IPS=")).split("=", 1)[1]
        assert docker0_address(docker_client) in deny.split(","), deny
        assert interface_address(bridge_name(f"fleet-run-{run_id}")) in deny.split(","), deny
    finally:
        await browser.close()


def host_addresses(*options: str) -> list[str]:
    """Every address of this machine, as ``ip`` lists them (``-4``: IPv4 only)."""
    out = subprocess.run(
        ["ip", "-o", *options, "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines()]


async def test_the_egress_proxy_cannot_reach_any_address_of_the_host(
    backend: DockerBackend, run_id: str, docker_client
) -> None:
    """The proxy's way out is a network of its own whose connections to the host are
    refused (docker0, the run network's and its own gateway, the LAN address: every
    address), and its deny list names every address of the host, IPv4 and IPv6."""
    import json

    policy = NetworkPolicy(egress="allowlist", allow=("example.org",))
    before = set(host_addresses())
    browser = await backend.create(
        SandboxSpec(kind="browser", network=policy), run=run_id, member="b"
    )
    (proxy,) = docker_client.api.containers(
        filters={"label": [f"fleet.run={run_id}", "fleet.kind=proxy"]}
    )
    listeners = [_Listener(a) for a in host_addresses("-4") if not a.startswith("127.")]
    try:
        assert {docker0_address(docker_client), interface_address("flt-egress")} <= {
            lis.address.rsplit(":", 1)[0] for lis in listeners
        }
        targets = [lis.address for lis in listeners]
        ran = docker_client.api.exec_create(
            proxy["Id"], ["python3", "-c", CONNECT, *targets], user="1000:1000"
        )
        seen = json.loads(docker_client.api.exec_start(ran))
        assert all(seen[t] != "connected" for t in targets), seen
        assert [lis.accepted for lis in listeners] == [0] * len(listeners)
        env = docker_client.api.inspect_container(proxy["Id"])["Config"]["Env"]
        deny = next(e for e in env if e.startswith("FLEET_DENY_IPS=")).split("=", 1)[1]
        # Link-local ones are refused as such (and new veths get new ones all the time).
        # The list is the host's addresses when the proxy started: those there before
        # and after; a bridge another test made meanwhile (a new address) is refused by
        # the host rules, which the connections above just showed.
        every = {a for a in before & set(host_addresses()) if not a.startswith("fe80:")}
        assert every <= set(deny.split(",")), every - set(deny.split(","))
    finally:
        for lis in listeners:
            lis.sock.close()
        await browser.close()


async def test_a_member_cannot_reach_a_siblings_box_but_the_host_drives_both(
    backend: DockerBackend, run_id: str, docker_client
) -> None:
    """Neither a sibling's CDP relay (:9223) nor any port a sibling's command listens on
    can be opened from a box; the run's proxy still can, and the host still drives
    both browsers."""
    import functools
    import json

    import anyio
    import httpx

    service = await docs_service(backend, run_id)
    policy = NetworkPolicy(egress="allowlist", allow=("docs:8080",))
    one = await backend.create(SandboxSpec(kind="browser", network=policy), run=run_id, member="b1")
    two = await backend.create(SandboxSpec(kind="browser", network=policy), run=run_id, member="b2")
    (proxy,) = docker_client.api.containers(
        filters={"label": [f"fleet.run={run_id}", "fleet.kind=proxy"]}
    )
    proxy_ip = proxy["NetworkSettings"]["Networks"][f"fleet-run-{run_id}"]["IPAddress"]
    try:
        async with anyio.create_task_group() as tg:
            # A port a sibling's command listens on, for as long as the probes run.
            server = functools.partial(two.exec, timeout=60.0)
            tg.start_soon(server, ["python3", "-m", "http.server", "8000"])
            up = await two.exec(
                "for i in $(seq 100); do (echo > /dev/tcp/127.0.0.1/8000) 2>/dev/null"
                " && exit 0; sleep 0.1; done; exit 1"
            )
            assert up.ok, up
            allowed = [f"{proxy_ip}:3128"]
            for box, sibling in ((one, two), (two, one)):
                siblings = [f"{sibling.ip}:9223", f"{sibling.ip}:8000"]
                res = await box.exec(["python3", "-c", CONNECT, *allowed, *siblings], timeout=30)
                seen = json.loads(res.stdout)
                assert all(seen[a] == "connected" for a in allowed), seen
                assert all(seen[s] != "connected" for s in siblings), seen
            async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
                for box in (one, two):
                    pages = await client.get(f"{await box.cdp_endpoint()}/json/list")
                    assert pages.status_code == 200 and isinstance(pages.json(), list)
                held = await client.get(f"http://{two.ip}:8000/")
                assert held.status_code == 200  # the host reaches the sibling's port too
            tg.cancel_scope.cancel()
    finally:
        await one.close()
        await two.close()
        await service.close()


async def test_a_browser_box_builds_no_address_bar_popups(
    backend: DockerBackend, run_id: str
) -> None:
    """Headless Chromium would build the omnibox's two WebUI popups at start, in a
    renderer of their own (about half of its start's CPU) that no CDP client ever sees:
    a box's Chromium has the member's page and nothing of the browser's own UI."""
    box = await backend.create(SandboxSpec(kind="browser"), run=run_id, member="b")
    try:
        await box.cdp_endpoint()  # DevTools answers: Chromium's start is done
        listing = await box.exec(
            ["python3", "-c", "import urllib.request as u; "
             "print(u.urlopen('http://127.0.0.1:9222/json/list').read().decode())"],
            timeout=30,
        )  # fmt: skip
        targets = json.loads(listing.stdout)
        assert [(t["type"], t["url"]) for t in targets] == [("page", "about:blank")], targets
        processes = await box.exec(["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"])
        assert "--type=renderer" in processes.stdout  # the page's
        assert "--top-chrome-webui" not in processes.stdout
    finally:
        await box.close()

"""What a box on a run network may open, port by port, and what its egress proxy
refuses before any packet leaves the machine.

Every connection aims at the run's own boxes (a member's box, the proxy, a service
box). The proxy is asked for carrier-grade NAT addresses it must refuse; a guard
table of the test's own rejects (and counts) anything sent towards 100.64.0.0/10
meanwhile, so even a proxy that wrongly let a request through would send nothing
off the machine, and the count says whether it tried.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator

import anyio
import pytest
from conftest import missing_dependency
from network_support import CONNECT, proxy_exec, run_proxy, service_box

from sandbox.docker.backend import DockerBackend
from sandbox.docker.firewall import PROXY_PORT, SERVICE_PORT
from sandbox.spec import NetworkPolicy, SandboxSpec

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.slow]

OTHER_PORT = 9000
"""A port something listens on in the proxy's and the service's box, that no box may open."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def backend(docker_client, images) -> DockerBackend:
    return DockerBackend(docker_client, images=images)


_FETCH = """
import json, socket, sys
proxy_host, proxy_port = sys.argv[1].rsplit(":", 1)
out = {}
for request in sys.argv[2:]:
    s = socket.create_connection((proxy_host, int(proxy_port)), 5)
    s.settimeout(30)
    s.sendall(request.encode() + b"\\r\\n\\r\\n")
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    out[request.split()[1]] = data.decode("latin-1")
print(json.dumps(out))
"""
"""``python3 -c _FETCH PROXY REQUEST...``: each request head sent to the proxy as it is,
``{target: the whole answer}``."""


_WAIT = """
import socket, sys, time
for _ in range(100):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1).close()
        print("up")
        break
    except OSError:
        time.sleep(0.1)
"""


async def test_a_box_opens_its_proxy_and_service_only_on_their_service_ports(
    backend: DockerBackend, run_id: str, docker_client
) -> None:
    """A member's box opens the proxy on 3128 and nothing else of the run; the proxy
    opens the service box on 8080 only, even for a port its allowlist names."""
    service = await service_box(backend, run_id, SERVICE_PORT, OTHER_PORT)
    await service.write_file("page.html", "<h1>through the proxy</h1>")
    allow = (f"docs:{SERVICE_PORT}", f"docs:{OTHER_PORT}")
    member = await backend.create(
        SandboxSpec(network=NetworkPolicy(egress="allowlist", allow=allow)),
        run=run_id,
        member="m",
    )
    proxy = run_proxy(docker_client, run_id)
    proxy_ip = proxy["NetworkSettings"]["Networks"][f"fleet-run-{run_id}"]["IPAddress"]
    listen = f"python3 -m http.server {OTHER_PORT} --directory /tmp"
    started = docker_client.api.exec_create(proxy["Id"], ["sh", "-c", listen], user="1000:1000")
    docker_client.api.exec_start(started, detach=True)
    waited = proxy_exec(docker_client, proxy, ["python3", "-c", _WAIT, str(OTHER_PORT)])
    assert waited.strip() == "up", waited
    opened = [f"{proxy_ip}:{PROXY_PORT}"]
    refused = [f"{proxy_ip}:{OTHER_PORT}", f"{service.ip}:{SERVICE_PORT}"]
    refused += [f"{service.ip}:{OTHER_PORT}"]
    requests = [f"GET http://docs:{p}/page.html HTTP/1.1" for p in (SERVICE_PORT, OTHER_PORT)]
    from_proxy = [f"{service.ip}:{SERVICE_PORT}", f"{service.ip}:{OTHER_PORT}"]
    out: dict[str, dict] = {}

    async def member_json(key: str, argv: list[str]) -> None:
        out[key] = json.loads((await member.exec(argv, timeout=60)).stdout)

    async def proxy_json(key: str, argv: list[str]) -> None:
        ran = await anyio.to_thread.run_sync(proxy_exec, docker_client, proxy, argv)
        out[key] = json.loads(ran)

    try:
        # At once: a dropped connection waits out its timeout (the proxy's: 10 s).
        async with anyio.create_task_group() as tg:
            tg.start_soon(member_json, "raw", ["python3", "-c", CONNECT, *opened, *refused])
            fetch = ["python3", "-c", _FETCH, f"{proxy_ip}:{PROXY_PORT}", *requests]
            tg.start_soon(member_json, "fetched", fetch)
            tg.start_soon(proxy_json, "from_proxy", ["python3", "-c", CONNECT, *from_proxy])
        seen = out["raw"]
        assert all(seen[t] == "connected" for t in opened), seen
        assert all(seen[t] != "connected" for t in refused), seen
        good = out["fetched"][f"http://docs:{SERVICE_PORT}/page.html"]
        assert good.startswith("HTTP/1.0 200") and "through the proxy" in good, good
        bad = out["fetched"][f"http://docs:{OTHER_PORT}/page.html"]
        assert bad.startswith("HTTP/1.1 403") and "cannot connect" in bad, bad
        assert out["from_proxy"][from_proxy[0]] == "connected", out
        assert out["from_proxy"][from_proxy[1]] != "connected", out
    finally:
        await member.close()
        await service.close()


@pytest.fixture
def guard() -> Iterator[str]:
    """A table of the test's own that rejects and counts every packet the machine
    would send or forward to 100.64.0.0/10; yields its name."""
    name = f"fleet_test_guard_{uuid.uuid4().hex[:8]}"
    rule = "ip daddr 100.64.0.0/10 counter reject with icmpx type admin-prohibited"
    table = f"""
    table inet {name} {{
        chain forward {{ type filter hook forward priority -10; policy accept; {rule}; }}
        chain output {{ type filter hook output priority -10; policy accept; {rule}; }}
    }}
    """
    try:
        done = subprocess.run(["nft", "-f", "-"], input=table, capture_output=True, text=True)
    except FileNotFoundError:
        missing_dependency("nft (Debian's nftables) is needed to guard the machine's egress")
    if done.returncode != 0:
        missing_dependency(f"cannot install a guard table (root needed): {done.stderr.strip()}")
    try:
        yield name
    finally:
        subprocess.run(["nft", "delete", "table", "inet", name], capture_output=True)


def guarded_packets(name: str) -> int:
    listed = subprocess.run(
        ["nft", "-j", "list", "table", "inet", name], capture_output=True, text=True, check=True
    )
    counters = [
        expr["counter"]["packets"]
        for item in json.loads(listed.stdout)["nftables"]
        for expr in item.get("rule", {}).get("expr", [])
        if "counter" in expr
    ]
    assert len(counters) == 2, listed.stdout
    return sum(counters)


async def test_the_proxy_refuses_carrier_grade_nat_without_a_packet_leaving(
    backend: DockerBackend, run_id: str, docker_client, guard: str
) -> None:
    """Even allowlisted (past the job check, which refuses them), a CGNAT address,
    the metadata address in it, and the latter in hexadecimal are refused by the proxy
    in a real box: a 403 saying why, a deny in its log, and not one packet sent."""
    allow = ("100.100.100.200", "100.64.0.1:443", "0x646464c8")
    policy = NetworkPolicy.model_construct(egress="allowlist", allow=allow)
    member = await backend.create(SandboxSpec(network=policy), run=run_id, member="m")
    proxy = run_proxy(docker_client, run_id)
    proxy_ip = proxy["NetworkSettings"]["Networks"][f"fleet-run-{run_id}"]["IPAddress"]
    requests = {
        "http://100.100.100.200/latest/meta-data/": "carrier-grade NAT",
        "100.64.0.1:443": "carrier-grade NAT",
        "http://0x646464c8/latest/meta-data/": "100.100.100.200 in disguise",
    }
    heads = [
        f"{'CONNECT' if '//' not in target else 'GET'} {target} HTTP/1.1" for target in requests
    ]
    try:
        fetched = await member.exec(
            ["python3", "-c", _FETCH, f"{proxy_ip}:{PROXY_PORT}", *heads], timeout=60
        )
        answers = json.loads(fetched.stdout)
        for target, why in requests.items():
            answer = answers[target]
            assert answer.startswith("HTTP/1.1 403") and why in answer, (target, answer)
        logs = docker_client.api.logs(proxy["Id"], stdout=False, stderr=True).decode()
        decisions = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
        assert not [d for d in decisions if d["decision"] == "allow"], decisions
        denied = [d["reason"] for d in decisions if d["decision"] == "deny"]
        assert len(denied) == 3 and all("cannot connect" not in r for r in denied), denied
        assert guarded_packets(guard) == 0
    finally:
        await member.close()

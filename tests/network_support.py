"""Shared pieces of the tests of a run network's reach: the probe a box runs, a
service box, and the run's egress proxy container.

Every probe aims at the run's own boxes, at this machine's own addresses, or at the
egress proxy, which must refuse before any packet leaves: nothing goes anywhere else.
"""

from __future__ import annotations

import docker

from sandbox.base import Sandbox
from sandbox.docker.backend import DockerBackend
from sandbox.spec import SandboxSpec

CONNECT = """
import json, socket, sys, threading
out = {}
def probe(target):
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), 3).close()
        out[target] = "connected"
    except OSError as e:
        out[target] = type(e).__name__
# All at once: a dropped connection takes its whole 3 s timeout to fail.
probes = [threading.Thread(target=probe, args=(t,)) for t in sys.argv[1:]]
for p in probes:
    p.start()
for p in probes:
    p.join()
print(json.dumps(out))
"""
"""``python3 -c CONNECT HOST:PORT...`` prints ``{target: "connected" or the error}``."""


async def service_box(backend: DockerBackend, run_id: str, *ports: int) -> Sandbox:
    """A service box ``docs`` serving its /workspace over HTTP on each of ``ports``."""
    servers = [f"python3 -m http.server {p} --directory /workspace" for p in ports]
    box = await backend.create(
        SandboxSpec(kind="service"),
        run=run_id,
        member="docs",
        command=["sh", "-c", " & ".join([*servers[:-1], f"exec {servers[-1]}"])],
    )
    up = " && ".join(f"(echo > /dev/tcp/127.0.0.1/{p})" for p in ports)
    ready = await box.exec(
        f"for i in $(seq 100); do ({up}) 2>/dev/null && exit 0; sleep 0.1; done; exit 1"
    )
    assert ready.ok, ready
    return box


def run_proxy(docker_client: docker.DockerClient, run_id: str) -> dict:
    """The run's one egress proxy container, as ``docker ps`` lists it."""
    (proxy,) = docker_client.api.containers(
        filters={"label": [f"fleet.run={run_id}", "fleet.kind=proxy"]}
    )
    return proxy


def proxy_exec(docker_client: docker.DockerClient, proxy: dict, argv: list[str]) -> str:
    """Run ``argv`` in the proxy's container as the proxy's user; its output."""
    ran = docker_client.api.exec_create(proxy["Id"], argv, user="1000:1000")
    return docker_client.api.exec_start(ran).decode()

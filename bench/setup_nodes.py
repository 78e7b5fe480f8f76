"""Repository setup on a cluster: each node builds its snapshot, or one builds and ships.

A run on a Ray cluster whose members need one setup can get each node's snapshot in
one of three ways, each measured here against a second Docker engine on this machine
(``tests/node_engine.py``, as the test cluster's nodes use), the node engine holding
Fleet's coding image as a node does after ``fleet images push``:

1. ``build``: the node runs the setup itself (what Fleet does: every node's Preparer
   sets up a key its engine lacks, at most once, all nodes at the same time).
2. ``ship image``: the snapshot made on one engine goes to the other whole
   (``docker save | docker load`` through a local pipe - the lower bound of any image
   transfer; through Ray it costs about 3x that, ``sandbox/images/push.py``).
3. ``ship tree``: only the snapshot's own tree goes (``/opt/fleet/prepared`` read from a
   container of the snapshot, again through a local pipe) and the node commits it over
   its own copy of the member's image, as a setup box's capture is committed.

The setup is ``bench/setup.py``'s (a virtualenv with one package from a wheelhouse),
plus ``--setup-s`` seconds of sleep standing for a slow install. Each round uses a key no
earlier round made. Needs root (the node engine).

    sudo .venv/bin/python bench/setup_nodes.py [--rounds 3] [--setup-s 0]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT / "tests")
sys.path.insert(1, str(ROOT))

from node_engine import node_engine  # noqa: E402
from test_setup_boxes import INSTALL, make_project  # noqa: E402

from sandbox.docker import prepared as store  # noqa: E402
from sandbox.docker.backend import DockerBackend  # noqa: E402
from sandbox.images.catalog import current_refs  # noqa: E402
from sandbox.prepared.capture import PREFIX  # noqa: E402
from sandbox.prepared.prepare import Preparer  # noqa: E402
from sandbox.prepared.spec import SetupSpec  # noqa: E402
from sandbox.spec import SandboxSpec  # noqa: E402


async def _build(backend: DockerBackend, setup: SetupSpec, repo: Path) -> tuple[float, str]:
    preparer = Preparer(backend, f"bench-{uuid.uuid4().hex[:8]}")
    t0 = time.monotonic()
    made = await preparer.prepare(setup, SandboxSpec(), repo, secrets={})
    took = time.monotonic() - t0
    await backend.remove_run(preparer.run)
    assert not made.reused, "the key was on the engine already"
    return took, made.ref


def _ship_image(host: str, node: str, ref: str) -> tuple[float, int]:
    t0 = time.monotonic()
    save = subprocess.Popen(["docker", "-H", host, "save", ref], stdout=subprocess.PIPE)
    count = subprocess.Popen(["wc", "-c"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    load = subprocess.Popen(
        ["docker", "-H", node, "load", "-q"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL
    )
    assert save.stdout and load.stdin and count.stdin
    sent = 0
    while chunk := save.stdout.read(1 << 20):
        sent += len(chunk)
        load.stdin.write(chunk)
    load.stdin.close()
    count.stdin.close()
    count.wait()
    assert save.wait() == 0 and load.wait() == 0
    return time.monotonic() - t0, sent


def _ship_tree(host_client, node_client, ref: str, base: str, key: str) -> tuple[float, int]:
    t0 = time.monotonic()
    cid = host_client.api.create_container(ref, network_disabled=True)["Id"]
    try:
        stream, _ = host_client.api.get_archive(cid, f"/{PREFIX}")
        data = b"".join(stream)
    finally:
        host_client.api.remove_container(cid, force=True)
    # get_archive names entries from the directory's base name; the commit wants them
    # under the prefix's parent, as a capture writes them.
    with tempfile.TemporaryDirectory() as tmp:
        clean = Path(tmp) / "tree.tar"
        with tarfile.open(fileobj=io.BytesIO(data)) as src, tarfile.open(clean, "w") as out:
            parent = str(Path(PREFIX).parent)
            for info in src.getmembers():
                f = src.extractfile(info) if info.isfile() else None
                info.name = f"{parent}/{info.name}"
                out.addfile(info, f)
        store.commit(node_client, base, clean, key=key, labels={}, venv=True)
    return time.monotonic() - t0, len(data)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--setup-s", type=float, default=0.0)
    args = parser.parse_args()
    import docker

    host_client = docker.from_env()
    coding = current_refs(["coding"])["coding"]
    builds_host, builds_node, images, trees = [], [], [], []
    image_bytes, tree_bytes = 0, 0
    with tempfile.TemporaryDirectory(prefix="fleet-bench-nodes-") as tmp:
        repo, wheels = make_project(Path(tmp))
        with node_engine([coding]) as engine:
            engine.loaded()
            node_client = engine.client()
            host_be = DockerBackend(host_client)
            node_be = DockerBackend(node_client, node="bench-node")
            host_addr = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
            for r in range(args.rounds):
                sleep = f" && sleep {args.setup_s:g}" if args.setup_s else ""
                setup = SetupSpec(
                    run=f"{INSTALL}{sleep} # bench {uuid.uuid4().hex[:8]}", wheels=str(wheels)
                )
                took_h, ref = anyio.run(_build, host_be, setup, repo)
                took_n, node_ref = anyio.run(_build, node_be, setup, repo)
                builds_host.append(took_h)
                builds_node.append(took_n)
                node_client.images.remove(node_ref, force=True)
                took_i, image_bytes = _ship_image(host_addr, engine.host, ref)
                images.append(took_i)
                node_client.images.remove(ref, force=True)
                took_t, tree_bytes = _ship_tree(host_client, node_client, ref, coding, f"ship{r}")
                trees.append(took_t)
                for info in store.list_all(node_client):
                    store.remove(node_client, info)
                host_client.images.remove(ref, force=True)
                print(
                    f"round {r + 1}: build here {took_h:.2f}s, on the node {took_n:.2f}s; "
                    f"ship image {took_i:.2f}s; ship tree {took_t:.2f}s",
                    flush=True,
                )
    med = statistics.median
    print(
        f"\nload average {os.getloadavg()[0]:.2f}; medians of {args.rounds} rounds; "
        f"setup = {INSTALL}" + (f" && sleep {args.setup_s:g}" if args.setup_s else "")
    )
    print("| way a node gets the snapshot | seconds | bytes moved | against a build on the node |")
    print("|---|---:|---:|---:|")
    base = med(builds_node)
    rows = [
        ("build on the node (what Fleet does)", base, 0),
        ("ship the image (docker save | load, local pipe)", med(images), image_bytes),
        ("ship the tree and commit on the node (local pipe)", med(trees), tree_bytes),
    ]
    for name, secs, moved in rows:
        print(f"| {name} | {secs:.2f} | {moved / 2**20:.1f} MiB | {secs / base:.2f}x |")
    print(f"(the same build on the coordinator's engine: {med(builds_host):.2f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What a box's start costs the engine, outside Fleet: the floor under fan-out.

    .venv/bin/python bench/box_start.py [--boxes 16] [--rounds 3] [--parts ways,settings,batches]

Every figure is the docker SDK alone on the coding image, ``--boxes`` containers started
at once from threads, each timed until it is ready, with the machine's CPU over that time
(``/proc/stat``: dockerd, containerd, the shims, runc and the kernel, not this script's
threads alone); the boxes are removed between measurements and the parts alternate within
each round.

- ``ways``: how the host reaches a box's agent - ``exec`` (created with ``sleep``, then a
  ``docker exec -i`` of a Python line echoer, answered once: how Fleet reached every
  agent before) against ``attach`` (the echoer is the container's command, the host
  attached to its stdio before the start, no log driver: how a coding box of Fleet's
  image is reached now).
- ``settings``: create and start alone with Fleet's settings (read-only root, tmpfs,
  limits, init, no capabilities), without each group of them, and with none.
- ``batches``: the same boxes started 1, 2, 4, 8 or 16 at a time: when the first, the
  eighth and the last is up.
- ``agent``: the box agent's own start, inside one box of the coding image (read-only
  root, the box's user): ``python3 -I -S`` of the agent's source as the program (how
  every box started it before), of the program that imports the agent from the image's
  bytecode (:mod:`sandbox.inbox.boxagent_main`, how it starts now), and of ``pass`` (the
  interpreter alone). Each ``--once`` with nothing on stdin: the start, then an exit.
  CPU of each child (``getrusage``), alternating, median of ``--boxes`` x ``--rounds``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)  # bench/sandbox.py would shadow the sandbox package

ECHO = "import sys\nfor line in sys.stdin: sys.stdout.write(line); sys.stdout.flush()"
LABELS = {"fleet.bench": "box_start"}
AGENT_STARTS = """import resource, statistics, subprocess, sys
ways = {
    "the agent's source as the program": ["/opt/fleet/boxagent.py", "--once"],
    "the program importing the agent's bytecode": ["/opt/fleet/boxagent_main.py", "--once"],
    "the interpreter alone": ["-c", "pass"],
}
cpu = {way: [] for way in ways}
for _ in range(int(sys.argv[1])):
    for way, argv in ways.items():
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(["python3", "-I", "-S", *argv], stdin=subprocess.DEVNULL, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        used = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        cpu[way].append(used * 1000)
for way, ms in cpu.items():
    print(f"{way}\t{statistics.median(ms):.1f}")
"""


def busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores, /proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def echo_once(sock: Any) -> None:
    raw = getattr(sock, "_sock", sock)
    raw.sendall(b"ready?\n")
    seen = b""
    while b"ready?" not in seen:
        chunk = raw.recv(4096)
        if not chunk:
            raise RuntimeError("the box's stream ended before its answer")
        seen += chunk
    raw.close()


class Engine:
    def __init__(self) -> None:
        import docker

        from sandbox.images.catalog import image_ref

        self.api = docker.from_env().api
        self.image = image_ref("coding")

    def host_config(self, drop: str = "") -> Any:
        settings: dict[str, Any] = {
            "network_mode": "none",
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "read_only": True,
            "tmpfs": {
                "/tmp": "rw,exec,nosuid,nodev,size=268435456,mode=1777",
                "/workspace": "rw,exec,nosuid,nodev,size=1073741824,uid=1000,gid=1000",
            },
            "pids_limit": 256,
            "mem_limit": 2 << 30,
            "memswap_limit": 2 << 30,
            "nano_cpus": 1_000_000_000,
            "init": True,
        }
        if drop == "all":
            settings = {"network_mode": "none"}
        elif drop == "init":
            settings.pop("init")
        elif drop == "tmpfs":
            settings.pop("tmpfs")
            settings["read_only"] = False
        elif drop == "limits":
            for key in ("pids_limit", "mem_limit", "memswap_limit", "nano_cpus"):
                settings.pop(key)
        elif drop == "seccomp":
            settings["security_opt"] = ["no-new-privileges", "seccomp=unconfined"]
        return self.api.create_host_config(**settings)

    def plain(self, drop: str = "") -> Callable[[], str]:
        config = self.host_config(drop)

        def start() -> str:
            box = self.api.create_container(
                self.image, ["sleep", "600"], user="1000:1000", host_config=config, labels=LABELS
            )["Id"]
            self.api.start(box)
            return box

        return start

    def via_exec(self) -> str:
        box = self.plain()()
        run = self.api.exec_create(box, ["python3", "-I", "-S", "-c", ECHO], stdin=True)
        echo_once(self.api.exec_start(run["Id"], socket=True))
        return box

    def via_attach(self) -> str:
        config = self.api.create_host_config(
            network_mode="none", read_only=True, cap_drop=["ALL"], log_config={"type": "none"}
        )
        box = self.api.create_container(
            self.image,
            ["python3", "-I", "-S", "-c", ECHO],
            user="1000:1000",
            host_config=config,
            labels=LABELS,
            stdin_open=True,
        )["Id"]
        sock = self.api.attach_socket(box, params={"stdin": 1, "stdout": 1, "stream": 1})
        self.api.start(box)
        echo_once(sock)
        return box

    def agent_starts(self, times: int) -> dict[str, float]:
        """Median CPU milliseconds of each way to start the agent, in one box."""
        box = self.api.create_container(
            self.image,
            ["python3", "-I", "-S", "-c", AGENT_STARTS, str(times)],
            user="1000:1000",
            host_config=self.api.create_host_config(network_mode="none", read_only=True),
            labels=LABELS,
        )["Id"]
        try:
            self.api.start(box)
            if self.api.wait(box)["StatusCode"] != 0:
                raise RuntimeError(self.api.logs(box).decode())
            lines = self.api.logs(box, stderr=False).decode().split("\n")
        finally:
            self.api.remove_container(box, force=True)
        return {k: float(v) for k, v in (line.split("\t") for line in lines if line)}

    def remove(self, boxes: list[str]) -> None:
        with ThreadPoolExecutor(len(boxes) or 1) as pool:
            list(pool.map(lambda b: self.api.remove_container(b, force=True), boxes))

    def timed(
        self, start: Callable[[], str], n: int, at_once: int
    ) -> tuple[float, float, list[float]]:
        """Wall seconds until all ``n`` are up, machine CPU seconds, each one's ready time."""
        began, cpu = time.monotonic(), busy_s()

        def one(_: int) -> tuple[str, float]:
            box = start()
            return box, time.monotonic() - began

        with ThreadPoolExecutor(at_once) as pool:
            done = list(pool.map(one, range(n)))
        wall, used = time.monotonic() - began, busy_s() - cpu
        self.remove([box for box, _ in done])
        time.sleep(1.0)
        return wall, used, sorted(t for _, t in done)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boxes", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parts", default="ways,settings,batches")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    engine = Engine()
    n = args.boxes
    figures: dict[str, list[tuple[float, float, list[float]]]] = {}
    for _ in range(args.rounds):
        runs: dict[str, tuple[Callable[[], str], int]] = {}
        if "ways" in parts:
            runs["agent by docker exec"] = (engine.via_exec, n)
            runs["agent attached at start"] = (engine.via_attach, n)
        if "settings" in parts:
            for drop in ("", "init", "tmpfs", "limits", "seccomp", "all"):
                what = {"": "", "all": " (none of them)"}.get(drop, f" without {drop}")
                runs[f"start, Fleet's settings{what}"] = (
                    engine.plain(drop),
                    n,
                )
        if "batches" in parts:
            for at_once in sorted({1, 2, 4, 8, n}):
                runs[f"start, {at_once} at a time"] = (engine.plain(), at_once)
        for name, (start, at_once) in runs.items():
            figures.setdefault(name, []).append(engine.timed(start, n, at_once))
    med = statistics.median
    if "agent" in parts:
        starts = [engine.agent_starts(n) for _ in range(args.rounds)]
        print(f"The agent's start in a box of {engine.image}, {n * args.rounds} of each way")
        print("| way | CPU, median of rounds (ms) | each round (ms) |\n|---|---:|---|")
        for way in starts[0]:
            each = ", ".join(f"{r[way]:.1f}" for r in starts)
            print(f"| {way} | {med(r[way] for r in starts):.1f} | {each} |")
        if parts == {"agent"}:
            return 0
    print(f"{n} boxes of {engine.image}, {args.rounds} rounds, load {os.getloadavg()[0]:.1f}")
    print("| | all ready (s) | machine CPU (s) | first / middle ready (s) |\n|---|---:|---:|---:|")
    for name, rows in figures.items():
        first = med(r[2][0] for r in rows)
        middle = med(r[2][len(r[2]) // 2 - 1] for r in rows)
        print(
            f"| {name} | {med(r[0] for r in rows):.2f} | {med(r[1] for r in rows):.2f} "
            f"| {first:.2f} / {middle:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

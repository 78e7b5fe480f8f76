"""OCI runtimes side by side: the CPU one container of the coding image costs each.

    sudo .venv/bin/python bench/runtime.py [--runs 40] [--runtimes runc,crun]

The coding image's file system is exported once into an OCI bundle (read-only root,
``true`` as its command); each runtime then runs it ``--runs`` times (``RUNTIME run``:
create, start, wait, delete), and the CPU of the runtime's processes (children of this
script, user + system) is divided by the runs. That is the runtime's own share of a
box start - dockerd, containerd and the shim come on top, whatever the runtime - and
of every ``docker exec``, which runs the runtime again. Needs root and the runtimes
on PATH (Debian: ``apt-get install crun``); the engine is only read (``docker
export``), never reconfigured.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)  # bench/sandbox.py would shadow the sandbox package


def bundle(into: Path) -> None:
    """The coding image's root file system and a config that runs ``true`` in it."""
    from sandbox.images.catalog import image_ref

    image = image_ref("coding")
    made = subprocess.run(["docker", "create", image, "true"], capture_output=True, text=True)
    made.check_returncode()
    box = made.stdout.strip()
    try:
        rootfs = into / "rootfs"
        rootfs.mkdir()
        export = subprocess.Popen(["docker", "export", box], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(rootfs)], stdin=export.stdout, check=True)
        export.wait()
    finally:
        subprocess.run(["docker", "rm", box], capture_output=True)
    subprocess.run(["runc", "spec"], cwd=into, check=True)
    config = json.loads((into / "config.json").read_text())
    config["process"]["terminal"] = False
    config["process"]["args"] = ["true"]
    config["root"]["readonly"] = True
    (into / "config.json").write_text(json.dumps(config))


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(runtime: str, where: Path, runs: int) -> tuple[float, float] | str:
    """CPU (ms) and wall time (ms) per container run, or why the runtime failed."""
    cpu, wall = children_cpu(), time.perf_counter()
    for i in range(runs):
        done = subprocess.run(
            [runtime, "run", "-b", str(where), f"fleet-bench-{runtime}-{os.getpid()}-{i}"],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:  # a failing run is cheap: never count it as a fast one
            return (done.stderr or done.stdout).strip()[-300:] or f"exit {done.returncode}"
    return (children_cpu() - cpu) / runs * 1e3, (time.perf_counter() - wall) / runs * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--runtimes", default="runc,crun")
    args = ap.parse_args()
    runtimes = args.runtimes.split(",")
    missing = [r for r in runtimes if shutil.which(r) is None]
    if missing:
        sys.exit(f"bench/runtime.py: {', '.join(missing)} not on PATH (apt-get install crun)")
    with tempfile.TemporaryDirectory() as tmp:
        bundle(Path(tmp))
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
        print("| runtime | CPU per container run (ms) | wall (ms) |")
        print("|---|---:|---:|")
        for _ in range(2):  # alternate, so drifting load hits both alike
            for runtime in runtimes:
                got = measure(runtime, Path(tmp), args.runs)
                if isinstance(got, str):
                    print(f"| {runtime} | fails here: {got} | - |")
                else:
                    print(f"| {runtime} | {got[0]:.1f} | {got[1]:.1f} |")


if __name__ == "__main__":
    main()

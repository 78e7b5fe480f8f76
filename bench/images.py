"""Image build figures: from nothing, incremental, and the up-to-date no-op.

    .venv/bin/python bench/images.py            # no-op figures only (seconds)
    .venv/bin/python bench/images.py --cold     # also a full build from nothing

``--cold`` builds every image under a throwaway builder salt (so no existing tag,
docker layer or rootfs/deb cache is reused: a fresh debootstrap from Debian's mirror,
as on a new machine), times it, and removes what it built. Existing images, which
other processes may be using, are not touched. Needs root (debootstrap).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sandbox.docker.engine import connect
from sandbox.images import catalog as images_mod
from sandbox.images.build import ensure_images


def _quantiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"median {statistics.median(ordered) * 1000:7.1f} ms   p95 {p95 * 1000:7.1f} ms"


def noop_figures(n: int) -> None:
    client = connect()
    ensure_images(client=client)  # make sure the no-op case is what we time
    ensure: list[float] = []
    ref: list[float] = []
    for _ in range(n):
        t = time.perf_counter()
        ensure_images(client=client)
        ensure.append(time.perf_counter() - t)
        t = time.perf_counter()
        images_mod.image_ref("coding", client=client)
        ref.append(time.perf_counter() - t)
    client.close()
    setup: list[float] = []
    fleet = Path(sys.executable).with_name("fleet")
    for _ in range(max(3, n // 10)):
        t = time.perf_counter()
        subprocess.run([str(fleet), "setup"], check=True, capture_output=True)
        setup.append(time.perf_counter() - t)
    print(f"ensure_images, all up to date ({n}x):  {_quantiles(ensure)}")
    print(f"image_ref('coding') ({n}x):            {_quantiles(ref)}")
    print(f"'fleet setup', all done ({len(setup)}x):     {_quantiles(setup)}")


def cold_build() -> None:
    images_mod.BUILDER_VERSION = f"bench-{uuid.uuid4().hex[:8]}"  # every tag new
    client = connect()
    with tempfile.TemporaryDirectory(prefix="fleet-bench-cache-") as cache:
        os.environ["FLEET_CACHE_DIR"] = cache  # no rootfs tarball, no downloaded debs
        refs = images_mod.current_refs()
        t0 = time.perf_counter()

        def say(line: str) -> None:
            if line.startswith("built"):
                print(f"  {time.perf_counter() - t0:6.1f} s  {line}", flush=True)

        try:
            ensure_images(client=client, say=say)
            print(f"all {len(refs)} images from nothing: {time.perf_counter() - t0:.1f} s")
        finally:
            for ref in reversed(refs.values()):
                if images_mod.image_exists(client, ref):
                    client.images.remove(ref, force=True)
            client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true", help="also time a build from nothing")
    parser.add_argument("-n", type=int, default=50, help="repetitions of the no-op figures")
    args = parser.parse_args()
    noop_figures(args.n)
    if args.cold:
        cold_build()


if __name__ == "__main__":
    main()

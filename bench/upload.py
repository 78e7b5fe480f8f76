"""Copying a repository into a coding box: what a member waits for before its first turn.

Run: ``.venv/bin/python bench/upload.py [--sizes 1,50,200] [--rounds 3]``. For each
size (MB, in 10 MB files of random bytes plus one small file) it times, on a fresh
box each round, the two steps a coding member's start takes: staging the selection
(``coordinator.nodes.repo_copy.staged_copy``, hard links) and ``upload`` into
``/workspace`` (one request up to ``INLINE_UPLOAD_BYTES``, a tar stream past it).
Prints the median and the throughput, and the load average, which these figures
follow closely on a shared machine. Every box belongs to one run (``bench-<hex>``),
removed at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path and its name would
# shadow the ``sandbox`` package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import anyio  # noqa: E402

from coordinator.nodes.repo_copy import staged_copy  # noqa: E402
from sandbox.docker.backend import INLINE_UPLOAD_BYTES, DockerBackend  # noqa: E402
from sandbox.spec import SandboxSpec  # noqa: E402

FILE_MB = 10


def make_repo(root: Path, mb: int) -> None:
    root.mkdir()
    (root / "README.md").write_text("bench\n")
    left = mb << 20
    i = 0
    while left > 0:
        n = min(left, FILE_MB << 20)
        (root / f"data-{i:03d}.bin").write_bytes(os.urandom(n))
        left -= n
        i += 1


async def one_size(backend: DockerBackend, run: str, repo: Path, mb: int, rounds: int) -> None:
    stage_s, upload_s = [], []
    for r in range(rounds):
        box = await backend.create(SandboxSpec(), run=run, member=f"up{mb}-{r}")
        try:
            t0 = time.perf_counter()
            staged = staged_copy(repo)
            t1 = time.perf_counter()
            try:
                await box.upload(Path(staged.name), "/workspace")
            finally:
                staged.cleanup()
            t2 = time.perf_counter()
            check = await box.exec("du -sm /workspace | cut -f1")
            assert int(check.stdout) >= mb, check
        finally:
            await box.close()
        stage_s.append(t1 - t0)
        upload_s.append(t2 - t1)
    up = statistics.median(upload_s)
    how = "stream" if mb << 20 > INLINE_UPLOAD_BYTES else "one request"
    print(
        f"{mb:>5} MB  stage median {statistics.median(stage_s) * 1000:7.1f} ms   "
        f"upload median {up:6.2f} s ({mb / up:6.1f} MB/s, {how})   "
        f"min {min(upload_s):6.2f} s  max {max(upload_s):6.2f} s   n={rounds}"
    )


async def main(sizes: list[int], rounds: int) -> None:
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    backend = DockerBackend()
    run = f"bench-{uuid.uuid4().hex[:8]}"
    try:
        with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
            for mb in sizes:
                repo = Path(tmp) / f"repo-{mb}"
                make_repo(repo, mb)
                await one_size(backend, run, repo, mb, rounds)
    finally:
        with anyio.CancelScope(shield=True):
            await backend.remove_run(run)
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,50,200", help="MB per repository, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    anyio.run(main, [int(s) for s in args.sizes.split(",")], args.rounds)

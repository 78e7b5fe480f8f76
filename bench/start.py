"""How long a large job waits before its first member starts, through the real CLI.

Writes a job of N coding members (offline model, ``max_parallel = 4``), starts
``fleet run JOB --plain`` as a user would, and reads its stderr: the seconds until the
run directory is made (imports, reading and validating the job, the preflight) and
until the first member is ``running``. Then it sends Ctrl-C, as a user would, and
waits for the run to end (its boxes removed). Nothing but the start is measured.

Usage: ``.venv/bin/python bench/start.py [--members 1000,10000]``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLEET = str(Path(sys.executable).with_name("fleet"))


def write_job(directory: Path, members: int) -> Path:
    lines = [
        'name = "start-bench"',
        f"output_dir = {json.dumps(str(directory / 'runs'))}",
        "[model]",
        'name = "offline"',
        "[fanout]",
        "max_parallel = 4",
    ]
    for i in range(members):
        lines += ["[[members]]", 'kind = "coding"', f'task = "Say hello to member {i}."']
    job = directory / f"job-{members}.toml"
    job.write_text("\n".join(lines) + "\n")
    return job


def measure(job: Path) -> tuple[float, float]:
    """Seconds to the run directory, and to the first running member."""
    started = time.monotonic()
    # SIGINT at its default, so that it ends the run even when this script is a
    # background job (which a shell starts with SIGINT ignored, and children inherit).
    argv = ["env", "--default-signal=INT", FLEET, "run", str(job), "--plain"]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    made = first = float("nan")
    for line in proc.stderr:
        if line.startswith("fleet: run "):
            made = time.monotonic() - started
        if ": running" in line:
            first = time.monotonic() - started
            break
    proc.send_signal(signal.SIGINT)
    proc.stderr.read()
    proc.wait()
    return made, first


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", default="1000,10000", help="comma-separated job sizes")
    args = parser.parse_args()
    print(f"load average: {os.getloadavg()[0]:.1f}")
    print(f"{'members':>8}  {'run directory made':>18}  {'first member running':>20}")
    with tempfile.TemporaryDirectory(prefix="fleet-start-bench-") as tmp:
        for n in (int(x) for x in args.members.split(",")):
            made, first = measure(write_job(Path(tmp), n))
            print(f"{n:>8}  {made:>17.1f}s  {first:>19.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

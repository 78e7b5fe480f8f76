"""How long the ``fleet`` commands that only read take, start-up included.

Each command runs as a user runs it (the ``fleet`` script of this virtualenv, a new
process each time) against a finished offline run made once at the start: ``fleet
--help``, ``fleet runs``, ``fleet trace RUN``, ``fleet trace RUN --json``, ``fleet trace RUN
MEMBER``, ``fleet trace RUN --html FILE``, ``fleet approve RUN`` (nothing waits) and ``fleet run`` on a job
file with a mistake (refused with exit 2). Rounds interleave the commands; the median
of each is printed, with the machine's load average.

Usage: ``.venv/bin/python bench/cli.py [--rounds 7]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLEET = str(Path(sys.executable).with_name("fleet"))


def _offline_run(root: Path) -> Path:
    """One finished run of the offline research job: what the read commands read."""
    done = subprocess.run(
        [FLEET, "research", "How do asyncio tasks get cancelled?", "--members", "2",
         "--model", "offline", "--output-dir", str(root), "--plain"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"the offline run failed:\n{done.stderr[-2000:]}")
    (run,) = [p for p in root.iterdir() if (p / "journal.jsonl").exists()]
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        run = _offline_run(root)
        bad = Path(tmp) / "bad.toml"
        bad.write_text('name = "x"\n[[members]]\nid = "a"\nkind = "coding"\n')
        page = Path(tmp) / "page.html"
        member = sorted(p.name for p in (run / "members").iterdir())[0]
        commands = {
            "fleet --help": ["--help"],
            "fleet runs": ["runs", "--output-dir", str(root)],
            "fleet trace RUN": ["trace", str(run)],
            "fleet trace RUN --json": ["trace", str(run), "--json"],
            "fleet trace RUN MEMBER": ["trace", str(run), member],
            "fleet trace RUN --html FILE": ["trace", str(run), "--html", str(page)],
            "fleet approve RUN": ["approve", str(run)],
            "fleet run BAD_JOB (exit 2)": ["run", str(bad)],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        print(f"load average at the start: {os.getloadavg()[0]:.2f}")
        for _ in range(args.rounds):
            for name, argv in commands.items():
                t0 = time.perf_counter()
                subprocess.run([FLEET, *argv], capture_output=True, timeout=120)
                times[name].append(time.perf_counter() - t0)
        width = max(len(n) for n in commands)
        print(f"{'command':<{width}}  median s  (of {args.rounds})")
        for name, ts in times.items():
            print(f"{name:<{width}}  {statistics.median(ts):8.3f}")


if __name__ == "__main__":
    main()

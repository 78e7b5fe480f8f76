"""The first model call: from ``fleet code`` / ``fleet run`` starting to its first request
arriving at the API, against a bare ``import anthropic`` (issue 43, goal 2).

Each round, interleaved so a drifting shared machine hits every figure alike:

- ``import``: the wall time of ``.venv/bin/python -c "import anthropic"``, a whole
  process (what the SDK's import costs on its own, interpreter start included);
- ``code``: ``fleet code REPO TASK --plain`` (one coding member, a real Docker box, the
  model ``auto`` with ``ANTHROPIC_API_KEY`` set: Claude), from starting the process to
  the member's first ``/v1/messages`` request arriving at the fake Messages API;
- ``run``: the same for ``fleet run JOB --plain``, a job file naming ``claude-sonnet-5``
  and one coding member.

The fake Messages API runs in this process, on 127.0.0.1 (the real ``anthropic``
client talks to it over HTTP); it notes when the first request arrives and answers
with a ``submit_result`` at once, so each run ends quickly and removes its box. The
runs' directories go to a temporary directory.

Printed: each figure's median and range, and the ratios ``code / import`` and
``run / import`` (goal: <= 1.0x). Beside them, the CPU each process had used by
then (every thread; ``/proc/PID/stat`` read as the request arrives, in 10 ms ticks):
on a shared machine, other people's load moves it far less than the wall times.

``--baseline DIR`` measures another checkout's ``fleet`` (its own ``.venv``: a worktree
of an older commit) in the same rounds, for a before/after on a shared machine.

Usage: ``.venv/bin/python bench/first_call.py [--rounds 7] [--baseline DIR]``
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# bench/sandbox.py would shadow the sandbox package: the tests directory (for the
# shared fake-API policy) takes the script's place.
ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT / "tests")
sys.path.insert(1, str(ROOT))

PYTHON = sys.executable
FLEET = str(Path(sys.executable).with_name("fleet"))


class FirstRequest:
    """The fake API's policy, noting when the first request of each run arrives."""

    def __init__(self) -> None:
        from fleet_policies import coding_policy

        self._policy = coding_policy(turns=0)
        self._arrived = threading.Event()
        self.at = 0.0
        self.cpu = 0.0
        self.pid = 0

    def arm(self, pid: int) -> None:
        self._arrived.clear()
        self.at = self.cpu = 0.0
        self.pid = pid

    def __call__(self, body: dict[str, Any]) -> Any:
        if not self._arrived.is_set():
            self.at = time.monotonic()
            self.cpu = process_cpu(self.pid)
            self._arrived.set()
        return self._policy(body)


def process_cpu(pid: int) -> float:
    """CPU seconds process ``pid`` has used so far, every thread (``/proc/PID/stat``)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bare_import() -> tuple[float, float]:
    """Wall and CPU seconds of a whole ``python -c "import anthropic"`` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    subprocess.run([PYTHON, "-c", "import anthropic"], check=True)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def first_call(argv: list[str], env: dict[str, str], seen: FirstRequest) -> tuple[float, float]:
    """Wall seconds from starting ``argv`` to the first request at the fake API, and the
    process's CPU seconds by then; the run is then left to finish (its box removed)
    before the next one starts."""
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    seen.arm(proc.pid)
    _, err = proc.communicate(timeout=600)
    if not seen.at:
        raise SystemExit(
            f"{argv[1]}: no model request arrived (exit {proc.returncode}):\n{err[-3000:]}"
        )
    if proc.returncode != 0:
        raise SystemExit(f"{argv[1]} exited {proc.returncode}:\n{err[-3000:]}")
    return seen.at - started, seen.cpu


def describe(name: str, xs: list[float]) -> str:
    return (
        f"{name:<9} median {statistics.median(xs):.3f} s  "
        f"range {min(xs):.3f}-{max(xs):.3f} s  (n={len(xs)})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="another checkout with its own .venv (e.g. a worktree of an older commit): "
        "its fleet is measured too, in the same rounds, as code@base and run@base",
    )
    args = parser.parse_args()
    from subagents.fake_api import FakeMessagesAPI

    fleets = {"": FLEET}
    if args.baseline:
        fleets["@base"] = str(Path(args.baseline).resolve() / ".venv" / "bin" / "fleet")
    seen = FirstRequest()
    api = FakeMessagesAPI(seen).start()
    api.record = lambda entry: None  # type: ignore[method-assign]  # keep no bodies
    figures: dict[str, list[float]] = {"import": []}
    cpu: dict[str, list[float]] = {"import": []}
    try:
        with tempfile.TemporaryDirectory(prefix="fleet-bench-first-") as tmp:
            base = Path(tmp)
            repo = base / "repo"
            repo.mkdir()
            (repo / "greet.txt").write_text("hello world\n")
            job = base / "job.toml"
            job.write_text(
                'name = "first-call"\n'
                f'output_dir = "{base / "runs"}"\n'
                '[model]\nname = "claude-sonnet-5"\n'
                '[[members]]\nid = "coder"\nkind = "coding"\n'
                'task = "Say hello."\n'
                f'repo = "{repo}"\n'
            )
            env = {
                k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "FLEET_"))
            }
            env |= {"ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": "bench-key"}
            out = ["--plain", "--output-dir", str(base / "runs")]
            commands: dict[str, list[str]] = {}
            for tag, fleet in fleets.items():
                commands[f"code{tag}"] = [fleet, "code", str(repo), "Say hello.", *out]
                commands[f"run{tag}"] = [fleet, "run", str(job), "--plain"]
            for name, argv in commands.items():
                figures[name], cpu[name] = [], []
                first_call(argv, env, seen)  # unmeasured: images checked, caches warm
            for r in range(args.rounds):
                wall, used = bare_import()
                figures["import"].append(wall)
                cpu["import"].append(used)
                for name, argv in commands.items():
                    wall, used = first_call(argv, env, seen)
                    figures[name].append(wall)
                    cpu[name].append(used)
                print(
                    f"round {r + 1}: "
                    + "  ".join(f"{name} {xs[-1]:.3f} s" for name, xs in figures.items()),
                    flush=True,
                )
    finally:
        api.stop()
    med = statistics.median
    print(f"\nload average {os.getloadavg()[0]:.2f}; {args.rounds} rounds")
    for name, xs in figures.items():
        print(describe(name, xs) + f"  CPU median {med(cpu[name]):.2f} s")
    for name in commands:
        ratios = [c / i for c, i in zip(figures[name], figures["import"], strict=True)]
        print(
            f"{name} / import: {med(figures[name]) / med(figures['import']):.2f}x of the medians "
            f"(per round {min(ratios):.2f}-{max(ratios):.2f}x, median {med(ratios):.2f}x; "
            f"CPU {med(cpu[name]) / med(cpu['import']):.2f}x); goal <= 1.0x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

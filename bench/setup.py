"""Repository setup: what a prepared snapshot costs and saves (issue's three goals).

A repository whose test imports a package it does not ship (``tinydep``, from a
wheelhouse the script writes), and a setup that installs it into ``.venv`` and then
works ``--setup-s`` seconds more (a ``sleep``: the stand-in for a real project's slow
install, so the figure does not depend on an index). Every run is the real ``fleet
run JOB --plain`` process; members talk to the fake Messages API (in another process,
on 127.0.0.1) through the real ``anthropic`` client, each call answered after 500 ms,
5 turns with a box exec each and a submit (about 3 s of model latency, as in
``bench/fanout.py``: a member's time is mostly its model's, as it is for real), and
Fleet re-runs the project's test in each box after it submits.

Printed, as medians over ``--rounds`` (each round interleaves every kind of run, so a
drifting machine hits them alike):

1. ``cold``: 8 members that share one setup whose key no earlier run made, against
   the setup's own time (its ``setup`` trace event) plus 1.3x one member's run of the
   same repository without setup. Goal: cold <= setup + 1.3 x one.
2. ``warm``: the same 8 members again (the snapshot reused, nothing set up), against 8
   members of a repository that needs no setup. Goal: warm <= 1.1 x plain.
3. box readiness: a coding box created from the snapshot (its tree copied into
   ``/workspace``) against a plain coding box, each until its first ``exec`` answers,
   ``--boxes`` of each, alternating. Goal: prepared <= 1.2 x plain.

Usage: ``.venv/bin/python bench/setup.py [--rounds 3] [--members 8] [--setup-s 20] [--boxes 10]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT / "tests")  # bench/sandbox.py would shadow the package
sys.path.insert(1, str(ROOT))

FLEET = str(Path(sys.executable).with_name("fleet"))
EDIT = "replace `world` with `fleet` in `greet.txt`"
INSTALL = "python3 -m venv --system-site-packages .venv && .venv/bin/pip install --no-index -r requirements.txt"


def make_project(base: Path) -> tuple[Path, Path, Path]:
    """The test's repository and wheelhouse, and a repository that needs no setup."""
    from test_setup_boxes import make_project as the_tests

    repo, wheels = the_tests(base)
    plain = base / "plain"
    plain.mkdir()
    (plain / "greet.txt").write_text("hello world\n")
    (plain / "test_dep.py").write_text("def test_value():\n    assert True\n")
    return repo, plain, wheels


def job(path: Path, repo: Path, members: int, setup: str | None) -> Path:
    from test_setup_boxes import job_file

    name = f"bench-setup-{members}"
    extra = ("[synthesis]", "enabled = false")
    return job_file(path, repo, [setup] * members, name=name, model="claude-sonnet-5", extra=extra)


def timed_run(job_file: Path, out: Path) -> tuple[float, float]:
    """(wall seconds, the longest ``setup`` event's duration) of one ``fleet run``."""
    t0 = time.monotonic()
    done = subprocess.run(
        [FLEET, "run", str(job_file), "--plain", "--output-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"bench: run of {job_file} failed:\n{done.stdout}\n{done.stderr}")
    runs = sorted(out.iterdir(), key=lambda p: p.stat().st_mtime)
    setup_s = 0.0
    for trace in runs[-1].glob("members/*/trace.jsonl"):
        for line in trace.read_text().splitlines():
            event = json.loads(line)
            if event.get("type") == "sandbox" and event.get("action") == "setup":
                setup_s = max(setup_s, float(event.get("duration_s") or 0))
    return wall, setup_s


def box_ready(rounds: int, ref: str) -> tuple[list[float], list[float]]:
    import anyio

    from sandbox.docker.backend import DockerBackend
    from sandbox.spec import SandboxSpec

    async def main() -> tuple[list[float], list[float]]:
        backend = DockerBackend()
        plain, prepared = [], []
        run = f"r-bench-{uuid.uuid4().hex[:8]}"
        try:
            for i in range(rounds):
                for spec, into in ((SandboxSpec(), plain), (SandboxSpec(prepared=ref), prepared)):
                    t0 = time.monotonic()
                    box = await backend.create(spec, run=run, member=f"b{i}")
                    res = await box.exec(["true"])
                    into.append(time.monotonic() - t0)
                    assert res.ok
                    await box.close()
        finally:
            await backend.remove_run(run)
        return plain, prepared

    return anyio.run(main)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--setup-s", type=float, default=20.0)
    parser.add_argument("--boxes", type=int, default=10)
    parser.add_argument(
        "--boxes-only",
        action="store_true",
        help="make one snapshot (a one-member run) and time boxes only",
    )
    args = parser.parse_args()
    from process_support import served_api

    # The fake Messages API with bench/fanout.py's coding policy, in its own process.
    with served_api([sys.executable, str(ROOT / "bench" / "fanout.py"), "--serve"]):
        return measure(args)


def measure(args: argparse.Namespace) -> int:
    import docker

    from sandbox.docker import prepared as store

    client = docker.from_env()
    cold, warm, plain8, one, setups = [], [], [], [], []
    made: list[str] = []
    with tempfile.TemporaryDirectory(prefix="fleet-bench-setup-") as tmp:
        base = Path(tmp)
        repo, plain, wheels = make_project(base)
        out = base / "runs"
        out.mkdir()
        one_job = job(base / "one.toml", plain, 1, None)
        plain_job = job(base / "plain.toml", plain, args.members, None)
        if args.boxes_only:
            command = f"{INSTALL} # bench {uuid.uuid4().hex[:8]}"
            table = f"{{ run = {json.dumps(command)}, wheels = {json.dumps(str(wheels))} }}"
            timed_run(job(base / "boxes.toml", repo, 1, table), out)
            made += [i.key for i in store.list_all(client) if "bench" in i.setup]
        for r in range(0 if args.boxes_only else args.rounds):
            # A key no earlier round made: the command names the round.
            command = f"{INSTALL} && sleep {args.setup_s:g} # bench {uuid.uuid4().hex[:8]}"
            table = f"{{ run = {json.dumps(command)}, wheels = {json.dumps(str(wheels))} }}"
            setup_job = job(base / f"setup-{r}.toml", repo, args.members, table)
            wall, setup_s = timed_run(setup_job, out)
            cold.append(wall)
            setups.append(setup_s)
            warm.append(timed_run(setup_job, out)[0])
            plain8.append(timed_run(plain_job, out)[0])
            one.append(timed_run(one_job, out)[0])
            print(
                f"round {r + 1}: cold {wall:.2f}s (setup {setup_s:.2f}s)  warm {warm[-1]:.2f}s  "
                f"plain x{args.members} {plain8[-1]:.2f}s  one {one[-1]:.2f}s",
                flush=True,
            )
            made += [i.key for i in store.list_all(client) if "bench" in i.setup]
        ref = next(i.ref for i in store.list_all(client) if i.key == made[-1])
        plain_box, prepared_box = box_ready(args.boxes, ref)
        for info in store.list_all(client):
            if info.key in made:
                store.remove(client, info)
    med = statistics.median
    box_ratio = med(prepared_box) / med(plain_box)
    box_line = (
        f"| box ready (create + first exec) | prepared {med(prepared_box) * 1000:.0f} ms vs plain "
        f"{med(plain_box) * 1000:.0f} ms ({box_ratio:.2f}x) | <= 1.2x | "
        f"{'yes' if box_ratio <= 1.2 else 'no'} |"
    )
    if args.boxes_only:
        print(f"\nload average {os.getloadavg()[0]:.2f}; medians over {args.boxes} boxes each")
        print(box_line)
        return 0
    goal1 = med(setups) + 1.3 * med(one)
    print(f"\nload average {os.getloadavg()[0]:.2f}; medians over {args.rounds} rounds")
    print("| figure | measured | goal | met |")
    print("|---|---|---|---|")
    print(
        f"| {args.members} members, cold setup | {med(cold):.2f} s (setup {med(setups):.2f} s, "
        f"one member {med(one):.2f} s) | <= setup + 1.3 x one = {goal1:.2f} s | "
        f"{'yes' if med(cold) <= goal1 else 'no'} |"
    )
    ratio = med(warm) / med(plain8)
    print(
        f"| {args.members} members, snapshot reused | {med(warm):.2f} s vs {med(plain8):.2f} s "
        f"without setup ({ratio:.2f}x) | <= 1.1x | {'yes' if ratio <= 1.1 else 'no'} |"
    )
    print(box_line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The fresh-machine rehearsal: CI's run of the suite on a new clone of this checkout.

A machine that has run the suite before hides missing set-up steps (an engine already
up, images already built, gVisor already registered, build caches warm). Each rehearsal
starts from what CI starts from: a new ``git clone`` of HEAD (committed work only), no
virtualenv, no Fleet image or container on the engine, the engine stopped, Fleet's gVisor
runtimes gone from ``/etc/docker/daemon.json``, an empty Fleet build cache and no pip
cache - then ``CI=true bash .ci/run`` in the clone, which must set all of that up again.

Each run is made one of three ways, the ways a suite is started for real:

- ``foreground``: a plain child, as a terminal runs it;
- ``background``: a job of a non-interactive shell (``bash -c '... & wait'``), which
  POSIX starts with SIGINT and SIGQUIT ignored - as ``nohup``, scripts and CI runners do;
  the job's ignored signals are read from ``/proc`` and printed, so the row shows that
  the run really was one;
- ``loaded``: foreground, with two CPU-bound processes beside it the whole time (this
  machine has two cores).

    sudo .venv/bin/python bench/rehearse.py                      # all three, in a row
    sudo python3 bench/rehearse.py --ways background --keep      # one; keep the clone

Needs root (it stops the engine and edits ``daemon.json``) and only the standard library.
Every run prints a Markdown row for ``bench/README.md``: the way, the commit, start and
end, the whole command's wall time, its exit code, pytest's summary line and the load
average before and after. The clone, its log and its caches are removed unless
``--keep``; the engine is left running, as ``.ci/run`` left it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
DAEMON_JSON = Path("/etc/docker/daemon.json")
DOCKER_PID = Path("/var/run/docker.pid")
FLEET_RUNTIMES = ("fleet-gvisor", "fleet-gvisor-net")
WAYS = ("foreground", "background", "loaded")
SUMMARY = re.compile(r"^=*\s*(\d[\d,]* (?:passed|failed)[^=]*?) in ([\d.]+)s", re.M)


@dataclass
class Rehearsal:
    way: str
    commit: str
    started: str
    ended: str
    wall_s: float
    exit_code: int
    summary: str
    load_before: str
    load_after: str
    ignored: str

    def row(self) -> str:
        took = f"{int(self.wall_s // 60)} min {int(self.wall_s % 60)} s"
        return (
            f"| {self.way} | {self.commit} | {self.started} -> {self.ended} | {took} | "
            f"{self.exit_code} | {self.summary} | {self.load_before} / {self.load_after} | "
            f"{self.ignored} |"
        )


def _sh(*argv: str, check: bool = True) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise SystemExit(f"rehearse: {' '.join(argv)} failed: {done.stderr.strip()[-500:]}")
    return done.stdout


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def _engine_up() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


def remove_fleet_state() -> None:
    """Fleet's containers and images gone, the engine stopped, Fleet's runtimes
    unregistered: what a new machine's CI has."""
    if _engine_up():
        boxes = _sh("docker", "ps", "-aq", "--filter", "label=fleet.run").split()
        if boxes:
            _sh("docker", "rm", "-f", *boxes, check=False)
        refs = [
            ref
            for ref in _sh("docker", "images", "--format", "{{.Repository}}:{{.Tag}}").split()
            if ref.startswith("fleet-")
        ]
        if refs:
            _sh("docker", "rmi", "-f", *refs)
        stop_engine()
    if DAEMON_JSON.exists():
        config = json.loads(DAEMON_JSON.read_text() or "{}")
        runtimes = config.get("runtimes", {})
        for name in FLEET_RUNTIMES:
            runtimes.pop(name, None)
        if not runtimes:
            config.pop("runtimes", None)
        if config:
            DAEMON_JSON.write_text(json.dumps(config, indent=2) + "\n")
        else:
            DAEMON_JSON.unlink()


def stop_engine() -> None:
    """End the engine this machine started (its pid file), and wait until it has gone."""
    if not DOCKER_PID.exists():
        raise SystemExit("rehearse: the engine answers but has no pid file; stop it by hand")
    pid = int(DOCKER_PID.read_text().strip())
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 120
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"rehearse: dockerd ({pid}) did not stop within 120 s")
        time.sleep(0.2)


@contextlib.contextmanager
def cpu_hogs(n: int) -> Iterator[None]:
    """``n`` CPU-bound processes for the length of the block (only these are ended)."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(n)
    ]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def _ignored(pid: int) -> str:
    """The signals the suite's processes start with ignored, by name, among those a
    shell's job may inherit: read from ``make`` - ``bash .ci/run``'s first child, or the
    process itself once bash has exec'd its last command - since bash ignores SIGQUIT
    itself in every case but gives its children what it was given."""
    deadline = time.monotonic() + 10
    status = ""
    while not status and time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError, IndexError):
            # bash may exec its last command itself: then the process is make already.
            if Path(f"/proc/{pid}/comm").read_text().strip() == "make":
                status = Path(f"/proc/{pid}/status").read_text()
            else:
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
                status = Path(f"/proc/{children[0]}/status").read_text()
        time.sleep(0.05)
    if not status:
        return "?"
    mask = int(re.search(r"^SigIgn:\s*([0-9a-f]+)", status, re.M).group(1), 16)  # type: ignore[union-attr]
    names = [s.name for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM) if mask >> (s - 1) & 1]
    return "+".join(names) or "none"


def run_ci(clone: Path, way: str, log: Path, env: dict[str, str]) -> tuple[int, str]:
    """``bash .ci/run`` in ``clone``, ``way`` (see the module docstring); its exit code,
    and the signals its process ignored."""
    with open(log, "wb") as out:
        if way == "background":
            pidfile = clone.parent / "job.pid"
            job = f"bash .ci/run > {log} 2>&1 & echo $! > {pidfile}; wait $!"
            shell = subprocess.Popen(["bash", "-c", job], cwd=clone, env=env)
            while not pidfile.exists() or not pidfile.read_text().strip():
                time.sleep(0.05)
            ignored = _ignored(int(pidfile.read_text()))
            return shell.wait(), ignored
        with cpu_hogs(2 if way == "loaded" else 0):
            # As a terminal starts it, whatever this script inherited.
            argv = ["env", "--default-signal=INT,QUIT,TERM", "bash", ".ci/run"]
            proc = subprocess.Popen(argv, cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT)
            ignored = _ignored(proc.pid)
            return proc.wait(), ignored


def rehearse(way: str, keep: bool) -> Rehearsal:
    top = Path(tempfile.mkdtemp(prefix="fleet-rehearse-"))
    clone = top / "fleet"
    _sh("git", "clone", "--quiet", "--no-hardlinks", str(HERE), str(clone))
    commit = _sh("git", "-C", str(clone), "rev-parse", "--short", "HEAD").strip()
    remove_fleet_state()
    env = dict(os.environ)
    env |= {"CI": "true", "FLEET_CACHE_DIR": str(top / "cache"), "PIP_NO_CACHE_DIR": "1"}
    env.pop("VIRTUAL_ENV", None)
    log = top / "ci.log"
    print(f"rehearse: {way} run of {commit} in {clone} (log: {log})", file=sys.stderr, flush=True)
    load_before, started, t0 = _load(), time.strftime("%H:%M:%S"), time.monotonic()
    code, ignored = run_ci(clone, way, log, env)
    wall, ended, load_after = time.monotonic() - t0, time.strftime("%H:%M:%S"), _load()
    found = SUMMARY.findall(log.read_text(errors="replace"))
    summary = f"{found[-1][0].strip()} in {found[-1][1]} s of pytest" if found else "no summary"
    if code != 0:
        print(log.read_text(errors="replace")[-4000:], file=sys.stderr)
    if not keep:
        shutil.rmtree(top, ignore_errors=True)
    return Rehearsal(
        way, commit, started, ended, wall, code, summary, load_before, load_after, ignored
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated, of {WAYS}")
    ap.add_argument("--keep", action="store_true", help="keep each clone, its log and caches")
    args = ap.parse_args()
    ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    if not ways or set(ways) - set(WAYS):
        ap.error(f"--ways takes {', '.join(WAYS)}")
    if os.geteuid() != 0:
        ap.error("needs root: it stops the Docker engine and edits /etc/docker/daemon.json")
    print(
        "| way | commit | start -> end | whole command | exit | pytest | load before / after | ignored |"
    )
    print("|---|---|---|---|---:|---|---|---|")
    failed = 0
    for way in ways:
        done = rehearse(way, args.keep)
        print(done.row(), flush=True)
        failed += done.exit_code != 0
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

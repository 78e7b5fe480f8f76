"""Where a command's CPU goes: its own processes by program, the boxes by image, the engine.

    sudo .venv/bin/python bench/suite_cpu.py [--out FILE] -- COMMAND...
    sudo .venv/bin/python bench/suite_cpu.py -- .venv/bin/python -m pytest -q -n 2 tests

Runs COMMAND in a cgroup of its own (root: cgroup v1's ``cpuacct`` hierarchy, or v2)
and prints, when it ends:

* the machine's CPU over the command's wall time, split into the command and every
  process it started (pytest, its workers, ``fleet`` processes, Ray, Chromium for the
  trace page...), the boxes (the Docker engine's cgroup: every container's processes),
  the engine itself (``dockerd``, ``containerd``) and the rest (container shims,
  ``runc``, the kernel, whatever else runs on the machine);
* the command's processes grouped by program (``fleet run``, Ray's ``default_worker``,
  an xdist worker...): CPU seconds and how many there were;
* the boxes grouped by image: CPU seconds and how many.

The per-process and per-box figures are sampled four times a second (a process's
counters are read while it lives; one that lives less than a quarter of a second is
missed, and counted only in the totals, which are exact).

Why this and not a profiler: the suite is bound by this machine's two cores, and most of
its CPU is not in the pytest process - it is in the ``fleet`` processes, Ray workers and
boxes the tests start. What to make cheaper is what this table names.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

V1 = Path("/sys/fs/cgroup/cpuacct")
V2 = Path("/sys/fs/cgroup")
TICK = os.sysconf("SC_CLK_TCK")


def _v1() -> bool:
    return (V1 / "cpuacct.usage").exists()


def _usage_s(group: Path) -> float:
    """CPU seconds of a cgroup and its children (0 when it does not exist)."""
    try:
        if _v1():
            return int((group / "cpuacct.usage").read_text()) / 1e9
        for line in (group / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
    except OSError:
        pass
    return 0.0


def _docker_group() -> Path:
    """The engine's parent cgroup for containers (cgroupfs driver, or systemd's slice)."""
    root = V1 if _v1() else V2
    for name in ("docker", "system.slice"):
        if (root / name).is_dir():
            return root / name
    return root / "docker"


def _box_groups(parent: Path) -> dict[str, Path]:
    """Container id -> its cgroup."""
    found = {}
    for path in parent.iterdir() if parent.is_dir() else ():
        name = path.name
        if name.startswith("docker-") and name.endswith(".scope"):
            name = name[len("docker-") : -len(".scope")]
        if len(name) == 64 and all(c in "0123456789abcdef" for c in name):
            found[name] = path
    return found


def _proc_ticks(pid: str) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[11]) + int(fields[12])


def _label(pid: str) -> str | None:
    """A process's program: ``fleet run``, ``py default_worker.py``, ``chromium``..."""
    try:
        argv = [
            a.decode(errors="replace")
            for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if a
        ]
    except OSError:
        return None
    if not argv:
        return None
    exe = os.path.basename(argv[0])
    if exe.startswith("python") and len(argv) > 1:
        if "-m" in argv[1:-1]:
            return f"py -m {argv[argv.index('-m') + 1]}"
        if argv[1] == "-c":
            return "py -c (an xdist worker, or a test's own script)"
        words = [os.path.basename(a) for a in argv[1:] if not a.startswith("-")][:2]
        return "py " + " ".join(words)
    return exe[:40]


def _engine_ticks() -> int:
    total = 0
    for name in ("dockerd", "containerd"):
        pids = subprocess.run(["pidof", name], capture_output=True, text=True).stdout.split()
        for pid in pids:
            total += _proc_ticks(pid) or 0
    return total


class Sampler(threading.Thread):
    def __init__(self, group: Path, boxes: Path) -> None:
        super().__init__(daemon=True)
        self.group, self.boxes = group, boxes
        self.procs: dict[str, tuple[str, int]] = {}
        self.box_cpu: dict[str, float] = {}
        self.images: dict[str, str] = {}
        self.done = threading.Event()

    def _image(self, box: str) -> str:
        if box not in self.images:
            out = subprocess.run(
                ["docker", "inspect", "--format", "{{.Config.Image}}", box],
                capture_output=True,
                text=True,
            )
            self.images[box] = out.stdout.strip().split(":")[0] or "(gone before it was named)"
        return self.images[box]

    def run(self) -> None:
        seen_before = set(_box_groups(self.boxes))
        while not self.done.wait(0.25):
            try:
                pids = (self.group / "cgroup.procs").read_text().split()
            except OSError:
                pids = []
            for pid in pids:
                ticks = _proc_ticks(pid)
                if ticks is None:
                    continue
                label, old = self.procs.get(pid, (None, 0))
                self.procs[pid] = (label or _label(pid) or "?", max(ticks, old))
            for box, path in _box_groups(self.boxes).items():
                if box in seen_before:
                    continue
                self._image(box)
                self.box_cpu[box] = max(self.box_cpu.get(box, 0.0), _usage_s(path))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="also write the tables to this file")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    if os.geteuid() != 0:
        parser.error("run as root: the command gets a cgroup of its own")
    root = V1 if _v1() else V2
    group = root / f"fleet-bench-{os.getpid()}"
    group.mkdir()
    boxes = _docker_group()
    try:
        before = (_usage_s(root) if _v1() else _all_cpu_s(), _usage_s(boxes), _engine_ticks())
        sampler = Sampler(group, boxes)
        sampler.start()
        started = time.monotonic()
        proc = subprocess.Popen(command, preexec_fn=lambda: _join(group))
        code = proc.wait()
        wall = time.monotonic() - started
        sampler.done.set()
        sampler.join()
        total = (_usage_s(root) if _v1() else _all_cpu_s()) - before[0]
        in_boxes = _usage_s(boxes) - before[1]
        engine = (_engine_ticks() - before[2]) / TICK
        own = _usage_s(group)
    finally:
        _remove(group)
    lines = [
        f"command exit {code}; wall {wall:.0f} s; machine CPU {total:.0f} s "
        f"({total / wall:.2f} cores busy)",
        f"  the command and its processes {own:8.0f} s",
        f"  boxes                         {in_boxes:8.0f} s",
        f"  dockerd + containerd          {engine:8.0f} s",
        f"  the rest                      {total - own - in_boxes - engine:8.0f} s",
        "",
        "the command's processes by program (CPU s, how many):",
    ]
    by_label: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for label, ticks in sampler.procs.values():
        by_label[label] += ticks / TICK
        count[label] += 1
    lines += [f"  {cpu:8.1f} {count[k]:5d}  {k}" for k, cpu in by_label.most_common(30)]
    lines += ["", "boxes by image (CPU s, how many):"]
    by_image: collections.Counter[str] = collections.Counter()
    boxes_of: collections.Counter[str] = collections.Counter()
    for box, cpu in sampler.box_cpu.items():
        by_image[sampler.images.get(box, "?")] += cpu
        boxes_of[sampler.images.get(box, "?")] += 1
    lines += [f"  {cpu:8.1f} {boxes_of[k]:5d}  {k}" for k, cpu in by_image.most_common(15)]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return code


def _all_cpu_s() -> float:
    """The machine's busy CPU seconds since boot (cgroup v2 has no root counter)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    values = [int(v) for v in fields]
    return (sum(values) - values[3] - values[4]) / TICK  # all but idle and iowait


def _join(group: Path) -> None:
    (group / "cgroup.procs").write_text(str(os.getpid()))


def _remove(group: Path) -> None:
    """Move whatever is left to the parent, then remove the group."""
    parent = group.parent / "cgroup.procs"
    for _ in range(50):
        try:
            for pid in (group / "cgroup.procs").read_text().split():
                try:
                    parent.write_text(pid)
                except OSError:
                    pass
            group.rmdir()
            return
        except OSError:
            time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())

"""``fleet doctor``: which of Fleet's guarantees hold here, and what to do about the rest.

One line per guarantee: ``ok``, ``FAIL`` (a guarantee Fleet's security or its runs
rest on does not hold here) or ``warn`` (informational, or a weaker promise), what was
seen, and for the last two the fix. Exit 0 when nothing is ``FAIL``, else 1.

On this machine (:func:`machine_checks`):

- ``engine``: the Docker engine answers.
- ``images``: every image a box runs is built at the tag this checkout's inputs give.
- ``host firewall``: the nftables table that keeps boxes off the host and off each
  other's boxes is in force - read back from the kernel and compared with Fleet's rule
  set (:func:`sandbox.docker.firewall.installed`), in ``external`` mode too, where Fleet
  otherwise takes an administrator's word for it.
- ``isolation``: the engine applies seccomp and can enforce a box's memory, process
  and CPU limits; ``swap limit``: it can keep a box from swapping past its memory.
- ``user namespaces`` and ``gVisor``: informational - whether uid 1000 in a box is
  another uid on the host, and whether Fleet's gVisor runtimes are registered as
  ``fleet setup --gvisor`` registers them (what ``runtime = "gvisor"`` needs).
- ``disk`` and ``memory``: headroom where the engine keeps images and containers, and
  on the machine the boxes run on.

With ``--cluster ADDRESS``: ``ray token auth`` - the cluster refuses a process without
its token (:mod:`sandbox.cluster.auth`, asked as an intruder would) - then, once Fleet
may connect, the checks above on each Fleet node, each line naming its node. The
coordinator's own machine needs no engine then, so it is not checked.

Why one command: each guarantee already fails closed where it is used (a run without
its images, browser boxes without the firewall, an open cluster are refused), but
only when a run needs it; an operator asks before, once, for all of them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ..docker import firewall
from ..errors import SandboxUnavailable

Status = Literal["ok", "FAIL", "warn"]
GiB = 2**30
DISK_FAIL, DISK_WARN = 2 * GiB, 10 * GiB
"""Free space under the engine's data root: images (about 1.6 GB) and boxes' layers."""
MEMORY_FAIL, MEMORY_WARN = GiB // 2, 2 * GiB
"""Available memory: a browser box with a page loaded holds about 260 MiB."""


class Check(BaseModel):
    """One guarantee, as found."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    status: Status
    seen: str
    """What holds, or what does not."""
    fix: str = ""
    """What to do (``FAIL`` and ``warn``)."""

    def line(self, where: str = "") -> str:
        fix = f" - fix: {self.fix}" if self.fix and self.status != "ok" else ""
        return f"{self.status:<5} {where}{self.name}: {self.seen}{fix}"


def machine_checks() -> list[Check]:
    """Every check of this machine (also what each node runs for ``--cluster``)."""
    from docker.errors import DockerException
    from requests.exceptions import RequestException

    from ..docker.engine import connect, engine_host

    try:
        client = connect(timeout=15)
    except SandboxUnavailable as exc:
        down = Check(
            name="engine",
            status="FAIL",
            seen=str(exc).split(". Start it")[0],
            fix="start it ('fleet setup' as root installs and starts it; or "
            "'setsid dockerd >/var/log/dockerd.log 2>&1 &'), or point DOCKER_HOST at it",
        )
        unknown = [
            Check(name=n, status="FAIL", seen="not checked: no engine", fix="start the engine")
            for n in ("images", "isolation", "disk")
        ]
        return [down, *unknown, _firewall(), _memory(local=True)]
    try:
        info = client.info()
        engine = Check(
            name="engine",
            status="ok",
            seen=f"Docker {info.get('ServerVersion', '?')} answers at {engine_host()}",
        )
        images = _images(client)
    except (DockerException, RequestException) as exc:
        seen = f"the engine at {engine_host()} stopped answering ({exc})"
        return [Check(name="engine", status="FAIL", seen=seen, fix="start it again")]
    finally:
        client.close()
    local = engine_host().startswith("unix://")
    return [
        engine,
        images,
        _firewall(),
        *_isolation(info),
        _disk(info, local=local),
        _memory(local=local),
    ]


def _images(client: Any) -> Check:
    from ..images.catalog import IMAGES, current_refs, image_exists

    parents = {d.parent for d in IMAGES}
    boxes = [d.name for d in IMAGES if d.name not in parents]  # the ones boxes run
    try:
        refs = current_refs(boxes)
    except SandboxUnavailable as exc:  # a build input that cannot be read (the extra CA)
        return Check(
            name="images",
            status="FAIL",
            seen=str(exc),
            fix="correct what this names ('fleet images build --no-extra-ca' forgets a "
            "remembered CA bundle)",
        )
    missing = [refs[n] for n in boxes if not image_exists(client, refs[n])]
    if missing:
        return Check(
            name="images",
            status="FAIL",
            seen=f"not built at this checkout's tags: {', '.join(missing)}",
            fix="'fleet images build' (the first time, 'fleet setup' as root)",
        )
    return Check(name="images", status="ok", seen=f"current: {', '.join(refs[n] for n in boxes)}")


def _firewall() -> Check:
    try:
        mode = firewall.mode()
    except SandboxUnavailable as exc:
        return Check(name="host firewall", status="FAIL", seen=str(exc))
    found, seen = firewall.installed()
    if found != "off":
        seen = f"{seen} (FLEET_HOST_FIREWALL={mode})"
    load = (
        "'fleet setup' as root replaces it"
        if mode == "auto"
        else "load sandbox/docker/firewall.py's RULESET with 'nft -f' (after every reboot)"
    )
    if found == "ok":
        return Check(name="host firewall", status="ok", seen=seen)
    if found == "missing" and mode == "auto" and os.geteuid() == 0:
        # Fleet, as root, puts it in place before it creates any run network.
        return Check(
            name="host firewall",
            status="warn",
            seen=f"{seen}; Fleet installs it before its first run network",
            fix="'fleet setup' installs it now",
        )
    fix = {
        "off": "unset FLEET_HOST_FIREWALL and run 'fleet setup' as root: with it off, a "
        "box can reach services on the host and other members' boxes",
        "unreadable": "run 'fleet doctor' as root (with nftables installed) to check it",
        "missing": load,
        "differs": load,
    }[found]
    return Check(name="host firewall", status="FAIL", seen=seen, fix=fix)


def _isolation(info: dict[str, Any]) -> list[Check]:
    security = " ".join(info.get("SecurityOptions") or [])
    lacks = (
        [] if "name=seccomp" in security and "profile=unconfined" not in security else ["seccomp"]
    )
    limits = {"MemoryLimit": "memory", "PidsLimit": "process", "CpuCfsQuota": "CPU"}
    lacks += [f"{what} limits" for key, what in limits.items() if not info.get(key)]
    cgroup = f"cgroup v{info.get('CgroupVersion', '?')}"
    checks = [
        Check(
            name="isolation",
            status="ok",
            seen=f"seccomp, memory, process and CPU limits ({cgroup})",
        )
        if not lacks
        else Check(
            name="isolation",
            status="FAIL",
            seen=f"the engine cannot apply {', '.join(lacks)} ({cgroup})",
            fix="a kernel with seccomp and the memory, pids and cpu cgroup controllers "
            "enabled, and an engine built with seccomp",
        )
    ]
    if not info.get("SwapLimit"):
        checks.append(
            Check(
                name="swap limit",
                status="warn",
                seen="the engine cannot limit swap: a box may swap past its memory limit",
                fix="boot with 'swapaccount=1' (cgroup v1), or use cgroup v2",
            )
        )
    userns = "name=userns" in security
    checks.append(
        Check(name="user namespaces", status="ok", seen="on: a box's users are not the host's")
        if userns
        else Check(
            name="user namespaces",
            status="warn",
            seen="off: a box's uid 1000 is uid 1000 on the host (informational)",
            fix="dockerd --userns-remap=default, if the host's uid 1000 matters",
        )
    )
    checks.append(_gvisor(info))
    return checks


def _gvisor(info: dict[str, Any]) -> Check:
    """Whether boxes may ask for ``runtime = "gvisor"``: Fleet's runtimes registered as
    :mod:`sandbox.docker.gvisor` writes them (a warning otherwise: runc boxes do not need it)."""
    from ..docker.gvisor import RUNSC, RUNTIMES, missing_runtimes

    missing = missing_runtimes(info)
    if not missing:
        return Check(
            name="gVisor",
            status="ok",
            seen=f'runtime = "gvisor" available ({", ".join(RUNTIMES)} -> {RUNSC})',
        )
    return Check(
        name="gVisor",
        status="warn",
        seen=f'runtime = "gvisor" unavailable: the engine lacks {", ".join(missing)} '
        "(boxes run under runc)",
        fix="'fleet setup --gvisor' as root installs runsc and registers it (no engine restart)",
    )


def _headroom(name: str, free: int, fail: int, warn: int, where: str, fix: str) -> Check:
    seen = f"{free / GiB:.1f} GiB free {where}"
    if free < fail:
        return Check(name=name, status="FAIL", seen=seen, fix=fix)
    if free < warn:
        return Check(name=name, status="warn", seen=seen, fix=fix)
    return Check(name=name, status="ok", seen=seen)


def _disk(info: dict[str, Any], *, local: bool) -> Check:
    root = Path(str(info.get("DockerRootDir") or "/var/lib/docker"))
    if not local or not root.is_dir():
        return Check(name="disk", status="warn", seen=f"not checked: {root} is not on this machine")
    return _headroom(
        "disk",
        shutil.disk_usage(root).free,
        DISK_FAIL,
        DISK_WARN,
        f"under {root}",
        "free space there ('fleet images prune' removes superseded images)",
    )


def _memory(*, local: bool) -> Check:
    if not local:
        return Check(
            name="memory", status="warn", seen="not checked: the engine is on another machine"
        )
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        free = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return Check(name="memory", status="warn", seen="not checked: /proc/meminfo unreadable")
    return _headroom(
        "memory",
        free,
        MEMORY_FAIL,
        MEMORY_WARN,
        "(available)",
        "stop what holds it, or run fewer members at once ([fanout] max_parallel)",
    )


def cluster_checks(address: str, *, insecure: bool = False) -> list[tuple[str, Check]]:
    """``ray token auth`` for the cluster, then each Fleet node's :func:`machine_checks`,
    as (where, check); the nodes only once Fleet may connect."""
    try:
        from ..cluster.auth import HOW_TO_TURN_ON, probe, refusal
        from ..cluster.nodes import ClusterUnavailable, connect, on_each_node
    except ImportError:
        return [
            (
                "",
                Check(
                    name="ray",
                    status="FAIL",
                    seen="Ray is not installed",
                    fix="pip install -e '.[cluster]' (make setup does)",
                ),
            )
        ]
    found = probe(address)
    auth = {
        "token": Check(
            name="ray token auth",
            status="ok",
            seen=f"the cluster at {address} refuses a process without its token",
        ),
        "open": Check(
            name="ray token auth",
            status="FAIL",
            seen=f"the cluster at {address} let in a process without a token: anyone who "
            "reaches it can run code on its nodes",
            fix=HOW_TO_TURN_ON,
        ),
    }.get(found.state) or Check(
        name="ray token auth",
        status="FAIL",
        seen=refusal(address, found) or found.detail,
        fix="check the address and that the cluster's head is up",
    )
    out = [("", auth)]
    if found.state == "unreachable":
        return [*out, ("", Check(name="nodes", status="FAIL", seen="not checked: no cluster"))]
    try:
        connect(address, insecure=insecure, probed=found)
        results = on_each_node(address, machine_checks)
    except ClusterUnavailable as exc:  # what is not known to hold does not hold
        return [*out, ("", Check(name="nodes", status="FAIL", seen=f"not checked: {exc}"))]
    for node, checks in results:
        if isinstance(checks, BaseException):
            out.append(
                (
                    f"node {node} ",
                    Check(name="node", status="FAIL", seen=f"did not answer ({checks})"),
                )
            )
            continue
        out += [(f"node {node} ", c) for c in checks]
    return out


def cmd_doctor(args: argparse.Namespace) -> int:
    found: list[tuple[str, Check]]
    if args.cluster:
        found = cluster_checks(args.cluster, insecure=args.insecure_cluster_without_auth)
    else:
        found = [("", c) for c in machine_checks()]
    for where, check in found:
        print(check.line(where), flush=True)
    failed = [c for _, c in found if c.status == "FAIL"]
    summary = f"{len(failed)} guarantee(s) do not hold" if failed else "every guarantee holds"
    print(f"fleet doctor: {summary}", file=sys.stderr)
    return 1 if failed else 0


def register(subparsers: Any) -> None:
    """Add ``fleet doctor``."""
    from ..cluster.auth import add_insecure_flag

    p = subparsers.add_parser(
        "doctor",
        help="say which of Fleet's guarantees hold on this machine (or a cluster's nodes)",
        description="One line per guarantee - ok, FAIL or warn, what was seen, and the fix. "
        "Exit 0 when nothing is FAIL.",
    )
    p.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="check the Ray cluster at ADDRESS: its token authentication, then each Fleet node",
    )
    add_insecure_flag(p)
    p.set_defaults(func=cmd_doctor)

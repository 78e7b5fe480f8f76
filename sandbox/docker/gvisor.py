"""gVisor as a box's runtime: a user-space kernel between the box and the host's.

Under ``runc`` a box's programs make system calls to the host kernel (behind seccomp,
no capabilities, a non-root user): one kernel bug reachable from there is one escape.
Under gVisor (``runsc``) they reach the Sentry, a kernel written in Go that runs as an
ordinary, seccomp-confined host process; the host kernel sees only the Sentry's own
small set of calls. A box asks for it with ``SandboxSpec(runtime="gvisor")``.

Registration. Docker runs ``runsc`` as a second runtime, named in
``/etc/docker/daemon.json`` and read again on SIGHUP (no restart: the engine is
shared, and running boxes stay up). :func:`ensure_registered` installs Debian's
``runsc`` when absent, merges Fleet's two runtimes into that file (every other key
and runtime kept as found) and signals ``dockerd``; root only, idempotent. Two
runtimes because the 2022 ``runsc`` needs its network mode as a runtime argument:
``fleet-gvisor`` (``--network=none``) for boxes with no network, ``fleet-gvisor-net``
(``--network=host``: the Sentry uses the container's own network namespace through
the host's stack, so the host firewall's rules on the box's interface hold as they do
under runc) for boxes on a run network. ``--platform=ptrace`` because these machines
are VMs without nested virtualisation (KVM).

What differs, and how Fleet keeps the promises the same (:func:`host_pids`,
:func:`exec_prefix`, checked by ``tests/test_sandbox_gvisor.py``):

- Processes. Under the ptrace platform each process of the box is backed by host
  stub processes and threads (about five host tasks per box process, measured), all
  in the box's pids cgroup; reaching that cgroup's limit ends the Sentry, so the whole
  box. The box's own process count is therefore held inside gVisor, by
  ``RLIMIT_NPROC`` (which the Sentry enforces for uid 1000 across the box: a fork
  past it is ``EAGAIN``, as under runc), and the host cgroup gets the room those
  processes need on top (:data:`HOST_TASKS_PER_PROCESS`).
- Memory. The Sentry holds every program's memory, so the host's OOM killer can only
  end it, the whole box, where runc would kill the one program. Two holds keep a hog's
  cost its own. Every process started through ``exec`` (and the box's command in a
  coding box) has its address space capped at ``memory`` (``RLIMIT_AS``, soft and
  hard, enforced by the Sentry): one allocation or mapping past it fails (``ENOMEM``;
  Python's ``MemoryError``), and a program cannot lift it. Chromium, the browser box's
  command, gets no such cap: it reserves far more address space than it uses. In a
  browser box, several programs that together pass the box's memory are held by the
  in-box agent's memory guard (:mod:`sandbox.inbox.memguard`, switched on by
  :data:`MEMORY_GUARD_ENV`): it reads the Sentry's own count of used memory every
  10 ms while a command runs and, past the box's limit (``memory`` plus its disks, as
  runc holds it), ends the command holding the most with everything it started; the
  command's reply says ``oom_killed``. Chromium is never its victim. The guard acts
  late by up to a few hundred milliseconds of allocation (about 1 GB/s here): a
  browser box gets :data:`GUARD_ROOM` on the host on top of :data:`SENTRY_MEMORY`
  (peaks measured 34-115 MB past the guard's line for eight 160 MiB processes and
  for a fork bomb of allocators; with only the Sentry's 256 MiB the box still died,
  as the host's reclaim near its limit slows the guard). Weighed and left:
  runsc's own flags (the 2022 ``runsc`` has no memory limit of its own; its
  ``--cgroupfs`` only counts), a cgroup inside the Sentry (the box has no capability
  to set one, and the 2022 Sentry does not enforce one), and an address-space cap
  alone (per process: eight programs under it still pass the box's memory together).
  Not held yet: allocators that left their command's session (the guard finds them
  too slowly; :mod:`sandbox.inbox.memguard` says why). A coding box has no guard: programs that together pass its memory end the box,
  which Fleet reports as ``crashed: oom-killed``.
- Disk. ``/tmp`` and ``/workspace`` are the Sentry's own tmpfs, with their sizes
  enforced: a full disk is ``ENOSPC``, as under runc.
- ``statx``. The 2022 Sentry refuses ``statx`` with ``AT_NO_AUTOMOUNT``, which
  coreutils 9 passes (``ls`` and ``stat`` fail with "Invalid argument"); Fleet's coding
  image carries a preload that drops that flag (nothing is automounted in a box), set
  for gVisor boxes of that image.
- Leftovers. A box whose start fails can leave ``runsc-sandbox``/``runsc-gofer``
  processes on the host with no container behind them; :func:`end_orphans` ends
  them, after such a start and in ``fleet sandbox gc``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SandboxUnavailable
from .engine import DEFAULT_HOST, Say, apt_install, engine_host, is_root

if TYPE_CHECKING:
    import docker

    from ..spec import SandboxSpec

RUNSC = "/usr/bin/runsc"
RUNTIME_OFFLINE = "fleet-gvisor"
RUNTIME_NETWORK = "fleet-gvisor-net"
RUNTIMES: dict[str, list[str]] = {
    RUNTIME_OFFLINE: ["--platform=ptrace", "--network=none"],
    RUNTIME_NETWORK: ["--platform=ptrace", "--network=host"],
}
"""Fleet's runtimes as daemon.json registers them (see the module docstring)."""
DAEMON_JSON = Path("/etc/docker/daemon.json")
DOCKERD_PIDFILE = "/var/run/docker.pid"
RELOAD_TIMEOUT_S = 15.0

SENTRY_MEMORY = 256 * 2**20
"""Host memory a gVisor box gets on top of its own limit: the Sentry, the gofer and the
ptrace stubs, so a box's programs have the same room as under runc."""
GUARD_ROOM = 256 * 2**20
"""Host memory a gVisor browser box gets on top of that: what its programs may allocate
past the box's own limit before the memory guard has ended the command holding the most
(module docstring)."""
HOST_TASKS_PER_PROCESS = 8
"""Host pids allowed per box process under the ptrace platform (about 5 measured, with
room for threads); the box's own count is held by ``RLIMIT_NPROC`` inside."""
HOST_TASKS_BASE = 128
"""Host pids of an idle gVisor box (about 54 measured: Sentry threads, gofer, stubs)."""
MEMORY_GUARD_ENV = "FLEET_MEMORY_GUARD"
"""Names, in a gVisor browser box's environment, the bytes past which the in-box agent's
memory guard (:mod:`sandbox.inbox.memguard`) ends the command holding the most."""
STATX_PRELOAD = "/opt/fleet/gvisor-statx.so"
"""In Fleet's coding image: drops ``AT_NO_AUTOMOUNT`` from ``statx`` (module docstring)."""

_CONTAINER_ID = re.compile(r"(?:^|/)([0-9a-f]{64})(?:/|$)")
"""A container id as a whole argument (runsc-sandbox's last) or path component (the
gofer's ``--bundle``)."""
_RUNSC_PROCESSES = ("runsc-sandbox", "runsc-gofer", "runsc")
_ENGINE_STATE = "/var/run/docker/"
"""Where the default engine keeps runtime state; a runsc process whose ``--root`` is
elsewhere belongs to another engine (one with its own ``--exec-root``)."""


def runtime_name(spec: SandboxSpec, network: str) -> str | None:
    """The engine's runtime for ``spec`` on ``network`` (None: the engine's default)."""
    if spec.runtime != "gvisor":
        return None
    return RUNTIME_OFFLINE if network == "none" else RUNTIME_NETWORK


def host_pids(spec: SandboxSpec) -> int:
    """The box's pids limit on the host (see "Processes" in the module docstring)."""
    if spec.runtime != "gvisor":
        return spec.pids
    return spec.pids * HOST_TASKS_PER_PROCESS + HOST_TASKS_BASE


def host_memory(spec: SandboxSpec) -> int:
    """The box's memory limit on the host (see "Memory" in the module docstring)."""
    if spec.runtime != "gvisor":
        return spec.box_memory_bytes
    guard = GUARD_ROOM if spec.kind == "browser" else 0
    return spec.box_memory_bytes + SENTRY_MEMORY + guard


def exec_prefix(spec: SandboxSpec) -> list[str]:
    """What every process the box's owner starts in it (``exec``, its agent, a long-lived
    process) runs under: gVisor's own limits (``prlimit``, util-linux, in every Debian
    image), nothing under runc. Each such process's address space is capped at
    ``memory``, in browser boxes too (Chromium is not started this way)."""
    if spec.runtime != "gvisor":
        return []
    return ["prlimit", f"--nproc={spec.pids}", f"--as={spec.memory_bytes}", "--"]


def command_prefix(spec: SandboxSpec) -> list[str]:
    """What the box's own command (its image's program: Chromium in a browser box) runs
    under: as :func:`exec_prefix`, without the address-space cap in a browser box
    (Chromium reserves far more address space than it uses)."""
    if spec.runtime != "gvisor":
        return []
    caps = [f"--nproc={spec.pids}"]
    if spec.kind != "browser":
        caps.append(f"--as={spec.memory_bytes}")
    return ["prlimit", *caps, "--"]


def box_env(spec: SandboxSpec) -> dict[str, str]:
    """Environment a gVisor box needs: the memory guard's limit in a browser box (the
    module docstring), the statx preload in a box of Fleet's own coding image."""
    if spec.runtime != "gvisor":
        return {}
    env = {}
    if spec.kind == "browser":
        env[MEMORY_GUARD_ENV] = str(spec.box_memory_bytes)
    if not spec.image and spec.kind in ("coding", "service"):
        env["LD_PRELOAD"] = STATX_PRELOAD
    return env


# ---------------------------------------------------------------- registration


def missing_runtimes(info: dict[str, Any]) -> list[str]:
    """Fleet's runtimes the engine (its ``info()``) does not have, or has otherwise."""
    have = info.get("Runtimes") or {}
    out = []
    for name, args in RUNTIMES.items():
        entry = have.get(name) or {}
        if entry.get("path") != RUNSC or list(entry.get("runtimeArgs") or []) != args:
            out.append(name)
    return out


def merged_config(text: str | None) -> dict[str, Any]:
    """daemon.json's content with Fleet's runtimes set, everything else kept; a file
    that is not a JSON object is refused (it is the administrator's, not ours to fix)."""
    config: Any = {}
    if text is not None and text.strip():
        try:
            config = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SandboxUnavailable(
                f"{DAEMON_JSON} is not valid JSON ({exc}); correct it, then run "
                f"'fleet setup --gvisor' again"
            ) from None
    if not isinstance(config, dict) or not isinstance(config.get("runtimes", {}), dict):
        raise SandboxUnavailable(
            f"{DAEMON_JSON} is not a JSON object with a 'runtimes' object; correct it, "
            f"then run 'fleet setup --gvisor' again"
        )
    runtimes = dict(config.get("runtimes") or {})
    for name, args in RUNTIMES.items():
        runtimes[name] = {"path": RUNSC, "runtimeArgs": list(args)}
    return {**config, "runtimes": runtimes}


def _write_config(config: dict[str, Any]) -> None:
    DAEMON_JSON.parent.mkdir(parents=True, exist_ok=True)
    tmp = DAEMON_JSON.with_name(f".{DAEMON_JSON.name}.fleet-{os.getpid()}")
    tmp.write_text(json.dumps(config, indent=2) + "\n")
    os.replace(tmp, DAEMON_JSON)  # the engine never reads half a file


def _dockerd_pids() -> list[int]:
    """The default engine's dockerd: its pid file, else every dockerd (a reload of
    another engine's own configuration changes nothing there)."""
    try:
        pid = int(Path(DOCKERD_PIDFILE).read_text().strip())
        if Path(f"/proc/{pid}/comm").read_text().strip() == "dockerd":
            return [pid]
    except (OSError, ValueError):
        pass
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and Path(f"/proc/{entry}/comm").read_text().strip() == "dockerd":
                found.append(int(entry))
        except OSError:
            continue
    return found


def ensure_registered(client: docker.DockerClient, say: Say = print) -> None:
    """gVisor's runtimes on the engine: ``runsc`` installed, daemon.json merged, the
    engine reloaded (SIGHUP). Costs one ``info`` when done; root and the local default
    engine only, else :class:`SandboxUnavailable` saying what to do."""
    missing = missing_runtimes(client.info())
    if not missing:
        return
    if engine_host() != DEFAULT_HOST:
        raise SandboxUnavailable(
            f"the engine at {engine_host()} lacks Fleet's gVisor runtimes "
            f"({', '.join(missing)}); run 'fleet setup --gvisor' as root on its machine"
        )
    if not is_root():
        raise SandboxUnavailable(
            f"gVisor is not registered with the Docker engine (missing runtimes: "
            f"{', '.join(missing)}); run 'sudo fleet setup --gvisor', which installs runsc, "
            f"adds them to {DAEMON_JSON} and reloads the engine (no restart)"
        )
    if not Path(RUNSC).exists() and shutil.which("runsc") is None:
        apt_install(["runsc"], say)
    text = DAEMON_JSON.read_text() if DAEMON_JSON.exists() else None
    _write_config(merged_config(text))
    pids = _dockerd_pids()
    if not pids:
        raise SandboxUnavailable(
            f"{DAEMON_JSON} now registers gVisor, but no dockerd process was found to "
            f"reload; start the engine ('fleet setup') and run 'fleet setup --gvisor' again"
        )
    say(f"registering gVisor's runtimes ({', '.join(RUNTIMES)}) in {DAEMON_JSON}; reloading")
    for pid in pids:
        os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + RELOAD_TIMEOUT_S
    while missing_runtimes(client.info()):
        if time.monotonic() > deadline:
            raise SandboxUnavailable(
                f"dockerd did not pick up gVisor's runtimes from {DAEMON_JSON} within "
                f"{RELOAD_TIMEOUT_S:.0f} s of SIGHUP; see its log for why"
            )
        time.sleep(0.2)


def unregistered_message(missing: list[str]) -> str:
    """gVisor was asked for on an engine without it: what to do."""
    return (
        f'runtime = "gvisor" was asked for, but the Docker engine lacks Fleet\'s gVisor '
        f"runtimes ({', '.join(missing)}); run 'fleet setup --gvisor' as root (it installs "
        f'runsc and registers it without restarting the engine), or use runtime = "runc"'
    )


def no_prlimit_message(image: str) -> str:
    """A gVisor box's image lacks ``prlimit``, which holds its limits: what to do."""
    return (
        f"image {image!r} has no 'prlimit' (util-linux), which a gVisor box needs to hold "
        f"its process and memory limits inside gVisor; use an image with util-linux (every "
        f'Debian or Ubuntu image has it) or runtime = "runc"'
    )


# ---------------------------------------------------------------- leftovers


def _runsc_container(pid: int) -> str | None:
    """The container id a runsc process of the default engine serves, or None."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    args = [a.decode("utf-8", "replace") for a in argv if a]
    if not args or os.path.basename(args[0]) not in _RUNSC_PROCESSES:
        return None
    root = next((a.split("=", 1)[1] for a in args if a.startswith("--root=")), "")
    if not root.startswith(_ENGINE_STATE):
        return None
    for arg in reversed(args):
        found = _CONTAINER_ID.search(arg)
        if found:
            return found.group(1)
    return None


def runsc_processes() -> dict[int, str]:
    """Host runsc processes of the default engine: pid -> container id."""
    out: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            cid = _runsc_container(int(entry))
            if cid is not None:
                out[int(entry)] = cid
    return out


def end_orphans(client: docker.DockerClient, *, only: str | None = None) -> int:
    """Kill runsc processes whose container the engine no longer has (``only``: those of
    that container); returns how many. Only on the local default engine, as root: a
    process is judged by the engine it belongs to, never by its name alone."""
    if engine_host() != DEFAULT_HOST or not is_root():
        return 0
    found = runsc_processes()
    if only is not None:
        found = {pid: cid for pid, cid in found.items() if cid == only}
    if not found:
        return 0
    # Listed after the processes: a box created meanwhile is known, never taken for one.
    known = {c["Id"] for c in client.api.containers(all=True, quiet=True)}
    ended = 0
    for pid, cid in found.items():
        if cid in known:
            continue
        try:
            os.kill(pid, signal.SIGKILL)  # also ends a ptrace-stopped process
            ended += 1
        except ProcessLookupError:
            pass
    return ended

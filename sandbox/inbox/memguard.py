"""The box's OOM killer where the kernel's cannot choose: a gVisor box's memory guard.

Under gVisor the host sees one process holding every program's memory, the Sentry;
when the box passes its memory the host's OOM killer ends the Sentry, so the whole
box (Chromium with it), where under runc it would kill the one hog. The agent
(:mod:`boxagent`) therefore runs this guard in gVisor boxes that ask for it
(``FLEET_MEMORY_GUARD=<bytes>`` in the box's environment; see
:mod:`sandbox.docker.gvisor`). Standard library only, baked in beside the agent.

Every :data:`TICK_S`, while a command runs, it reads the Sentry's own count
(``/proc/meminfo``; see :func:`used`). When that passes the limit (the box's memory as
runc holds it: ``memory`` plus its disks), it ends the command holding the most
memory with everything it started: its session and process group, the orphans the
agent (every command's subreaper) adopted from it - those that still carry its
``FLEET_EXEC_ID``, or all of them when it runs alone - and their descendants. Orphans
that dropped both while several commands ran are an owner of their own. Nothing else
is ever touched (Chromium, socat, the init): what a command holds is what it loses.
The agent says so in the command's reply (``oom_killed``, exit 137, a line on stderr).
After a strike the guard waits :data:`SETTLE_S`, then strikes again only while the count
is not shrinking: the Sentry gives a killed command's memory back over some time, and
the next command is not to pay for it.

Why the agent, and polling: the 2022 Sentry enforces no memory limit of its own (no
runsc flag; its cgroupfs only counts), and a box has no capability to set one. The
guard is late by a tick and by the time a kill takes to free memory, during which
programs allocate on (about 1 GB/s here): the host gives a guarded box room for that
(``GUARD_ROOM`` in :mod:`sandbox.docker.gvisor`, with the figures). What the guard
cannot see: a process orphaned with its environment cleared while no agent ran (a
command that killed the agent), and a long-lived process (``start_process``, an MCP
server), which the agent does not start; each is still held by its own address-space
cap (``RLIMIT_AS``, set by the host on everything ``exec`` and ``start_process`` start).
Not held yet: allocators that left their command's session (``setsid`` after a double
fork) are found only by reading the process table, and under the ptrace platform each
read of a process that is faulting pages in waits for it; the host's limit is reached
first, and its OOM killer takes a host stub - Chromium's, the largest, so the page goes
(``tests/test_sandbox_memory_hog.py`` keeps that case as a strict expected failure).
"""

from __future__ import annotations

import os
import signal
import threading
import time

TICK_S = 0.01
"""Seconds between looks at the box's memory while a command runs (none runs: none)."""
NEAR = 0.7
"""Past this share of the limit the guard reads the process table ahead of a strike."""
LOOK_S = 0.1
"""Seconds between those reads."""
SETTLE_S = 0.25
"""After a strike, seconds before the next: the kill's memory is being given back."""
MARKER = b"FLEET_EXEC_ID="
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_lock = threading.Lock()
_started = False
_commands: dict[int, str] = {}  # running commands: main pid -> marker; none: no looks
_wake = threading.Event()
_ended: set[int] = set()  # main pids of commands the guard ended, until asked for


def limit() -> int:
    """Bytes the box's programs and files may hold (0: no guard in this box)."""
    try:
        return max(0, int(os.environ.get("FLEET_MEMORY_GUARD") or 0))
    except ValueError:
        return 0


def used() -> int | None:
    """Bytes the host charges the box for, by the Sentry's own count, or None.

    ``MemTotal - MemAvailable`` less ``Mapped``: the Sentry counts the image's files
    that programs map (Chromium's binary, its libraries, about 360 MB) as used, but
    those are the host's page cache, shared and reclaimable, which no OOM kill is
    about; programs' pages and tmpfs files are what the host cannot take back."""
    want = (b"MemTotal", b"MemAvailable", b"Mapped")
    fields: dict[bytes, int] = {}
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                key, _, rest = line.partition(b":")
                if key in want:
                    fields[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if len(fields) != len(want):
        return None
    return fields[b"MemTotal"] - fields[b"MemAvailable"] - fields[b"Mapped"]


def start(agent: int) -> None:
    """Start the guard once, if this box asks for one (a thread; none left: no guard)."""
    global _started
    with _lock:
        if _started or not limit():
            return
        _started = True
    try:
        threading.Thread(target=_watch, args=(agent, limit()), daemon=True).start()
    except RuntimeError:  # the pids limit leaves no room for a thread
        with _lock:
            _started = False


def running(main: int, marker: str, *, done: bool = False) -> None:
    """Command ``main`` (its own process, its session and group) with ``marker`` (its
    ``FLEET_EXEC_ID``) started, or is ``done``."""
    with _lock:
        if done:
            _commands.pop(main, None)
        else:
            _commands[main] = marker
        if _commands:
            _wake.set()
        else:
            _wake.clear()


def ended(main: int) -> bool:
    """Whether the guard ended command ``main`` (asked once, when it finished)."""
    with _lock:
        if main in _ended:
            _ended.discard(main)
            return True
        return False


def _watch(agent: int, cap: int) -> None:
    last, quiet_until = 0, 0.0
    seen: dict[int, tuple[int, int, int]] = {}
    seen_at = 0.0
    while True:
        _wake.wait()
        time.sleep(TICK_S)
        now = used()
        if now is None:
            continue
        clock = time.monotonic()
        if now > cap * NEAR and clock - seen_at > LOOK_S:
            # Near the line, the process table is read ahead: reading it once the
            # allocators are at full speed waits for them (each read of a process that
            # is faulting pages in does), while memory keeps growing.
            seen, seen_at = _table(), clock
        # A struck command's memory comes back over a while: until it stops shrinking,
        # the next command (often the one that looks at what happened) is not to blame.
        if now > cap and now >= last and clock >= quiet_until:
            if strike(agent, seen if clock - seen_at < 1.0 else None) is not None:
                quiet_until = time.monotonic() + SETTLE_S
        last = now


def _table() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, pgid, sid) of every live process but the init."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or name == "1":
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in (b"Z", b"X"):
            out[int(name)] = (int(fields[1]), int(fields[2]), int(fields[3]))
    return out


def _resident(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _carries(pid: int, marker: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"\0{MARKER.decode()}{marker}\0".encode() in b"\0" + f.read() + b"\0"
    except OSError:
        return False


def _with_descendants(found: set[int], table: dict[int, tuple[int, int, int]]) -> set[int]:
    grew = True
    while grew:
        more = {pid for pid, (ppid, _, _) in table.items() if ppid in found} - found
        grew = bool(more)
        found |= more
    return found


def members(
    agent: int, main: int, marker: str, table: dict[int, tuple[int, int, int]], alone: bool
) -> set[int]:
    """The live processes of command ``main``: its session and group, the orphans the
    agent adopted from it (all of them when it runs ``alone``, else those that carry
    its marker), and everything descending from any of these."""
    found = {pid for pid, (_, pgid, sid) in table.items() if main in (pgid, sid)}
    for pid, (ppid, _, _) in table.items():
        if ppid == agent and pid not in _commands and (alone or _carries(pid, marker)):
            found.add(pid)
    return _with_descendants(found, table) - {agent}


STRAYS = -1
"""The owner of the orphans no running command claims (they left their session and
dropped their marker while another command ran)."""


def _owners(
    agent: int, commands: dict[int, str], table: dict[int, tuple[int, int, int]]
) -> dict[int, set[int]]:
    """Several commands run: each one's processes, and the strays no one claims."""
    groups = {main: members(agent, main, mark, table, False) for main, mark in commands.items()}
    claimed = set().union(*groups.values())
    orphans = {p for p, (pp, _, _) in table.items() if pp == agent and p not in _commands}
    groups[STRAYS] = _with_descendants(orphans - claimed, table) - {agent}
    return groups


def strike(agent: int, seen: dict[int, tuple[int, int, int]] | None = None) -> int | None:
    """End the command holding the most memory, everything it started with it; its
    main pid (:data:`STRAYS`: the unclaimed orphans were ended), or None when no
    command runs (the guard then leaves the box alone).

    One command running (the usual case) is ended with one ``killpg`` before anything
    is read: reading a process that is busy faulting pages in waits for it, and the
    box's memory keeps growing meanwhile. Passes then find what left its group, the
    first on the process table read ahead (``seen``), until one finds nothing."""
    with _lock:  # one already ended is not struck again while its memory is given back
        commands = {main: mark for main, mark in _commands.items() if main not in _ended}
    if not commands:
        return None
    alone = len(commands) == 1
    if alone:
        (victim,) = commands
    else:
        groups = _owners(agent, commands, _table())
        sizes = {owner: sum(_resident(p) for p in pids) for owner, pids in groups.items()}
        victim = max(sizes, key=lambda o: sizes[o])
    if victim != STRAYS:
        with _lock:
            _ended.add(victim)
        try:
            os.killpg(victim, signal.SIGKILL)
        except OSError:
            pass
    for attempt in range(50):
        table = seen if attempt == 0 and seen else _table()
        if victim == STRAYS:
            left = _owners(agent, commands, table)[STRAYS]
        else:
            left = members(agent, victim, commands[victim], table, alone)
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
    return victim

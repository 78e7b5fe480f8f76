"""Fleet's in-box agent: runs commands and file operations for the host over one stream.

Baked into every Fleet image at ``/opt/fleet/boxagent.py``, with its bytecode, and
started once per box: as the box's PID 1 (``--init``), or by the host with ``docker
exec -i <box> python3 -I -S /opt/fleet/boxagent_main.py``, the program that imports
this module (:mod:`sandbox.inbox.boxagent_main` says why). Standard library only: the
box image needs nothing but ``python3``.

The wire - every operation's request and reply, and the frame they travel in (a
4-byte big-endian length, then that many bytes of UTF-8 JSON) - is declared in
:mod:`sandbox.inbox.wire`, which the host imports too. Every request has an ``id``
that its response repeats, so many requests run at once (each in a thread).

Why an agent rather than one ``docker exec`` per command: each ``docker exec`` costs
a round trip through the engine, containerd and runc (about 55 ms here); a request
on an already-open stream costs well under a millisecond in the box. The timeout and
the output cap are enforced here, inside the box, so they hold whatever the host does:
each command runs in its own session (process group) and on timeout the whole group
is killed with SIGKILL; output beyond the cap keeps its head and tail.

A command's processes end with it. When it exits or times out, what it left running is
killed and counted in its reply (``leftovers``), with a line on stderr saying so: its
process group (one ``killpg``, which also stops a fork bomb, whose copies never leave
the group), every process of its session, and every process whose environment still
carries the command's ``FLEET_EXEC_ID`` (a ``setsid`` daemon keeps it). The agent is a
child subreaper, so a process that both left the session and cleared its environment
is re-parented to the agent when its parent dies, and killed as soon as no command
runs (while one runs, it cannot be told apart from that command's own). When the box
can no longer start a process (its pids limit is reached), the request fails with
``no_processes`` rather than a made-up exit code, and so does ``probe``, the host's
health check.

Four files, this one and ``wire.py``, ``stamps.py`` and ``memguard.py`` beside it in
``/opt/fleet``. ``python3 -I`` keeps the script's directory off ``sys.path``, so this
file puts its own directory there for those imports. Hosts whose image lacks the agent
send the sources with ``python3 -c`` (:func:`sandbox.docker.boxops.agent_source`), the
other three defined first.

In a gVisor box that asks for it, the agent also runs :mod:`memguard`, the OOM killer
the Sentry lacks: when the box's memory runs out it ends the command holding the most,
never Chromium; that command's reply says ``oom_killed`` and why on stderr.

An ``exec`` request with ``stamps`` gets the workspace's stamps print
(:mod:`sandbox.inbox.stamps`) in its reply, taken once the command and what it left
running have ended: a coding member's checkpoint needs no call of its own after a
turn whose commands changed nothing.

Run with ``--once`` it answers exactly one request read from stdin and exits; the
host uses that as a fallback when the long-lived stream broke, and for a large upload,
whose archive follows the request on stdin as raw bytes (see :func:`op_tar_in`).
"""

from __future__ import annotations

import binascii
import contextlib
import errno
import io
import os
import selectors
import signal
import stat
import subprocess
import sys
import threading
import time

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs startup time
if TYPE_CHECKING:
    import tarfile
    from collections.abc import Callable, Iterator, Mapping
    from typing import Any, BinaryIO, Literal

    from . import memguard, stamps, wire
elif "wire" in sys.modules:  # the inline fallback defined them (see the docstring)
    import memguard
    import stamps
    import wire
else:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import memguard
    import stamps
    import wire

    del sys.path[0]

ROOTS = ("/workspace", "/tmp")
# Startup time is part of every box's cold start: binascii instead of base64 (which
# pulls in re and enum), and tarfile only when a tree is copied.
_MAX_FRAME = wire.MAX_FRAME
_TAR_BUF = 1024 * 1024
_out_lock = threading.Lock()
_running: dict[int, int] = {}  # request id -> process group id, for "kill"
_running_lock = threading.Lock()
_mains: set[int] = set()  # commands' own processes, until waited for (never leftovers)
_procs_lock = threading.Lock()  # a start and a leftover pass never overlap
_SPAWN_RETRY_S = 2.0
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_DUMPABLE = 4
_subreaper = False


class Refused(Exception):
    """A request the agent will not perform; ``code`` is machine readable."""

    def __init__(self, code: wire.ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code: wire.ErrorCode = code


def b64encode(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode()


def b64decode(text: str) -> bytes:
    return binascii.a2b_base64(text)


def _read_exact(stream: BinaryIO, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def read_frame(stream: BinaryIO) -> dict[str, Any] | None:
    head = _read_exact(stream, wire.HEADER.size)
    if head is None:
        return None
    (size,) = wire.HEADER.unpack(head)
    if size > _MAX_FRAME:
        raise Refused("bad_frame", f"frame of {size} bytes is over the limit")
    body = _read_exact(stream, size)
    return None if body is None else wire.decode(body)


def write_frame(stream: BinaryIO, msg: Any) -> None:
    frame = wire.encode(msg)
    with _out_lock:
        stream.write(frame)
        stream.flush()


# ---------------------------------------------------------------- paths


def _inside_roots(real: str) -> bool:
    for root in ROOTS:
        real_root = os.path.realpath(root)
        if real == real_root or real.startswith(real_root.rstrip("/") + "/"):
            return True
    return False


def safe_path(path: str) -> str:
    """The real path of ``path``, refused when it (or a symlink on the way) leaves the roots."""
    if not path.startswith("/"):
        raise Refused("path_refused", f"path {path!r} is not absolute")
    real = os.path.realpath(path)
    if not _inside_roots(real):
        raise Refused("path_refused", f"path {path!r} resolves to {real!r}, outside {ROOTS}")
    return real


# ---------------------------------------------------------------- exec


class _Capture:
    """Keeps the first and last ``limit // 2`` bytes of a stream and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.half = max(limit // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.half:
                del self.tail[: len(self.tail) - self.half]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def value(self) -> bytes:
        if not self.truncated:
            return bytes(self.head + self.tail)
        dropped = self.total - len(self.head) - len(self.tail)
        marker = f"\n[... {dropped} bytes dropped ...]\n".encode()
        return bytes(self.head) + marker + bytes(self.tail)


def oom_kills() -> int | None:
    """The memory cgroup's OOM-kill counter (cgroup v2, then v1), or None if unreadable."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except OSError:
            continue
    return None


def _feed_stdin(proc: subprocess.Popen, data: bytes) -> None:
    assert proc.stdin is not None  # started with stdin=PIPE
    try:
        if data:
            proc.stdin.write(data)
        proc.stdin.close()
    except OSError:
        pass  # the command exited without reading all of it


class _StdinFeeder:
    """Writes a command's stdin from a thread started *before* the command.

    A command may fill the box's pids limit the moment it starts (a fork bomb does), and
    a thread is a pid too: a feeder started after the command could then not start, and
    the command would be refused as if it had never run. So the thread exists first and
    waits to be handed the process; with no stdin there is no thread at all.
    """

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.proc: subprocess.Popen | None = None
        self.handed = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()  # RuntimeError when no thread is left: nothing started yet

    def _run(self) -> None:
        self.handed.wait()
        if self.proc is not None:
            _feed_stdin(self.proc, self.data)

    def hand(self, proc: subprocess.Popen | None) -> None:
        self.proc = proc
        self.handed.set()


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def _pump(proc: subprocess.Popen, caps: dict, deadline: float | None) -> bool:
    """Read both streams until EOF; returns True when the deadline killed the group."""
    sel = selectors.DefaultSelector()
    for name in ("stdout", "stderr"):
        stream = getattr(proc, name)
        os.set_blocking(stream.fileno(), False)
        sel.register(stream, selectors.EVENT_READ, name)
    timed_out = False
    exited_at: float | None = None
    while sel.get_map():
        now = time.monotonic()
        if not timed_out and deadline is not None and now >= deadline:
            timed_out = True
            _kill_group(proc.pid)
            exited_at = now
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        # A background child may hold the pipes after the command exits; give it a
        # short grace to finish writing, then stop listening (it keeps running).
        if exited_at is not None and now - exited_at > 0.25:
            break
        wait = 0.05 if exited_at is None else 0.02
        if deadline is not None and not timed_out:
            wait = min(wait, max(deadline - now, 0.0))
        for key, _ in sel.select(wait):
            try:
                chunk = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if chunk:
                caps[key.data].add(chunk)
            else:
                sel.unregister(key.fileobj)
    sel.close()
    return timed_out


def _shell_argv(cmd: str) -> list[str]:
    shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
    return [shell, "-c", cmd]


class _NotStarted(Exception):
    """The program could not be started; ``code`` is the shell's exit status for it."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _spawn(argv: list[str], cwd: str, env: dict) -> subprocess.Popen:
    """Start ``argv`` in a new session, with a shell's exit statuses when it cannot be.

    The contract of :meth:`Sandbox.exec`, the same as ``bash`` and ``docker exec`` with
    ``timeout`` give on the other exec paths: 127 and ``PROG: No such file or
    directory`` when the program (or the working directory) is missing, 126 and
    ``PROG: Permission denied`` when it is not executable or is a directory. A file
    that is executable but no binary and has no ``#!`` line runs with ``/bin/sh``, as
    ``execvp`` (and so every shell) does.
    """
    popen: dict[str, Any] = {
        "cwd": cwd,
        "env": env,
        "stdin": subprocess.PIPE,
        "stdout": subprocess.PIPE,
        "stderr": subprocess.PIPE,
        "start_new_session": True,
        "close_fds": True,
    }
    _become_subreaper()
    give_up = time.monotonic() + _SPAWN_RETRY_S
    try:
        while True:
            try:
                with _procs_lock, _scored_for_the_oom_killer():
                    try:
                        proc = subprocess.Popen(argv, **popen)
                    except OSError as e:
                        if e.errno != errno.ENOEXEC:
                            raise
                        proc = subprocess.Popen(["/bin/sh", *argv], **popen)
                    _mains.add(proc.pid)
                    return proc
            except OSError as e:
                # Out of pids: another command's leftovers may be on their way out.
                if e.errno != errno.EAGAIN or time.monotonic() > give_up:
                    raise
                time.sleep(0.05)
    except FileNotFoundError as e:
        what = e.filename if e.filename == cwd else argv[0]
        raise _NotStarted(127, f"{what}: No such file or directory\n") from None
    except OSError as e:
        if e.errno == errno.EAGAIN:
            raise Refused("no_processes", _no_processes()) from None
        raise _NotStarted(126, f"{argv[0]}: {e.strerror or e}\n") from None


_score_fd: int | None = None
"""The agent's own ``/proc/self/oom_score_adj``, opened before it made itself not
dumpable (after that the file is root's, and the agent's user may not open it)."""
_own_score = b"0"


@contextlib.contextmanager
def _scored_for_the_oom_killer() -> Iterator[None]:
    """Start commands with the highest OOM score there is (1000), from their first
    instruction on.

    The command, not this agent nor Chromium (whose renderers score themselves 300), is
    the OOM killer's first choice, so a hog of any size goes before a page does. A
    child takes its score from its parent when it is forked, so the agent holds 1000
    itself for as long as ``Popen`` takes (under ``_procs_lock``, so no other start
    overlaps) and goes back to its own score after. Written into the started process
    instead, the score lands a moment after ``exec``: a command that forks at once
    (eight allocators, each smaller than Chromium) has children that keep the old
    score, and the OOM killer ends Chromium before them. A hostile command may lower
    its own score again (down to the box's floor, 0), or raise another's: it can cost
    only its own box, never a sibling's.

    The write goes through a descriptor kept from before the agent stopped being
    dumpable (:func:`_become_subreaper`); a write needs no permission beyond the open.
    Where there is none (no such file), the started process's own file is written
    after it starts (see :func:`_score_started`).
    """
    fd = _score_fd
    if fd is None:
        yield
        return
    try:
        os.write(fd, b"1000")
    except OSError:
        yield
        return
    try:
        yield
    finally:
        try:
            os.write(fd, _own_score)
        except OSError:
            pass


def _score_started(pid: int) -> None:
    """Where the agent could not give a command its score at the fork, give it now."""
    if _score_fd is not None:
        return
    try:
        with open(f"/proc/{pid}/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def _no_processes() -> str:
    """Why nothing can be started, with the box's pids limit when it can be read."""
    limit = current = None
    for base in ("/sys/fs/cgroup/pids/", "/sys/fs/cgroup/"):
        try:
            with open(base + "pids.max") as f:
                limit = f.read().strip()
            with open(base + "pids.current") as f:
                current = f.read().strip()
            break
        except OSError:
            continue
    usage = f" ({current} of its {limit} processes and threads run)" if limit else ""
    return f"the box cannot start a process: its process limit is reached{usage}"


def _become_subreaper() -> None:
    """Make orphans of commands this agent's children instead of init's (see module doc),
    and this process one that the member's commands cannot attach to.

    Commands run as the agent's own user, so without the second step any of them could
    ``ptrace`` the agent (Docker's seccomp profile allows it, and a box has no Yama) or
    write its ``/proc/PID/mem``, and fake whatever the agent reports - file contents,
    exit codes, the collected patch. A process that is not dumpable can be attached to
    only with CAP_SYS_PTRACE, which no box has. Its children become dumpable again when
    they exec, so the member's own debugging of its programs is unchanged. Done before
    the first command starts: until then no process of the member's exists."""
    global _subreaper
    if _subreaper:
        return
    _subreaper = True
    _keep_score_file()  # while this process's /proc files are still its user's
    try:
        import ctypes  # here, not at the top: it costs startup time every box pays

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # no prctl: orphans go to init, the other rules still end them


def _keep_score_file() -> None:
    global _score_fd, _own_score
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return
    try:
        _own_score = os.pread(fd, 16, 0).strip() or b"0"
    except OSError:
        os.close(fd)
        return
    _score_fd = fd


def _process_table() -> dict[int, tuple[str, int, int, int]]:
    """pid -> (state, ppid, pgid, sid) of every process the box can see."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        table[int(name)] = (fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]))
    return table


def _carries(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in b"\0" + f.read() + b"\0"
    except OSError:
        return False


def end_leftovers(sid: int | None, marker: bytes | None, *, everything: bool = False) -> int:
    """Kill what a finished command left running (see the module docstring); how many.

    ``sid`` is the command's session (and process group); ``marker`` the
    ``\\0FLEET_EXEC_ID=...\\0`` its processes inherit. Orphans adopted by this agent are
    killed only when no command runs (or ``everything``: the agent is leaving). Zombies
    adopted by this agent are reaped. Passes repeat until one finds nothing, so the
    children of a killed process are found too. The count is of processes seen: copies
    a fork bomb made between a look and the ``killpg`` after it die uncounted.
    """
    me = os.getpid()
    killed: set[int] = set()
    for _ in range(200):
        with _procs_lock:
            found, reaped = _leftover_pass(me, sid, marker, idle=everything or not _mains)
        if sid is not None:
            _kill_group(sid)  # after each look: a fork bomb cannot outrun one killpg
        if not found and not reaped:
            break
        killed.update(found)
        time.sleep(0.005)
    return len(killed)


def _leftover_pass(
    me: int, sid: int | None, marker: bytes | None, *, idle: bool
) -> tuple[list[int], int]:
    """One look at every process: (killed now, zombies of ours reaped now)."""
    found, reaped = [], 0
    for pid, (state, ppid, pgid, psid) in _process_table().items():
        if pid in (me, 1) or pid in _mains:
            continue
        if state in ("Z", "X"):
            if ppid == me:
                reaped += _reap(pid)
            continue
        mine = sid is not None and sid in (psid, pgid)
        if mine or (ppid == me and idle) or (marker and _carries(pid, marker)):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
            found.append(pid)
    return found, reaped


def _reap(pid: int) -> int:
    try:
        return 1 if os.waitpid(pid, os.WNOHANG)[0] == pid else 0
    except OSError:
        return 0


def op_exec(req: wire.ExecRequest) -> wire.ExecReply:
    argv = req["argv"] if isinstance(req.get("argv"), list) else _shell_argv(req["cmd"])
    env = dict(os.environ)
    env.update(req.get("env") or {})
    limit = int(req.get("limit") or 1024 * 1024)
    timeout = req.get("timeout")
    stdin_data = b64decode(req["stdin"]) if req.get("stdin") else b""
    cwd = req.get("cwd") or "/workspace"
    exec_id = f"{os.getpid()}-{req['id']}-{binascii.hexlify(os.urandom(6)).decode()}"
    env["FLEET_EXEC_ID"] = exec_id
    oom_before = oom_kills()
    memguard.start(os.getpid())
    started = time.monotonic()
    try:
        feeder = _StdinFeeder(stdin_data) if stdin_data else None
    except RuntimeError:  # no thread left in the pids limit
        raise Refused("no_processes", _no_processes()) from None
    try:
        proc = _spawn(argv, cwd, env)
    except BaseException as e:
        if feeder is not None:
            feeder.hand(None)
        if isinstance(e, _NotStarted):
            return _exec_reply(e.code, b"", e.message.encode(), False, False, started, False)
        raise
    if feeder is not None:
        feeder.hand(proc)
    _score_started(proc.pid)
    with _running_lock:
        _running[req["id"]] = proc.pid
    memguard.running(proc.pid, exec_id)
    caps = {"stdout": _Capture(limit), "stderr": _Capture(limit)}
    deadline = started + float(timeout) if timeout else None
    try:
        if feeder is None:
            _feed_stdin(proc, b"")
        timed_out = _pump(proc, caps, deadline)
        code = proc.wait()
    finally:
        memguard.running(proc.pid, exec_id, done=True)
        with _running_lock:
            _running.pop(req["id"], None)
        with _procs_lock:
            _mains.discard(proc.pid)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        leftovers = end_leftovers(proc.pid, f"\0FLEET_EXEC_ID={exec_id}\0".encode())
    if code < 0:
        code = 128 - code
    if timed_out:
        code = 124
    after = oom_kills()
    oom = oom_before is not None and after is not None and after > oom_before
    out, err = caps["stdout"], caps["stderr"]
    if memguard.ended(proc.pid):
        oom = True
        err.add(_GUARD_NOTE)
    if leftovers:
        err.add(_leftovers_note(leftovers))
    truncated = out.truncated or err.truncated
    reply = _exec_reply(code, out.value(), err.value(), timed_out, truncated, started, oom)
    reply["leftovers"] = leftovers
    if req.get("stamps"):
        try:
            reply["stamps_print"] = stamps.stamps_print()
        except Exception:  # the command's result is what the host must get
            reply["stamps_print"] = None
    return reply


_GUARD_NOTE = (
    b"\n[fleet: the box ran out of memory and this command, holding the most of it, "
    b"was ended with everything it started]\n"
)


def _leftovers_note(count: int) -> bytes:
    what = "process" if count == 1 else "processes"
    return (
        f"\n[fleet: ended {count} {what} the command left running; background processes "
        f"end with the command that started them]\n"
    ).encode()


def _exec_reply(
    code: int, out: bytes, err: bytes, timed_out: bool, truncated: bool, started: float, oom: bool
) -> wire.ExecReply:
    return {
        "exit_code": code,
        "stdout": b64encode(out),
        "stderr": b64encode(err),
        "timed_out": timed_out,
        "truncated": truncated,
        "duration_s": time.monotonic() - started,
        "oom_killed": oom,
    }


def op_probe(req: wire.ProbeRequest) -> wire.ProbeReply:
    """Whether the box can still run a command (``no_processes`` when it cannot).

    As much as the smallest command takes: this request's thread, a shell and one
    process of its own (one free slot in the pids limit is not a usable box).
    """
    try:
        proc = _spawn(["/bin/sh", "-c", "/bin/true & wait $!"], "/", dict(os.environ))
    except _NotStarted:  # no /bin/sh in this image; the fork itself worked
        return {"spawned": True}
    try:
        proc.communicate(timeout=10)
    finally:
        with _procs_lock:
            _mains.discard(proc.pid)
    if proc.returncode != 0:
        raise Refused("no_processes", _no_processes())
    return {"spawned": True}


def op_kill(req: wire.KillRequest) -> wire.KillReply:
    with _running_lock:
        pgid = _running.get(req["target"])
    if pgid is not None:
        _kill_group(pgid)
    return {"killed": pgid is not None}


# ---------------------------------------------------------------- files


def op_read(req: wire.ReadRequest) -> wire.ReadReply:
    path = safe_path(req["path"])
    limit = int(req.get("limit") or _MAX_FRAME // 2)
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise Refused("is_dir", f"{req['path']} is a directory")
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError as e:
        raise Refused("not_found", f"{req['path']}: no such file") from e
    if len(data) > limit:
        return {"too_large": True, "size": st.st_size, "limit": limit}
    return {"data": b64encode(data)}


def _make_parents(real: str) -> None:
    parent = os.path.dirname(real)
    os.makedirs(parent, exist_ok=True)
    safe_path(parent)


def op_write(req: wire.WriteRequest) -> wire.WriteReply:
    """Replace a file whole, as the box user could with a shell redirection.

    The data goes to a temporary file beside the target, then is renamed over it, so a
    reader never sees half a file. What a rename alone would get wrong is checked
    first: a directory is refused (``is_dir``), a file the box user may not write
    (``chmod 444``) is refused with ``permission`` although the rename would succeed
    (the directory is writable), and an existing file keeps its mode unless the
    request names one. The temporary file never outlives a failed write. A writable
    file in a directory the box user may not write in is written in place, as a
    redirection would (no temporary file can be made there).
    """
    path = safe_path(req["path"])
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise Refused("is_dir", f"{req['path']} is a directory")
    if st is not None and not os.access(path, os.W_OK):
        raise PermissionError(f"{req['path']} is not writable (mode {stat.S_IMODE(st.st_mode):o})")
    _make_parents(path)
    data = b64decode(req.get("data") or "")
    wanted = req.get("mode")
    if wanted is not None:
        mode = int(wanted)
    else:
        mode = stat.S_IMODE(st.st_mode) if st is not None else 0o644
    if st is not None and not os.access(os.path.dirname(path), os.W_OK):
        with open(path, "wb") as f:
            f.write(data)
        if wanted is not None:
            os.chmod(path, mode)
        return {"size": len(data)}
    tmp = f"{path}.fleet-{os.getpid()}-{req['id']}"
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    return {"size": len(data)}


def _entry(path: str, name: str) -> wire.Entry:
    st = os.lstat(path)
    kind: Literal["file", "dir", "link", "other"]
    if stat.S_ISLNK(st.st_mode):
        kind = "link"
    elif stat.S_ISDIR(st.st_mode):
        kind = "dir"
    elif stat.S_ISREG(st.st_mode):
        kind = "file"
    else:
        kind = "other"
    return {"name": name, "path": path, "type": kind, "size": st.st_size, "mtime": st.st_mtime}


def op_list(req: wire.ListRequest) -> wire.ListReply:
    path = safe_path(req["path"])
    try:
        names = sorted(os.listdir(path))
    except FileNotFoundError as e:
        raise Refused("not_found", f"{req['path']}: no such directory") from e
    except NotADirectoryError as e:
        raise Refused("not_dir", f"{req['path']} is not a directory") from e
    shown = req["path"].rstrip("/") or "/"
    entries = []
    for name in names:
        try:
            entries.append(_entry(os.path.join(path, name), name))
        except FileNotFoundError:
            continue  # removed while listing
        entries[-1]["path"] = f"{shown}/{name}"
    return {"entries": entries}


def op_tar_out(req: wire.TarOutRequest) -> wire.TarOutReply:
    import tarfile

    path = safe_path(req["path"])
    if not os.path.exists(path):
        raise Refused("not_found", f"{req['path']}: no such file or directory")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        # Symlinks are stored as links, never followed, so nothing outside the roots leaks.
        tar.add(path, arcname=".", recursive=True)
    if buf.tell() > int(req.get("limit") or _MAX_FRAME // 2):
        raise Refused("too_large", f"{req['path']} is {buf.tell()} bytes as a tar archive")
    return {"data": b64encode(buf.getvalue())}


def _within(path: str, dest: str) -> bool:
    real = os.path.realpath(path)
    return real == dest or real.startswith(dest + "/")


def _check_name(member: tarfile.TarInfo) -> None:
    parts = member.name.replace("\\", "/").split("/")
    if member.name.startswith("/") or ".." in parts:
        raise Refused("path_refused", f"archive entry {member.name!r} is absolute or has '..'")
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        raise Refused("path_refused", f"archive entry {member.name!r} is a device or fifo")


def _check_on_disk(member: tarfile.TarInfo, dest: str) -> None:
    """Checked against the disk as it is right before this entry is written.

    Earlier entries may have planted symlinks, so a check of the whole archive up front
    (on names alone) can be fooled; this one resolves what is really there now.
    """
    target = os.path.join(dest, member.name)
    where = os.path.dirname(target) if member.issym() else target
    if not _within(where, dest):
        raise Refused("path_refused", f"archive entry {member.name!r} would land outside {dest}")
    if member.islnk():
        if member.linkname.startswith("/") or ".." in member.linkname.split("/"):
            raise Refused("path_refused", f"archive hard link {member.name!r} points outside")
        if not _within(os.path.join(dest, member.linkname), dest):
            raise Refused("path_refused", f"archive hard link {member.name!r} points outside")


def _points_out(member: tarfile.TarInfo, dest: str) -> bool:
    target = os.path.join(dest, os.path.dirname(member.name), member.linkname)
    return member.issym() and not _within(target, dest)


def _through_link_out(member: tarfile.TarInfo, links_out: list[tarfile.TarInfo]) -> None:
    """Refuse an entry whose path goes through a link that points outside (held back),
    or a hard link to one (tarfile would make the held-back link there at once)."""
    name = os.path.normpath(member.name)
    target = os.path.normpath(member.linkname) if member.islnk() else None
    for link in links_out:
        held = os.path.normpath(link.name)
        if name.startswith(held + "/") or (target and (target + "/").startswith(held + "/")):
            raise Refused(
                "path_refused",
                f"archive entry {member.name!r} goes through "
                f"link {link.name!r}, which points outside",
            )


def _make_links_out(members: list[tarfile.TarInfo], dest: str) -> None:
    """Symlinks that point outside ``dest``, made once every other entry is written."""
    for member in members:
        path = os.path.join(dest, member.name)
        if not _within(os.path.dirname(path), dest) or os.path.isdir(path):
            raise Refused(
                "path_refused",
                f"archive link {member.name!r} would replace a directory or land outside",
            )
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.lexists(path):
            os.unlink(path)
        os.symlink(member.linkname, path)


def op_tar_in(req: wire.TarInRequest, stream: BinaryIO | None = None) -> wire.TarInReply:
    """Unpack an archive under ``path``: nothing outside it is written.

    The archive is the request's base64 ``data``, or - for a request sent with
    ``stream`` to a ``--once`` agent - the raw bytes that follow the request on stdin
    (``stream``, the agent's stdin): a large tree then needs no frame, no base64 and no memory of its
    size. Either way it is read as a stream, entry by entry.

    A symlink that points outside ``path`` (a repository's link to a file elsewhere on
    its host) is kept as the link it is - dangling in the box - but made last, after
    every other entry, so nothing is ever written through it.
    """
    import tarfile

    dest = safe_path(req["path"])
    os.makedirs(dest, exist_ok=True)
    dest = os.path.realpath(dest)
    src = stream if req.get("stream") and stream else io.BytesIO(b64decode(req["data"]))
    links: list[str] = []
    links_out: list[tarfile.TarInfo] = []
    count = 0
    with tarfile.open(fileobj=src, mode="r|", bufsize=_TAR_BUF) as tar:
        try:
            for member in tar:
                count += 1
                _check_name(member)
                _check_on_disk(member, dest)
                _through_link_out(member, links_out)
                if _points_out(member, dest):
                    links_out.append(member)
                    continue
                member.uid, member.gid, member.uname, member.gname = -1, -1, "", ""
                member.mode &= 0o777
                tar.extract(member, dest, set_attrs=not member.issym())
                if member.issym():
                    links.append(os.path.join(dest, member.name))
            # A later entry can change what an earlier link resolves to ('b/..' with
            # 'b' -> '.' arriving after it): every link is checked again at the end.
            for link in links:
                if not _within(link, dest):
                    raise Refused("path_refused", f"archive link {link!r} points outside {dest}")
            _make_links_out(links_out, dest)
        except Refused:
            for link in links:  # the archive is refused: none of its links stay behind
                if os.path.islink(link):
                    os.unlink(link)
            raise
    return {"entries": count}


def op_ping(req: wire.PingRequest) -> wire.PingReply:
    return {"pid": os.getpid(), "uid": os.getuid(), "oom_kills": oom_kills()}


OPS: dict[str, Callable[[Any], Mapping[str, Any]]] = {
    wire.EXEC: op_exec,
    wire.KILL: op_kill,
    wire.READ: op_read,
    wire.WRITE: op_write,
    wire.LIST: op_list,
    wire.TAR_OUT: op_tar_out,
    wire.TAR_IN: op_tar_in,
    wire.PING: op_ping,
    wire.PROBE: op_probe,
}
"""Each operation of :mod:`sandbox.inbox.wire`; a handler takes that op's request."""


def _failure(rid: int | None, code: wire.ErrorCode, message: str) -> wire.ErrorReply:
    return {"id": rid, "ok": False, "error": code, "message": message}


def handle(req: dict[str, Any], stream: BinaryIO | None = None) -> dict[str, Any]:
    """The reply to one request: the op's own reply with ``id`` and ``ok``, or a failure.

    ``stream`` is where a ``tar_in`` sent with ``stream`` reads its archive from.
    """
    rid = req.get("id")
    try:
        name = req.get("op", "")
        op = OPS.get(name)
        if op is None:
            raise Refused("bad_op", f"unknown op {name!r}")
        if name == wire.TAR_IN:
            reply: Mapping[str, Any] = op_tar_in(req, stream)  # type: ignore[arg-type]
        else:
            reply = op(req)
        return {**reply, "id": rid, "ok": True}
    except Refused as e:
        failure = _failure(rid, e.code, str(e))
    except PermissionError as e:
        failure = _failure(rid, "permission", str(e))
    except FileNotFoundError as e:
        failure = _failure(rid, "not_found", str(e))
    except Exception as e:
        failure = _failure(rid, "failed", f"{type(e).__name__}: {e}")
    return dict(failure)


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    ready: wire.Ready = {"id": 0, "ok": True, "ready": True, "pid": os.getpid()}
    write_frame(out, ready)
    while True:
        req = read_frame(inp)
        if req is None:
            return
        if req.get("op") in wire.INLINE_OPS:
            write_frame(out, handle(req))  # cheap: answer inline, no thread
            continue
        worker = threading.Thread(target=lambda r=req: write_frame(out, handle(r)), daemon=True)
        try:
            worker.start()
        except RuntimeError:  # the pids limit leaves no room for a thread
            write_frame(out, _failure(req.get("id"), "no_processes", _no_processes()))


def init_then_serve() -> int:
    """``--init``: this process is the box's PID 1, and the host is attached to its
    stdio (the container's own stdin, stdout and stderr, attached before the box
    started: no ``docker exec`` is needed to reach the agent).

    The agent is a fork of it (no second interpreter to start) that keeps stdin and
    stdout and serves them as ever; PID 1 gives its own copies of those two up at once,
    for ``/dev/null``, so the agent's stream is held by the agent alone. That matters:
    PID 1 runs as the box's user and stays dumpable, as Docker's own init is (a command
    may raise its OOM score, and end its own box that way), so a command can open
    ``/proc/1/fd/*`` - which then leads nowhere. The agent is not dumpable
    (:func:`_become_subreaper`).

    PID 1 then reaps what comes to it. The container's stdout stays open after the
    agent's death (the engine's end of it holds it), so the host would not see the
    stream end: PID 1 says so on stderr, its one stream left (:data:`wire.AGENT_ENDED`),
    and the host starts another agent with ``docker exec``, as for any box whose agent
    ended. A command could write that line too (PID 1's stderr is open to it through
    ``/proc/1/fd/2``); all it gets is its own agent restarted."""
    agent = os.fork()
    if agent == 0:
        return main([])
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:  # none now; orphans of `docker exec`'s processes may come
            time.sleep(1.0)
            continue
        if pid == agent:
            how = (
                f"signal {-os.waitstatus_to_exitcode(status)}"
                if os.WIFSIGNALED(status)
                else (f"exit {os.waitstatus_to_exitcode(status)}")
            )
            try:
                os.write(2, b"\n" + wire.AGENT_ENDED + f" ({how})\n".encode())
            except OSError:
                pass


def make_home() -> None:
    """The box user's home, when the image puts it on the box's own ``/tmp`` (Fleet's
    coding image: the root is read-only, and a tool that keeps a cache or settings in
    the home - uv, npm, cargo, go, ``git config --global`` - fails on a read-only
    one). ``/tmp`` is an empty tmpfs at the box's start, so the directory is made here,
    before any command, by every agent that starts (a command may have removed it)."""
    home = os.environ.get("HOME", "")
    if home.startswith("/tmp/"):
        try:
            os.makedirs(home, mode=0o700, exist_ok=True)
        except OSError:
            pass  # /tmp full, or the name taken by a file: the command meets that itself


def main(argv: list[str]) -> int:
    make_home()
    if "--init" in argv:
        return init_then_serve()
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    if "--once" in argv:
        req = read_frame(inp)
        if req is not None:
            reply = handle(req, inp)
            while inp.read(_TAR_BUF):
                pass  # the rest of a refused stream: answer once the host sent it all
            write_frame(out, reply)
        return 0
    try:
        serve(inp, out)
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    # The host went away: stop every command still running on its behalf, and what
    # they left.
    with _running_lock:
        groups = list(_running.values())
    for pgid in groups:
        _kill_group(pgid)
    end_leftovers(None, None, everything=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Small pure helpers of the Docker backend: agent requests in, typed results out.

Kept apart from :mod:`sandbox.docker.backend` so the backend file holds the lifecycle and the
transport, and the translation between the agent's wire operations
(:mod:`sandbox.inbox.wire`) and the sandbox contract (results, the error contract,
crash reasons) can be read on its own.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import re
import tarfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import anyio

from ..base import Command, ExecResult
from ..errors import (
    OutputLimitExceeded,
    PathRefused,
    SandboxError,
    SandboxSpecError,
    SandboxUnavailable,
)
from ..inbox import wire

if TYPE_CHECKING:
    import httpx

AGENT_PATH = "/opt/fleet/boxagent_main.py"
"""The agent's program in a Fleet image (it imports the agent from its bytecode:
:mod:`sandbox.inbox.boxagent_main` says why)."""
# -I -S: no site packages, no user environment - faster startup, nothing injected.
AGENT_ARGV = ["python3", "-I", "-S", AGENT_PATH]
_ROOTS = ("/workspace", "/tmp")


_INLINE = """import sys
for name, src in (("wire", {wire!r}), ("stamps", {stamps!r}), ("memguard", {memguard!r})):
    m = type(sys)(name)
    exec(compile(src, "/opt/fleet/" + name + ".py", "exec"), m.__dict__)
    sys.modules[name] = m
exec(compile({agent!r}, "/opt/fleet/boxagent.py", "exec"), {{"__name__": "__main__"}})
"""


@functools.cache
def agent_source() -> str:
    """The agent as one ``python3 -c`` program, for images that lack the baked-in copy.

    The agent imports :mod:`sandbox.inbox.wire` as ``wire`` and
    :mod:`sandbox.inbox.stamps` as ``stamps`` (and :mod:`sandbox.inbox.memguard`); here those modules are made from their
    source first and registered, so the agent finds them without a file.
    """
    inbox = Path(__file__).parent.parent / "inbox"
    return _INLINE.format(
        wire=(inbox / "wire.py").read_text(),
        stamps=(inbox / "stamps.py").read_text(),
        memguard=(inbox / "memguard.py").read_text(),
        agent=(inbox / "boxagent.py").read_text(),
    )


PLAIN_EXEC = r"""
id=$1 limit=$2
shift 2
FLEET_EXEC_ID=$id timeout -k 2 "$limit" "$@" &
t=$!
wait "$t"
rc=$?
n=0
round=0
seen=" "
while [ "$round" -lt 50 ]; do
  round=$((round + 1))
  found=0
  for s in /proc/[0-9]*/stat; do
    p=${s#/proc/}
    p=${p%/stat}
    case $seen in *" $p "*) continue ;; esac
    [ "$p" = "$$" ] && continue
    read -r l 2>/dev/null <"$s" || continue
    set -- ${l##*") "}
    [ "$1" = Z ] && continue
    hit=0
    [ "$3" = "$t" ] && hit=1
    if [ "$hit" = 0 ]; then
      while IFS= read -r e || [ -n "$e" ]; do
        case $e in *"FLEET_EXEC_ID=$id"*) hit=1; break ;; esac
      done 2>/dev/null <"/proc/$p/environ"
    fi
    if [ "$hit" = 1 ] && kill -KILL "$p" 2>/dev/null; then
      found=$((found + 1))
      seen="$seen$p "
    fi
  done
  kill -KILL -"$t" 2>/dev/null
  [ "$found" = 0 ] && break
  n=$((n + found))
done
if [ "$n" -gt 0 ]; then
  w=processes
  [ "$n" = 1 ] && w=process
  printf '\n[fleet: ended %s %s the command left running; ' "$n" "$w" >&2
  printf 'background processes end with the command that started them]\n' >&2
fi
exit "$rc"
"""
"""``exec`` in an image without python3 (``sh -c PLAIN_EXEC fleet-exec ID TIMEOUT ARGV...``).

The same rules as the agent's, in POSIX sh: the command runs under ``timeout`` (its
own process group; 0 means no limit), with ``FLEET_EXEC_ID`` in its environment only.
Afterwards every process of that group or carrying that id is killed, with shell
builtins alone (a fork bomb may have left no room for a ``ps``), and a line on stderr
counts them. ``/proc/PID/environ`` is read with ``read``, which drops its NUL
separators; the id is random and fixed-length, so the concatenation cannot fake it.
A process that clears its environment after ``setsid`` escapes here: there is no
agent to adopt it (it is ``init``'s).
"""
LEFTOVERS_RE = re.compile(r"\[fleet: ended (\d+) process")
FORK_FAILED = ("Cannot fork", "fork system call failed")
"""What ``sh`` and ``timeout`` print when the box's pids limit leaves no room."""


def exec_request(
    cmd: Command,
    timeout: float | None,
    cwd: str,
    env: Mapping[str, str] | None,
    stdin: bytes | str | None,
    limit: int,
) -> wire.ExecRequest:
    req: wire.ExecRequest = {"op": wire.EXEC, "cwd": cwd, "limit": limit, "timeout": timeout}
    if isinstance(cmd, str):
        req["cmd"] = cmd
    elif not cmd:
        raise SandboxSpecError("exec needs a command: the argv list is empty")
    else:
        req["argv"] = [str(a) for a in cmd]
    if env:
        req["env"] = dict(env)
    if stdin:
        raw = stdin.encode() if isinstance(stdin, str) else stdin
        req["stdin"] = base64.b64encode(raw).decode()
    return req


def _text(b64: str) -> str:
    return base64.b64decode(b64).decode("utf-8", "replace")


def exec_result(reply: wire.ExecReply) -> ExecResult:
    return ExecResult(
        exit_code=reply["exit_code"],
        stdout=_text(reply["stdout"]),
        stderr=_text(reply["stderr"]),
        timed_out=reply["timed_out"],
        truncated=reply["truncated"],
        duration_s=reply["duration_s"],
        oom_killed=reply.get("oom_killed", False),
        leftovers=reply.get("leftovers", 0),
    )


class HeadTail:
    """The first and last ``limit // 2`` bytes of a stream fed in pieces, and how many
    were dropped between them: the agent's output cap, kept on the host for the plain
    path, so a command's output never makes the host hold more than ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self.half = max(limit // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        if len(self.tail) > self.half:
            cut = len(self.tail) - self.half
            self.dropped += cut
            del self.tail[:cut]

    def value(self) -> tuple[bytes, bool]:
        """The bytes kept (with a marker where some were dropped); whether any were."""
        if not self.dropped:
            return bytes(self.head + self.tail), False
        marker = f"\n[... {self.dropped} bytes dropped ...]\n".encode()
        return bytes(self.head) + marker + bytes(self.tail), True


def cap_output(code: int, out: HeadTail, err: HeadTail, started: float) -> ExecResult:
    """The plain path's result: the cap applied on the host, ``timeout``'s 124 kept,
    the leftovers counted from :data:`PLAIN_EXEC`'s last line."""
    stdout, t1 = out.value()
    stderr, t2 = err.value()
    counted = LEFTOVERS_RE.search(stderr[-512:].decode("utf-8", "replace"))
    return ExecResult(
        exit_code=code,
        stdout=stdout.decode("utf-8", "replace"),
        stderr=stderr.decode("utf-8", "replace"),
        timed_out=code == 124,
        truncated=t1 or t2,
        duration_s=time.monotonic() - started,
        leftovers=int(counted.group(1)) if counted else 0,
    )


def bounded_data_filter(limit: int) -> Any:
    """tarfile's ``data`` filter that also refuses, as :class:`OutputLimitExceeded`,
    entries whose sizes add up past ``limit`` bytes."""
    total = 0

    def check(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        nonlocal total
        total += member.size
        if total > limit:
            raise OutputLimitExceeded(
                f"the archive's entries add up past {limit} bytes (its own size) at "
                f"{member.name!r}",
                limit=limit,
                size=total,
            )
        return tarfile.data_filter(member, dest)

    return check


def agent_error(reply: wire.Reply, box: str) -> Exception:
    """The error-contract exception for a refused agent request."""
    failure = cast("wire.ErrorReply", reply)
    code, message = failure.get("error", "failed"), failure.get("message", "")
    if code == "path_refused":
        err = PathRefused(message, _ROOTS)
        err.args = (f"sandbox {box}: {message}; use a path under {', '.join(_ROOTS)}",)
        return err
    if code == "not_found":
        return FileNotFoundError(f"sandbox {box}: {message}")
    if code == "is_dir":
        return IsADirectoryError(f"sandbox {box}: {message}")
    if code == "not_dir":
        return NotADirectoryError(f"sandbox {box}: {message}")
    if code == "permission":
        return PermissionError(f"sandbox {box}: {message}")
    if code == "too_large":
        return OutputLimitExceeded(f"sandbox {box}: {message}", limit=0)
    return SandboxError(f"sandbox {box}: the agent could not do it: {message}")


@contextlib.contextmanager
def reading_reply(op: str, box: str) -> Iterator[None]:
    """Around the reading of an ``op`` reply's fields. A reply is whatever whole JSON
    object came back, and a box can forge one (a one-shot agent's stdout is open to the
    command it runs): one that lacks a field, holds one of another type, or base64
    that does not decode ends the call as the box's doing (:class:`SandboxUnavailable`,
    naming the op), not with the error of the line that read it."""
    try:
        yield
    except SandboxError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # ValidationError too
        raise SandboxUnavailable(
            f"sandbox {box}: the agent's reply to {op!r} is malformed "
            f"({type(e).__name__}: {str(e)[:200]}); retry the call"
        ) from None


def ok_reply(reply: wire.Reply, box: str) -> Any:
    """``reply`` when the agent did what was asked (the caller reads it as that op's
    reply type); else the error-contract exception for it."""
    if not reply.get("ok"):
        raise agent_error(reply, box)
    return reply


def read_reply(reply: wire.Reply, path: str, limit: int, box: str) -> bytes:
    done: wire.ReadReply = ok_reply(reply, box)
    if done.get("too_large"):
        raise OutputLimitExceeded(
            f"{path} in sandbox {box} is {done['size']} bytes, over the {limit}-byte limit; "
            f"read it in pieces with exec (head, tail, sed -n) or raise the limit",
            limit=limit,
            size=done["size"],
        )
    return base64.b64decode(done["data"])


def crash_reason(info: dict | None) -> tuple[str, str] | None:
    """(reason, detail) when the container is gone or not running, else None."""
    if info is None:
        return "removed", "the container no longer exists"
    state = info["State"]
    if state.get("Running") and not state.get("Paused"):
        return None
    detail = f"status {state.get('Status')}, exit code {state.get('ExitCode')}"
    if state.get("Error"):
        detail += f", {state['Error']}"
    if state.get("OOMKilled"):
        return "oom-killed", detail
    if state.get("Paused"):
        return "paused", detail
    code = state.get("ExitCode", 0)
    if code in (137, 143) or state.get("Status") in ("removing", "dead"):
        return "killed", detail
    return f"exited({code})", detail


PROBE_BYTES = 64 * 1024
"""The most of a readiness probe's answer the host reads: a box's answer is the box's
to make, and one that never ends must cost the host nothing but the probe's time."""


def probe_client() -> httpx.AsyncClient:
    """A client for readiness probes of a box: plain HTTP to its address, never through
    a host proxy (``trust_env=False``), no CA bundle loaded (``verify=False``: reading
    the system's bundle costs 0.1-0.3 s of CPU, once per box, for a probe that never
    speaks TLS). ``httpx`` is imported here, not with the module: only browser and
    service boxes are probed, and a run of coding members would pay its import (about
    25 ms of CPU, ``click`` included) before its first model call."""
    import httpx

    return httpx.AsyncClient(trust_env=False, timeout=2.0, verify=False)


def probe_failed() -> type[Exception]:
    """What a failed probe raises (``httpx.HTTPError``)."""
    import httpx

    return httpx.HTTPError


async def probe(client: httpx.AsyncClient, url: str) -> tuple[int, bytes]:
    """GET ``url`` (plain HTTP only): its status and at most :data:`PROBE_BYTES` of its body."""
    if not url.startswith("http://"):
        raise ValueError(f"a box's readiness probe is plain HTTP, not {url!r}")
    body = bytearray()
    async with client.stream("GET", url) as resp:
        async for chunk in resp.aiter_raw():
            body += chunk
            if len(body) >= PROBE_BYTES:
                break
    return resp.status_code, bytes(body[:PROBE_BYTES])


async def wait_cdp(url: str, timeout: float) -> bool:
    """Poll ``url/json/version`` until Chromium answers (:func:`probe`)."""
    with anyio.move_on_after(timeout):
        async with probe_client() as client:
            while True:
                try:
                    status, body = await probe(client, f"{url}/json/version")
                    if status == 200 and b"webSocketDebuggerUrl" in body:
                        return True
                except probe_failed():
                    pass
                await anyio.sleep(0.05)
    return False

"""How requests reach one Docker box: the exec transport under :class:`DockerSandbox`.

:mod:`sandbox.docker.backend` says *what* a box does (the Sandbox API, the backend); this
module says *how* a request gets in and its answer out, and what a dead box looks like
on the way.

Paths, best first. ``docker exec`` costs about 55 ms a call here (engine, containerd
and runc each take their turn). Each box instead runs ONE long-lived agent
(:mod:`sandbox.inbox.boxagent`, started as ``python3 -I -S
/opt/fleet/boxagent_main.py``); requests travel as framed JSON (the operations of
:mod:`sandbox.inbox.wire`) over its stdin and stdout (:mod:`sandbox.docker.agent_client`)
and many run at once, tagged by id. A round trip costs about a millisecond.

How the agent is reached. A coding box of Fleet's image (or of a snapshot of it) runs
the agent from its PID 1, and the host attached to the container's stdio before it
started (:mod:`sandbox.docker.container`, :mod:`sandbox.docker.attached`): the first
transport takes that socket, and no ``docker exec`` is made at all. Measured on a
2-core engine (``bench/box_start.py``), sixteen such boxes at once were ready (created,
started, agent answering) in 1.89 s and 3.67 s of the machine's CPU, against 2.13 s and
4.17 s with an exec'd agent: the exec was an eighth of a box's start. The container's stdout outlives
the agent (the engine's end holds it open), so PID 1 says on stderr when the agent ends
(:data:`sandbox.inbox.wire.AGENT_ENDED`) and the stream is then broken as if it had
closed. Every other box (browser boxes, a user's image, which may have no agent), and
every later agent of any box (a restart: the container's stdin closed with the first
connection), is started with ``docker exec -i``. The agent enforces the timeout and the output cap
inside the box (new session per command, ``killpg`` on timeout, head+tail capture), so
the semantics do not depend on the host. Fallbacks, in order: when the stream breaks
and the box still runs, the agent is restarted once (``agent``); when that fails, each
call runs the agent one-shot (``--once``) in its own ``docker exec`` (``oneshot``); when
the image has no agent file the agent's source is passed with ``python3 -c``
(``inline``); when the image has no ``python3``, ``exec`` becomes ``timeout -k`` in a
plain ``docker exec`` with the cap applied on the host (``plain``; file operations say
they need python3).

Large uploads. A request on the agent's stream is one frame of JSON (at most 256 MB,
binary payloads in base64), fine for a file or a small tree but not for a project of
a few hundred MB. A request given a ``body`` therefore goes to a one-shot agent of its
own, and the body follows the request on that exec's stdin as raw bytes - a tar
stream, packed on the host while it is sent and unpacked in the box while it arrives:
no base64, no frame limit, memory that does not grow with the tree, and the agent's
stream stays free for other requests meanwhile. It costs one ``docker exec`` (about
55 ms), so only trees past :data:`sandbox.docker.backend.INLINE_UPLOAD_BYTES` take it.

Dead boxes. Every engine call on the box goes through :meth:`BoxTransport.engine`: a
Docker API error (a 409 "container is not running" from a box that died between two
calls, a 404 from one that was removed) makes the transport re-inspect the container,
and a box that is not running becomes :class:`SandboxCrashed` naming why (``killed``,
``oom-killed``, ``exited(N)``, ``removed``, ``paused``). The first crash is recorded and
raised again by every later call. An error on a box that still runs is
:class:`SandboxUnavailable`, and so is an engine that stopped answering
(:func:`sandbox.docker.engine.engine_calls`): a box is judged crashed only on the engine's
word. Nothing from the ``docker`` or ``requests`` packages reaches the caller.

Frozen boxes. A paused box keeps the agent's stream open and silent, so the in-box
timeout cannot fire: while a request waits on the agent, the container's state is
looked at every :data:`WATCH_S` seconds, and a paused box ends the wait as crashed.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any, BinaryIO, TypeVar

import anyio
import docker
import docker.errors

from ..base import ExecResult
from ..errors import SandboxCrashed, SandboxUnavailable
from ..inbox import wire
from ..process import BoxProcess
from . import attached
from .agent_client import AgentStream, StreamBroken, one_shot
from .boxops import (
    AGENT_ARGV,
    AGENT_PATH,
    FORK_FAILED,
    PLAIN_EXEC,
    HeadTail,
    agent_source,
    cap_output,
    crash_reason,
)
from .engine import engine_calls
from .process import DockerProcess

T = TypeVar("T")

# Base64 of stdin in plain mode rides in one environment variable (Linux: 128 KiB each).
_PLAIN_STDIN_MAX = 96 * 1024
WATCH_S = 5.0
"""Seconds between looks at the container while a request waits on the agent: the
longest a call on a frozen (paused) box waits before it is reported crashed."""


class BoxTransport:
    """The exec transport of one box: the agent stream, its fallbacks, crash detection."""

    def __init__(
        self, client: docker.DockerClient, box_id: str, name: str, prefix: list[str] | None = None
    ) -> None:
        self._client = client
        self.prefix = list(prefix or [])
        """Put in front of every process started in the box (gVisor's limits, see
        :func:`sandbox.docker.gvisor.exec_prefix`)."""
        self._api = client.api
        self.id = box_id
        self.name = name
        self.mode = "agent"
        """``agent``, ``oneshot``, ``inline`` or ``plain`` (see the module docstring)."""
        self.agent: AgentStream | None = None
        self.crashed: SandboxCrashed | None = None
        """The box's death, once seen; every later call raises it again."""
        self._restarts = 0
        self.oom_kills: int | None = None
        """The memory cgroup's OOM-kill count when the agent last started (None: unknown)."""

    # ------------------------------------------------------------ engine calls

    async def engine(self, fn: Callable[[], T]) -> T:
        """Run one blocking engine call on a worker thread; a Docker API error becomes
        :class:`SandboxCrashed` when the box is dead, else :class:`SandboxUnavailable`."""
        try:
            with engine_calls(self._client):
                return await anyio.to_thread.run_sync(fn)
        except docker.errors.APIError as e:
            await self.raise_if_dead()
            raise SandboxUnavailable(
                f"the engine refused a call on sandbox {self.name}, which still runs "
                f"({e.explanation or e}); retry, or see 'docker inspect {self.name}'"
            ) from None

    async def raise_if_dead(self, settle_s: float = 0.0) -> None:
        """Re-inspect the container; record and raise :class:`SandboxCrashed` if it is
        not running (``settle_s``: first wait that long for the engine to record an exit)."""
        if settle_s:
            # The agent's stream ending is usually the box dying (an OOM kill of its
            # init takes the agent with it), but the engine records the exit a moment
            # later: wait for it (bounded) so a dying box is not judged alive.
            try:
                await anyio.to_thread.run_sync(lambda: self._api.wait(self.id, timeout=settle_s))
            except Exception:  # still running (the read timed out) or already gone
                pass
        try:
            with engine_calls(self._client):
                info = await anyio.to_thread.run_sync(self._api.inspect_container, self.id)
        except docker.errors.NotFound:
            info = None
        except docker.errors.APIError as e:
            raise SandboxUnavailable(
                f"the engine could not say whether sandbox {self.name} still runs ({e}); "
                f"check the engine with 'docker info' and retry"
            ) from None
        reason = crash_reason(info)
        if reason is not None:
            self.crashed = self.crashed or SandboxCrashed(self.name, *reason)
            raise self.crashed

    async def open_process(
        self, command: str, cwd: str | None, env: dict[str, str] | None = None
    ) -> BoxProcess:
        """A long-lived process on its own ``docker exec -i`` (see :mod:`sandbox.process`),
        with ``env`` added to the box's environment."""

        def start() -> Any:
            exec_id = self._api.exec_create(
                self.id,
                [*self.prefix, "/bin/sh", "-c", command],
                stdin=True,
                user="1000:1000",
                workdir=cwd,
                environment=env or None,
            )["Id"]
            return self._api.exec_start(exec_id, socket=True)

        if self.crashed:
            raise self.crashed
        return DockerProcess(await self.engine(start), f"'{command}' in {self.name}")

    def _open_exec(self, cmd: list[str]) -> Any:
        argv = [*self.prefix, *cmd]
        exec_id = self._api.exec_create(self.id, argv, stdin=True, user="1000:1000")["Id"]
        return self._api.exec_start(exec_id, socket=True)

    # ------------------------------------------------------------ the agent

    async def start(self) -> None:
        """Open the long-lived agent stream, or pick a fallback mode."""
        try:
            held = attached.take(self.id)  # the box's PID 1 agent, attached as it started
            sock = held or await self.engine(lambda: self._open_exec(AGENT_ARGV))
            agent = AgentStream(sock)
            with anyio.fail_after(10):
                hello = await agent.request({"op": wire.PING})
            self.agent, self.mode = agent, "agent"
            self.oom_kills = _count(hello.get("oom_kills"))
        except (StreamBroken, TimeoutError, SandboxUnavailable):
            await self.raise_if_dead()
            self.mode = await self._pick_fallback()

    async def _pick_fallback(self) -> str:
        def has_agent_file() -> bool:
            code = self._api.exec_create(self.id, ["test", "-f", AGENT_PATH])["Id"]
            self._api.exec_start(code)
            return self._api.exec_inspect(code)["ExitCode"] == 0

        if await self.engine(has_agent_file):
            return "oneshot"
        probe = await self.engine(
            lambda: self._client.containers.get(self.id).exec_run(["python3", "-c", "1"])
        )
        return "inline" if probe.exit_code == 0 else "plain"

    async def request(
        self,
        msg: wire.Request,
        *,
        timeout: float | None = None,
        body: Callable[[BinaryIO], None] | None = None,
    ) -> wire.Reply:
        """One request by the best path (not ``plain``): the agent's reply.

        A request with a ``body`` (raw bytes written after it, a large upload) always
        goes to a one-shot agent of its own, so it holds up no other request and needs
        no frame of its size.
        """
        if self.mode == "agent" and self.agent is not None and body is None:
            return self.check_reply(await self._agent_request(self.agent, msg))
        return self.check_reply(await self._request_once(msg, timeout, body))

    async def _agent_request(self, agent: AgentStream, msg: wire.Request) -> wire.Reply:
        rid = agent.new_id()
        try:
            return await agent.request(msg, rid, watch=self.raise_if_dead, every=WATCH_S)
        except StreamBroken as e:
            await self.raise_if_dead(settle_s=1.0)
            before = self.oom_kills
            await self._restart()
            if before is not None and (await self._oom_count() or 0) > before:
                raise SandboxUnavailable(
                    f"sandbox {self.name} ran out of memory during a call: the OOM killer "
                    f"ended its agent (what programs hold plus what /tmp and /workspace "
                    f"hold reached the box's memory limit); the box still runs and the "
                    f"agent was restarted: retry with less in memory"
                ) from None
            raise SandboxUnavailable(
                f"the agent stream of sandbox {self.name} broke during a call ({e}); the box "
                f"still runs and the agent was restarted: retry the call"
            ) from None
        except BaseException:
            with anyio.CancelScope(shield=True):
                await agent.kill(rid)
            raise

    async def _oom_count(self) -> int | None:
        """The box's OOM-kill count now (None when it cannot be read)."""
        try:
            if self.agent is not None:
                with anyio.fail_after(10):
                    reply = await self.agent.request({"op": wire.PING})
            else:
                reply = await self._request_once({"op": wire.PING}, 10)
        except (StreamBroken, SandboxUnavailable, TimeoutError):
            return None
        return _count(reply.get("oom_kills"))

    async def _restart(self) -> None:
        self.agent = None
        if self._restarts >= 1:
            self.mode = "oneshot"
            return
        self._restarts += 1
        await self.start()

    async def _request_once(
        self,
        msg: wire.Request,
        timeout: float | None,
        body: Callable[[BinaryIO], None] | None = None,
    ) -> wire.Reply:
        if self.mode == "inline":
            cmd = ["python3", "-I", "-S", "-c", agent_source(), "--once"]
        else:
            cmd = [*AGENT_ARGV, "--once"]
        sock = await self.engine(lambda: self._open_exec(cmd))
        wait = None if timeout is None else timeout + 30
        try:
            reply, stderr = await anyio.to_thread.run_sync(
                lambda: one_shot(sock, msg, timeout=wait, body=body)
            )
        except OSError as e:  # the box stopped reading or answering (died, froze)
            await self.raise_if_dead()
            raise SandboxUnavailable(
                f"the agent in sandbox {self.name} stopped answering ({e}); retry"
            ) from None
        if reply is None:
            await self.raise_if_dead()
            raise SandboxUnavailable(f"the agent in sandbox {self.name} gave no answer: {stderr}")
        return reply

    # ------------------------------------------------------------ plain docker exec

    async def exec_plain(self, req: wire.ExecRequest) -> ExecResult:
        """``exec`` without python3 in the box: ``timeout -k`` in a plain ``docker exec``."""
        argv = req.get("argv") or ["/bin/sh", "-c", req["cmd"]]
        env = dict(req.get("env") or {})
        if req.get("stdin"):
            # No agent to write stdin through: it travels in the environment, decoded by
            # a shell in front of the command (inside the timeout, so it dies with it).
            if len(req["stdin"]) > _PLAIN_STDIN_MAX:
                raise SandboxUnavailable(
                    f"sandbox {self.name}'s image has no python3, so stdin is limited to "
                    f"{_PLAIN_STDIN_MAX * 3 // 4} bytes; write the data to a file first or "
                    f"use a Fleet image"
                )
            env["FLEET_STDIN_B64"] = req["stdin"]
            script = 'printf %s "$FLEET_STDIN_B64" | base64 -d | "$@"'
            argv = ["/bin/sh", "-c", script, "fleet-stdin", *argv]
        # Always through ``timeout`` (0: no limit): a program that cannot be started is
        # then 126/127 with a message on stderr, as on the agent's paths, instead of the
        # engine's "OCI runtime exec failed" on stdout. What the command leaves running
        # ends with it (see PLAIN_EXEC).
        exec_id = secrets.token_hex(8)
        limit = str(req.get("timeout") or 0)
        argv = [*self.prefix, "/bin/sh", "-c", PLAIN_EXEC, "fleet-exec", exec_id, limit, *argv]
        started = time.monotonic()

        out, err = HeadTail(req["limit"]), HeadTail(req["limit"])

        def run() -> int:
            # Streamed and capped as it arrives: the box decides how much it writes.
            started_exec = self._api.exec_create(
                self.id, argv, workdir=req["cwd"], environment=env, user="1000:1000"
            )["Id"]
            chunks = self._api.exec_start(started_exec, stream=True, demux=True)
            for chunk_out, chunk_err in chunks:
                if chunk_out:
                    out.feed(chunk_out)
                if chunk_err:
                    err.feed(chunk_err)
            return int(self._api.exec_inspect(started_exec)["ExitCode"])

        result = cap_output(await self.engine(run), out, err, started)
        if result.exit_code in (2, 125) and any(f in result.stderr for f in FORK_FAILED):
            await self.probe()  # the box, not the command, may be what could not fork
        return result

    async def probe(self) -> None:
        """Raise :class:`SandboxCrashed` (``process-limit``) when the box can no longer
        start a process; every later call then raises it too."""
        if self.mode != "plain":
            self.check_reply(await self.request({"op": wire.PROBE}, timeout=30))
            return

        def fork() -> Any:
            container = self._client.containers.get(self.id)
            argv = [*self.prefix, "/bin/sh", "-c", "/bin/true & wait $!"]
            return container.exec_run(argv, user="1000:1000")

        res = await self.engine(fork)
        if res.exit_code != 0:
            why = res.output.decode("utf-8", "replace").strip()
            self._process_limit(f"the box cannot start a process ({why})")

    def check_reply(self, reply: wire.Reply) -> wire.Reply:
        """``reply``, unless it says the box can no longer start a process (then crashed)."""
        if not reply.get("ok") and reply.get("error") == "no_processes":
            self._process_limit(reply.get("message", ""))
        return reply

    def _process_limit(self, detail: str) -> None:
        self.crashed = self.crashed or SandboxCrashed(self.name, "process-limit", detail)
        raise self.crashed

    # ------------------------------------------------------------ state

    def alive(self) -> bool:
        """Without an engine call: no crash seen and the agent stream (if any) open."""
        if self.crashed is not None:
            return False
        return self.agent is None or self.agent.alive()

    def close(self) -> None:
        if self.agent is not None:
            self.agent.close()
            self.agent = None


def _count(value: object) -> int | None:
    """A count a reply gave, when it is one (a box's forged reply may say anything)."""
    return value if type(value) is int else None

"""The Docker backend: one container per box, driven through an in-box agent.

Exec transport. How a request reaches the box - one long-lived in-box agent over a
framed stream (about a millisecond a round trip, against 55 ms for ``docker exec``),
its restart and fallbacks (one-shot agent, inline agent, plain ``docker exec``), and
how a dead, removed or frozen box becomes :class:`SandboxCrashed` - lives in
:mod:`sandbox.docker.transport`. This module holds the Sandbox API and the backend.

Filesystem. The root is read-only; ``/tmp`` is a tmpfs (``tmpfs_size``, mode 1777)
and ``/workspace`` is a tmpfs owned by uid 1000 with ``workspace_size`` as its size
limit. tmpfs is chosen over a volume because it is the only size-limited writable
mount the engine offers on overlay2/ext4 without xfs quotas, and it is fast and
disappears with the box. Its pages are charged as memory, so the container's memory
limit counts the tmpfs sizes on top of ``spec.memory`` (:mod:`sandbox.docker.container`): a
full workspace is ENOSPC, not an OOM kill. Paths are checked twice: on the host
(:meth:`Sandbox.resolve`) and in the box after symlinks are resolved, so a symlink
in ``/workspace`` pointing at ``/etc`` is refused.

OOM. A box whose main process dies raises :class:`SandboxCrashed` naming the reason
(``oom-killed`` from ``State.OOMKilled``, ``killed``, ``exited(N)``, ``removed``,
``paused``) on the next call. When the OOM killer kills a command but the box lives on (the usual
case: commands get a higher ``oom_score_adj`` than the agent), the agent sees the
memory cgroup's ``oom_kill`` counter rise during the command and the result carries
``oom_killed=True`` (exit code 137). With several commands running at once the flag
can land on a sibling that ran at the same moment; it never goes missing. When the
OOM killer ends the agent itself (a file operation too big for the box), the call's
:class:`SandboxUnavailable` says the box ran out of memory, and the agent is restarted.

Security defaults (from :class:`SandboxSpec`): user 1000, all capabilities dropped,
no-new-privileges, read-only root, pids/memory (no swap)/CPU limits, an init process,
no network for coding boxes, never the Docker socket, never the host's environment.
``spec.runtime = "gvisor"`` puts gVisor's kernel between the box and the host's, with
every process the backend starts in the box under gVisor's limits (:mod:`sandbox.docker.gvisor`).
"""

from __future__ import annotations

import io
import os
import re
import stat
import tarfile
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import docker
import docker.errors

from ..base import BoxInfo, Command, ExecResult, FileInfo, Sandbox, SandboxBackend, owner_key
from ..errors import (
    PathRefused,
    SandboxClosed,
    SandboxCrashed,
    SandboxError,
    SandboxSpecError,
    SandboxUnavailable,
)
from ..inbox import wire
from ..prepared import waiting
from ..prepared.capture import PREFIX
from ..prepared.waiting import MOUNT
from ..process import BoxProcess
from ..spec import SandboxSpec
from ..watch import WorkspaceWatch
from . import prepared, reaper
from .boxops import (
    AGENT_ARGV,
    bounded_data_filter,
    exec_request,
    exec_result,
    ok_reply,
    reading_reply,
    wait_cdp,
)
from .container import create_container
from .engine import engine_calls, remove_box
from .firewall import infra_mac
from .gvisor import exec_prefix, no_prlimit_message
from .network import PROXY_PORT, RunNetworks, proxy_env
from .prepared import TREE_FILE
from .transport import BoxTransport

_NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$")
_CODING_COMMAND = ["sleep", "infinity"]
# A box of a prepared snapshot copies the snapshot's tree into its fresh /workspace as its
# first act, while the engine finishes the start and the host connects to the box's agent
# (about 60 ms for a 25 MB virtualenv, in series before): the copy is then mostly done by
# the time the first request arrives. What it leaves behind says how it went; the first
# request waits for that (:meth:`DockerBackend._lay_prepared`), so no caller sees a half
# laid tree. The markers live in the box's own /tmp and are removed before the box is
# handed out.
_LAID, _LAY_FAILED, _LAY_ERR = "/tmp/.fleet-laid", "/tmp/.fleet-lay-failed", "/tmp/.fleet-lay.err"
_READ_ERR, _READ_FAILED = "/tmp/.fleet-lay-read.err", "/tmp/.fleet-lay-read-failed"
_LAY = f"if cp -a /{PREFIX}/. /workspace/ 2>{_LAY_ERR}; then : >{_LAID}; else : >{_LAY_FAILED}; fi"
# In Fleet's own image (Debian's GNU tar) the copy is a tar pipe: one process reads while
# the other writes, so it takes about half of `cp -a`'s time (31 against 69 ms for the
# 25 MB, 1,683-file virtualenv of bench/setup.py, median of 7 in one box). `-p` keeps the
# modes as `cp -a` does (the box's user owns every entry either way: the snapshot's
# entries are its own). A pipeline's status is its last command's, so the reading side
# leaves a marker when it fails; the extracting side's error is what the host is shown,
# the reading side's only when there is no other. A tree that does not fit makes tar
# say only "Wrote only 7168 of 10240 bytes" (tmpfs writes short before it refuses), so
# a workspace left with less than a MiB free says so in the words `cp` would use.
_FULL = (
    "df -Pk /workspace | awk 'NR == 2 && $4 < 1024 { print \"/workspace: No space left on "
    'device (" $2 " KiB, " $4 " KiB free)" }\''
)
"""Prints, when the workspace has under a MiB left, what a tree that did not fit came to."""
_TAR = (
    f"{{ tar -C /{PREFIX} -cf - . 2>{_READ_ERR} || : >{_READ_FAILED}; }} "
    f"| tar -C /workspace -xpf - 2>{_LAY_ERR} && [ ! -e {_READ_FAILED} ]"
)
_LAY_FAST = (
    f"if {_TAR}; then rm -f {_READ_ERR}; : >{_LAID}; "
    f"else [ -s {_LAY_ERR} ] || cat {_READ_ERR} >{_LAY_ERR}; {_FULL} >>{_LAY_ERR}; "
    f": >{_LAY_FAILED}; fi"
)
_LAYING_COMMAND = ["sh", "-c", f"{_LAY}; exec sleep infinity"]
# A box that waited for its setup's snapshot lays the snapshot's archive (its entries
# under PREFIX, three names deep) from its read-only mount (sandbox/prepared/waiting.py).
_LAY_TREE = (
    f"tar -C /workspace --strip-components=3 -xpf {MOUNT}/{TREE_FILE} || {{ {_FULL} >&2; exit 1; }}"
)
_LAYING_OWN = ["sh", "-c", f"{_LAY_FAST}; exec sleep infinity"]
# A coding box of Fleet's image runs its agent as PID 1, attached to from the host before
# it starts (sandbox/docker/container.py): no `docker exec` to reach it. Other images may
# have no agent (the transport's fallbacks), so they sleep and get one by `docker exec`.
# A box of a snapshot copies its tree beside the agent's start, not before it: the copy
# in the background, with none of the container's stdio (the agent's stream is the
# agent's alone), and PID 1 - the shell's `exec` - reaps it.
_AGENT_INIT = [*AGENT_ARGV, "--init"]
_LAYING_AGENT = [
    "sh",
    "-c",
    f"({_LAY_FAST}) </dev/null >/dev/null 2>&1 & exec {' '.join(_AGENT_INIT)}",
]
_LAY_WAIT = (
    f"while :; do if [ -e {_LAID} ]; then rm -f {_LAID} {_LAY_ERR}; exit 0; fi; "
    f"if [ -e {_LAY_FAILED} ]; then tail -c 2000 {_LAY_ERR} >&2; exit 1; fi; sleep 0.005; done"
)
# Chromium skips its proxy for loopback and link-local (169.254/16) addresses unless
# told otherwise; "<-loopback>" removes those implicit bypasses, so even the metadata
# address goes to the proxy, which refuses it.
_BROWSER_COMMAND = ["/opt/fleet/start-browser", "--proxy-bypass-list=<-loopback>"]


INLINE_UPLOAD_BYTES = 8 * 1024 * 1024
"""Uploads up to this size go in one request on the agent's stream (base64 in JSON,
about a millisecond of overhead); larger ones stream as raw tar bytes."""
STALL_S = 120.0
"""Seconds a streamed upload may make no progress before the box is judged stuck."""


def tree_bytes(local: Path) -> int:
    """Bytes of the regular files under ``local`` (links not followed)."""
    if not local.is_dir():
        return local.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(local):
        for name in files:
            st = os.lstat(os.path.join(root, name))
            total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total


class DockerSandbox(Sandbox):
    """One container; see the module docstring for how calls reach it."""

    def __init__(
        self, backend: DockerBackend, info: dict, spec: SandboxSpec, run: str, member: str
    ):
        self._backend = backend
        self.id = info["Id"]
        self.name = info["Name"].lstrip("/")
        self.spec = spec
        self.run = run
        self.member = member
        nets = info["NetworkSettings"]["Networks"]
        self.ip = next((n["IPAddress"] for n in nets.values() if n.get("IPAddress")), None)
        prefix = exec_prefix(spec)
        self.transport = BoxTransport(backend.client, self.id, self.name, prefix)
        self._closed = False
        self._cdp: str | None = None
        self._watch = WorkspaceWatch()
        # Fleet's coding image starts nothing but its agent, and /workspace is a fresh
        # tmpfs; another image's entrypoint may write there before anyone asks.
        self._untouched = spec.kind == "coding" and spec.image is None and spec.prepared is None
        self.env_overlay: dict[str, str] = {}
        """Set on every command the box runs: what its snapshot adds to a box's
        environment, for a box that got the snapshot's tree after it started
        (:meth:`DockerBackend.lay_tree`); a command's own ``env`` wins."""

    def untouched_workspace(self) -> bool:
        return self._untouched and not self._closed

    @property
    def mode(self) -> str:
        """How calls reach the box: ``agent``, ``oneshot``, ``inline`` or ``plain``."""
        return self.transport.mode

    async def _call(
        self,
        msg: wire.Request,
        *,
        timeout: float | None = None,
        body: Callable[[BinaryIO], None] | None = None,
    ) -> wire.Reply:
        """Send one request by the best path; raise crash/close errors first."""
        self._ensure_usable()
        if self.mode == "plain":
            raise SandboxUnavailable(
                f"sandbox {self.name}'s image has no python3, which file operations need; "
                f"use a Fleet image or one with python3"
            )
        return await self.transport.request(msg, timeout=timeout, body=body)

    def _ensure_usable(self) -> None:
        if self._closed:
            raise SandboxClosed(f"sandbox {self.name} was closed; create a new one")
        if self.transport.crashed:
            raise self.transport.crashed

    # ------------------------------------------------------------ Sandbox API

    async def exec(
        self,
        cmd: Command,
        *,
        timeout: float | None = 60.0,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        output_limit: int | None = None,
    ) -> ExecResult:
        self._untouched = False
        limit = output_limit or self.spec.output_limit
        if self.env_overlay:
            env = {**self.env_overlay, **(env or {})}
        req = exec_request(cmd, timeout, cwd or self.spec.workdir, env, stdin, limit)
        with self._watch.command() as report:
            if self.mode == "plain":
                self._ensure_usable()
                return await self.transport.exec_plain(req)
            if self._watch.on:
                req["stamps"] = True
            done: wire.ExecReply = ok_reply(await self._call(req, timeout=timeout), self.name)
            with reading_reply(wire.EXEC, self.name):
                result = exec_result(done)
                stamps = done.get("stamps_print")
                if stamps is not None and not isinstance(stamps, str):
                    raise TypeError(f"stamps_print is {type(stamps).__name__}")
            report(stamps)
        if result.exit_code == 137 and not result.oom_killed:
            await self.transport.raise_if_dead()
        return result

    def watch_workspace(self) -> None:
        self._watch.on = True

    def settled_print(self) -> str | None:
        return self._watch.settled

    async def read_file(self, path: str, *, limit: int = 64 * 1024 * 1024) -> bytes:
        from .boxops import read_reply

        reply = await self._call({"op": wire.READ, "path": self.resolve(path), "limit": limit})
        with reading_reply(wire.READ, self.name):
            return read_reply(reply, path, limit, self.name)

    async def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        self._untouched = False
        import base64

        raw = data.encode() if isinstance(data, str) else data
        data = base64.b64encode(raw).decode()
        req: wire.WriteRequest = {
            "op": wire.WRITE,
            "path": self.resolve(path),
            "mode": mode,
            "data": data,
        }
        with self._watch.writer():
            ok_reply(await self._call(req), self.name)

    async def list_dir(self, path: str) -> list[FileInfo]:
        req: wire.ListRequest = {"op": wire.LIST, "path": self.resolve(path)}
        done: wire.ListReply = ok_reply(await self._call(req), self.name)
        with reading_reply(wire.LIST, self.name):
            return [FileInfo(**e) for e in done["entries"]]

    async def start_process(self, command: str, *, cwd: str | None = None) -> BoxProcess:
        self._untouched = False
        if self._closed:
            raise SandboxClosed(f"sandbox {self.name} was closed; create a new one")
        self._watch.live_process()
        return await self.transport.open_process(
            command, self.resolve(cwd) if cwd else None, env=self.env_overlay
        )

    async def upload(self, local: Path, remote: str) -> None:
        """Small trees travel in one request; large ones (and large files) as a tar
        stream on a one-shot agent of their own (see :mod:`sandbox.docker.transport`)."""
        self._untouched = False
        import base64

        local = Path(local)
        if not local.exists():
            raise FileNotFoundError(f"{local}: no such file or directory on the host")
        size = await anyio.to_thread.run_sync(tree_bytes, local)
        if local.is_file() and size <= INLINE_UPLOAD_BYTES:
            await self.write_file(remote, await anyio.Path(local).read_bytes())
            return
        dest, arcname = self.resolve(remote), "."
        if local.is_file():
            dest, _, arcname = dest.rpartition("/")

        def pack(out: BinaryIO) -> None:
            with tarfile.open(fileobj=out, mode="w|", bufsize=1 << 20) as tar:
                tar.add(local, arcname=arcname)

        req: wire.TarInRequest = {"op": wire.TAR_IN, "path": dest or "/"}
        with self._watch.writer():
            if size > INLINE_UPLOAD_BYTES:
                req["stream"] = True
                reply = await self._call(req, timeout=STALL_S, body=pack)
            else:
                buf = io.BytesIO()
                await anyio.to_thread.run_sync(pack, buf)
                req["data"] = base64.b64encode(buf.getvalue()).decode()
                reply = await self._call(req)
        ok_reply(reply, self.name)

    async def download(self, remote: str, local: Path) -> None:
        import base64

        local = Path(local)
        info = await self._stat(remote)
        if info != "dir":
            data = await self.read_file(remote)
            local.parent.mkdir(parents=True, exist_ok=True)
            await anyio.Path(local).write_bytes(data)
            return
        req: wire.TarOutRequest = {"op": wire.TAR_OUT, "path": self.resolve(remote)}
        reply: wire.TarOutReply = ok_reply(await self._call(req), self.name)
        with reading_reply(wire.TAR_OUT, self.name):
            archive = base64.b64decode(reply["data"])

        def unpack() -> None:
            local.mkdir(parents=True, exist_ok=True)
            # "r:": an archive the box sends is never decompressed (a small gzip could
            # unpack to far more than the frame that carried it); what it unpacks to is
            # held to the archive's own size (a sparse entry may claim more).
            with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
                # The box is not trusted: "data" refuses absolute names, '..', links out.
                tar.extractall(local, filter=bounded_data_filter(len(archive)))

        try:
            await anyio.to_thread.run_sync(unpack)
        except tarfile.ReadError as e:
            raise SandboxError(
                f"sandbox {self.name}: the archive of {remote} is not a plain tar archive "
                f"({e}); nothing more of it was unpacked"
            ) from None
        except tarfile.FilterError as e:
            err = PathRefused(remote, ("the download's destination",))
            err.args = (
                f"sandbox {self.name}: {remote} holds {e}, which would leave {local} on the "
                f"host; remove or replace that entry in the box (e.g. 'cp -L') and retry",
            )
            raise err from None

    async def _stat(self, remote: str) -> str:
        full = self.resolve(remote)
        parent, _, name = full.rpartition("/")
        for entry in await self.list_dir(parent or "/"):
            if entry.name == name:
                return entry.type
        raise FileNotFoundError(f"{remote}: no such file or directory in sandbox {self.name}")

    async def cdp_endpoint(self) -> str:
        if self.spec.kind != "browser":
            return await super().cdp_endpoint()
        self._ensure_usable()
        if self._cdp is None:
            url = f"http://{self.ip}:9223"
            if not await wait_cdp(url, 20.0):
                await self.transport.raise_if_dead()
                raise SandboxUnavailable(
                    f"Chromium in sandbox {self.name} did not open DevTools at {url} within "
                    f"20 s; see 'docker logs {self.name}'"
                )
            self._cdp = url
        return self._cdp

    def looks_alive(self) -> bool:
        """Without an engine call: not closed, not crashed, agent stream still open."""
        return not self._closed and self.transport.alive()

    async def check(self) -> None:
        self._ensure_usable()
        await self.transport.raise_if_dead()
        await self.transport.probe()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            self.transport.close()
            if not self.spec.keep:
                await self._backend.remove_container(self.id)


class DockerBackend(SandboxBackend):
    """Boxes as containers on one Docker engine.

    ``node`` names the cluster node this backend serves ("" on one machine): its boxes,
    networks and proxies carry ``fleet.node``, its run networks and proxies have names
    of their own (two nodes may share an engine), and ``list_boxes``/``remove_run`` see
    only what it made; their liveness is the node's marker (:func:`reaper.owner_key`).
    """

    adopts_prestarted = True

    def __init__(
        self,
        client: docker.DockerClient | None = None,
        *,
        images: Mapping[str, str] | None = None,
        node: str = "",
    ) -> None:
        self._client = client
        self._images = dict(images or {})
        self._added_env: dict[str, dict[str, str]] = {}
        """What each snapshot adds to its boxes' environment (:meth:`lay_tree`)."""
        self._networks: RunNetworks | None = None
        self.node = node

    def owner(self, run: str) -> str:
        return owner_key(run, self.node)

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            from .engine import connect

            self._client = connect()
        return self._client

    async def _ready(self) -> docker.DockerClient:
        if self._client is None:
            await anyio.to_thread.run_sync(lambda: self.client)
        if self._networks is None:
            self._networks = RunNetworks(self.client, self.node)
        return self.client

    async def image_for(self, spec: SandboxSpec) -> str:
        """The spec's image, else Fleet's image for its kind (service boxes: coding)."""
        if spec.image:
            return spec.image
        kind = "coding" if spec.kind == "service" else spec.kind
        if kind not in self._images:
            from ..images.catalog import image_ref

            client = await self._ready()
            with engine_calls(client):
                self._images[kind] = await anyio.to_thread.run_sync(
                    lambda: image_ref(kind, client=client)
                )
        return self._images[kind]

    async def egress_proxy(self, run: str, allow: Sequence[str]) -> str:
        await self._ready()
        assert self._networks is not None
        await self._networks.ensure_network(run)
        proxy_image = await self.image_for(SandboxSpec())
        ip = await self._networks.ensure_proxy(
            run, list(allow), proxy_image, reaper.proxy_labels(run)
        )
        # A proxy just started may not listen yet: a box's programs retry, a host-side
        # client connects once, so wait (bounded) until it accepts a connection.
        with anyio.move_on_after(10):
            while True:
                try:
                    stream = await anyio.connect_tcp(ip, PROXY_PORT)
                except OSError:
                    await anyio.sleep(0.1)
                    continue
                await stream.aclose()
                break
        return f"http://{ip}:{PROXY_PORT}"

    async def create(
        self,
        spec: SandboxSpec,
        *,
        run: str,
        member: str,
        command: list[str] | None = None,
        tree: Path | None = None,
    ) -> DockerSandbox:
        """Create and start a box; browser boxes are returned once CDP answers.

        ``command`` overrides the image's command (service boxes use it to start their
        server); a service box answers on the run network under ``member`` as its name,
        on :data:`~sandbox.docker.firewall.SERVICE_PORT` only, to the run's proxies only.
        ``tree``: that directory read-only at :data:`~sandbox.prepared.waiting.MOUNT`
        (only through :meth:`create_waiting`, which says for which boxes).
        """
        for what, value in (("run", run), ("member", member)):
            if not _NAME_RE.match(value):
                raise SandboxSpecError(
                    f"{what} id {value!r} must be 1-63 letters, digits, '_', '.' or '-' "
                    f"(starting with a letter or digit), e.g. 'r1' or 'browser-2'"
                )
        await self._ready()
        image = spec.prepared or await self.image_for(spec)
        reaper.mark_live(self.owner(run))
        labels = reaper.box_labels(spec, run, member, self.node)
        env = dict(spec.env)
        network = "none"
        aliases: list[str] = []
        if spec.kind in ("browser", "service") or spec.network.egress == "allowlist":
            assert self._networks is not None
            net = await self._networks.ensure_network(run)
            network = net["Name"]
            if spec.kind == "service":
                aliases = [member]
            else:
                proxy_image = await self.image_for(SandboxSpec())
                ip = await self._networks.ensure_proxy(
                    run, spec.network.allow, proxy_image, reaper.proxy_labels(run, self.node)
                )
                env.update(proxy_env(ip))
        attach = False
        if command is None and spec.kind == "coding":
            command, attach = _coding_command(spec)
        elif command is None and spec.kind == "service" and not spec.image:
            # a service box of a named image runs that image's server
            command = _LAYING_OWN if spec.prepared else _CODING_COMMAND
        elif command is None and spec.kind == "browser" and not spec.image:
            command = _BROWSER_COMMAND
        # A service box is one its run's proxies may connect to (firewall.py).
        mac = infra_mac() if spec.kind == "service" and network != "none" else None
        args = (spec, image, labels, env, network, aliases, command, run, member, mac, attach)
        mount = str(tree) if tree is not None else None
        info = await anyio.to_thread.run_sync(
            lambda: create_container(self.client, *args, tree=mount)
        )
        return await self.adopt(info, spec, run=run, member=member)

    async def create_waiting(
        self, spec: SandboxSpec, *, run: str, member: str, tree: Path
    ) -> DockerSandbox:
        if spec.kind != "coding" or spec.image or spec.prepared:
            # Another image may have no GNU tar to lay the tree with.
            raise SandboxError("only a coding box of Fleet's own image waits for a setup")
        return await self.create(spec, run=run, member=member, tree=tree)

    async def lay_tree(self, box: Sandbox, *, ref: str) -> None:
        """The tree of the snapshot ``ref`` - kept as an archive in the directory the box
        was created with (:mod:`sandbox.prepared.waiting`) - laid into ``box``'s
        ``/workspace`` by the box's own ``tar``, and what the snapshot adds to its boxes'
        environment set on the box's every command: the box is then as one started from
        the snapshot. The box is removed if the tree does not lay."""
        assert isinstance(box, DockerSandbox)
        added: dict[str, str] = {}

        async def lay() -> ExecResult:
            if ref not in self._added_env:  # every waiting box of a key asks: once
                base = await self.image_for(box.spec)
                self._added_env[ref] = await anyio.to_thread.run_sync(
                    prepared.added_env, self.client, ref, base
                )
            added.update(self._added_env[ref])
            return await box.exec(["sh", "-c", _LAY_TREE], cwd="/", timeout=600)

        await self._laid_or_removed(box, lay)
        box.env_overlay = added
        box.spec = box.spec.model_copy(update={"prepared": ref})

    async def _lay_prepared(self, box: DockerSandbox, *, started: bool) -> None:
        """The snapshot's tree in the box's fresh ``/workspace`` (the box removed if not):
        waited for when the box's command copies it (``started``), copied here if not."""
        if started:
            argv = ["sh", "-c", _LAY_WAIT]
        else:
            argv = ["cp", "-a", f"/{PREFIX}/.", "/workspace/"]
        await self._laid_or_removed(box, lambda: box.exec(argv, cwd="/", timeout=600))

    async def _laid_or_removed(
        self, box: DockerSandbox, lay: Callable[[], Awaitable[ExecResult]]
    ) -> None:
        """Run ``lay``; the box is removed when it raises or its command fails."""
        try:
            res = await lay()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.remove_container(box.id)
            raise
        if not res.ok:
            await self.remove_container(box.id)
            raise SandboxUnavailable(
                f"box {box.name}: the prepared tree did not copy into /workspace "
                f"(exit {res.exit_code}): {(res.stderr or res.stdout).strip()[-300:]}"
            )

    async def setup_image(self, spec: SandboxSpec) -> str:
        await self._ready()
        image = await self.image_for(spec)
        return await anyio.to_thread.run_sync(prepared.image_id, self.client, image)

    async def find_prepared(self, key: str) -> str | None:
        await self._ready()
        return await anyio.to_thread.run_sync(prepared.find_for_use, self.client, key)

    async def save_prepared(
        self,
        box: Sandbox,
        *,
        key: str,
        inputs: dict[str, Any],
        setup: str,
        repo: Path | None,
        secrets: dict[str, str],
        keep: Path | None = None,
    ) -> str:
        assert isinstance(box, DockerSandbox)
        base = await self.image_for(box.spec)
        prefix = exec_prefix(box.spec)

        def save() -> str:
            with engine_calls(self.client):
                return prepared.save(
                    self.client, box.id, prefix, base,
                    key=key, inputs=inputs, setup=setup, repo=repo, secrets=secrets,
                    keep=keep,
                )  # fmt: skip

        return await anyio.to_thread.run_sync(save)

    def start_offline(
        self, spec: SandboxSpec, *, run: str, member: str, image: str
    ) -> dict[str, Any]:
        """Blocking: create and start a box with no network (a coding box) from a
        thread without an event loop, before the run's own loop exists; returns the
        container's details for :meth:`adopt`. The caller marked ``run`` live."""
        if spec.kind != "coding" or spec.network.egress != "none":
            raise SandboxSpecError(f"only a coding box without network starts early, not {spec}")
        labels = reaper.box_labels(spec, run, member, self.node)
        env = dict(spec.env)
        command, attach = _coding_command(spec)
        return create_container(
            self.client, spec, image, labels, env, "none", [], command, run, member, attach=attach
        )

    async def adopt(
        self, info: dict[str, Any], spec: SandboxSpec, *, run: str, member: str
    ) -> DockerSandbox:
        """The box of a started container (:meth:`create`, :meth:`start_offline`), ready
        for ``exec`` once its agent answers (and CDP, for a browser box) and, for a box of
        a prepared snapshot, once the snapshot's tree is in ``/workspace``; removed if not."""
        box = DockerSandbox(self, info, spec, run, member)
        try:
            await box.transport.start()
            if spec.kind == "browser":
                await box.cdp_endpoint()
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self.remove_container(box.id)
            command = (info.get("Config") or {}).get("Cmd") or [""]
            if isinstance(exc, SandboxCrashed) and exc.reason == "exited(127)":
                # A gVisor box's command goes through prlimit first: 127 is its absence.
                if command[0] != "prlimit":
                    raise
                image = spec.image or str(info["Config"]["Image"])
                raise SandboxUnavailable(no_prlimit_message(image)) from None
            raise
        if spec.prepared:
            command = (info.get("Config") or {}).get("Cmd") or []
            laying = command[-len(_LAYING_COMMAND) :] in (
                _LAYING_COMMAND,
                _LAYING_OWN,
                _LAYING_AGENT,
            )
            await self._lay_prepared(box, started=laying)
        return box

    async def remove_container(self, ident: str) -> None:
        with engine_calls(self.client):
            await anyio.to_thread.run_sync(lambda: remove_box(self.client, ident))

    async def list_boxes(self, *, run: str | None = None) -> list[BoxInfo]:
        await self._ready()
        return await anyio.to_thread.run_sync(reaper.list_boxes, self.client, run, self.node)

    async def remove_run(self, run: str) -> int:
        await self._ready()
        count = await anyio.to_thread.run_sync(reaper.remove_run, self.client, run, self.node)
        await anyio.to_thread.run_sync(waiting.drop_trees, self.owner(run))
        reaper.mark_done(self.owner(run))
        return count

    async def gc(
        self, *, live_runs: set[str] | None = None, now: float | None = None
    ) -> list[BoxInfo]:
        await self._ready()

        def live() -> set[str]:  # asked after each listing (reaper.collect says why)
            return reaper.live_runs() if live_runs is None else live_runs

        removed = await anyio.to_thread.run_sync(
            lambda: reaper.gc(self.client, lambda _: live(), now=now or time.time())
        )
        await anyio.to_thread.run_sync(waiting.drop_stale, live)
        return removed


def _coding_command(spec: SandboxSpec) -> tuple[list[str], bool]:
    """A coding box's command, and whether the host attaches to its stdio (the agent is
    its PID 1: a box of Fleet's image, or of a snapshot of it)."""
    if not spec.image:
        return (_LAYING_AGENT if spec.prepared else _AGENT_INIT), True
    return (_LAYING_COMMAND if spec.prepared else _CODING_COMMAND), False


def new_run_id() -> str:
    """A fresh run id suitable for labels and names."""
    return f"r-{uuid.uuid4().hex[:12]}"

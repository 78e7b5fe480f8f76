"""The backend-neutral sandbox API: one isolated box, and what creates boxes.

A :class:`Sandbox` runs commands and moves files inside one box; a
:class:`SandboxBackend` creates, lists and removes boxes. The subagent harness
talks only to these two classes, and everything above the sandbox layer gets a
backend from :mod:`sandbox.registry`, so a new backend (another engine, a remote
cluster node) is a room of its own and one registration. Errors follow
:mod:`sandbox.errors`.
"""

from __future__ import annotations

import abc
import posixpath
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from .errors import PathRefused, SandboxError
from .process import BoxProcess
from .spec import SandboxSpec


class ExecResult(BaseModel):
    """What one command did."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    exit_code: int
    """Exit status; 124 when the timeout killed it, 128+N when killed by signal N, 126
    when the program could not be started (not executable, a directory), 127 when it
    does not exist (see :meth:`Sandbox.exec`)."""
    stdout: str
    """Standard output, UTF-8 with replacement; head and tail kept when over the cap."""
    stderr: str
    """Standard error, same rules as ``stdout``."""
    timed_out: bool = False
    """The timeout fired and the whole process group was killed."""
    truncated: bool = False
    """At least one stream was over the cap and its middle was dropped."""
    duration_s: float = 0.0
    """Wall time of the command inside the box."""
    leftovers: int = 0
    """Processes the command left running (background jobs, ``setsid`` daemons) that
    were killed when it ended or timed out; a line on stderr says so too."""
    oom_killed: bool = False
    """The box's OOM killer killed a process while the command ran (exit 137 if it was
    the command itself); the box itself may well be alive."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class FileInfo(BaseModel):
    """One entry of a directory listing."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    path: str
    type: Literal["file", "dir", "link", "other"]
    size: int
    mtime: float


class BoxInfo(BaseModel):
    """A box as the engine sees it (for ``fleet sandbox ls`` and gc)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    name: str
    kind: str
    run: str
    member: str
    status: str
    created: float
    ttl_s: float
    keep: bool = False
    node: str = ""
    """The cluster node that made the box (its ``fleet.node`` label); "" on one machine."""

    @property
    def owner(self) -> str:
        """The live marker that keeps this box's run live (see :mod:`sandbox.docker.reaper`)."""
        return owner_key(self.run, self.node)


Command = str | Sequence[str]


class Sandbox(abc.ABC):
    """One isolated box.

    Error contract: every method may raise :class:`~sandbox.errors.SandboxCrashed`
    (the box died, was removed or was paused; the reason is named; a crash is final:
    a box paused and then unpaused stays crashed, ``reason == "paused"``),
    :class:`~sandbox.errors.SandboxClosed` and :class:`~sandbox.errors.SandboxUnavailable`
    (engine gone, or it refused a call on a box that still runs). No exception of the
    engine's client library escapes. File methods
    raise :class:`~sandbox.errors.PathRefused` for paths outside
    :attr:`allowed_roots`, ``FileNotFoundError`` for missing paths and
    :class:`~sandbox.errors.OutputLimitExceeded` for reads over their limit.
    ``exec`` never raises for a slow or noisy command: it returns an
    :class:`ExecResult` with ``timed_out`` / ``truncated`` set and the output kept.
    """

    id: str
    name: str
    spec: SandboxSpec
    allowed_roots: tuple[str, ...] = ("/workspace", "/tmp")

    def looks_alive(self) -> bool:
        """Without an engine call, as far as the box's own record tells (a box that
        keeps none: True)."""
        return True

    def untouched_workspace(self) -> bool:
        """True only while ``/workspace`` can be nothing but what the box started with:
        an empty mount (a box of Fleet's own image, fresh - boxes are never reused -,
        in which nothing has run and into which nothing was written). False whenever
        that is not known: then whoever needs its content looks."""
        return False

    @abc.abstractmethod
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
        """Run ``cmd`` (a shell string, or an argv list) inside the box.

        The timeout is enforced inside the box: its whole process group is killed
        and the output so far is returned with ``timed_out=True``.

        A program that cannot be started is a result, never an exception, and the same
        on every way a backend reaches the box, for an argv list and a shell string
        alike: exit code 126 and a line on stderr that names the program and says
        ``Permission denied`` when the file is not executable (or is a directory); 127
        and a line naming it when it does not exist. An executable file with no ``#!`` line that is
        not a binary runs with ``/bin/sh``, as a shell would run it.

        Raises:
            SandboxCrashed: the box died, was removed or paused (``reason`` says which).
            SandboxClosed: its owner closed it.
            SandboxUnavailable: the engine is gone, or refused the call.
            SandboxSpecError: the request itself is invalid (an empty argv).
        """

    async def start_process(self, command: str, *, cwd: str | None = None) -> BoxProcess:
        """Start ``command`` (a shell string) as a long-lived process whose stdin and
        stdout stay open to the caller (:mod:`sandbox.process`), e.g. an MCP server.
        Raises :class:`SandboxError` when this backend cannot stream a process.

        Raises:
            SandboxError: this backend cannot stream a process.
            SandboxCrashed: the box died, was removed or paused (``reason`` says which).
            SandboxClosed: its owner closed it.
            SandboxUnavailable: the engine is gone, or refused the call.
        """
        raise SandboxError(f"{type(self).__name__} cannot run a long-lived process")

    @abc.abstractmethod
    async def read_file(self, path: str, *, limit: int = 64 * 1024 * 1024) -> bytes:
        """The bytes of a file in the box.

        Raises:
            PathRefused: ``path`` is outside :attr:`allowed_roots`.
            FileNotFoundError: there is no such file.
            OutputLimitExceeded: the file is larger than ``limit``.
            SandboxCrashed: the box died, was removed or paused (``reason`` says which).
            SandboxClosed: its owner closed it.
            SandboxUnavailable: the engine is gone, or refused the call.
        """

    @abc.abstractmethod
    async def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        """Create or replace a file whole (parents are created), as the box's user could.

        A new file gets ``mode`` (default ``0o644``); a replaced file keeps its mode
        unless ``mode`` is given. ``IsADirectoryError`` when ``path`` is a directory,
        ``PermissionError`` when the box's user could not write it (a read-only file, a
        directory it may not write in). A failed write leaves nothing behind: the old
        file stays as it was and no temporary file remains.

        Raises:
            PathRefused: ``path`` is outside :attr:`allowed_roots`.
            IsADirectoryError: ``path`` is a directory.
            PermissionError: the box's user could not write it.
            SandboxCrashed: the box died, was removed or paused (``reason`` says which).
            SandboxClosed: its owner closed it.
            SandboxUnavailable: the engine is gone, or refused the call.
        """

    @abc.abstractmethod
    async def list_dir(self, path: str) -> list[FileInfo]:
        """Entries of a directory, sorted by name.

        Raises:
            PathRefused: ``path`` is outside :attr:`allowed_roots`.
            FileNotFoundError: there is no such directory.
            SandboxCrashed: the box died, was removed or paused (``reason`` says which).
            SandboxClosed: its owner closed it.
            SandboxUnavailable: the engine is gone, or refused the call.
        """

    @abc.abstractmethod
    async def upload(self, local: Path, remote: str) -> None:
        """Copy a host file or directory tree into the box at ``remote``.

        Raises:
            PathRefused: ``remote`` is outside :attr:`allowed_roots`.
            FileNotFoundError: ``local`` does not exist on the host.
            SandboxCrashed: the box died, was removed or paused (``reason`` says which).
            SandboxClosed: its owner closed it.
            SandboxUnavailable: the engine is gone, or refused the call.
        """

    @abc.abstractmethod
    async def download(self, remote: str, local: Path) -> None:
        """Copy a file or directory tree out of the box to ``local`` on the host.

        Raises:
            PathRefused: ``remote`` is outside :attr:`allowed_roots`.
            FileNotFoundError: there is no such file or directory in the box.
            SandboxCrashed: the box died, was removed or paused (``reason`` says which).
            SandboxClosed: its owner closed it.
            SandboxUnavailable: the engine is gone, or refused the call.
        """

    async def cdp_endpoint(self) -> str:
        """The Chrome DevTools endpoint (``http://ip:port``) of a browser box.

        Raises:
            NotImplementedError: this is not a browser box.
            SandboxCrashed: the box died, was removed or paused (``reason`` says which).
            SandboxClosed: its owner closed it.
            SandboxUnavailable: the engine is gone, or refused the call.
        """
        raise NotImplementedError(
            f"sandbox {self.name} is a {self.spec.kind} box, not a browser box"
        )

    def watch_workspace(self) -> None:
        """From now on, have each command report the workspace's stamps print where this
        backend can (:mod:`sandbox.watch`); a no-op where it cannot."""
        return None

    def settled_print(self) -> str | None:
        """The workspace's stamps print after the last command, if it ran alone and
        nothing may have written since (:mod:`sandbox.watch`); None: none known."""
        return None

    @abc.abstractmethod
    async def check(self) -> None:
        """Raise :class:`~sandbox.errors.SandboxCrashed` if the box is no longer running,
        or can no longer start a process (``reason == "process-limit"``: its pids limit
        is taken by processes nothing of Fleet's started).

        Raises:
            SandboxCrashed: the box is gone, paused, or out of processes.
            SandboxClosed: its owner closed it.
            SandboxUnavailable: the engine is gone, or refused the call.
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Remove the box (unless the spec says keep). Idempotent: a box closed already,
        or gone already, is no error.

        Raises:
            SandboxUnavailable: the engine could not be reached to remove it (``fleet
                sandbox gc`` removes it later, by its labels).
        """

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def resolve(self, path: str) -> str:
        """Normalise ``path`` (relative to the workdir) and refuse it outside the roots."""
        full = posixpath.normpath(posixpath.join(self.spec.workdir, path))
        for root in self.allowed_roots:
            if full == root or full.startswith(root.rstrip("/") + "/"):
                return full
        raise PathRefused(path, self.allowed_roots)


def owner_key(run: str, node: str = "") -> str:
    """Whose liveness a run's boxes follow: the run's coordinator (``run``) on one
    machine, the node's actor for the run (``run@node``) on a cluster."""
    return f"{run}@{node}" if node else run


class SandboxBackend(abc.ABC):
    """Creates, lists and removes boxes on one engine."""

    adopts_prestarted: bool = False
    """Whether :meth:`adopt` takes boxes started before a run existed (the command
    line's early boxes, ``coordinator.nodes.prewarm``)."""

    def owner(self, run: str) -> str:
        """The live-marker name of this backend's share of ``run`` (see :func:`owner_key`)."""
        return run

    @abc.abstractmethod
    async def create(self, spec: SandboxSpec, *, run: str, member: str) -> Sandbox:
        """Create and start a box, ready for ``exec`` (and CDP, for browser boxes).

        Raises:
            SandboxSpecError: ``spec`` cannot be made here (an unknown image or runtime).
            SandboxUnavailable: the engine is gone, or could not start the box.
            SandboxCrashed: the box died while it started.
        """

    @abc.abstractmethod
    async def list_boxes(self, *, run: str | None = None) -> list[BoxInfo]:
        """Fleet's boxes on this engine, optionally only one run's.

        Raises:
            SandboxUnavailable: the engine is gone.
        """

    async def egress_proxy(self, run: str, allow: Sequence[str]) -> str:
        """The URL of ``run``'s egress proxy for the hosts ``allow``, for a host-side
        client that must reach them the way a box would (an MCP server's URL):
        through the proxy's allowlist and address checks, never around them.
        Raises :class:`SandboxError` when this backend has no egress proxy."""
        raise SandboxError(f"{type(self).__name__} has no egress proxy")

    def start_offline(
        self, spec: SandboxSpec, *, run: str, member: str, image: str
    ) -> dict[str, Any]:
        """Blocking, from a thread with no event loop: create and start a coding box with
        no network before the run exists, from ``image`` (Fleet's coding image, or the
        snapshot ``spec.prepared`` names); its details, for :meth:`adopt`.

        Raises:
            SandboxError: this backend starts no boxes early (:attr:`adopts_prestarted`).
            SandboxSpecError: ``spec`` is not a coding box without network.
        """
        raise SandboxError(f"{type(self).__name__} starts no boxes before a run")

    async def adopt(
        self, info: dict[str, Any], spec: SandboxSpec, *, run: str, member: str
    ) -> Sandbox:
        """The box of ``info``, a box of ``spec`` started before the run, ready for
        ``exec`` once it answers (removed if it does not).

        Raises:
            SandboxError: this backend takes no such boxes (:attr:`adopts_prestarted`).
            SandboxCrashed: the box died before it answered.
        """
        raise SandboxError(f"{type(self).__name__} takes no boxes started before a run")

    async def setup_image(self, spec: SandboxSpec) -> str:
        """The id of the image a box of ``spec`` starts from (a prepared snapshot's key
        names the image by id, not by name).

        Raises:
            SandboxError: this backend keeps no prepared snapshots.
            SandboxUnavailable: the engine is gone, or has no such image.
        """
        raise SandboxError(f"{type(self).__name__} keeps no prepared snapshots")

    async def find_prepared(self, key: str) -> str | None:
        """The prepared snapshot ``key`` (for ``SandboxSpec.prepared``), its use
        recorded; None when this engine has none.

        Raises:
            SandboxError: this backend keeps no prepared snapshots.
            SandboxUnavailable: the engine is gone.
        """
        raise SandboxError(f"{type(self).__name__} keeps no prepared snapshots")

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
        """Keep the finished setup ``box``'s ``/workspace`` as the snapshot ``key``
        (:mod:`sandbox.prepared.capture` says what of it is kept); its reference.
        ``keep``: a directory that also gets the snapshot's tree for the boxes that
        waited for it (:meth:`create_waiting`).

        Raises:
            CaptureRefused: the tree cannot become a snapshot (a secret's value in it,
                an entry that is not a file, link or directory, too large).
            SandboxError: this backend keeps no prepared snapshots.
            SandboxUnavailable: the engine is gone.
        """
        raise SandboxError(f"{type(self).__name__} keeps no prepared snapshots")

    async def create_waiting(
        self, spec: SandboxSpec, *, run: str, member: str, tree: Path
    ) -> Sandbox:
        """A coding box of ``spec`` started before its setup's snapshot exists, that sees
        the directory ``tree`` (read-only) where the snapshot's tree will be kept;
        :meth:`lay_tree` makes it a box of the snapshot (:mod:`sandbox.prepared.waiting`).

        Raises:
            SandboxError: this backend (or this spec: another image) makes no such boxes.
            SandboxUnavailable: the engine is gone, or could not start the box.
        """
        raise SandboxError(f"{type(self).__name__} makes no boxes that wait for a setup")

    async def lay_tree(self, box: Sandbox, *, ref: str) -> None:
        """Lay the snapshot ``ref``'s tree, kept in the directory ``box`` was created with
        (:meth:`create_waiting`), into its ``/workspace``; the box is removed if it cannot.

        Raises:
            SandboxUnavailable: the tree did not lay (no room, no archive), or the engine
                is gone.
        """
        raise SandboxError(f"{type(self).__name__} makes no boxes that wait for a setup")

    @abc.abstractmethod
    async def remove_run(self, run: str) -> int:
        """Remove every box and network of one run; returns how many boxes.

        Raises:
            SandboxUnavailable: the engine is gone.
        """

    @abc.abstractmethod
    async def gc(
        self, *, live_runs: set[str] | None = None, now: float | None = None
    ) -> list[BoxInfo]:
        """Remove boxes whose TTL passed or whose run is not in ``live_runs``.

        Raises:
            SandboxUnavailable: the engine is gone.
        """

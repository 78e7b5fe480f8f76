"""The box agent's wire: every operation's request and reply, and the frame they travel in.

Both ends import this one file: the agent in the box (:mod:`sandbox.inbox.boxagent`,
beside it at ``/opt/fleet/wire.py``, or bundled into its source when the host sends
that with ``python3 -c``) and the host (:mod:`sandbox.docker.agent_client`,
:mod:`sandbox.docker.transport`, :mod:`sandbox.docker.boxops`, :mod:`sandbox.docker.backend`). So an
operation's fields are declared once, and mypy checks both sides against them.

Frame, both directions: a 4-byte big-endian length (:data:`HEADER`), then that many
bytes of UTF-8 JSON, at most :data:`MAX_FRAME`. Binary payloads travel base64-encoded
inside the JSON. Every request carries an ``id`` that its reply repeats, so many
requests share one stream. A reply is either the operation's own reply with
``ok: true`` or an :class:`ErrorReply` (``ok: false``, one of the error codes below).

Why TypedDicts rather than dataclasses: a frame is JSON, and a TypedDict is the dict
``json`` gives and takes, with no conversion on either side; and the agent's startup
time is part of every box's cold start, which ``dataclasses`` (it imports ``inspect``
and ``re``) would add to. Standard library only, like everything that runs in a box.
"""

from __future__ import annotations

import json
import struct

TYPE_CHECKING = False  # not typing's: importing typing costs every box's start
if TYPE_CHECKING:
    from typing import Any, Literal, NotRequired, TypedDict

HEADER = struct.Struct(">I")
"""The length prefix of every frame."""
MAX_FRAME = 256 * 1024 * 1024
"""The largest frame the agent reads (a request past it is refused with ``bad_frame``)."""
AGENT_ENDED = b"fleet-init: the box agent ended"
"""What a box's PID 1 writes on the container's stderr when the agent it started ends
(:func:`sandbox.inbox.boxagent.init_then_serve`): the attached stream stays open after
the agent's death, so this is how the host learns of it."""

# ---------------------------------------------------------------- operation names

EXEC: Literal["exec"] = "exec"
KILL: Literal["kill"] = "kill"
READ: Literal["read"] = "read"
WRITE: Literal["write"] = "write"
LIST: Literal["list"] = "list"
TAR_OUT: Literal["tar_out"] = "tar_out"
TAR_IN: Literal["tar_in"] = "tar_in"
PING: Literal["ping"] = "ping"
PROBE: Literal["probe"] = "probe"
INLINE_OPS = (PING, KILL)
"""Operations the agent answers on its reading thread: cheap, and never blocked."""

if TYPE_CHECKING:
    # ---------------------------------------------------------------- error codes

    ErrorCode = Literal[
        "path_refused",  # the path (or a link on the way, or an archive entry) leaves the roots
        "not_found",
        "is_dir",
        "not_dir",
        "permission",
        "too_large",  # a tree's archive is over the request's limit
        "no_processes",  # the box's pids limit leaves no room: the box, not the call, is done
        "bad_op",
        "bad_frame",
        "failed",  # anything else; the message names the exception
    ]

    class ErrorReply(TypedDict):
        """What a refused or failed request gets back."""

        id: int | None
        ok: Literal[False]
        error: ErrorCode
        message: str

    # ---------------------------------------------------------------- requests

    class _Request(TypedDict, total=False):
        id: int
        """Set by the host's stream when the request is sent; the reply repeats it."""

    class ExecRequest(_Request):
        """Run ``argv``, or ``cmd`` with the box's shell, in its own session."""

        op: Literal["exec"]
        cwd: str
        limit: int
        """Bytes of stdout and of stderr kept (head and tail); the rest is counted."""
        timeout: float | None
        """Seconds, enforced in the box (the whole process group is killed); None: none."""
        argv: NotRequired[list[str]]
        cmd: NotRequired[str]
        env: NotRequired[dict[str, str]]
        stdin: NotRequired[str]
        """Base64 of what the command reads on stdin."""
        stamps: NotRequired[bool]
        """Reply with the workspace's stamps print too (``stamps_print``)."""

    class KillRequest(_Request):
        """Kill the process group of the running request ``target`` (best effort)."""

        op: Literal["kill"]
        target: int

    class ReadRequest(_Request):
        op: Literal["read"]
        path: str
        limit: NotRequired[int]
        """Bytes; a larger file is answered ``too_large`` with its size, not its data."""

    class WriteRequest(_Request):
        op: Literal["write"]
        path: str
        data: str
        """Base64 of the file's new content."""
        mode: int | None
        """Permission bits; None keeps an existing file's (0o644 for a new one)."""

    class ListRequest(_Request):
        op: Literal["list"]
        path: str

    class TarOutRequest(_Request):
        """A tar archive of the tree at ``path`` (links stored as links, never followed)."""

        op: Literal["tar_out"]
        path: str
        limit: NotRequired[int]

    class TarInRequest(_Request):
        """Unpack an archive under ``path``: base64 ``data``, or with ``stream`` (to a
        ``--once`` agent only) the raw bytes that follow the request on stdin."""

        op: Literal["tar_in"]
        path: str
        data: NotRequired[str]
        stream: NotRequired[bool]

    class PingRequest(_Request):
        op: Literal["ping"]

    class ProbeRequest(_Request):
        """Whether the box can still start a process (``no_processes`` when it cannot)."""

        op: Literal["probe"]

    Request = (
        ExecRequest
        | KillRequest
        | ReadRequest
        | WriteRequest
        | ListRequest
        | TarOutRequest
        | TarInRequest
        | PingRequest
        | ProbeRequest
    )

    # ---------------------------------------------------------------- replies (ok: true)

    class ExecReply(TypedDict):
        exit_code: int
        """The command's status; 124 on timeout, 128+N when signal N ended it."""
        stdout: str
        """Base64 of what was kept (see ``truncated``)."""
        stderr: str
        timed_out: bool
        truncated: bool
        duration_s: float
        oom_killed: bool
        """The box's OOM killer ended something while the command ran."""
        leftovers: NotRequired[int]
        """Processes the command left running, which were killed when it ended."""
        stamps_print: NotRequired[str | None]
        """When asked for (``stamps``): :func:`sandbox.inbox.stamps.stamps_print` once the
        command and its leftovers had ended (None: not settled, or too many entries)."""

    class KillReply(TypedDict):
        killed: bool

    class ReadReply(TypedDict, total=False):
        """``data`` (base64), or ``too_large`` with the file's ``size`` and the ``limit``."""

        data: str
        too_large: bool
        size: int
        limit: int

    class WriteReply(TypedDict):
        size: int

    class Entry(TypedDict):
        """One directory entry, as :class:`sandbox.base.FileInfo` takes it."""

        name: str
        path: str
        type: Literal["file", "dir", "link", "other"]
        size: int
        mtime: float

    class ListReply(TypedDict):
        entries: list[Entry]

    class TarOutReply(TypedDict):
        data: str
        """Base64 of the tar archive."""

    class TarInReply(TypedDict):
        entries: int

    class PingReply(TypedDict):
        pid: int
        uid: int
        oom_kills: int | None
        """The memory cgroup's OOM-kill counter (None when the box cannot read it)."""

    class ProbeReply(TypedDict):
        spawned: bool

    class Ready(TypedDict):
        """The agent's first frame on a long-lived stream."""

        id: Literal[0]
        ok: Literal[True]
        ready: Literal[True]
        pid: int

    Reply = dict[str, Any]
    """A reply as it arrives: an op's reply plus ``id`` and ``ok: true``, or an
    :class:`ErrorReply`. Check ``ok`` first, then read it as that op's reply type."""


# ---------------------------------------------------------------- frames


def encode(msg: Any) -> bytes:
    """One frame: the length prefix, then the message as compact JSON."""
    body = json.dumps(msg, separators=(",", ":")).encode()
    return HEADER.pack(len(body)) + body


def decode(body: bytes) -> Reply:
    """The message of one frame's body."""
    msg: Reply = json.loads(body)
    return msg

"""The agent's wire, end to end without Docker: the host's typed requests, the agent run
as the box runs it (from a directory, ``python3 -I -S``, and as the inline ``-c``
program), and the host's reading of its replies."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.docker.agent_client import Demuxer
from sandbox.docker.boxops import (
    AGENT_PATH,
    agent_source,
    exec_request,
    exec_result,
    ok_reply,
    read_reply,
)
from sandbox.errors import PathRefused
from sandbox.images.catalog import BOX_HELPERS
from sandbox.inbox import wire

REPO = Path(__file__).resolve().parent.parent
INBOX = REPO / "sandbox" / "inbox"


def _ask(argv: list[str], req: wire.Request) -> wire.Reply:
    """One request to a ``--once`` agent; its reply as the host's stream reads it."""
    done = subprocess.run(
        [*argv, "--once"], input=wire.encode({**req, "id": 7}), capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr.decode()
    demux = Demuxer()
    # The host reads the agent's stdout behind Docker's stream headers (type 1: stdout).
    demux.feed(bytes([1, 0, 0, 0]) + len(done.stdout).to_bytes(4, "big") + done.stdout)
    reply = demux.next_frame()
    assert reply is not None and reply["id"] == 7
    return reply


@pytest.fixture(params=["opt-fleet", "inline"])
def agent(request, tmp_path: Path) -> list[str]:
    """The agent as a box image holds it (its files flat in one directory, as the
    image build copies them), or as the inline fallback sends it."""
    if request.param == "inline":
        return [sys.executable, "-I", "-S", "-c", agent_source()]
    opt = tmp_path / "opt-fleet"
    opt.mkdir()
    for helper in BOX_HELPERS:
        shutil.copy(REPO / helper, opt)
    return [sys.executable, "-I", "-S", str(opt / Path(AGENT_PATH).name)]


def test_typed_requests_round_trip_through_the_agent(agent: list[str], tmp_path: Path) -> None:
    req = exec_request(["sh", "-c", "cat; echo err >&2; exit 3"], 10, "/tmp", None, "in", 1000)
    result = exec_result(ok_reply(_ask(agent, req), "box"))
    assert (result.exit_code, result.stdout, result.stderr) == (3, "in", "err\n")
    read: wire.ReadRequest = {"op": wire.READ, "path": "/etc/hostname"}
    with pytest.raises(PathRefused, match="outside"):
        read_reply(_ask(agent, read), "/etc/hostname", 100, "box")
    probe = _ask(agent, {"op": wire.PING})
    assert probe["ok"] and isinstance(probe["pid"], int)
    bad = _ask(agent, {"op": "nope"})  # type: ignore[typeddict-item]
    assert (bad["ok"], bad["error"]) == (False, "bad_op")


_NO_THREAD_ONCE_STARTED = """
import base64, json, subprocess, sys, threading
sys.path.insert(0, sys.argv[1])
import boxagent

# Once a command runs, the box's pids limit may be full (a fork bomb fills it at once):
# from then on no thread can start, as in such a box.
started = []
popen, start = subprocess.Popen, threading.Thread.start
def counting_popen(*a, **k):
    started.append(1)
    return popen(*a, **k)
def refusing_start(self):
    if started:
        raise RuntimeError("can't start new thread")
    start(self)
subprocess.Popen, threading.Thread.start = counting_popen, refusing_start
replies = []
for stdin in (None, base64.b64encode(b"from stdin").decode()):
    req = {"op": "exec", "id": 1, "cmd": "cat; echo ran", "cwd": sys.argv[2], "stdin": stdin}
    started.clear()
    reply = boxagent.op_exec(req)
    replies.append([reply["exit_code"], base64.b64decode(reply["stdout"]).decode()])
print(json.dumps(replies))
"""


def test_a_command_that_fills_the_pids_limit_at_once_still_runs(tmp_path: Path) -> None:
    """Nothing the agent needs for a command (its stdin feeder) starts after the command:
    a command that leaves no pid free is the command's outcome, not 'cannot start'."""
    for name in ("boxagent.py", "memguard.py", "stamps.py", "wire.py"):
        shutil.copy(INBOX / name, tmp_path / name)
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _NO_THREAD_ONCE_STARTED, str(tmp_path), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == '[[0, "ran\\n"], [0, "from stdinran\\n"]]'


def test_the_agent_ended_line_counts_on_stderr_only_even_across_a_split_frame() -> None:
    """A box's PID 1 says on stderr that the agent ended; a command whose output holds
    the same words (on stdout) must not make a live box look dead."""
    import struct

    header = struct.Struct(">BxxxI")
    said = b"x " + wire.AGENT_ENDED + b" y"
    stdout = header.pack(1, len(said)) + said
    demux = Demuxer()
    assert wire.AGENT_ENDED not in demux.stderr_ahead(stdout)
    line = b"\n" + wire.AGENT_ENDED + b" (signal 9)\n"
    both = stdout + header.pack(2, len(line)) + line
    demux.feed(both[:5])  # part of a header already read off the socket
    assert wire.AGENT_ENDED in demux.stderr_ahead(both[5:])
    assert demux.stdout == b"" and demux.stderr == b""  # looked at, not taken


def _on_stdout(body: bytes) -> bytes:
    """``body`` as one agent frame on stdout, behind Docker's stream header."""
    frame = wire.HEADER.pack(len(body)) + body
    return bytes([1, 0, 0, 0]) + len(frame).to_bytes(4, "big") + frame


NOT_REPLIES = {
    "not UTF-8": b'{"id": 1, "ok": true, "x": "\xff\xfe"}',
    "not JSON": b'{"id": 1, "ok": tru',
    "a list": b"[1, 2, 3]",
    "a number": b"7",
    "nested past the parser": b"[" * 20_000 + b"]" * 20_000,
}


@pytest.mark.parametrize("body", NOT_REPLIES.values(), ids=NOT_REPLIES.keys())
def test_a_frame_that_is_not_a_json_object_breaks_the_stream_with_its_reason(body: bytes) -> None:
    """Whatever whole frame the box writes on the agent's stream, the host's call ends
    with the stream broken and why - never with the JSON parser's own error - and a
    one-shot call ends with no reply and that reason."""
    import socket

    import anyio

    from sandbox.docker.agent_client import AgentStream, StreamBroken, one_shot

    async def asked() -> str:
        host, box = socket.socketpair()
        stream = AgentStream(host)
        box.sendall(_on_stdout(body))
        try:
            with anyio.fail_after(10):
                await stream.request({"op": wire.PING})
        except StreamBroken as e:
            return str(e)
        finally:
            box.close()
        raise AssertionError("the request was answered")

    broken = anyio.run(asked)
    assert "the box agent's stream carried a frame that is not" in broken, broken

    host, box = socket.socketpair()
    box.sendall(_on_stdout(body))
    box.shutdown(socket.SHUT_WR)
    reply, why = one_shot(host, {"op": wire.PING}, timeout=10)
    box.close()
    assert reply is None and "a frame that is not" in why, why


def test_a_reply_under_an_id_no_request_has_is_passed_over() -> None:
    """A frame whose id is not one the host waits for (another type, an unknown number)
    is dropped; the request still gets its own reply."""
    import socket

    import anyio

    from sandbox.docker.agent_client import AgentStream

    async def asked() -> tuple[int, wire.Reply]:
        host, box = socket.socketpair()
        stream = AgentStream(host)
        rid = stream.new_id()
        for id_ in ([rid], {"a": rid}, str(rid), rid + 1000):
            box.sendall(_on_stdout(wire.encode({"id": id_, "ok": True})[4:]))
        box.sendall(_on_stdout(wire.encode({"id": rid, "ok": True, "pid": 5})[4:]))
        try:
            with anyio.fail_after(10):
                return rid, await stream.request({"op": wire.PING}, rid)
        finally:
            box.close()

    rid, reply = anyio.run(asked)
    assert reply == {"id": rid, "ok": True, "pid": 5}


MALFORMED = {
    "exec without its fields": (wire.EXEC, {"id": 1, "ok": True}),
    "exec with output of broken base64": (
        wire.EXEC,
        {"exit_code": 0, "stdout": "abc", "stderr": "", "timed_out": False}
        | {"truncated": False, "duration_s": 0.1, "id": 1, "ok": True},
    ),
    "exec with a code that is no number": (
        wire.EXEC,
        {"exit_code": [], "stdout": "", "stderr": "", "timed_out": False}
        | {"truncated": False, "duration_s": 0.1, "id": 1, "ok": True},
    ),
    "read without data": (wire.READ, {"id": 1, "ok": True}),
    "read with data of another type": (wire.READ, {"id": 1, "ok": True, "data": 5}),
    "read too large without a size": (wire.READ, {"id": 1, "ok": True, "too_large": True}),
    "list with an entry of other fields": (
        wire.LIST,
        {"id": 1, "ok": True, "entries": [{"name": 5, "extra": 1}]},
    ),
    "list with entries that are no list": (wire.LIST, {"id": 1, "ok": True, "entries": 7}),
}


@pytest.mark.parametrize(("op", "reply"), MALFORMED.values(), ids=MALFORMED.keys())
def test_a_reply_without_its_ops_fields_ends_the_call_as_the_boxs_doing(
    op: str, reply: wire.Reply
) -> None:
    """What the backend reads of each op's reply, read inside ``reading_reply``: a reply
    the box forged without the fields (or with fields of other types) raises
    SandboxUnavailable naming the op, never KeyError, TypeError or pydantic's error."""
    from sandbox.base import FileInfo
    from sandbox.docker.boxops import reading_reply
    from sandbox.errors import SandboxUnavailable

    read = {
        wire.EXEC: lambda: exec_result(ok_reply(reply, "box")),
        wire.READ: lambda: read_reply(reply, "/workspace/f", 100, "box"),
        wire.LIST: lambda: [FileInfo(**e) for e in ok_reply(reply, "box")["entries"]],
    }[op]
    with pytest.raises(SandboxUnavailable, match=f"the agent's reply to '{op}' is malformed"):
        with reading_reply(op, "box"):
            read()


def test_an_oom_count_is_believed_only_as_a_number() -> None:
    """The box's OOM-kill count decides what a broken stream is blamed on; a forged
    ping reply's count of another type is no count (never compared, never raised on)."""
    from sandbox.docker.transport import _count

    assert [_count(v) for v in (3, 0, "3", 3.0, True, None, [1])] == [3, 0] + [None] * 5

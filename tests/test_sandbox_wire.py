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
from sandbox.docker.boxops import agent_source, exec_request, exec_result, ok_reply, read_reply
from sandbox.errors import PathRefused
from sandbox.inbox import wire

INBOX = Path(__file__).resolve().parent.parent / "sandbox" / "inbox"


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
    for name in ("boxagent.py", "memguard.py", "stamps.py", "wire.py"):
        shutil.copy(INBOX / name, opt / name)
    return [sys.executable, "-I", "-S", str(opt / "boxagent.py")]


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

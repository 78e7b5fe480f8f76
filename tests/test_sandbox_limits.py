"""Resource limits hold: fork bombs, memory hogs and disk fills stay inside their box,
and what a box writes reaches the host with a bound, whatever writes it: a command that
forges frames on the box agent's stdout (it runs as the agent's user, so it can), on
the long-lived stream and on a one-shot agent's, a command answering a tree download
in the agent's place with a gzip bomb, and a command flooding its output where the
host applies the cap itself (an image without python3)."""

from __future__ import annotations

import re
import struct
import time

import anyio
import pytest
from rss_support import RssWatch

from sandbox.docker.backend import DockerBackend
from sandbox.errors import SandboxUnavailable
from sandbox.spec import SandboxSpec

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def backend(docker_client, images) -> DockerBackend:
    return DockerBackend(docker_client, images=images)


async def test_fork_bomb_is_contained_and_another_box_keeps_working(
    backend: DockerBackend, run_id: str
) -> None:
    spec = SandboxSpec(pids=64)
    async with (
        await backend.create(spec, run=run_id, member="bomb") as bomb,
        await backend.create(SandboxSpec(), run=run_id, member="calm") as calm,
    ):
        res = await bomb.exec("bomb() { bomb | bomb & }; bomb; sleep 5", timeout=3)
        assert res.timed_out
        count = await bomb.exec("ls /proc | grep -c '^[0-9]'", timeout=10)
        assert count.ok and int(count.stdout) < 64
        ok = await calm.exec("echo alive")
        assert ok.stdout == "alive\n"
        with anyio.fail_after(10):
            again = await bomb.exec("echo recovered")
        assert again.stdout == "recovered\n"


async def test_memory_hog_is_reported_as_oom_killed(backend: DockerBackend, run_id: str) -> None:
    async with await backend.create(SandboxSpec(memory="128m"), run=run_id, member="hog") as box:
        res = await box.exec(
            ["python3", "-c", "chunks = []\nwhile True: chunks.append(bytearray(8 << 20))"],
            timeout=30,
        )
        assert res.oom_killed
        assert res.exit_code == 137
        assert (await box.exec("echo still-here")).stdout == "still-here\n"


async def test_workspace_fill_is_bounded(backend: DockerBackend, run_id: str) -> None:
    spec = SandboxSpec(workspace_size="32m", tmpfs_size="64m", memory="512m")
    async with await backend.create(spec, run=run_id, member="filler") as box:
        res = await box.exec("dd if=/dev/zero of=/workspace/fill bs=1M count=100", timeout=30)
        assert res.exit_code != 0
        assert "No space left" in res.stderr
        size = await box.exec("stat -c %s /workspace/fill")
        assert int(size.stdout) <= 32 * 1024 * 1024
        tmp = await box.exec("dd if=/dev/zero of=/tmp/fill bs=1M count=100", timeout=30)
        assert "No space left" in tmp.stderr
        assert (await box.exec("echo ok")).stdout == "ok\n"


_TOUCH = "b = bytearray({mb} << 20); b[::4096] = b'x' * len(b[::4096]); print('held')"


async def test_a_full_workspace_is_no_space_left_not_an_oom_kill_with_the_defaults(
    backend: DockerBackend, run_id: str
) -> None:
    """tmpfs pages are memory: with the default 1 GB workspace and 1 GB of memory, filling
    the disk must say ENOSPC, leave the programs their memory, and a real memory hog must
    still be reported as memory."""
    async with await backend.create(SandboxSpec(), run=run_id, member="filler") as box:
        fill = await box.exec("head -c 3G /dev/zero > /workspace/fill", timeout=120)
        assert fill.exit_code == 1 and "No space left on device" in fill.stderr, fill
        assert not fill.oom_killed
        tmp = await box.exec("head -c 1G /dev/zero > /tmp/fill", timeout=60)
        assert "No space left on device" in tmp.stderr and not tmp.oom_killed, tmp
        size = await box.exec("du -sm /workspace/fill /tmp/fill | cut -f1")
        assert size.stdout.split() == ["1024", "256"], size
        held = await box.exec(["python3", "-c", _TOUCH.format(mb=700)], timeout=60)
        assert held.stdout == "held\n" and not held.oom_killed, held
        hog = await box.exec(
            ["python3", "-c", "chunks = []\nwhile True: chunks.append(bytearray(8 << 20))"],
            timeout=60,
        )
        assert hog.oom_killed and hog.exit_code == 137, hog
        assert (await box.exec("echo still-here")).stdout == "still-here\n"


async def test_an_agent_killed_for_memory_says_memory(backend: DockerBackend, run_id: str) -> None:
    """Reading a file that (with its copies in flight) does not fit the box's memory gets
    the in-box agent itself OOM-killed: the error must say memory, not 'stream broke'."""
    from sandbox.errors import SandboxUnavailable

    spec = SandboxSpec(memory="64m", workspace_size="200m", tmpfs_size="16m")
    async with await backend.create(spec, run=run_id, member="reader") as box:
        made = await box.exec("head -c 190M /dev/urandom > big.bin", timeout=60)
        assert made.ok, made
        with pytest.raises(SandboxUnavailable, match="ran out of memory") as err:
            await box.read_file("big.bin", limit=256 << 20)
        assert "restarted" in str(err.value)
        assert (await box.exec("echo still-here")).stdout == "still-here\n"


LEFT = (
    "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done | grep 'sleep 30[0-9]' || true"
)
"""The sleeps still running in the box (the pattern does not match its own command line)."""


async def test_what_a_command_leaves_running_ends_with_it(
    backend: DockerBackend, run_id: str
) -> None:
    """Background jobs, setsid daemons, a double fork, one that also cleared its
    environment, and a fork bomb that returns at once: all end with their command."""
    async with await backend.create(SandboxSpec(pids=64), run=run_id, member="bg") as box:
        left = await box.exec(
            "sleep 300 & setsid sleep 301 & (setsid sleep 302 &); env -i setsid sleep 303 &"
            " echo started"
        )
        assert (left.exit_code, left.stdout, left.leftovers) == (0, "started\n", 4), left
        assert "ended 4 processes the command left running" in left.stderr
        assert (await box.exec(LEFT)).stdout == ""
        timed = await box.exec("setsid sleep 304 & sleep 305", timeout=0.5)
        assert timed.timed_out and timed.leftovers >= 1, timed
        assert (await box.exec(LEFT)).stdout == ""
        bomb = await box.exec(":(){ :|:& };:", timeout=60)
        assert bomb.leftovers >= 1 and "left running" in bomb.stderr, bomb
        with anyio.fail_after(10):
            again = await box.exec("echo recovered")
        assert again.stdout == "recovered\n"
        await box.check()


async def test_a_running_commands_background_processes_survive_a_sibling_ending(
    backend: DockerBackend, run_id: str
) -> None:
    """Leftovers are told apart by command: one command's end does not kill what another,
    still running, started (even a setsid daemon), only its own."""
    async with await backend.create(SandboxSpec(), run=run_id, member="two") as box:
        long = (
            "(setsid sleep 306 & echo $! > /tmp/p306); sleep 301 & echo $! > /tmp/p301;"
            " sleep 2; kill -0 $(cat /tmp/p306) $(cat /tmp/p301) && echo both-alive"
        )
        async with anyio.create_task_group() as tg:
            seen: dict[str, object] = {}

            async def first() -> None:
                seen["long"] = await box.exec(long, timeout=30)

            tg.start_soon(first)
            await anyio.sleep(0.8)
            seen["short"] = await box.exec("sleep 307 & echo short")
        short, done = seen["short"], seen["long"]
        assert short.leftovers == 1, short  # its own sleep 307 only
        assert done.stdout == "both-alive\n", done
        assert done.leftovers == 2, done
        assert (await box.exec(LEFT)).stdout == ""


async def test_a_box_that_cannot_start_processes_is_reported_crashed(
    backend: DockerBackend, run_id: str, docker_client
) -> None:
    """Processes Fleet did not start (a plain docker exec) fill the pids limit: check()
    notices, and exec says so instead of inventing an exit code."""
    from sandbox.errors import SandboxCrashed

    async with await backend.create(SandboxSpec(pids=32), run=run_id, member="full") as box:
        await box.check()
        filler = "while :; do sleep 1000 & done 2>/dev/null"
        docker_client.api.exec_start(
            docker_client.api.exec_create(box.id, ["sh", "-c", filler], user="1000:1000"),
            detach=True,
        )
        await anyio.sleep(2)
        with pytest.raises(SandboxCrashed) as err:
            await box.check()
        assert err.value.reason == "process-limit"
        assert "cannot start a process" in str(err.value)
        with pytest.raises(SandboxCrashed, match="process-limit"):
            await box.exec("echo hi")


# A length prefix of almost 4 GiB, then 200 MB, written on the agent's own stdout.
FORGE = (
    "a=$(pgrep -f '^python3 -I -S /opt/fleet/boxagent' | grep -vx 1 | head -n 1) && [ -n \"$a\" ] && "
    "printf '\\377\\377\\377\\360' > /proc/$a/fd/1 && head -c 200000000 /dev/zero > /proc/$a/fd/1"
)
ONE_SHOT_FORGE = FORGE.replace(
    "$(pgrep -f '^python3 -I -S /opt/fleet/boxagent' | grep -vx 1 | head -n 1)", "$PPID"
)


@pytest.mark.parametrize("mode", ["agent", "oneshot"])
async def test_a_command_forging_agent_frames_breaks_that_call_not_the_hosts_memory(
    backend: DockerBackend, run_id: str, mode: str
) -> None:
    async with await backend.create(SandboxSpec(), run=run_id, member="c") as box:
        if mode == "oneshot":  # as after two agent restarts: each call its own agent
            box.transport.close()
            box.transport.mode = "oneshot"
        started = time.monotonic()
        with RssWatch() as rss, anyio.fail_after(60):
            # The agent is not dumpable, so a command cannot open its stdout at all; were
            # it able to, the forged length would break only that stream.
            try:
                res = await box.exec(FORGE if mode == "agent" else ONE_SHOT_FORGE, timeout=30)
            except SandboxUnavailable as exc:
                assert "over the 268435456-byte limit" in str(exc)
            else:
                assert res.exit_code != 0 and "Permission denied" in res.stderr, res
        assert time.monotonic() - started < 30
        assert rss.grew_mib < 64, f"the host grew by {rss.grew_mib:.0f} MiB"
        assert (await box.exec("echo after")).stdout == "after\n"


def _forger(frame: str, times: int) -> str:
    """A command that stops each of the next ``times`` one-shot agents but its own and
    writes ``frame`` on its stdout (the box's user may: it is not the agent that runs
    the command), so the host reads it before anything that agent says."""
    return (
        "seen=$PPID; n=0; end=$(( $(date +%s) + 20 )); "
        f"while [ $n -lt {times} ] && [ $(date +%s) -lt $end ]; do "
        "for p in $(pgrep -f 'boxagent_main[.]py --once'); do "
        'case " $seen " in *" $p "*) continue;; esac; seen="$seen $p"; '
        f"kill -STOP $p 2>/dev/null && cat {frame} > /proc/$p/fd/1 && n=$((n+1)); done; done"
    )


NOT_REPLIES = {
    "a list": (b"[1, 2, 3]", "a frame that is not"),
    "cut JSON": (b'{"id": 1, "ok": tru', "a frame that is not"),
    "not UTF-8": (b'{"x": "\xff"}', "a frame that is not"),
    "no fields": (b'{"id": 1, "ok": true}', "is malformed"),
    "fields of other types": (
        b'{"id": 1, "ok": true, "too_large": false, "data": 5}',
        "is malformed",
    ),
}


@pytest.mark.parametrize(("body", "says"), NOT_REPLIES.values(), ids=NOT_REPLIES.keys())
async def test_a_frame_forged_for_a_one_shot_agent_that_is_no_reply_ends_only_that_call(
    backend: DockerBackend, run_id: str, body: bytes, says: str
) -> None:
    """A whole frame that is not a reply the host can read (not a JSON object, or one
    without the op's fields), where a one-shot agent's reply should be, ends that call
    with the reason - not the error of the parser or of the line that read it - and
    the box goes on."""
    async with await backend.create(SandboxSpec(), run=run_id, member="c") as box:
        box.transport.close()  # each call its own one-shot agent, as after two restarts
        box.transport.mode = "oneshot"
        await box.write_file("/tmp/frame", struct.pack(">I", len(body)) + body)
        # A file slow enough to read and encode that the forger stops its agent first.
        await box.exec("head -c 40000000 /dev/urandom > big", timeout=60)
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: box.exec(_forger("/tmp/frame", 1), timeout=30))
            await anyio.sleep(1.0)
            with pytest.raises(SandboxUnavailable, match=says):
                await box.read_file("big")
            tg.cancel_scope.cancel()
        assert (await box.exec("echo after")).stdout == "after\n"


async def test_output_capped_on_the_host_is_never_held_whole(
    backend: DockerBackend, run_id: str, images
) -> None:
    spec = SandboxSpec(image=images["base"])  # no python3: the plain path
    async with await backend.create(spec, run=run_id, member="c") as box:
        assert box.mode == "plain"
        with RssWatch() as rss:
            res = await box.exec("head -c 300000000 /dev/zero; echo end", timeout=120)
        assert res.truncated and res.stdout.endswith("end\n")
        dropped = re.search(r"\[\.\.\. (\d+) bytes dropped \.\.\.\]", res.stdout)
        assert dropped and int(dropped.group(1)) > 290_000_000
        assert rss.grew_mib < 64, f"the host grew by {rss.grew_mib:.0f} MiB"


def _gzip_bomb_reply(path: str) -> bytes:
    """One agent frame that answers both a listing (``path`` is a directory) and a tree
    download (a gzipped tar of 200 MB of zeros, about 200 KB)."""
    import base64
    import gzip
    import io
    import json
    import struct
    import tarfile

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("zeros")
        info.size = 200_000_000
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    name = path.rpartition("/")[2]
    entry = {"name": name, "path": path, "type": "dir", "size": 0, "mtime": 0.0}
    reply = {"id": 1, "ok": True, "entries": [entry], "data": ""}
    reply["data"] = base64.b64encode(gzip.compress(raw.getvalue(), 1)).decode()
    body = json.dumps(reply).encode()
    return struct.pack(">I", len(body)) + body


async def test_a_downloaded_tree_is_never_decompressed_whatever_the_box_answers(
    backend: DockerBackend, run_id: str, tmp_path
) -> None:
    from sandbox.errors import SandboxError

    async with await backend.create(SandboxSpec(), run=run_id, member="c") as box:
        box.transport.close()  # each call its own one-shot agent, as after two restarts
        box.transport.mode = "oneshot"
        await box.write_file("/tmp/forged", _gzip_bomb_reply("/workspace/d"))
        await box.exec("mkdir -p d && head -c 40000000 /dev/urandom > d/big", timeout=60)
        forger = _forger("/tmp/forged", 2)
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: box.exec(forger, timeout=30))
            await anyio.sleep(1.0)
            with pytest.raises(SandboxError, match="not a plain tar archive"):
                await box.download("/workspace/d", tmp_path / "out")
            tg.cancel_scope.cancel()  # the forger's loop has nothing left to answer
        assert not (tmp_path / "out" / "zeros").exists()

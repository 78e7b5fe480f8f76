"""The Docker backend against the real engine: exec, files, paths, and the secure defaults."""

from __future__ import annotations

import ast
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox.docker.backend import DockerBackend, DockerSandbox
from sandbox.docker.boxops import AGENT_ARGV, AGENT_PATH
from sandbox.errors import (
    OutputLimitExceeded,
    PathRefused,
    SandboxClosed,
    SandboxCrashed,
    SandboxUnavailable,
)
from sandbox.spec import SandboxSpec

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def backend(docker_client, images) -> DockerBackend:
    return DockerBackend(docker_client, images=images)


@pytest.fixture
async def box(backend: DockerBackend, run_id: str) -> AsyncIterator[DockerSandbox]:
    sandbox = await backend.create(SandboxSpec(), run=run_id, member="coder")
    async with sandbox:
        yield sandbox


async def test_exec_returns_output_exit_code_and_uses_the_fast_path(box: DockerSandbox) -> None:
    assert box.mode == "agent"
    res = await box.exec("echo out; echo err >&2; pwd; exit 3")
    assert res.exit_code == 3
    assert res.stdout == "out\n/workspace\n"
    assert res.stderr == "err\n"
    assert not res.timed_out and not res.truncated
    argv = await box.exec(["python3", "-c", "import sys; print(sys.argv[1:])", "a b", "c"])
    assert argv.stdout.strip() == "['a b', 'c']"
    piped = await box.exec("tr a-z A-Z", stdin="hello", cwd="/tmp", env={"X": "1"})
    assert piped.stdout == "HELLO"


async def test_commands_run_concurrently_on_one_stream(box: DockerSandbox) -> None:
    import anyio

    results: dict[int, str] = {}

    async def one(i: int) -> None:
        results[i] = (await box.exec(f"sleep 0.3; echo {i}")).stdout.strip()

    start = anyio.current_time()
    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(one, i)
    assert results == {i: str(i) for i in range(8)}
    assert anyio.current_time() - start < 2.0


async def test_timeout_kills_the_process_group_and_keeps_partial_output(
    box: DockerSandbox,
) -> None:
    res = await box.exec(
        "echo started; (sleep 300; echo never) & sleep 301 & echo $! > /tmp/bg; sleep 302",
        timeout=0.5,
    )
    assert res.timed_out and res.exit_code == 124
    assert res.stdout == "started\n"
    left = await box.exec("ps -eo args | grep 'sleep 30[012]' || true")
    assert left.stdout == "", f"survivors of the timeout: {left.stdout}"


async def test_output_is_capped_with_head_and_tail_kept(box: DockerSandbox) -> None:
    res = await box.exec(
        "echo HEAD; head -c 200000 /dev/zero | tr '\\0' x; echo; echo TAIL", output_limit=4096
    )
    assert res.truncated
    assert res.stdout.startswith("HEAD\n") and res.stdout.endswith("TAIL\n")
    assert "bytes dropped" in res.stdout
    assert len(res.stdout) < 4096 + 100


async def test_binary_file_round_trip_and_listing(box: DockerSandbox, tmp_path: Path) -> None:
    blob = bytes(range(256)) * 1000 + b"\x00\xff\r\n"
    await box.write_file("data/blob.bin", blob)
    assert await box.read_file("/workspace/data/blob.bin") == blob
    await box.write_file("/tmp/note.txt", "héllo\n")
    assert (await box.exec(["cat", "/tmp/note.txt"])).stdout == "héllo\n"
    entries = await box.list_dir("data")
    assert [(e.name, e.type, e.size) for e in entries] == [("blob.bin", "file", len(blob))]
    with pytest.raises(OutputLimitExceeded):
        await box.read_file("data/blob.bin", limit=1000)
    with pytest.raises(FileNotFoundError):
        await box.read_file("missing.txt")


async def test_write_file_keeps_the_mode_and_refuses_what_the_box_user_could_not_write(
    box: DockerSandbox,
) -> None:
    await box.exec(
        "printf old > ro.txt && chmod 444 ro.txt && printf x > run.sh && chmod 750 run.sh"
        " && mkdir adir locked && printf old > locked/in.txt && chmod 555 locked"
    )
    with pytest.raises(PermissionError) as err:
        await box.write_file("ro.txt", "new")
    assert not isinstance(err.value, PathRefused)
    assert await box.read_file("ro.txt") == b"old"
    await box.write_file("run.sh", "#!/bin/sh\necho kept\n")
    assert (await box.exec("stat -c %a run.sh && ./run.sh")).stdout == "750\nkept\n"
    await box.write_file("run.sh", "#!/bin/sh\n", mode=0o700)  # a mode given is applied
    assert (await box.exec("stat -c %a run.sh")).stdout == "700\n"
    with pytest.raises(IsADirectoryError):
        await box.write_file("adir", "x")
    with pytest.raises(PermissionError):
        await box.write_file("locked/new.txt", "x")
    await box.write_file("locked/in.txt", "new")  # writable, as `echo new > in.txt` is
    assert await box.read_file("locked/in.txt") == b"new"
    await box.write_file("fresh.txt", "x")
    assert (await box.exec("stat -c %a fresh.txt")).stdout == "644\n"
    left = await box.exec("find /workspace -name '*.fleet-*'")
    assert left.stdout == "", f"temporary files left behind: {left.stdout}"


async def test_upload_and_download_trees(box: DockerSandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    (src / "bin.dat").write_bytes(b"\x00\x01\x02")
    await box.upload(src, "proj")
    res = await box.exec("cat pkg/mod.py && stat -c %U bin.dat", cwd="/workspace/proj")
    assert res.stdout == "X = 1\nagent\n"
    await box.exec("mkdir -p out/sub && echo made > out/sub/f.txt")
    await box.download("out", tmp_path / "back")
    assert (tmp_path / "back" / "sub" / "f.txt").read_text() == "made\n"
    await box.download("proj/bin.dat", tmp_path / "one.dat")
    assert (tmp_path / "one.dat").read_bytes() == b"\x00\x01\x02"


async def test_paths_outside_the_roots_are_refused_including_symlink_escapes(
    box: DockerSandbox,
) -> None:
    for path in ("/etc/passwd", "../etc/passwd", "/workspace/../etc/shadow", "/proc/1/environ"):
        with pytest.raises(PathRefused):
            await box.read_file(path)
    with pytest.raises(PathRefused):
        await box.write_file("/etc/evil", "x")
    await box.exec("ln -s /etc escape && ln -s /etc/passwd pw")
    with pytest.raises(PathRefused):
        await box.read_file("pw")
    with pytest.raises(PathRefused):
        await box.write_file("escape/evil", "x")
    with pytest.raises(PathRefused):
        await box.list_dir("escape")


async def test_box_is_non_root_without_capabilities(box: DockerSandbox) -> None:
    ident = await box.exec("id -u; grep CapEff /proc/self/status")
    uid, capeff = ident.stdout.split("\n")[:2]
    assert uid == "1000"
    assert capeff.split()[1] == "0000000000000000"
    mount = await box.exec("mkdir -p /tmp/m && mount -t tmpfs none /tmp/m")
    assert mount.exit_code != 0
    raw = await box.exec(
        ["python3", "-c", "import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)"]
    )
    assert raw.exit_code != 0 and "PermissionError" in raw.stderr
    for target in ("/etc/fleet-test", "/usr/bin/fleet-test", "/opt/fleet/x"):
        wrote = await box.exec(f"echo x > {target}")
        assert wrote.exit_code != 0, target
    nnp = await box.exec("grep NoNewPrivs /proc/self/status")
    assert nnp.stdout.split()[1] == "1"


_ATTACH_TO_THE_AGENT = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
agents = []
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != os.getpid():
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if b"boxagent" in cmd and pid != "1":  # PID 1 starts the agent: not the agent
            agents.append(int(pid))
for pid in agents:
    attached = libc.ptrace(16, pid, 0, 0)  # PTRACE_ATTACH
    print(pid, attached, os.strerror(ctypes.get_errno()))
    if attached == 0:
        libc.ptrace(17, pid, 0, 0)  # PTRACE_DETACH
    try:
        open(f"/proc/{pid}/mem", "rb").close()
        print(pid, "mem opened")
    except OSError as exc:
        print(pid, "mem", exc.strerror)
"""


async def test_a_command_cannot_attach_to_or_read_the_box_agent(box: DockerSandbox) -> None:
    """The agent runs as the member's user: a command that could ptrace it or open its
    memory could fake everything it reports (files, exit codes, the patch)."""
    probe = await box.exec(["python3", "-c", _ATTACH_TO_THE_AGENT])
    lines = probe.stdout.splitlines()
    assert lines, probe.stderr  # the agent serving this very call was found
    assert all(
        "Operation not permitted" in line or "Permission denied" in line for line in lines
    ), lines


async def test_the_agent_is_reached_without_docker_exec_and_its_stream_is_its_alone(
    box: DockerSandbox, docker_client
) -> None:
    """A coding box of Fleet's image runs its agent from PID 1, attached from the host
    before it started: the engine ran no ``docker exec`` for it, keeps no log of what it
    says, and PID 1 - open to the member's commands, as Docker's init is - holds none of
    the agent's stream (a command writing a forged frame there writes to /dev/null)."""
    info = docker_client.api.inspect_container(box.id)
    assert not info["ExecIDs"], info["ExecIDs"]
    assert info["HostConfig"]["LogConfig"]["Type"] == "none"
    assert info["Config"]["Cmd"] == [*AGENT_ARGV, "--init"]
    fds = await box.exec("readlink /proc/1/fd/0 /proc/1/fd/1")
    assert fds.stdout.split() == ["/dev/null", "/dev/null"], fds
    forged = await box.exec(["sh", "-c", "printf '\\377\\377\\377\\360' > /proc/1/fd/1"])
    assert forged.ok, forged
    assert (await box.exec("echo still")).stdout == "still\n"
    assert not docker_client.api.inspect_container(box.id)["ExecIDs"]


_COMPILED = """import runpy, sys
seen = []
sys.addaudithook(lambda event, args: event == "compile" and seen.append(args[1]))
sys.argv = [sys.argv[1], "--once"]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print(repr(seen))
"""


@pytest.mark.parametrize("kind", ["coding", "browser", "corpus"])
def test_the_box_agent_starts_from_the_images_bytecode(docker_client, images, kind) -> None:
    """A box's root is read-only, so Python can keep nothing it compiles there: each
    image carries its helpers' bytecode, and the agent's program only imports the agent.
    Run as a box runs it (read-only root, the box's user), the agent's start compiles
    nothing of /opt/fleet but that program's few lines."""
    out = docker_client.containers.run(
        images[kind],
        ["python3", "-I", "-S", "-c", _COMPILED, AGENT_PATH],
        user="1000:1000",
        read_only=True,
        network_mode="none",
        remove=True,
    )
    seen = ast.literal_eval(out.decode().strip().splitlines()[-1])
    assert [name for name in seen if "/opt/fleet" in name] == [AGENT_PATH], seen


async def test_a_forged_agent_end_only_restarts_the_boxs_own_agent(box: DockerSandbox) -> None:
    """PID 1's stderr is how the host learns that the agent ended; a command can write
    there too, and all it gets is its own agent restarted (by ``docker exec``)."""
    from sandbox.errors import SandboxUnavailable
    from sandbox.inbox import wire

    line = wire.AGENT_ENDED.decode()
    with pytest.raises(SandboxUnavailable, match="agent was restarted"):
        await box.exec(["sh", "-c", f"echo '{line}' > /proc/1/fd/2; sleep 5"], timeout=30)
    assert (await box.exec("echo still")).stdout == "still\n"


async def test_the_home_of_a_coding_box_is_writable_and_on_its_own_tmp(
    box: DockerSandbox,
) -> None:
    """The root is read-only; the user's home is on the box's /tmp (its own, bounded by
    /tmp's size), made before the first command: a tool that keeps a cache or settings
    there (uv, npm, cargo, ``git config --global``) works, and nothing of it is the
    image's or outlives the box."""
    res = await box.exec(
        'stat -c "%n %U %a" "$HOME" && df --output=target "$HOME" | tail -n 1 && '
        "mkdir -p ~/.cache/tool && echo kept > ~/.cache/tool/f && cat ~/.cache/tool/f && "
        "git config --global user.name box && git config --global user.name && "
        "getent passwd agent | cut -d: -f6"
    )
    assert res.exit_code == 0, res
    assert res.stdout.split("\n")[:5] == [
        "/tmp/home agent 700",
        "/tmp",
        "kept",
        "box",
        "/tmp/home",  # what a tool that reads the user's entry (ssh) finds too
    ], res
    assert (await box.exec("touch /home/x")).exit_code != 0  # the root stays read-only


async def test_coding_box_has_no_network(box: DockerSandbox) -> None:
    links = await box.exec("cat /proc/net/dev")
    ifaces = {line.split(":")[0].strip() for line in links.stdout.splitlines()[2:]}
    assert ifaces == {"lo"}
    conn = await box.exec(
        ["python3", "-c", "import socket; socket.create_connection(('127.0.0.53', 53), 2)"]
    )
    assert conn.exit_code != 0


async def test_programs_built_or_written_in_the_box_can_run(box: DockerSandbox) -> None:
    """A coding task builds and runs things: a script in the repo, a compiled test binary,
    a program a test writes under /tmp. The writable mounts must allow exec."""
    script = await box.exec(
        "printf '#!/bin/sh\\necho script-ran\\n' > s.sh && chmod +x s.sh && ./s.sh"
    )
    assert script.stdout == "script-ran\n", script
    built = await box.exec(
        "printf 'int main(void){return 7;}' > t.c && cc -o t t.c && ./t; echo exit=$?"
    )
    assert built.stdout == "exit=7\n", built
    in_tmp = await box.exec("cp s.sh /tmp/s.sh && /tmp/s.sh")
    assert in_tmp.stdout == "script-ran\n", in_tmp


async def test_paused_box_is_crashed_promptly_and_stays_unusable_after_unpause(
    backend: DockerBackend, run_id: str, docker_client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frozen box cannot run the in-box timeout: the call must not hang on it."""
    import time

    import anyio

    from sandbox.docker import transport

    monkeypatch.setattr(transport, "WATCH_S", 0.5)
    box = await backend.create(SandboxSpec(), run=run_id, member="frozen")
    try:
        docker_client.api.pause(box.id)
        started = time.monotonic()
        with anyio.fail_after(20), pytest.raises(SandboxCrashed) as err:
            await box.exec("true", timeout=60)
        took = time.monotonic() - started
        assert took < 15, f"{took:.1f} s: waited on the frozen box, not on the watch's 0.5 s"
        assert err.value.reason == "paused"
        assert not box.looks_alive()
        docker_client.api.unpause(box.id)
        with pytest.raises(SandboxCrashed, match="paused"):
            await box.read_file("x")
    finally:
        if docker_client.api.inspect_container(box.id)["State"]["Paused"]:
            docker_client.api.unpause(box.id)
        await box.close()


async def test_host_environment_never_enters_the_box(
    backend: DockerBackend, run_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-host-secret")
    monkeypatch.setenv("FLEET_HOST_ONLY_PROBE", "host-value")
    async with await backend.create(
        SandboxSpec(env={"GIVEN": "yes"}), run=run_id, member="e"
    ) as box:
        env = (await box.exec("env")).stdout
        assert "GIVEN=yes" in env
        assert "sk-host-secret" not in env and "host-value" not in env
        assert not (await box.exec("test -S /var/run/docker.sock")).ok


async def test_killed_box_raises_crashed_naming_the_reason(
    backend: DockerBackend, run_id: str, docker_client
) -> None:
    box = await backend.create(SandboxSpec(), run=run_id, member="victim")
    try:
        docker_client.api.kill(box.id)
        with pytest.raises(SandboxCrashed) as err:
            await box.exec("true")
        assert err.value.reason == "killed"
        with pytest.raises(SandboxCrashed):
            await box.read_file("x")
    finally:
        await box.close()
    with pytest.raises(SandboxClosed):
        await box.exec("true")
    await box.close()  # idempotent


async def test_removed_box_raises_crashed_removed(
    backend: DockerBackend, run_id: str, docker_client
) -> None:
    box = await backend.create(SandboxSpec(), run=run_id, member="gone")
    docker_client.api.remove_container(box.id, force=True)
    with pytest.raises(SandboxCrashed) as err:
        await box.check()
    assert err.value.reason == "removed"
    await box.close()


async def test_unknown_image_is_a_clear_error(backend: DockerBackend, run_id: str) -> None:
    with pytest.raises(SandboxUnavailable, match="fleet images build"):
        await backend.create(SandboxSpec(image="fleet-nope:missing"), run=run_id, member="m")

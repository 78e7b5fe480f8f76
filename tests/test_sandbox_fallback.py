"""The exec paths behind the fast one: agent restart, one-shot agent per call, inline
agent source, and plain ``docker exec`` - each keeps the timeout and cap semantics."""

from __future__ import annotations

import io
import uuid
from collections.abc import AsyncIterator, Iterator

import anyio
import docker
import pytest

from sandbox.docker.backend import INLINE_UPLOAD_BYTES, DockerBackend, DockerSandbox
from sandbox.errors import SandboxCrashed, SandboxUnavailable
from sandbox.spec import SandboxSpec

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def backend(docker_client, images) -> DockerBackend:
    return DockerBackend(docker_client, images=images)


async def _kill_agent(box: DockerSandbox, client: docker.DockerClient) -> None:
    assert box.transport.agent is not None
    pid = (await box.transport.agent.request({"op": "ping"}))["pid"]
    res = client.containers.get(box.id).exec_run(["kill", "-9", str(pid)], user="1000:1000")
    assert res.exit_code == 0, res.output


_SLEEPS = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done | grep 'sleep 30[0-9]'"


async def _semantics_hold(box: DockerSandbox) -> None:
    """Exit code, stdin, the in-box timeout with partial output, the per-stream cap, and
    what a command leaves running (background, setsid, a fork bomb) ending with it."""
    res = await box.exec("cat; exit 4", stdin="in")
    assert (res.exit_code, res.stdout) == (4, "in")
    slow = await box.exec("echo partial; sleep 30", timeout=1)
    assert slow.timed_out and slow.stdout == "partial\n" and slow.duration_s < 10
    big = await box.exec("head -c 50000 /dev/zero | tr '\\0' x", output_limit=4096)
    assert big.truncated and len(big.stdout) < 5000 and big.stdout.startswith("x")
    left = await box.exec("sleep 300 & setsid sleep 301 & (setsid sleep 302 &); echo started")
    assert (left.stdout, left.leftovers) == ("started\n", 3), left
    assert "ended 3 processes the command left running" in left.stderr, left
    timed = await box.exec("setsid sleep 303 & sleep 304", timeout=0.5)
    assert timed.timed_out and timed.leftovers >= 1, timed
    await box.exec(["sh", "-c", "bomb() { bomb | bomb & }; bomb"], timeout=30)
    assert (await box.exec(_SLEEPS)).stdout == "", "leftovers survived"
    assert (await box.exec("echo recovered")).stdout == "recovered\n"
    await box.check()


async def test_an_idle_box_whose_agent_ended_no_longer_looks_alive(
    backend: DockerBackend, run_id: str, docker_client
) -> None:
    """A pool hands out only boxes that look alive. An attached agent's stream stays open
    after the agent dies; what PID 1 then says, waiting unread, is what tells."""
    async with await backend.create(SandboxSpec(), run=run_id, member="idle") as box:
        assert box.looks_alive()
        await _kill_agent(box, docker_client)
        for _ in range(200):  # PID 1's line comes a moment after the kill
            if not box.looks_alive():
                break
            await anyio.sleep(0.05)
        assert not box.looks_alive()
        with pytest.raises(SandboxUnavailable, match="agent was restarted"):
            await box.exec("true")
        assert (await box.exec("echo x")).stdout == "x\n"


async def test_a_broken_agent_is_restarted_once_then_calls_go_one_shot(
    backend: DockerBackend, run_id: str, docker_client
) -> None:
    async with await backend.create(SandboxSpec(), run=run_id, member="c") as box:
        await _kill_agent(box, docker_client)
        with pytest.raises(SandboxUnavailable, match="agent was restarted: retry"):
            await box.exec("true")
        assert box.mode == "agent"
        assert (await box.exec("echo back")).stdout == "back\n"
        await _kill_agent(box, docker_client)
        with pytest.raises(SandboxUnavailable, match="retry"):
            await box.exec("true")
        assert box.mode == "oneshot"
        await _semantics_hold(box)
        await box.write_file("f.txt", "one-shot")
        assert await box.read_file("f.txt") == b"one-shot"


@pytest.fixture
def image_without_agent(docker_client, images) -> Iterator[str]:
    """The coding image with the baked-in agent removed (python3 still there)."""
    tag = f"fleet-test-noagent:{uuid.uuid4().hex[:8]}"
    dockerfile = f"FROM {images['coding']}\nUSER root\nRUN rm /opt/fleet/boxagent*.py\n"
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    try:
        yield tag
    finally:
        docker_client.images.remove(tag, force=True)


async def test_an_image_without_the_agent_file_gets_the_agent_inline(
    backend: DockerBackend, run_id: str, image_without_agent: str, tmp_path
) -> None:
    spec = SandboxSpec(image=image_without_agent)
    async with await backend.create(spec, run=run_id, member="c") as box:
        assert box.mode == "inline"
        await _semantics_hold(box)
        await box.write_file("f.txt", "inline")
        assert [e.name for e in await box.list_dir("/workspace")] == ["f.txt"]
        # A tree past one request's size streams into the inline agent too.
        big = bytes(INLINE_UPLOAD_BYTES + 1)
        (tmp_path / "tree").mkdir()
        (tmp_path / "tree" / "big.bin").write_bytes(big)
        await box.upload(tmp_path / "tree", "up")
        assert await box.read_file("up/big.bin") == big


async def test_an_image_without_python_gets_plain_docker_exec(
    backend: DockerBackend, run_id: str, images
) -> None:
    async with await backend.create(
        SandboxSpec(image=images["base"]), run=run_id, member="c"
    ) as box:
        assert box.mode == "plain"
        await _semantics_hold(box)
        with pytest.raises(SandboxUnavailable, match="no python3"):
            await box.read_file("anything.txt")


# ---------------------------------------------------------------- a box dying mid-path


async def test_a_box_killed_as_its_agent_restarts_is_crashed_never_an_engine_error(
    backend: DockerBackend, run_id: str, docker_client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent dies, and the box dies the moment the agent is being restarted."""
    api = docker_client.api
    async with await backend.create(SandboxSpec(), run=run_id, member="c") as box:
        real_start = api.exec_start
        restarts: list[str] = []

        def start_then_kill_the_box(exec_id, *args, **kwargs):
            result = real_start(exec_id, *args, **kwargs)
            if kwargs.get("socket") and not restarts:
                restarts.append(exec_id)
                api.kill(box.id)  # right after the restarted agent's exec began
            return result

        await _kill_agent(box, docker_client)
        monkeypatch.setattr(api, "exec_start", start_then_kill_the_box)
        with pytest.raises(SandboxCrashed) as err:
            await box.exec("true")
        assert restarts, "the agent restart must have been attempted"
        assert err.value.reason == "killed"
        with pytest.raises(SandboxCrashed, match="killed"):
            await box.write_file("f.txt", "x")


async def _oneshot_box(box: DockerSandbox, client: docker.DockerClient) -> None:
    for _ in range(2):
        await _kill_agent(box, client)
        with pytest.raises(SandboxUnavailable, match="retry"):
            await box.exec("true")
    assert box.mode == "oneshot"


@pytest.mark.parametrize("mode", ["oneshot", "plain"])
async def test_a_dead_box_in_a_fallback_mode_is_crashed_never_an_engine_error(
    backend: DockerBackend, run_id: str, docker_client, images, mode: str
) -> None:
    """Without the agent stream nothing notices the box died before the next engine call:
    that call's 409 ('container is not running') must come out as the typed crash."""
    spec = SandboxSpec() if mode == "oneshot" else SandboxSpec(image=images["base"])
    async with await backend.create(spec, run=run_id, member="c") as box:
        if mode == "oneshot":
            await _oneshot_box(box, docker_client)
        assert box.mode == mode
        docker_client.api.kill(box.id)
        with pytest.raises(SandboxCrashed) as err:
            await box.exec("echo hi")
        assert err.value.reason == "killed"
        assert "docker" not in type(err.value).__module__


# ---------------------------------------------------------------- programs that cannot start


@pytest.fixture(params=["agent", "oneshot", "inline", "plain"])
async def box_in_each_mode(
    request, backend: DockerBackend, run_id: str, docker_client, images
) -> AsyncIterator[DockerSandbox]:
    mode = request.param
    if mode == "inline":
        spec = SandboxSpec(image=request.getfixturevalue("image_without_agent"))
    else:
        spec = SandboxSpec(image=images["base"]) if mode == "plain" else SandboxSpec()
    async with await backend.create(spec, run=run_id, member="c") as box:
        if mode == "oneshot":
            await _oneshot_box(box, docker_client)
        assert box.mode == mode
        yield box


async def test_a_program_that_cannot_start_is_126_or_127_with_why_on_stderr_on_every_path(
    box_in_each_mode: DockerSandbox,
) -> None:
    """The documented contract of Sandbox.exec, for argv lists and shell strings, with and
    without a timeout, whichever way the box is reached."""
    box = box_in_each_mode
    made = await box.exec(
        "printf '#!/bin/sh\\necho ran\\n' > notexec.sh && mkdir adir"
        " && printf 'echo via-sh\\n' > noshebang && chmod +x noshebang"
    )
    assert made.ok, made
    for timeout in (30.0, None):
        for cmd in (["/workspace/notexec.sh"], "/workspace/notexec.sh", ["/workspace/adir"]):
            res = await box.exec(cmd, timeout=timeout)
            assert res.exit_code == 126, (box.mode, cmd, timeout, res)
            program = cmd if isinstance(cmd, str) else cmd[0]
            assert "Permission denied" in res.stderr and program in res.stderr, res
            assert res.stdout == "", res
        for cmd in (["/workspace/missing"], "/workspace/missing"):
            res = await box.exec(cmd, timeout=timeout)
            assert res.exit_code == 127 and "/workspace/missing" in res.stderr, res
            assert res.stdout == "", res
        # Executable, not a binary, no '#!': a shell runs it, and so does every path.
        ran = await box.exec(["/workspace/noshebang"], timeout=timeout)
        assert (ran.exit_code, ran.stdout) == (0, "via-sh\n"), (box.mode, ran)

"""The exec paths behind the fast one: agent restart, one-shot agent per call, inline
agent source, and plain ``docker exec`` - each keeps the timeout and cap semantics."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator

import docker
import pytest

from sandbox.docker import DockerBackend, DockerSandbox
from sandbox.errors import SandboxUnavailable
from sandbox.spec import SandboxSpec

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def backend(docker_client, images) -> DockerBackend:
    return DockerBackend(docker_client, images=images)


async def _kill_agent(box: DockerSandbox, client: docker.DockerClient) -> None:
    assert box._agent is not None
    pid = (await box._agent.request({"op": "ping"}))["pid"]
    res = client.containers.get(box.id).exec_run(["kill", "-9", str(pid)], user="1000:1000")
    assert res.exit_code == 0, res.output


async def _semantics_hold(box: DockerSandbox) -> None:
    """Exit code, stdin, the in-box timeout with partial output, and the per-stream cap."""
    res = await box.exec("cat; exit 4", stdin="in")
    assert (res.exit_code, res.stdout) == (4, "in")
    slow = await box.exec("echo partial; sleep 30", timeout=1)
    assert slow.timed_out and slow.stdout == "partial\n" and slow.duration_s < 10
    big = await box.exec("head -c 50000 /dev/zero | tr '\\0' x", output_limit=4096)
    assert big.truncated and len(big.stdout) < 5000 and big.stdout.startswith("x")


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
    dockerfile = f"FROM {images['coding']}\nUSER root\nRUN rm /opt/fleet/boxagent.py\n"
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    try:
        yield tag
    finally:
        docker_client.images.remove(tag, force=True)


async def test_an_image_without_the_agent_file_gets_the_agent_inline(
    backend: DockerBackend, run_id: str, image_without_agent: str
) -> None:
    spec = SandboxSpec(image=image_without_agent)
    async with await backend.create(spec, run=run_id, member="c") as box:
        assert box.mode == "inline"
        await _semantics_hold(box)
        await box.write_file("f.txt", "inline")
        assert [e.name for e in await box.list_dir("/workspace")] == ["f.txt"]


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

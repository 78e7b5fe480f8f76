"""Resource limits hold: fork bombs, memory hogs and disk fills stay inside their box."""

from __future__ import annotations

import anyio
import pytest

from sandbox.docker import DockerBackend
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

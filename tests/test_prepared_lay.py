"""A box of a prepared snapshot starts with the snapshot's tree in its ``/workspace``.

The box's own command copies the tree as it starts, and the backend hands the box out
only once that copy is known to have finished (``sandbox/docker/backend.py``). These
tests take a snapshot image made here by hand (the product's own ``commit`` over a clean
archive) and check what the first caller sees: the whole tree, owned by the box's user,
with no trace of the copy's own bookkeeping; a tree that does not fit ends as a clear
error with the box removed, never as a half-laid workspace handed out.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import docker
import pytest

from sandbox.docker import prepared as store
from sandbox.docker.backend import DockerBackend
from sandbox.errors import SandboxUnavailable
from sandbox.prepared.capture import PREFIX
from sandbox.spec import SandboxSpec

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def backend(docker_client, images) -> DockerBackend:
    return DockerBackend(docker_client, images=images)


def _snapshot(
    client: docker.DockerClient,
    base: str,
    files: dict[str, bytes],
    tmp: Path,
    key: str,
    modes: dict[str, int] | None = None,
) -> str:
    """An image of ``base`` with ``files`` under the prepared prefix, made as a setup's is
    (each file 0644 unless ``modes`` names it)."""
    clean = tmp / "clean.tar"
    with tarfile.open(clean, "w") as tar:
        dirs = sorted({str(Path(name).parent) for name in files} - {"."})
        for d in ["", *dirs]:
            info = tarfile.TarInfo(f"{PREFIX}/{d}".rstrip("/"))
            info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, 1000, 1000
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(f"{PREFIX}/{name}")
            info.size, info.uid, info.gid = len(data), 1000, 1000
            info.mode = (modes or {}).get(name, 0o644)
            tar.addfile(info, io.BytesIO(data))
    return store.commit(client, base, clean, key=key, labels={}, venv=False)


@pytest.fixture
def snapshots(docker_client):
    made: list[str] = []
    yield made
    for ref in made:
        docker_client.images.remove(ref, force=True)


async def test_the_tree_is_whole_and_the_copy_leaves_nothing_behind(
    backend: DockerBackend, docker_client, run_id: str, tmp_path: Path, snapshots: list[str]
) -> None:
    files = {f"pkg/m{i}.py": f"VALUE = {i}\n".encode() * 50 for i in range(300)}
    files["big.bin"] = bytes(range(256)) * 40_000  # 10 MB: a copy that takes a while
    base = await backend.image_for(SandboxSpec())
    ref = _snapshot(docker_client, base, files, tmp_path, "t-lay-whole-" + run_id)
    snapshots.append(ref)

    async with await backend.create(SandboxSpec(prepared=ref), run=run_id, member="m") as box:
        # The first request after create: everything is there already.
        res = await box.exec(
            "find /workspace -type f | wc -l; stat -c '%u:%g' /workspace/pkg/m7.py; "
            "sha256sum /workspace/big.bin | cut -c1-16; cat /workspace/pkg/m299.py | wc -l; "
            "ls -A /tmp",
            cwd="/",
        )
        assert res.ok, res.stderr
        count, owner, digest, lines, *left = res.stdout.split("\n")
        assert int(count) == len(files)
        assert owner == "1000:1000"
        assert digest == hashlib.sha256(files["big.bin"]).hexdigest()[:16]
        assert int(lines) == 50
        assert [name for name in left if name] == []  # no marker, no error file
        # The box works as any box: the tree is its own to change.
        assert (await box.exec("echo x >> /workspace/pkg/m1.py && rm /workspace/big.bin")).ok


async def test_a_tree_that_does_not_fit_is_an_error_and_no_box_is_left(
    backend: DockerBackend, docker_client, run_id: str, tmp_path: Path, snapshots: list[str]
) -> None:
    files = {"big.bin": b"\0" * (6 * 1024 * 1024)}
    base = await backend.image_for(SandboxSpec())
    ref = _snapshot(docker_client, base, files, tmp_path, "t-lay-full-" + run_id)
    snapshots.append(ref)

    spec = SandboxSpec(prepared=ref, workspace_size="4m")
    with pytest.raises(SandboxUnavailable) as err:
        await backend.create(spec, run=run_id, member="m")
    message = str(err.value)
    assert "did not copy into /workspace" in message
    assert "No space left on device" in message
    assert await backend.list_boxes(run=run_id) == []


async def test_a_file_the_box_cannot_read_fails_the_copy_rather_than_leaving_it_out(
    backend: DockerBackend, docker_client, run_id: str, tmp_path: Path, snapshots: list[str]
) -> None:
    # A setup may leave a file its own user cannot read (`chmod 000`): the copy must not
    # hand out a workspace without it. Each file's copy is read first and written after
    # (a pipe), and the reading side's failure alone does not end the pipe in error.
    files = {"a.txt": b"a\n", "locked.bin": b"x" * 4096, "z.txt": b"z\n"}
    base = await backend.image_for(SandboxSpec())
    ref = _snapshot(
        docker_client, base, files, tmp_path, "t-lay-locked-" + run_id, {"locked.bin": 0}
    )
    snapshots.append(ref)

    with pytest.raises(SandboxUnavailable) as err:
        await backend.create(SandboxSpec(prepared=ref), run=run_id, member="m")
    message = str(err.value)
    assert "did not copy into /workspace" in message
    assert "locked.bin" in message and "Permission denied" in message
    assert await backend.list_boxes(run=run_id) == []


async def test_a_snapshot_with_labels_fleet_did_not_write_is_listed_not_fatal(
    backend: DockerBackend, docker_client, run_id: str, tmp_path: Path, snapshots: list[str]
) -> None:
    # An image's labels are whoever made it's word: no base, a date that is no number.
    base = await backend.image_for(SandboxSpec())
    clean = tmp_path / "clean.tar"
    with tarfile.open(clean, "w"):
        pass
    key = "t-lay-foreign-" + run_id
    labels = {"fleet.prepared.created": "yesterday", "fleet.prepared.base": ""}
    snapshots.append(store.commit(docker_client, base, clean, key=key, labels=labels, venv=False))
    listed = {info.key: info for info in store.list_all(docker_client)}
    assert key in listed
    assert listed[key].created > 0 and listed[key].size >= 0

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
import shutil
import tarfile
from pathlib import Path

import anyio
import docker
import pytest

from sandbox.docker import prepared as store
from sandbox.docker.backend import DockerBackend
from sandbox.errors import SandboxError, SandboxUnavailable
from sandbox.prepared import waiting
from sandbox.prepared.capture import PREFIX, CaptureRefused
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
    venv: bool = False,
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
    return store.commit(client, base, clean, key=key, labels={}, venv=venv)


async def _too_big(
    backend: DockerBackend, client: docker.DockerClient, tmp: Path, key: str, made: list[str]
) -> str:
    """A snapshot whose 6 MB tree a 4 MB workspace cannot hold (its archive in ``tmp``)."""
    base = await backend.image_for(SandboxSpec())
    ref = _snapshot(client, base, {"big.bin": b"\0" * (6 * 1024 * 1024)}, tmp, key)
    made.append(ref)
    return ref


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
        # No marker, no error file: /tmp holds the user's home alone.
        assert [name for name in left if name] == ["home"]
        # The box works as any box: the tree is its own to change.
        assert (await box.exec("echo x >> /workspace/pkg/m1.py && rm /workspace/big.bin")).ok


async def test_a_tree_that_does_not_fit_is_an_error_and_no_box_is_left(
    backend: DockerBackend, docker_client, run_id: str, tmp_path: Path, snapshots: list[str]
) -> None:
    ref = await _too_big(backend, docker_client, tmp_path, "t-lay-full-" + run_id, snapshots)
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


_LOOK = (
    "find /workspace -printf '%P %m %u %s\\n' | sort; echo VE=$VIRTUAL_ENV; echo PATH=$PATH; "
    "command -v python"
)


async def test_a_box_that_waited_for_its_setup_is_then_as_one_started_from_the_snapshot(
    backend: DockerBackend, docker_client, run_id: str, tmp_path: Path, snapshots: list[str]
) -> None:
    files = {f"pkg/m{i}.py": b"X = 1\n" for i in range(50)}
    files[".venv/bin/python"] = b"#!/bin/sh\necho venv-python\n"
    base = await backend.image_for(SandboxSpec())
    key = "t-lay-wait-" + run_id
    ref = _snapshot(docker_client, base, files, tmp_path, key, {".venv/bin/python": 0o755}, True)
    snapshots.append(ref)
    tree = waiting.key_dir(backend.owner(run_id), hashlib.sha256(key.encode()).hexdigest())
    shutil.copyfile(tmp_path / "clean.tar", tree / store.TREE_FILE)

    box = await backend.create_waiting(SandboxSpec(), run=run_id, member="w", tree=tree)
    # Before its tree: an empty workspace, and the kept tree read-only - its own key's
    # directory alone, nothing above it, nothing it can add, change or remove.
    res = await box.exec(
        "ls -A /workspace; ls -A /opt/fleet/tree; touch /opt/fleet/tree/x; "
        f"rm /opt/fleet/tree/{store.TREE_FILE}; echo more >> /opt/fleet/tree/{store.TREE_FILE}",
        cwd="/",
    )
    assert res.stdout.split() == [store.TREE_FILE], res.stdout
    assert len(res.stderr.strip().splitlines()) == 3 and "Read-only" in res.stderr, res.stderr
    assert (tree / store.TREE_FILE).read_bytes() == (tmp_path / "clean.tar").read_bytes()
    assert [p.name for p in tree.iterdir()] == [store.TREE_FILE]
    await backend.lay_tree(box, ref=ref)
    laid = await box.exec(_LOOK, cwd="/")
    async with await backend.create(SandboxSpec(prepared=ref), run=run_id, member="s") as same:
        started = await same.exec(_LOOK, cwd="/")
    assert laid.ok and started.ok, laid.stderr + started.stderr
    assert laid.stdout == started.stdout
    assert "VE=/workspace/.venv" in laid.stdout and "/workspace/.venv/bin/python" in laid.stdout
    # A process of its own (an MCP server) has the snapshot's environment too.
    proc = await box.start_process('echo "ve=$VIRTUAL_ENV"')
    try:
        with anyio.fail_after(30):
            assert (await proc.receive()).strip() == b"ve=/workspace/.venv"
    finally:
        await proc.close()
    # The run's end takes what it kept for its waiting boxes.
    await backend.remove_run(run_id)
    assert not (waiting.trees_dir() / backend.owner(run_id)).exists()


async def test_a_waiting_box_that_cannot_take_its_tree_is_removed_and_says_why(
    backend: DockerBackend, docker_client, run_id: str, tmp_path: Path, snapshots: list[str]
) -> None:
    key = "t-lay-wait-full-" + run_id
    ref = await _too_big(backend, docker_client, tmp_path, key, snapshots)
    owner = backend.owner(run_id)
    full, empty = waiting.key_dir(owner, "a" * 64), waiting.key_dir(owner, "b" * 64)
    shutil.copyfile(tmp_path / "clean.tar", full / store.TREE_FILE)

    small = SandboxSpec(workspace_size="4m")
    box = await backend.create_waiting(small, run=run_id, member="w1", tree=full)
    with pytest.raises(SandboxUnavailable) as err:
        await backend.lay_tree(box, ref=ref)
    assert "did not copy into /workspace" in str(err.value)
    assert "No space left on device" in str(err.value)
    # No archive in its directory (the tree was never kept for it): the same.
    box = await backend.create_waiting(SandboxSpec(), run=run_id, member="w2", tree=empty)
    with pytest.raises(SandboxUnavailable) as err:
        await backend.lay_tree(box, ref=ref)
    assert "tree.tar" in str(err.value)
    assert await backend.list_boxes(run=run_id) == []
    # Only a coding box of Fleet's image waits for a tree (another image may have no tar).
    for spec in (SandboxSpec(kind="browser"), SandboxSpec(image="debian:bookworm-slim")):
        with pytest.raises(SandboxError, match="waits for a setup"):
            await backend.create_waiting(spec, run=run_id, member="w3", tree=full)


async def test_a_kept_tree_is_whole_clean_and_never_one_the_capture_refused(
    backend: DockerBackend, docker_client, run_id: str, tmp_path: Path, snapshots: list[str]
) -> None:
    from sandbox.docker.gvisor import exec_prefix

    secret = "s3cr3t-t0ken-value"
    base = await backend.image_for(SandboxSpec())
    keep = waiting.key_dir(backend.owner(run_id), "c" * 64)
    async with await backend.create(SandboxSpec(), run=run_id, member="setup") as box:
        await box.exec(f"mkdir -p .venv/bin && echo {secret} > pip.conf && echo ok > made.txt")

        def save(key: str, secrets: dict[str, str]) -> str:
            return store.save(
                docker_client, box.id, exec_prefix(box.spec), base, key=key, inputs={},
                setup="t", repo=None, secrets=secrets, keep=keep,
            )  # fmt: skip

        # A tree holding a secret's value is refused: nothing of it is kept anywhere a
        # waiting box could see, and the private directory it was read into is gone.
        with pytest.raises(CaptureRefused):
            await anyio.to_thread.run_sync(save, "t-keep-refused-" + run_id, {"T": secret})
        assert list(keep.iterdir()) == [] and list(keep.parent.iterdir()) == [keep]
        assert await box.exec("rm pip.conf")
        ref = await anyio.to_thread.run_sync(save, "t-keep-whole-" + run_id, {"T": secret})
        snapshots.append(ref)
    kept = keep / store.TREE_FILE
    assert list(keep.iterdir()) == [kept] and list(keep.parent.iterdir()) == [keep]
    assert kept.stat().st_mode & 0o777 == 0o644
    with tarfile.open(kept) as tar:
        names = tar.getnames()
    assert f"{PREFIX}/made.txt" in names and not any("pip.conf" in n for n in names)
    assert secret.encode() not in kept.read_bytes()

"""Tree transfer against hostile archives and boxes, in both directions.

``upload`` unpacks a tar archive inside the box; an archive may hold absolute names,
``..`` components or symlinks that point out of the destination, alone or chained so
that an entry only escapes once an earlier one is on disk. ``download`` unpacks on
the host what the box sends, and the box is not trusted.
"""

from __future__ import annotations

import base64
import io
import os
import tarfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sandbox.docker.backend import INLINE_UPLOAD_BYTES, DockerBackend, DockerSandbox
from sandbox.errors import PathRefused
from sandbox.spec import SandboxSpec

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def module_run(docker_client) -> Iterator[str]:
    from conftest import remove_run

    from sandbox.docker.reaper import mark_done, mark_live

    rid = f"test-{uuid.uuid4().hex[:12]}"
    mark_live(rid)
    try:
        yield rid
    finally:
        remove_run(docker_client, rid)
        mark_done(rid)


@pytest.fixture(scope="module")
async def box(docker_client, images, module_run: str) -> AsyncIterator[DockerSandbox]:
    backend = DockerBackend(docker_client, images=images)
    sandbox = await backend.create(SandboxSpec(), run=module_run, member="files")
    async with sandbox:
        yield sandbox


def _archive(*entries: tuple[str, str, str]) -> str:
    """A tar archive of (type, name, payload) entries: 'f' file, 'l' symlink, 'h' hard link."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for kind, name, payload in entries:
            info = tarfile.TarInfo(name)
            if kind == "f":
                data = payload.encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = tarfile.SYMTYPE if kind == "l" else tarfile.LNKTYPE
            info.linkname = payload
            tar.addfile(info)
    return base64.b64encode(buf.getvalue()).decode()


HOSTILE = {
    "absolute name": [("f", "/tmp/abs-planted", "x")],
    "dot-dot name": [("f", "../dotdot-planted", "x")],
    "deep dot-dot": [("f", "a/../../dotdot2-planted", "x")],
    "hard link out": [("h", "pw", "/etc/passwd")],
    "write through a symlink out": [("l", "t", "/tmp"), ("f", "t/through-planted", "x")],
    "hard link to a symlink out": [
        ("l", "t", "/tmp"),
        ("h", "h", "t"),
        ("f", "h/hard-planted", "x"),
    ],
    "symlink then dot-dot through it": [("l", "d", "/workspace"), ("f", "d/../dd-planted", "x")],
}
LINKS_OUT = {
    "symlink out": [("l", "etc", "/etc")],
    "relative symlink out": [("l", "up", "../../../etc")],
    # Lexically 's/../../x' stays under /workspace while 's' is not on disk yet; once
    # 's' -> '.' exists, 'u' really points at /x: a check before extraction misses it.
    "chained symlinks": [("l", "s", "."), ("l", "u", "s/../../../x-planted")],
}


async def _tar_in(box: DockerSandbox, dest: str, archive: str, via: str) -> dict:
    """Send an archive in one request (``frame``) or as a raw stream after it."""
    req = {"op": "tar_in", "path": dest}
    if via == "frame":
        return await box._call({**req, "data": archive})
    raw = base64.b64decode(archive)
    return await box._call({**req, "stream": True}, timeout=60, body=lambda out: out.write(raw))


@pytest.mark.parametrize("via", ["frame", "stream"])
@pytest.mark.parametrize("case", list(HOSTILE))
async def test_hostile_archives_are_refused_and_nothing_lands_outside(
    box: DockerSandbox, case: str, via: str
) -> None:
    dest = f"/workspace/in-{uuid.uuid4().hex[:6]}"
    reply = await _tar_in(box, dest, _archive(*HOSTILE[case]), via)
    assert reply["ok"] is False and reply["error"] == "path_refused", reply
    stray = await box.exec(
        "find / -xdev -name '*-planted' 2>/dev/null; find /tmp /workspace -name '*-planted'; "
        f"find {dest} -type l"
    )
    assert stray.stdout == "", stray.stdout


@pytest.mark.parametrize("via", ["frame", "stream"])
@pytest.mark.parametrize("case", list(LINKS_OUT))
async def test_symlinks_out_are_kept_as_links_and_nothing_is_written_through_them(
    box: DockerSandbox, case: str, via: str
) -> None:
    dest = f"/workspace/in-{uuid.uuid4().hex[:6]}"
    entries = [*LINKS_OUT[case], ("f", "after.txt", "x")]
    reply = await _tar_in(box, dest, _archive(*entries), via)
    assert reply["ok"] is True, reply
    for _kind, name, target in LINKS_OUT[case]:
        seen = await box.exec(["readlink", f"{dest}/{name}"])
        assert seen.stdout.strip() == target
    assert await box.read_file(f"{dest}/after.txt") == b"x"
    stray = await box.exec("find / -xdev -name '*-planted' 2>/dev/null")
    assert stray.stdout == "", stray.stdout


async def test_upload_of_a_tree_keeps_a_symlink_out_dangling_and_never_follows_it(
    box: DockerSandbox, tmp_path: Path
) -> None:
    src = tmp_path / "tree"
    src.mkdir()
    (src / "ok.txt").write_text("fine\n")
    (src / "secrets").symlink_to("/etc")
    (src / "inner").symlink_to("ok.txt")
    await box.upload(src, "up1")
    assert (await box.exec(["readlink", "up1/secrets"])).stdout == "/etc\n"
    assert await box.read_file("up1/inner") == b"fine\n"
    with pytest.raises(PathRefused, match="secrets"):
        await box.read_file("up1/secrets/passwd")


async def test_a_tree_or_file_past_the_inline_size_streams_in_whole(
    box: DockerSandbox, tmp_path: Path
) -> None:
    src = tmp_path / "tree"
    (src / "sub").mkdir(parents=True)
    blob = os.urandom(INLINE_UPLOAD_BYTES + 1)
    (src / "sub" / "big.bin").write_bytes(blob)
    (src / "small.txt").write_text("small\n")
    (src / "link").symlink_to("sub/big.bin")
    await box.upload(src, "streamed")
    assert await box.read_file("streamed/sub/big.bin") == blob
    assert await box.read_file("streamed/link") == blob
    assert await box.read_file("streamed/small.txt") == b"small\n"
    await box.upload(src / "sub" / "big.bin", "/tmp/one/file.bin")
    assert await box.read_file("/tmp/one/file.bin") == blob
    await box.exec("rm -rf streamed /tmp/one")


async def test_download_never_writes_outside_the_local_destination(
    box: DockerSandbox, tmp_path: Path
) -> None:
    await box.exec(
        "mkdir -p out && echo data > out/f.txt && ln -s /etc/passwd out/pw "
        "&& ln -s ../../../../../../tmp out/up && ln -s f.txt out/same"
    )
    with pytest.raises(PathRefused, match="out"):
        await box.download("out", tmp_path / "back")
    assert not (tmp_path / "back" / "pw").exists()
    await box.exec("rm out/pw out/up")
    await box.download("out", tmp_path / "back2")
    assert (tmp_path / "back2" / "same").read_text() == "data\n"

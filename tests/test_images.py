"""Fleet's images: tags follow the build inputs, builds are incremental, and the
coding, browser and base images do what boxes rely on - against the real engine."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
from conftest import missing_dependency

from coordinator.cli import main as fleet_main
from sandbox.errors import SandboxUnavailable
from sandbox.images import catalog as images_mod
from sandbox.images.build import ensure_images
from sandbox.images.catalog import (
    ImageDef,
    current_refs,
    image_ref,
    input_hash,
    save_extra_ca,
    split_pem,
)

SECURE = {
    "cap_drop": ["ALL"],
    "security_opt": ["no-new-privileges"],
    "init": True,
    "pids_limit": 256,
    "mem_limit": "1g",
}


def _context(tmp_path: Path, dockerfile: str = "ARG BASE\nFROM ${BASE}\n") -> Path:
    ctx = tmp_path / f"ctx-{uuid.uuid4().hex[:6]}"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(dockerfile)
    (ctx / "tool.sh").write_text("#!/bin/sh\necho hi\n")
    return ctx


def _probe_defs(ctx: Path, *, name: str = "probe") -> tuple[ImageDef, ...]:
    """The real root and base images plus one small test image built on the base."""
    real = images_mod.image_defs()
    return (real["rootfs"], real["base"], ImageDef(name=name, directory=str(ctx), parent="base"))


@pytest.fixture
def probe_name(docker_client: docker.DockerClient) -> Iterator[str]:
    """A throwaway image name; every tag of its repository is removed afterwards."""
    name = f"testprobe-{uuid.uuid4().hex[:8]}"
    yield name
    # By label, so untagged leftovers (an image a forced rebuild replaced) go too.
    for image in docker_client.images.list(filters={"label": f"{images_mod.LABEL_IMAGE}={name}"}):
        try:
            docker_client.images.remove(image.id, force=True)
        except docker.errors.NotFound:
            pass


# ---------------------------------------------------------------- tags


def test_tag_is_stable_and_changes_with_every_input(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    defn = ImageDef(name="probe", directory=str(ctx), parent="base")
    first = input_hash(defn, "aaaa", b"")
    assert first == input_hash(defn, "aaaa", b""), "same inputs must give the same tag"
    assert len(first) == 12

    seen = {first}

    def changed(tag: str) -> None:
        assert tag not in seen, "a changed build input must change the tag"
        seen.add(tag)

    changed(input_hash(defn, "bbbb", b""))  # parent's tag
    (ctx / "Dockerfile").write_text("ARG BASE\nFROM ${BASE}\nRUN true\n")
    changed(input_hash(defn, "aaaa", b""))  # Dockerfile
    (ctx / "tool.sh").chmod(0o755)
    changed(input_hash(defn, "aaaa", b""))  # a file's executable bit
    (ctx / "sub").mkdir()
    (ctx / "sub" / "data.txt").write_text("x")
    changed(input_hash(defn, "aaaa", b""))  # a new context file
    with_ca = defn.model_copy(update={"extra_ca": True})
    cert = _self_signed_pem(tmp_path)
    changed(input_hash(with_ca, "aaaa", b""))
    changed(input_hash(with_ca, "aaaa", cert))  # the extra CA bundle
    # The CA only counts for images that take it (children inherit it via the parent tag).
    assert input_hash(defn, "aaaa", cert) == input_hash(defn, "aaaa", b"")


def test_child_tag_follows_parent_inputs(tmp_path: Path, monkeypatch) -> None:
    parent_ctx, child_ctx = _context(tmp_path), _context(tmp_path)
    defs = (
        ImageDef(name="p", directory=str(parent_ctx)),
        ImageDef(name="c", directory=str(child_ctx), parent="p"),
    )
    monkeypatch.setattr(images_mod, "IMAGES", defs)
    before = current_refs()
    assert before == current_refs()
    (parent_ctx / "Dockerfile").write_text("FROM scratch\n")
    after = current_refs()
    assert after["p"] != before["p"] and after["c"] != before["c"]
    assert after["c"].startswith("fleet-c:")


def test_helper_files_are_hashed_and_missing_ones_skipped(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    helper = tmp_path / "helper.py"
    defn = ImageDef(name="probe", directory=str(ctx), files=(str(helper),))
    without = input_hash(defn, None, b"")
    assert [rel for rel, _ in images_mod.context_files(defn)] == ["Dockerfile", "tool.sh"]
    helper.write_text("print('hi')\n")
    assert input_hash(defn, None, b"") != without
    assert "fleet/helper.py" in [rel for rel, _ in images_mod.context_files(defn)]


def test_every_in_box_program_goes_into_every_box_image() -> None:
    """A missing helper is skipped silently, so a moved or new in-box file must be named:
    every program of ``sandbox/inbox/`` (and nothing else) is a box helper, and every
    image that runs boxes carries all of them."""
    root = images_mod.REPO_ROOT
    inbox = sorted(
        p.relative_to(root).as_posix()
        for p in (root / "sandbox" / "inbox").glob("*.py")
        if p.name != "__init__.py"
    )
    assert inbox and sorted(images_mod.BOX_HELPERS) == inbox
    for name in ("coding", "browser", "corpus"):
        defn = images_mod.image_defs()[name]
        shipped = {rel for rel, _ in images_mod.context_files(defn) if rel.startswith("fleet/")}
        assert shipped == {f"fleet/{Path(p).name}" for p in inbox}, name
    corpus = images_mod.image_defs()["corpus"]
    assert "corpus_server.py" in [rel for rel, _ in images_mod.context_files(corpus)]


def test_unknown_image_names_what_exists() -> None:
    with pytest.raises(SandboxUnavailable, match=r"unknown image 'nope'.*coding"):
        image_ref("nope")


def test_image_ref_of_unbuilt_image_says_to_build(tmp_path, monkeypatch, docker_client) -> None:
    monkeypatch.setattr(images_mod, "IMAGES", _probe_defs(_context(tmp_path)))
    with pytest.raises(SandboxUnavailable, match="fleet images build"):
        image_ref("probe", client=docker_client)


# ---------------------------------------------------------------- builds


def test_second_build_is_a_noop(images: dict[str, str], docker_client) -> None:
    ids = {name: docker_client.images.get(ref).id for name, ref in images.items()}
    lines: list[str] = []
    again = ensure_images(None, client=docker_client, say=lines.append)
    assert again == images
    assert lines == [], f"an up-to-date build must not build anything: {lines}"
    assert {name: docker_client.images.get(ref).id for name, ref in again.items()} == ids
    for name, ref in images.items():
        assert image_ref(name, client=docker_client) == ref


def test_images_ls_shows_every_image_current(images, capsys) -> None:
    assert fleet_main(["images", "ls"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert set(rows) == set(images)
    for name, ref in images.items():
        assert rows[name][1:3] == [ref, "current"]
        assert rows[name][4] == "MiB"


def test_changed_input_builds_a_new_tag(
    images, docker_client, tmp_path, monkeypatch, probe_name, run_id
) -> None:
    ctx = _context(tmp_path, "ARG BASE\nFROM ${BASE}\nCOPY tool.sh /probe/tool.sh\n")
    monkeypatch.setattr(images_mod, "IMAGES", _probe_defs(ctx, name=probe_name))
    lines: list[str] = []
    first = ensure_images([probe_name], client=docker_client, say=lines.append)[probe_name]
    assert any(line.startswith(f"building {first}") for line in lines)
    assert first.startswith(f"fleet-{probe_name}:")

    (ctx / "tool.sh").write_text("#!/bin/sh\necho changed\n")
    lines.clear()
    second = ensure_images([probe_name], client=docker_client, say=lines.append)[probe_name]
    assert second != first
    # Only the changed image is rebuilt; its parents are current.
    assert [line for line in lines if line.startswith("building")] == [f"building {second}"]
    code, out = _run_to_end(docker_client, second, "cat /probe/tool.sh", run_id)
    assert code == 0 and "echo changed" in out

    lines.clear()
    assert ensure_images([probe_name], client=docker_client, say=lines.append)[probe_name] == second
    assert lines == []


def test_force_rebuilds_only_the_named_image_afresh(
    images, docker_client, tmp_path, monkeypatch, probe_name
) -> None:
    ctx = _context(tmp_path, "ARG BASE\nFROM ${BASE}\nRUN cat /proc/sys/kernel/random/uuid > /id\n")
    monkeypatch.setattr(images_mod, "IMAGES", _probe_defs(ctx, name=probe_name))
    ref = ensure_images([probe_name], client=docker_client)[probe_name]
    before = docker_client.images.get(ref).id
    lines: list[str] = []
    again = ensure_images([probe_name], client=docker_client, force=True, say=lines.append)
    assert again[probe_name] == ref, "same inputs, same tag"
    assert docker_client.images.get(ref).id != before, "--force must not reuse the layer cache"
    assert [line for line in lines if line.startswith("building")] == [f"building {ref}"]
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(before)  # the replaced image is not left dangling


def test_failing_build_reports_its_last_output(
    images, docker_client, tmp_path, monkeypatch, probe_name
) -> None:
    ctx = _context(tmp_path, "ARG BASE\nFROM ${BASE}\nRUN echo boom-from-step && false\n")
    monkeypatch.setattr(images_mod, "IMAGES", _probe_defs(ctx, name=probe_name))
    with pytest.raises(images_mod.ImageBuildFailed) as info:
        ensure_images([probe_name], client=docker_client)
    text = str(info.value)
    assert "boom-from-step" in text and "fleet images build" in text
    assert not images_mod.image_exists(docker_client, current_refs()[probe_name])


def test_prune_removes_superseded_tags_but_not_ones_in_use(
    images, docker_client, tmp_path, monkeypatch, probe_name, run_id
) -> None:
    ctx = _context(tmp_path, "ARG BASE\nFROM ${BASE}\nCOPY tool.sh /probe/tool.sh\n")
    monkeypatch.setattr(images_mod, "IMAGES", _probe_defs(ctx, name=probe_name))
    old = ensure_images([probe_name], client=docker_client)[probe_name]
    (ctx / "tool.sh").write_text("#!/bin/sh\necho newer\n")
    new = ensure_images([probe_name], client=docker_client)[probe_name]
    user = docker_client.containers.create(old, ["true"], labels={"fleet.run": run_id})

    assert images_mod.prune_superseded(docker_client, [probe_name]) == ([], [old])
    user.remove()
    assert images_mod.prune_superseded(docker_client, [probe_name]) == ([old], [])
    assert not images_mod.image_exists(docker_client, old)
    assert images_mod.image_exists(docker_client, new)
    assert images_mod.image_exists(docker_client, images["base"])


def test_cached_rootfs_tarball_is_imported_without_debootstrap(
    docker_client, tmp_path, monkeypatch, probe_name
) -> None:
    monkeypatch.setenv("FLEET_CACHE_DIR", str(tmp_path / "cache"))
    config = tmp_path / "rootfs-def"
    config.mkdir()
    (config / "debootstrap.json").write_text("{}")
    defn = ImageDef(name=probe_name, directory=str(config), builder="debootstrap")
    monkeypatch.setattr(images_mod, "IMAGES", (defn,))
    ref = current_refs()[probe_name]
    # A cached root file system for exactly this tag: building must only import it.
    store = tmp_path / "cache" / "rootfs"
    store.mkdir(parents=True)
    marker = tmp_path / "marker"
    marker.write_text("from the cache\n")
    with tarfile.open(store / f"{ref.split(':')[1]}.tar", "w") as tar:
        tar.add(marker, arcname="etc/fleet-marker")
    monkeypatch.setattr(
        "sandbox.images.build._debootstrap_tarball",
        lambda *a: pytest.fail("debootstrap ran although the tarball was cached"),
    )

    lines: list[str] = []
    assert ensure_images(None, client=docker_client, say=lines.append) == {probe_name: ref}
    attrs = docker_client.images.get(ref).attrs
    assert attrs["Config"]["Labels"][images_mod.LABEL_IMAGE] == probe_name
    assert any("importing" in line for line in lines)


# ---------------------------------------------------------------- extra CA


def _self_signed_pem(tmp_path: Path) -> bytes:
    if shutil.which("openssl") is None:
        missing_dependency("openssl is needed to make a test certificate")
    key, cert = tmp_path / "key.pem", tmp_path / f"ca-{uuid.uuid4().hex[:6]}.pem"
    subject = "/CN=Fleet Test Intercepting CA"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"),
            *("-subj", subject, "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert.read_bytes()


def test_extra_ca_setting_is_validated_and_remembered(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("FLEET_CONFIG_DIR", str(tmp_path / "config"))
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    assert fleet_main(["images", "build", "--extra-ca", str(not_pem)]) == 2
    err = capsys.readouterr().err
    assert "no PEM certificate" in err and "Traceback" not in err
    assert images_mod.saved_extra_ca() == b""

    pem = _self_signed_pem(tmp_path)
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(b"junk before\n" + pem + pem)
    assert len(split_pem(save_extra_ca(bundle))) == 2
    assert images_mod.saved_extra_ca().count(b"BEGIN CERTIFICATE") == 2
    assert current_refs(["base"]) != current_refs(["base"], extra_ca=b"")
    save_extra_ca(None)
    assert images_mod.saved_extra_ca() == b""


def test_extra_ca_ends_up_in_the_trust_store(images, docker_client, tmp_path, run_id) -> None:
    pem = _self_signed_pem(tmp_path)
    ref = ensure_images(["base"], client=docker_client, extra_ca=pem)["base"]
    assert ref != images["base"], "the CA bundle is a build input of the base image"
    try:
        # Two base64 lines of this freshly made key: unique to this certificate.
        lines = pem.strip().splitlines()
        script = (
            f"grep -qF '{lines[1].decode()}' /etc/ssl/certs/ca-certificates.crt && "
            f"grep -qF '{lines[-2].decode()}' /etc/ssl/certs/ca-certificates.crt && "
            "test -L /etc/ssl/certs/extra-000.pem && echo bundle-ok; "
            "ls /usr/local/share/ca-certificates/fleet/; echo PIP_CERT=$PIP_CERT"
        )
        code, out = _run_to_end(docker_client, ref, script, run_id)
        assert code == 0 and "bundle-ok" in out, out
        assert "extra-000.crt" in out
        assert "PIP_CERT=/etc/ssl/certs/ca-certificates.crt" in out
    finally:
        try:
            docker_client.images.remove(ref)
        except docker.errors.APIError:
            pass  # still in use by a concurrent build; prune removes it later


# ---------------------------------------------------------------- image contents


def _run_to_end(client, image: str, script: str, run_id: str, **kwargs) -> tuple[int, str]:
    box = client.containers.run(
        image,
        ["sh", "-c", script],
        detach=True,
        network_mode="none",
        labels={"fleet.run": run_id},
        **SECURE,
        **kwargs,
    )
    try:
        code = box.wait(timeout=60)["StatusCode"]
        return code, box.logs().decode()
    finally:
        box.remove(force=True)  # now, so the image can be removed before run_id teardown


def test_coding_image_has_tools_and_runs_as_agent(images, docker_client, run_id) -> None:
    script = (
        "set -e; id -u; id -un; pwd; python3 --version; git --version; rg --version | sed -n 1p; "
        "printf 'int main(void){return 7;}' > /workspace/t.c && gcc -o /workspace/t /workspace/t.c; "
        "/workspace/t || echo gcc-exit=$?; ls /opt/fleet"
    )
    code, out = _run_to_end(docker_client, images["coding"], script, run_id)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[:3] == ["1000", "agent", "/workspace"]
    assert "Python 3.11" in out and "git version" in out and "ripgrep" in out
    assert "gcc-exit=7" in out, "gcc must compile and the result must run in /workspace"
    helpers = [Path(p).name for p in images_mod.BOX_HELPERS if Path(p).is_file()]
    for helper in helpers:
        assert helper in lines, f"/opt/fleet must hold {helper}"


_TINY_PROJECT = {
    "pyproject.toml": (
        '[project]\nname = "tiny"\nversion = "0.1"\n'
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
    ),
    "src/tiny/__init__.py": "def two():\n    return 2\n",
    "tests/test_tiny.py": "from tiny import two\n\ndef test_two():\n    assert two() == 2\n",
}


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_coding_box_runs_pytest_and_installs_a_project_offline(
    images, docker_client, run_id, anyio_backend
) -> None:
    """``fleet code REPO TASK --test "python3 -m pytest -q"`` in a box with no network:
    pytest is there, and a src-layout project installs into a venv without an index."""
    from sandbox.docker.backend import DockerBackend
    from sandbox.spec import SandboxSpec

    backend = DockerBackend(docker_client, images=images)
    async with await backend.create(SandboxSpec(), run=run_id, member="coder") as box:
        await box.write_file("test_one.py", "def test_one():\n    assert 1 + 1 == 2\n")
        ran = await box.exec("python3 -m pytest -q test_one.py", timeout=60)
        assert ran.ok and "1 passed" in ran.stdout, ran
        for path, text in _TINY_PROJECT.items():
            await box.write_file(f"tiny/{path}", text)
        installed = await box.exec(
            "python3 -m venv --system-site-packages /tmp/venv"
            " && /tmp/venv/bin/pip install -q --no-index --no-build-isolation -e ."
            " && /tmp/venv/bin/python -m pytest -q",
            cwd="/workspace/tiny",
            timeout=120,
        )
        assert installed.ok and "1 passed" in installed.stdout, installed


@pytest.mark.parametrize("name", ["base", "coding", "browser", "corpus"])
def test_images_hold_no_setuid_or_setgid_programs(images, docker_client, run_id, name) -> None:
    """su, mount, passwd and the like lose their bits at build time (looked at as root)."""
    out = docker_client.containers.run(
        images[name],
        ["find", "/", "-xdev", "-type", "f", "-perm", "/6000"],
        user="0",
        network_mode="none",
        labels={"fleet.run": run_id},
        remove=True,
    )
    assert out.decode() == "", f"fleet-{name} still has: {out.decode()}"


def test_browser_serves_cdp_under_secure_flags(images, docker_client, run_id) -> None:
    net = docker_client.networks.create(
        f"fleet-{run_id}", internal=True, labels={"fleet.run": run_id}
    )
    box = docker_client.containers.run(
        images["browser"],
        detach=True,
        user="1000",
        read_only=True,
        tmpfs={"/tmp": "size=256m"},
        network=net.name,
        environment={"FLEET_PROXY": "http://egress.invalid:3128"},
        labels={"fleet.run": run_id},
        **SECURE,
    )
    box.reload()
    ip = box.attrs["NetworkSettings"]["Networks"][net.name]["IPAddress"]
    version = _wait_for_json(f"http://{ip}:9223/json/version", box)
    assert version["Browser"].startswith("Chrome/")
    assert version["webSocketDebuggerUrl"].startswith(f"ws://{ip}:9223/devtools/browser/")

    cmdlines = box.exec_run(
        [
            "python3",
            "-c",
            "import glob; [print(open(p).read().replace(chr(0), ' ')) "
            "for p in glob.glob('/proc/[0-9]*/cmdline')]",
        ]
    ).output.decode()
    assert "--proxy-server=http://egress.invalid:3128" in cmdlines
    assert "--disable-quic" in cmdlines
    assert box.exec_run(["id", "-u"]).output.strip() == b"1000"


def _wait_for_json(url: str, box, timeout: float = 20.0) -> dict:
    # Straight to the container's address: never through an environment proxy.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with opener.open(url, timeout=2) as resp:
                return json.loads(resp.read())
        except OSError as exc:
            last = exc
            time.sleep(0.2)
    box.reload()
    logs = box.logs(tail=20).decode(errors="replace")
    pytest.fail(f"CDP never answered at {url} ({last}); box {box.status}; logs:\n{logs}")

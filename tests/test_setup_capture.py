"""A setup's key and what of its tree is kept: pure host-side parts, attacked.

The box's archive is hostile: each test hands :func:`capture` an archive a setup (or
what it installed) could have made, and checks what reaches the snapshot.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from coordinator.job.jobfile import JobError, parse_job, resolve_paths
from sandbox.prepared.capture import PREFIX, CaptureRefused, capture, capture_bytes
from sandbox.prepared.key import key_files, key_inputs, setup_key
from sandbox.prepared.spec import AUTO_COMMAND, SetupSpec


def _archive(*entries: tuple[str, str, bytes | str]) -> bytes:
    """A tar of (kind, name, data-or-link-target) entries, as a box's tar would make."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for kind, name, data in entries:
            info = tarfile.TarInfo(name)
            info.uid = info.gid = 0
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif kind == "file":
                raw = data if isinstance(data, bytes) else data.encode()
                info.size, info.mode = len(raw), 0o4755
                tar.addfile(info, io.BytesIO(raw))
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, str(data)
                tar.addfile(info)
            elif kind == "hard":
                info.type, info.linkname = tarfile.LNKTYPE, str(data)
                tar.addfile(info)
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
                tar.addfile(info)
    return buf.getvalue()


def _kept(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_unchanged_repository_files_are_left_out_and_the_rest_kept_owned_by_the_box_user(
    tmp_path: Path,
) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text("print('hi')\n")
    (tmp_path / "README").write_text("same size!\n")
    data = _archive(
        ("dir", ".", b""),
        ("file", "./src/app.py", "print('hi')\n"),  # as in the repository: left out
        ("file", "./README", "diff size?\n"),  # same size, other bytes: kept
        ("dir", "./.venv", b""),
        ("sym", "./.venv/bin/python", "/usr/bin/python3"),
        ("file", "./.venv/lib/pkg.py", "x = 1\n"),
    )
    out, got = capture_bytes(data, repo=tmp_path, secrets={})
    kept = _kept(out)
    assert f"{PREFIX}/src/app.py" not in kept and got.unchanged == 1
    assert f"{PREFIX}/README" in kept and f"{PREFIX}/.venv/lib/pkg.py" in kept
    assert kept[f"{PREFIX}/.venv/bin/python"].linkname == "/usr/bin/python3"
    assert got.venv is True
    for member in kept.values():
        assert (member.uid, member.gid) == (1000, 1000)
        assert member.mode & 0o7000 == 0  # no set-uid, set-gid or sticky bit survives


def test_a_file_edited_since_the_setup_comes_from_the_repository_not_the_snapshot(
    tmp_path: Path,
) -> None:
    # The repository changed one byte since the setup copied it: the box's copy is
    # kept (it differs), but each member's box gets the repository laid over it.
    (tmp_path / "a.py").write_text("v = 2\n")
    out, got = capture_bytes(_archive(("file", "a.py", "v = 1\n")), repo=tmp_path, secrets={})
    assert f"{PREFIX}/a.py" in _kept(out) and got.unchanged == 0


@pytest.mark.parametrize(
    "entries",
    [
        [("file", "/etc/passwd", "x")],
        [("file", "../../outside", "x")],
        [("file", "a/../../b", "x")],
        [("fifo", "pipe", b"")],
        [("hard", "h", "/etc/shadow")],
        [("hard", "h", "never-kept")],
    ],
    ids=["absolute", "dotdot", "inner-dotdot", "fifo", "hardlink-out", "hardlink-unkept"],
)
def test_entries_no_snapshot_may_hold_refuse_the_whole_capture(
    entries: list[tuple[str, str, bytes | str]],
) -> None:
    with pytest.raises(CaptureRefused):
        capture_bytes(_archive(*entries), repo=None, secrets={})


def test_a_repository_link_out_is_never_followed_to_judge_a_file_unchanged(
    tmp_path: Path,
) -> None:
    # The repository copy has lib -> a directory outside it holding the very bytes the
    # box's lib/x has: were the link followed, lib/x would be judged "unchanged" and
    # left out (and a host file would have been read). It is kept instead.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x").write_text("host secret\n")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "lib").symlink_to(outside)
    out, got = capture_bytes(_archive(("file", "lib/x", "host secret\n")), repo=repo, secrets={})
    assert f"{PREFIX}/lib/x" in _kept(out) and got.unchanged == 0


def test_a_hard_link_to_a_kept_file_stays_inside_the_tree() -> None:
    out, _ = capture_bytes(
        _archive(("file", "a", "data"), ("hard", "b", "a")), repo=None, secrets={}
    )
    assert _kept(out)[f"{PREFIX}/b"].linkname == f"{PREFIX}/a"


SECRET = "tok-3f9a1c7e55d0"


@pytest.mark.parametrize(
    "entries",
    [
        [("file", "pip.conf", f"[global]\nindex-url = https://u:{SECRET}@idx/simple\n")],
        [("file", "big.bin", b"\0" * (1024 * 1024 - 5) + SECRET.encode())],  # across a chunk end
        [("file", f"cache-{SECRET}", "x")],
        [("sym", "link", f"/tmp/{SECRET}")],
    ],
    ids=["content", "chunk-boundary", "name", "link-target"],
)
def test_a_secrets_value_anywhere_in_the_tree_refuses_it_naming_the_variable_not_the_value(
    entries: list[tuple[str, str, bytes | str]],
) -> None:
    with pytest.raises(CaptureRefused) as err:
        capture_bytes(_archive(*entries), repo=None, secrets={"INDEX_TOKEN": SECRET})
    assert "INDEX_TOKEN" in str(err.value) and SECRET not in str(err.value)


def test_the_kept_bytes_are_bounded() -> None:
    data = _archive(("file", "a", "x" * 600), ("file", "b", "y" * 600))
    with pytest.raises(CaptureRefused, match="more than 1,000 bytes"):
        capture_bytes(data, repo=None, secrets={}, limit=1000)


def test_what_is_not_a_tar_archive_is_refused() -> None:
    with pytest.raises(CaptureRefused):
        capture(io.BytesIO(b"not a tar at all" * 100), io.BytesIO(), repo=None, secrets={})


def _key(repo: Path, **setup: object) -> str:
    spec = SetupSpec(**{"run": "pip install -e .", **setup})
    return setup_key(key_inputs(spec, image_id="sha256:" + "a" * 64, runtime="runc", repo=repo))


def test_the_key_follows_manifests_not_source_files(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "requirements-dev.txt").write_text("hypothesis\n")
    (tmp_path / "p.py").write_text("x = 1\n")
    first = _key(tmp_path)
    (tmp_path / "p.py").write_text("x = 2\n")
    assert _key(tmp_path) == first  # a source edit sets up nothing again
    (tmp_path / "requirements-dev.txt").write_text("hypothesis\nfreezegun\n")
    second = _key(tmp_path)
    assert second != first
    assert _key(tmp_path, key_files=("p.py",)) != second  # named, a source file counts
    assert _key(tmp_path, allow=("pypi.org",)) != second
    assert _key(tmp_path, timeout_s=30) == second  # the time limit changes no result
    assert _key(tmp_path, refresh="pip install --no-deps -e .") == second


def test_the_key_follows_the_wheelhouses_content_not_its_path(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    one, two = tmp_path / "w1", tmp_path / "w2"
    for w in (one, two):
        w.mkdir()
        (w / "p-1.0-py3-none-any.whl").write_bytes(b"wheel")
    assert _key(repo, wheels=str(one)) == _key(repo, wheels=str(two))
    (two / "p-1.0-py3-none-any.whl").write_bytes(b"other")
    assert _key(repo, wheels=str(one)) != _key(repo, wheels=str(two))


def test_a_manifest_that_is_a_link_is_keyed_by_its_target_text_never_followed(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "host-secret"
    secret.write_text("one")
    repo = tmp_path / "repo"
    repo.mkdir()
    os.symlink(secret, repo / "requirements.txt")
    before = key_files(repo)
    secret.write_text("two")
    assert key_files(repo) == before and before["requirements.txt"].startswith("link:")


def _member(setup: str) -> str:
    return f'name = "t"\n[[members]]\nkind = "coding"\ntask = "x"\nsetup = {setup}\n'


def test_auto_is_fleets_own_command_and_a_string_is_a_command() -> None:
    job = parse_job(_member('"auto"'), source="t")
    assert job.members[0].setup is not None and job.members[0].setup.command == AUTO_COMMAND
    job = parse_job(_member('"make deps"'), source="t")
    assert job.members[0].setup is not None and job.members[0].setup.command == "make deps"


@pytest.mark.parametrize(
    ("setup", "says"),
    [
        ('{ run = "x", colour = "red" }', "setup.colour: is not a known field"),
        ('"   "', "setup.run: the setup command is empty"),
        ('{ run = "x", allow = ["127.0.0.1"] }', "loopback"),
        ('{ run = "x", allow = ["192.168.1.5"] }', "private"),
        ('{ run = "x", allow = ["169.254.169.254"] }', "link-local"),
        ('{ run = "x", allow = ["localhost"] }', "loopback"),
        ('{ run = "x", timeout_s = 0 }', "setup.timeout_s"),
        ('{ run = "x", timeout_s = 100000 }', "setup.timeout_s"),
        ('{ run = "x", secrets = ["HTTPS_PROXY"] }', "set by Fleet"),
        ('{ run = "x", key_files = ["/etc/passwd"] }', "not a relative file pattern"),
        ('{ run = "x", allow = ["pyp\u0456.org"] }', "is not a host name"),  # Cyrillic i
        ('{ run = "x", allow = ["0x7f000001"] }', "loopback"),
        ('{ run = "x", secrets = ["T\u041eKEN"] }', "not an environment variable name"),
        (f'"{"x" * 20_001}"', "setup.run"),
    ],
)
def test_bad_setups_are_refused_naming_the_field(setup: str, says: str) -> None:
    with pytest.raises(JobError) as err:
        parse_job(_member(setup), source="t")
    assert says in str(err.value)


def test_setup_on_a_browser_member_is_refused() -> None:
    with pytest.raises(JobError, match="'setup' is only for coding members"):
        parse_job(_member('"auto"').replace('"coding"', '"browser"'), source="t")


def test_a_missing_wheelhouse_or_unset_secret_is_refused_before_any_box(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "file").write_text("x")
    monkeypatch.delenv("SETUP_TEST_UNSET_TOKEN", raising=False)
    for setup, says in (
        ('{ run = "x", wheels = "nowhere" }', "does not exist"),
        ('{ run = "x", wheels = "file" }', "is not a directory"),
        ('{ run = "x", secrets = ["SETUP_TEST_UNSET_TOKEN"] }', "is not set in this environment"),
    ):
        job = parse_job(_member(setup), source="t")
        with pytest.raises(JobError, match=says):
            resolve_paths(job, tmp_path, source="t", relative_to="the job file")
    (tmp_path / "wh").mkdir()
    job = parse_job(_member('{ run = "x", wheels = "wh" }'), source="t")
    resolve_paths(job, tmp_path, source="t", relative_to="the job file")
    assert job.members[0].setup is not None
    assert job.members[0].setup.wheels == str(tmp_path / "wh")


def test_the_key_walk_enters_only_directories_that_could_hold_a_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sandbox.prepared.key as key_module

    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "test.txt").write_text("pytest\n")
    (tmp_path / "sub" / "deep").mkdir(parents=True)
    (tmp_path / "sub" / "deep" / "pyproject.toml").write_text("x")
    (tmp_path / "node_modules" / "left-pad").mkdir(parents=True)
    (tmp_path / "node_modules" / "left-pad" / "package.json").write_text("{}")
    seen: list[str] = []
    real = os.lstat

    def lstat(path: str) -> os.stat_result:
        seen.append(str(path))
        return real(path)

    monkeypatch.setattr(key_module.os, "lstat", lstat)
    assert sorted(key_files(tmp_path)) == ["requirements/test.txt"]
    assert not any("node_modules" in p or "sub" in p for p in seen), seen
    assert sorted(key_files(tmp_path, ("**/pyproject.toml",))) == [
        "requirements/test.txt",
        "sub/deep/pyproject.toml",
    ]

"""Engine checks: a clear paragraph (never a traceback) when Docker cannot be reached,
and ``fleet setup`` decides correctly between installing, starting and explaining."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.docker import engine
from sandbox.errors import SandboxUnavailable


def test_wrong_socket_path_names_the_socket_and_what_to_do(tmp_path: Path) -> None:
    url = f"unix://{tmp_path}/docker.sock"
    with pytest.raises(SandboxUnavailable) as info:
        engine.connect(url, timeout=5)
    text = str(info.value)
    assert f"there is no socket at {tmp_path}/docker.sock" in text
    assert "dockerd" in text and "DOCKER_HOST" in text
    assert "\n" not in text, "one paragraph"


def test_socket_that_does_not_answer_is_told_apart(tmp_path: Path) -> None:
    path = tmp_path / "silent.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    try:
        with pytest.raises(SandboxUnavailable, match="exists but the engine behind it"):
            engine.connect(f"unix://{path}", timeout=2)
    finally:
        server.close()


@pytest.mark.parametrize("argv", [["setup"], ["images", "ls"], ["images", "build"]])
def test_cli_without_engine_exits_2_with_one_paragraph(tmp_path: Path, argv: list[str]) -> None:
    # A DOCKER_HOST that is not the default engine is never installed or started.
    env = dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/missing.sock")
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("fleet: the Docker engine is not reachable")
    assert proc.stderr.count("\n") == 1


def test_running_engine_answers(docker_client) -> None:
    client = engine.connect()
    try:
        assert client.version()["ApiVersion"]
    finally:
        client.close()


class _Recorder:
    """Stands in for the host-changing steps (apt-get, starting dockerd)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def apt(self, packages: list[str], say) -> None:
        self.calls.append("apt " + " ".join(packages))

    def start(self, say, **_: object) -> str:
        self.calls.append("start")
        return "client"


@pytest.fixture
def engine_down(monkeypatch, tmp_path: Path) -> _Recorder:
    """The default engine does not answer; host-changing steps are recorded, not run."""
    monkeypatch.delenv("DOCKER_HOST", raising=False)

    def refuse(base_url: str | None = None, *, timeout: float = 60.0):
        raise SandboxUnavailable(engine.unreachable_message(f"unix://{tmp_path}/none.sock"))

    rec = _Recorder()
    monkeypatch.setattr(engine, "connect", refuse)
    monkeypatch.setattr(engine, "apt_install", rec.apt)
    monkeypatch.setattr(engine, "start_dockerd", rec.start)
    return rec


def test_setup_as_root_installs_then_starts_when_dockerd_is_absent(engine_down, monkeypatch):
    monkeypatch.setattr(engine, "is_root", lambda: True)
    monkeypatch.setattr(engine.shutil, "which", lambda name: None)
    assert engine.ensure_engine(lambda _l: None) == "client"
    assert engine_down.calls == ["apt docker.io", "start"]


def test_setup_as_root_only_starts_an_installed_dockerd(engine_down, monkeypatch):
    monkeypatch.setattr(engine, "is_root", lambda: True)
    monkeypatch.setattr(engine.shutil, "which", lambda name: f"/usr/sbin/{name}")
    engine.ensure_engine(lambda _l: None)
    assert engine_down.calls == ["start"]


def test_setup_as_non_root_explains_and_changes_nothing(engine_down, monkeypatch):
    monkeypatch.setattr(engine, "is_root", lambda: False)
    with pytest.raises(SandboxUnavailable, match="setsid dockerd"):
        engine.ensure_engine(lambda _l: None)
    assert engine_down.calls == []


def test_second_setup_builds_nothing(images) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator.cli", "setup"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "building" not in proc.stderr
    assert "ready" in proc.stderr

"""Bad input to the sandbox layer: one paragraph saying what was wrong and what to do,
a typed error from the Python API and no traceback from the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.docker.backend import DockerBackend
from sandbox.errors import SandboxSpecError, SandboxUnavailable
from sandbox.spec import NetworkPolicy, SandboxSpec

FLEET = str(Path(sys.executable).with_name("fleet"))

BAD_SPECS = [
    ({"cpu": 1}, "cpu: not a field of SandboxSpec"),
    ({"cpus": -1}, "cpus: Input should be greater than 0 (got -1)"),
    ({"pids": -3}, "pids: Input should be greater than or equal to 16"),
    ({"memory": "-5m"}, "memory: '-5m' is not a size; write e.g. '512m'"),
    ({"ttl_s": 0, "output_limit": -1}, "ttl_s: Input should be greater than 0"),
    ({"network": {"egress": "all"}}, "network.egress: Input should be 'none' or 'allowlist'"),
    ({"network": {"egress": "allowlist", "allow": ["a b"]}}, "'a b' is not a host name"),
]


@pytest.mark.parametrize(("fields", "says"), BAD_SPECS)
def test_a_bad_spec_is_one_typed_paragraph_naming_the_field(fields: dict, says: str) -> None:
    with pytest.raises(SandboxSpecError) as err:
        SandboxSpec(**fields)
    text = str(err.value)
    assert says in text
    assert "\n" not in text and "errors.pydantic.dev" not in text
    assert "Its fields: kind, image, cpus" in text and "e.g. SandboxSpec(" in text


def test_a_bad_network_policy_alone_says_how_to_write_one() -> None:
    with pytest.raises(SandboxSpecError, match=r"set egress = 'allowlist'.*e.g. NetworkPolicy"):
        NetworkPolicy(allow=("docs.python.org",))
    assert isinstance(SandboxSpecError("x"), ValueError)  # pydantic validators still wrap it


@pytest.mark.anyio
@pytest.mark.docker
async def test_an_unknown_image_says_how_to_get_one_and_leaves_no_box(
    docker_client, images, run_id: str
) -> None:
    backend = DockerBackend(docker_client, images=images)
    with pytest.raises(SandboxUnavailable, match=r"'fleet-nosuch:1' is not on this engine.*fleet"):
        await backend.create(SandboxSpec(image="fleet-nosuch:1"), run=run_id, member="m")
    assert await backend.list_boxes(run=run_id) == []


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_engine_down_is_one_paragraph_from_the_api(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    monkeypatch.setenv("FLEET_HOME", str(tmp_path))
    with pytest.raises(SandboxUnavailable) as err:
        await DockerBackend().create(SandboxSpec(), run="r-down", member="m")
    assert "not reachable" in str(err.value) and "dockerd" in str(err.value)


@pytest.mark.parametrize("argv", [["sandbox", "ls"], ["sandbox", "gc"]])
def test_engine_down_is_one_paragraph_from_the_cli(argv: list[str], tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DOCKER_HOST": "unix:///nonexistent/docker.sock",
        "FLEET_HOME": str(tmp_path),
    }
    res = subprocess.run([FLEET, *argv], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res
    assert res.stderr.startswith("fleet: the Docker engine is not reachable")
    assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1

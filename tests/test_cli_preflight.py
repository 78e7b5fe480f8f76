"""Before a run exists, Fleet checks the images the job needs: it builds what is missing
(with a progress line), or says in one paragraph how to build them - never members that
all "crash" with ``image ... is not built``, get retried, and fail the run.

Missing images are simulated with a throwaway salt in the image tags (every current
reference then names an image the engine does not have); the build path's builder tags
the real, already built images under the salted references instead of rebuilding them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import remove_run

import sandbox.images.build as image_build
import sandbox.images.catalog as images_mod
from coordinator.cli import main
from coordinator.job.spec import Job
from coordinator.rundir.runs import RunDir
from coordinator.runner.preflight import needed_images

FLEET = str(Path(sys.executable).with_name("fleet"))


def _job(tmp_path: Path) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(
        f'name = "t"\noutput_dir = "{tmp_path / "runs"}"\n[model]\nname = "offline"\n'
        '[[members]]\nid = "coder"\nkind = "coding"\ntask = "List the files."\n'
    )
    return path


@pytest.fixture
def salted(images, monkeypatch) -> tuple[dict[str, str], dict[str, str]]:
    """(real refs, salted refs): from here on every image counts as not built."""
    real = images_mod.current_refs()
    monkeypatch.setattr(images_mod, "BUILDER_VERSION", f"test-{uuid.uuid4().hex[:10]}")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    return real, images_mod.current_refs()


def test_missing_images_are_built_with_a_progress_line_before_the_run_starts(
    tmp_path, docker_client, salted, monkeypatch, capsys
):
    real, new = salted
    built: list[str] = []
    runs_existed: list[bool] = []

    def build(order: list[Any], *, client: Any, forced: Any, extra_ca: bytes, say: Any):
        runs_existed.append((tmp_path / "runs").exists())
        for defn in order:
            if not images_mod.image_exists(client, new[defn.name]):
                say(f"building {new[defn.name]}")
                repo, tag = new[defn.name].split(":")
                client.images.get(real[defn.name]).tag(repo, tag)
                built.append(defn.name)
        return {d.name: new[d.name] for d in order}

    monkeypatch.setattr(image_build, "build_images", build)
    try:
        code = main(["run", str(_job(tmp_path)), "--plain"])
    finally:
        for name in built:
            docker_client.images.remove(new[name])  # the salted tag only
        for run in RunDir.list(tmp_path / "runs"):
            remove_run(docker_client, run.id)
    err = capsys.readouterr().err
    assert code == 0, err
    assert built == ["rootfs", "base", "coding"]  # what a coding job needs, parents first
    assert runs_existed == [False]  # built before any run directory was created
    notice = next(ln for ln in err.splitlines() if "not built yet" in ln)
    assert new["coding"] in notice and "building them now" in notice
    assert err.index(f"building {new['coding']}") < err.index("fleet: run ")
    (run,) = RunDir.list(tmp_path / "runs")
    assert run.outcome("coder").status == "ok"  # its box ran on the image just built


def test_images_that_cannot_be_built_are_bad_input_naming_setup(
    tmp_path, docker_client, salted, monkeypatch, capsys
):
    # A user who is not root cannot debootstrap the root image.
    monkeypatch.setattr(image_build, "is_root", lambda: False)
    code = main(["run", str(_job(tmp_path)), "--plain"])
    err = capsys.readouterr().err
    assert code == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("fleet: the job needs Fleet's image(s) coding")
    assert "debootstrap, which needs root" in last
    assert "'fleet setup'" in last and "'fleet images build'" in last
    assert "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_no_docker_engine_is_bad_input_before_any_run(tmp_path):
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    env.pop("ANTHROPIC_API_KEY", None)
    proc = subprocess.run(
        [FLEET, "run", str(_job(tmp_path)), "--plain"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert "\n" not in err and "Traceback" not in err  # one paragraph
    assert "Docker engine is not reachable" in err and "'fleet setup'" in err
    assert not (tmp_path / "runs").exists()


def test_a_job_needs_the_images_of_its_kinds_its_proxy_and_the_corpus():
    research = Job.model_validate({"name": "r", "research": {"question": "q", "members": 2}})
    assert needed_images(research) == ["coding", "browser", "corpus"]
    own = Job.model_validate(
        {"name": "c", "members": [{"kind": "coding", "task": "t", "sandbox": {"image": "x:1"}}]}
    )
    assert needed_images(own) == []
